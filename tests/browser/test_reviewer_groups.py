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


LEAD = ("lead", "lead-T1042")


def test_a_lead_assigns_the_reviewer_hands_over_and_the_history_lists_both(demo, login, live_server, screenshot_dir):
    _, lead = login(*LEAD)
    lead.goto(review_url(live_server, "T-1077"))
    expect(lead.locator("#df-assignee")).to_contain_text("Assigned to the policy's group Billing reviewers (at begin)")
    form = lead.locator("#df-assign-form")
    form.locator("#df-assign-user").select_option(label="reviewer")
    form.locator("#df-assign-note").fill("owns the March renewals")
    form.locator("#df-assign").click()
    expect(lead.locator(".messagelist")).to_contain_text("T-1077 is now assigned to reviewer.")
    expect(lead.locator("#df-assignee")).to_contain_text("Assigned to reviewer (assigned by lead at")
    expect(lead.locator("#df-handover-form")).to_have_count(0)  # a lead does not decide

    _, page = login(*REVIEWER)
    page.goto(review_url(live_server, "T-1077"))
    expect(page.locator("#df-assignee-first")).to_have_text("Assignee first: it is yours.")
    page.locator("#df-assignment").screenshot(path=str(screenshot_dir / "assignment.png"))
    # reviewer2 is not a billing reviewer, and nobody else is: no one to hand it to, no form.
    expect(page.locator("#df-handover-form")).to_have_count(0)

    # On T-1042 (no group) the reviewer hands it to reviewer2, who then sees it under Me.
    page.goto(review_url(live_server, "T-1042"))
    page.locator("#df-handover-user").select_option(label="reviewer2")
    page.locator("#df-handover-note").fill("I am out this afternoon")
    page.locator("#df-handover").click()
    expect(page.locator(".messagelist")).to_contain_text("T-1042 is now assigned to reviewer2.")
    expect(page.locator("#df-assignee-first")).to_contain_text("others may decide it too")
    _, other = login(*REVIEWER2)
    other.goto(f"{live_server.url}/admin/reviews/reviewqueueitem/?groups=me")
    rows = other.locator("#result_list tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("T-1042")
    expect(rows.first.locator(".df-assignee")).to_have_text("reviewer2")

    lead.goto(f"{live_server.url}/admin/cases/case/{Case.objects.get(case_id='T-1077').pk}/history/")
    move = lead.locator("li.df-ev-assignment")
    expect(move).to_contain_text("to reviewer by lead")
    expect(move).to_contain_text("owns the March renewals")
    lead.screenshot(path=str(screenshot_dir / "assignment-history.png"), full_page=True)


def test_out_of_office_sends_new_assignments_to_the_substitute(demo, login, live_server):
    _, page = login(*REVIEWER)
    page.goto(f"{live_server.url}/admin/reviews/reviewqueueitem/")
    page.locator("#df-away-link").click()
    expect(page.locator("#df-away-none")).to_be_visible()
    page.locator("#df-away-until").fill("2099-01-31T17:00")
    page.locator("#df-away-substitute").select_option(label="reviewer2")
    page.locator("#df-away-save").click()
    expect(page.locator("#df-away-now")).to_contain_text("new assignments go to reviewer2")
    _, lead = login(*LEAD)
    lead.goto(review_url(live_server, "T-1042"))
    lead.locator("#df-assign-user").select_option(label="reviewer")
    lead.locator("#df-assign").click()
    expect(lead.locator(".messagelist")).to_contain_text(
        "T-1042 is now assigned to reviewer2 (for reviewer, who is away)."
    )
    expect(lead.locator("#df-assignee")).to_contain_text("for reviewer, who is away")
