"""Publishing a policy version in a real browser: the page, its confirmation, and what a
reviewer then sees ("policy changed", the parameter diff, a stale tab refused)."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from reviews.models import Origin, ReviewDecision
from tests.browser.conftest import LEAD, REVIEWER

pytestmark = pytest.mark.django_db(transaction=True)

V4 = {
    "name": "support-reply",
    "label": "v4",
    "parameters": {"allowance_units": 10, "rollback_advice": "forbidden", "requires_human_review": True},
}


def test_publish_page_confirms_then_the_review_page_shows_the_policy_diff(demo, login, live_server, screenshot_dir):
    old = demo.current_proposal
    # A reviewer's tab, opened before the publish.
    _, tab = login(*REVIEWER)
    tab.goto(f"{live_server.url}/admin/reviews/proposal/{old.pk}/review/")
    tab.wait_for_selector("#df-approve")

    _, page = login(*LEAD)
    page.goto(f"{live_server.url}/admin/cases/policy/")
    page.click("#df-publish-link")
    page.fill("#df-policy-json", json.dumps(V4, indent=2))
    page.click("#df-publish-preview")
    # The confirmation lists what would be superseded; nothing is written yet.
    expect(page.locator("#df-publish-summary")).to_contain_text("support-reply v4")
    expect(page.locator("#df-publish-rows")).to_contain_text("T-1042")
    expect(page.locator("#df-publish-rows")).to_contain_text(old.operation_id)
    page.screenshot(path=str(screenshot_dir / "publish-policy-confirm.png"), full_page=True)
    demo.refresh_from_db()
    assert demo.current_proposal_id == old.pk
    page.click("#df-publish-apply")
    expect(page.locator("ul.messagelist")).to_contain_text("published support-reply v4")
    expect(page.locator("#result_list")).to_contain_text("v4")

    # The tab from before the publish is refused as stale.
    tab.click("#df-approve")
    tab.wait_for_selector("ul.messagelist")
    expect(tab.locator("ul.messagelist")).to_contain_text("stale:")
    assert not ReviewDecision.objects.exists()

    demo.refresh_from_db()
    new = demo.current_proposal
    assert new.origin == Origin.POLICY_CHANGE and new.parent_id == old.pk
    tab.goto(f"{live_server.url}/admin/reviews/proposal/{new.pk}/review/")
    banner = tab.locator("#df-policy-changed")
    expect(banner).to_contain_text("Policy changed")
    expect(banner).to_contain_text("allowance_units 9 → 10")
    expect(tab.locator("#df-findings .df-recheck-flag")).to_have_count(len(new.findings))
    banner.screenshot(path=str(screenshot_dir / "review-policy-changed.png"))
    tab.screenshot(path=str(screenshot_dir / "review-policy-changed-page.png"), full_page=True)
    # The bulk confirmation flags the same findings in its Warnings column.
    tab.goto(f"{live_server.url}/admin/cases/case/")
    tab.locator("#result_list tr", has_text="T-1042").locator("input.action-select").check()
    tab.select_option("select[name=action]", "approve_selected")
    tab.click("button[name=index]")
    warnings = tab.locator("tr[data-case=T-1042] .df-warnings")
    expect(warnings).to_contain_text(f"Re-check (policy changed): {len(new.findings)} finding")
    expect(warnings).to_contain_text("policy v3 → v4")
    expect(warnings).not_to_contain_text("none")  # the text markers' "none" is not said beside a warning
    tab.locator("#df-confirm-rows").screenshot(path=str(screenshot_dir / "bulk-policy-changed.png"))
    # The reviewer does not get the publish button.
    tab.goto(f"{live_server.url}/admin/cases/policy/")
    expect(tab.locator("#df-publish-link")).to_have_count(0)


def test_a_case_switched_but_not_yet_prepared_again_says_so_instead_of_offering_approve(
    demo, login, live_server, screenshot_dir, make_user
):
    """A publish killed after its switch (its commit point): the old proposal is still the
    case's current one, but a decision on it would be refused, so the page offers none."""
    from workflow.publishing import _switch, publish_plan

    old = demo.current_proposal
    _switch(publish_plan(data=V4), V4, make_user("publisher-b", group="leads"), 100)
    _, tab = login(*REVIEWER)
    tab.goto(f"{live_server.url}/admin/reviews/proposal/{old.pk}/review/")
    banner = tab.locator("#df-policy-switched")
    expect(banner).to_contain_text(
        "Policy support-reply v4 has been published since this proposal was prepared under v3"
    )
    expect(banner).to_contain_text("reload in a moment")
    expect(tab.locator("#df-approve")).to_have_count(0)
    expect(tab.locator("#df-decline")).to_have_count(0)
    expect(tab.locator("#df-no-actions")).to_contain_text("no longer in force")
    tab.screenshot(path=str(screenshot_dir / "review-policy-switched.png"), full_page=True)
