"""Two-person approval in a real browser: a copy of the demo's T-1042 under support-reply
with ``approvals_required`` 2. The demo's reviewer approves first, reviewer2 second."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from cases.models import Case
from tests.browser.conftest import REVIEWER, in_thread
from tests.conftest import load_fixture

pytestmark = pytest.mark.django_db(transaction=True)

REVIEWER2 = ("reviewer2", "review2-T1042")


def two_person_case() -> Case:
    from cases.services import case_import
    from workflow.begin import review_begin

    data = load_fixture("t1042.json")
    data["case_id"] = "T-2042"
    data["policy"]["parameters"]["approvals_required"] = 2
    case = case_import(data=data).case
    in_thread(review_begin, case=case)  # the engine runs: not in Playwright's thread
    case.refresh_from_db()
    return case


def test_the_first_approval_awaits_the_second_and_the_page_says_so(demo, login, live_server, screenshot_dir):
    case = two_person_case()
    url = f"{live_server.url}/admin/reviews/proposal/{case.current_proposal_id}/review/"
    _, page = login(*REVIEWER)
    page.goto(url)
    page.locator("#df-approve").click()
    expect(page.locator(".messagelist")).to_contain_text("Approval recorded: 1 of 2 approvals;")
    page.goto(url)
    expect(page.locator("#df-approvals-count")).to_have_text("1 of 2 approvals")
    expect(page.locator("#df-approvals")).to_contain_text("approved by reviewer at")
    expect(page.locator("#df-approved-by-you")).to_contain_text("You approved this proposal already")
    expect(page.locator("#df-approve")).to_have_count(0)
    expect(page.locator("#df-decline")).to_be_visible()  # a decline still ends it
    page.locator("#df-approvals").screenshot(path=str(screenshot_dir / "two-person-approvals.png"))
    page.locator("#df-actions").screenshot(path=str(screenshot_dir / "two-person-approval.png"))

    _, other = login(*REVIEWER2)
    other.goto(url)
    expect(other.locator("#df-approvals-count")).to_have_text("1 of 2 approvals")
    other.locator("#df-approve").click()
    expect(other.locator(".messagelist")).to_contain_text("Approved: the support review record was written")
    other.goto(f"{live_server.url}/admin/cases/case/{case.pk}/history/")
    counts = other.locator("li.df-ev-approval .df-approval-count")
    expect(counts).to_have_text(["1 of 2 approvals", "2 of 2 approvals"])
