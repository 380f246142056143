"""A proposal a new source version marked "evidence changed", in a real browser: the review
page says why instead of offering Approve, and Decline stays."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from cases.models import SourceVersion
from reviews.models import ReviewDecision
from tests.browser.conftest import REVIEWER, in_thread

pytestmark = pytest.mark.django_db(transaction=True)

QUOTATION = "Engineering needs a diagnostic export from affected units before advising any change."


def test_a_marked_proposal_shows_the_reason_instead_of_approve(demo, login, live_server, screenshot_dir, make_user):
    from workflow.sources import source_version_add

    old = demo.current_proposal
    v4 = SourceVersion.objects.get(source__source_id="HOLD-7", version=4).text
    # A tab opened before the new version came in.
    _, tab = login(*REVIEWER)
    tab.goto(f"{live_server.url}/admin/reviews/proposal/{old.pk}/review/")
    tab.wait_for_selector("#df-approve")

    result = in_thread(
        source_version_add,
        source_id="HOLD-7",
        version=5,
        text=v4.replace(QUOTATION + " ", ""),
        actor=make_user("pipeline-b", group="pipeline"),
        apply=True,
    )
    assert result.marked == 1

    # The old tab's Approve is refused with the reason; nothing is written.
    tab.click("#df-approve")
    tab.wait_for_selector("ul.messagelist")
    expect(tab.locator("ul.messagelist")).to_contain_text("evidence changed: the quotation is no longer in HOLD-7 v5")
    assert not ReviewDecision.objects.exists()

    # Reloaded: the reason instead of Approve, Decline still there.
    tab.goto(f"{live_server.url}/admin/reviews/proposal/{old.pk}/review/")
    reason = tab.locator("#df-evidence-changed")
    expect(reason).to_contain_text("Evidence changed: the quotation is no longer in HOLD-7 v5")
    expect(reason).to_contain_text("Approval waits for a re-draft or an edit")
    expect(tab.locator("#df-approve")).to_have_count(0)
    expect(tab.locator("#df-decline")).to_be_visible()
    tab.locator("#df-actions").screenshot(path=str(screenshot_dir / "review-evidence-changed.png"))
    tab.screenshot(path=str(screenshot_dir / "review-evidence-changed-page.png"), full_page=True)
