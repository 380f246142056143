"""The review queue and claims in a real browser: the queue from the admin index,
a claim renewed by the page's ping, the warning a second reviewer sees, and the lapse."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from reviews.models import PendingReview
from tests.browser.conftest import REVIEWER, in_thread

pytestmark = pytest.mark.django_db(transaction=True)

REVIEWER2 = ("reviewer2", "review2-T1042")


LOOK = "el => { const s = getComputedStyle(el); return [s.backgroundColor, s.color, s.borderRadius, s.borderStyle]; }"


def button_look(page, selector: str) -> list[str]:
    return page.eval_on_selector(selector, LOOK)


def admin_button_look(page, *, default: bool) -> list[str]:
    """What the admin's own stylesheet gives a button of its class (the same page, the same theme)."""
    return page.evaluate(
        """(cls) => { const b = document.createElement('button'); b.className = cls; document.body.appendChild(b);
           const s = getComputedStyle(b); const look = [s.backgroundColor, s.color, s.borderRadius, s.borderStyle];
           b.remove(); return look; }""",
        "button default" if default else "button",
    )


@pytest.fixture
def queue_demo(demo, settings):
    """Every demo case begun (as load_demo leaves them), aged so the queue shows each SLA state."""
    settings.DECISIONFLOW_REVIEW_SLA = "4h"
    # Short, so the test sees a renewal and a lapse in seconds (renewed every 1.5 s).
    settings.DECISIONFLOW_REVIEW_CLAIM_LEASE = "4.5s"
    now = timezone.now()
    for case_id, age in (("T-1042", timedelta(hours=5, minutes=12)), ("T-1077", timedelta(hours=3, minutes=20))):
        PendingReview.objects.filter(case__case_id=case_id).update(created_at=now - age)
    return demo


def test_queue_claim_renewal_warning_and_lapse(queue_demo, login, live_server, screenshot_dir):
    _, page = login(*REVIEWER)
    expect(page.locator("#df-queue-link")).to_have_text("4 pending reviews")
    page.click("#df-queue-link")
    expect(page.locator("#result_list tbody tr")).to_have_count(4)
    first_row = page.locator("#result_list tbody tr").first
    expect(first_row).to_contain_text("T-1042")
    expect(first_row.locator(".df-sla-breached")).to_have_text("Breached")
    expect(page.locator("#result_list tbody tr").nth(1).locator(".df-sla-at_risk")).to_have_text("At risk")

    first_row.locator("a.df-queue-case").click()
    # The claim buttons are the admin's own (its colours and corners), not the browser's.
    assert button_look(page, "#df-claim-button") == admin_button_look(page, default=True)
    assert button_look(page, "#df-claim-button")[3] == "none"  # no bevelled browser border
    # On the banner's line, after its sentence, not on a line of its own.
    said, button = page.locator("#df-claim-none").bounding_box(), page.locator("#df-claim-button").bounding_box()
    assert said and button and button["x"] > said["x"] + said["width"]
    assert abs((button["y"] + button["height"] / 2) - (said["y"] + said["height"] / 2)) < 12, (said, button)
    page.locator("#df-claim").screenshot(path=str(screenshot_dir / "claim-button.png"))
    page.click("#df-claim-button")
    expect(page.locator("#df-claim-mine")).to_contain_text("You are reviewing this since")
    assert button_look(page, "#df-release") == admin_button_look(page, default=False)
    page.locator("#df-claim").screenshot(path=str(screenshot_dir / "release-button.png"))
    pending = PendingReview.objects.get(case__case_id="T-1042")
    granted = pending.claim_expires_at
    # The open page renews the claim: the lease moves on without a click.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pending.refresh_from_db()
        if pending.claim_expires_at > granted:
            break
        time.sleep(0.3)
    assert pending.claim_expires_at > granted

    _, other = login(*REVIEWER2)
    other.goto(f"{live_server.url}/admin/reviews/reviewqueueitem/")
    expect(other.locator("#result_list tbody tr").first.locator(".df-claim")).to_contain_text(
        "being reviewed by reviewer"
    )
    # The queue as the second reviewer sees it: who is on T-1042 already.
    other.screenshot(path=str(screenshot_dir / "review-queue.png"), full_page=True)
    other.locator("#result_list tbody tr").first.locator("a.df-queue-case").click()
    expect(other.locator("#df-claim-other")).to_contain_text("Being reviewed by reviewer since")
    expect(other.locator("#df-claim-warning")).to_contain_text("A claim is advisory")
    # Advisory: the decision buttons are still there.
    expect(other.locator("#df-decline")).to_be_visible()
    other.screenshot(path=str(screenshot_dir / "claimed-case.png"), full_page=True)

    # The first reviewer leaves: no more pings, and the claim lapses after its lease.
    page.goto(f"{live_server.url}/admin/")
    time.sleep(5)
    other.reload()
    expect(other.locator("#df-claim-none")).to_contain_text("reviewer's claim lapsed")
    other.click("#df-claim-button")
    expect(other.locator("#df-claim-mine")).to_be_visible()


def test_an_empty_queue_says_why_and_leads_to_the_cases(demo, login, live_server, screenshot_dir):
    from django.contrib.auth import get_user_model

    from workflow.decide import decision_record

    reviewer = get_user_model().objects.get(username="reviewer")
    for pending in PendingReview.objects.filter(status=PendingReview.Status.PENDING).select_related("case"):
        in_thread(
            decision_record,
            case=pending.case,
            operation_id=pending.operation_id,
            approved=False,
            reviewer=reviewer,
            channel="test",
        )
    _, page = login(*REVIEWER)
    page.click("#df-queue-top-link")
    empty = page.locator("#df-queue-empty")
    expect(empty).to_have_text(
        "No pending reviews. A case's review starts when the pipeline sends it, or with Start review on its page in Cases."
    )
    page.screenshot(path=str(screenshot_dir / "review-queue-empty.png"))
    empty.get_by_role("link", name="Cases").click()
    expect(page.locator("h1")).to_contain_text("case")
