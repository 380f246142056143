"""Reviewer groups in a real browser, on the demo as `make run` loads it: billing-reply
(T-1077) names "Billing reviewers"; the demo's reviewer is one, reviewer2 is not."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from cases.models import Case
from tests.browser.conftest import REVIEWER

pytestmark = pytest.mark.django_db(transaction=True)

REVIEWER2 = ("reviewer2", "review2-T1042")


def review_url(live_server, case_id: str) -> str:
    case = Case.objects.get(case_id=case_id)
    return f"{live_server.url}/admin/reviews/proposal/{case.current_proposal_id}/review/"


def test_the_reason_stands_in_place_of_the_buttons_for_an_outsider(demo, login, live_server, screenshot_dir):
    _, page = login(*REVIEWER2)
    page.goto(review_url(live_server, "T-1077"))
    reason = page.locator("#df-not-in-group")
    expect(reason).to_contain_text("You cannot decide this proposal.")
    expect(reason).to_contain_text("decided by the members of Billing reviewers only, and you are not one")
    expect(page.locator("#df-approve")).to_have_count(0)
    expect(page.locator("#df-decline")).to_have_count(0)
    expect(page.locator("#df-edit")).to_be_visible()  # editing is not deciding
    page.locator("#df-actions").screenshot(path=str(screenshot_dir / "not-in-group.png"))
    # T-1042's support-reply names no group: reviewer2 decides it as before.
    page.goto(review_url(live_server, "T-1042"))
    expect(page.locator("#df-approve")).to_be_visible()
    expect(page.locator("#df-not-in-group")).to_have_count(0)


def test_the_demo_reviewer_decides_the_billing_case_and_sees_it_under_my_groups(
    demo, login, live_server, screenshot_dir
):
    _, page = login(*REVIEWER)
    page.goto(f"{live_server.url}/admin/reviews/reviewqueueitem/")
    page.get_by_role("link", name="My groups").click()
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("T-1077")
    expect(rows.first.locator(".df-group")).to_have_text("Billing reviewers")
    page.screenshot(path=str(screenshot_dir / "queue-my-groups.png"), full_page=True)
    page.goto(review_url(live_server, "T-1077"))
    page.locator("#df-approve").click()
    expect(page.locator(".messagelist")).to_contain_text("Approved: the support review record was written")
    # And the demo case itself, T-1042, as `make run` promises.
    page.goto(review_url(live_server, "T-1042"))
    page.locator("#df-approve").click()
    expect(page.locator(".messagelist")).to_contain_text("Approved: the support review record was written")
