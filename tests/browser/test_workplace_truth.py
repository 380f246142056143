"""The workplace in a real browser: self-service tokens used against the API, the API docs with
no network, the bulk confirmation's counts, and the lists at 1280 px."""

from __future__ import annotations

import re
from urllib.parse import urlparse

import pytest
from playwright.sync_api import expect

from cases.models import Case
from cases.services import case_import
from effects.models import EffectRecord
from tests.browser.conftest import LEAD, REVIEWER, in_thread
from tests.conftest import load_fixture
from workflow.begin import review_begin
from workflow.decide import decision_record
from workflow.edit import review_edit

pytestmark = pytest.mark.django_db(transaction=True)

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


def messages(page) -> str:
    return page.locator("ul.messagelist").inner_text()


def test_a_reviewer_creates_a_token_uses_it_and_revokes_it(demo, login, live_server, screenshot_dir):
    context, page = login(*REVIEWER)
    page.click("#df-my-tokens-link")
    expect(page.locator("h1")).to_have_text("Your API tokens")
    page.fill("#df-token-name", "trying the API")
    page.click("#df-token-submit")
    secret = page.locator("#df-token-secret").input_value()
    assert re.fullmatch(r"dft_[A-Za-z0-9_-]{43}", secret), secret
    expect(page.locator("#df-token-example")).to_contain_text(f"Bearer {secret}")
    # The whole curl line is on screen at 1280 px: wrapped inside its box, nothing cut off.
    example = page.locator("#df-token-example")
    assert example.inner_text().endswith("/api/cases/T-1042")
    assert page.evaluate("(el) => el.scrollWidth <= el.clientWidth", example.element_handle())
    box = example.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 1280 and box["height"] > 30  # two lines
    page.screenshot(path=str(screenshot_dir / "api-token-created.png"), full_page=True)

    # The token works against the API, with no session: a fresh request context.
    api = context.request
    headers = {"Authorization": f"Bearer {secret}"}
    response = api.get(f"{live_server.url}/api/cases/T-1042", headers=headers, fail_on_status_code=False)
    assert response.status == 200 and response.json()["case_id"] == "T-1042"
    op = response.json()["operation_id"]
    decided = api.post(
        f"{live_server.url}/api/cases/T-1042/decision",
        headers=headers,
        data={"operation_id": op, "approved": True},
        fail_on_status_code=False,
    )
    assert decided.status == 200 and decided.json()["outcome"] == "committed", decided.text()
    assert EffectRecord.objects.get(operation_id=op).reviewer.username == "reviewer"

    # Shown once: the list has its prefix, never the whole secret again.
    page.goto(f"{live_server.url}/admin/api/apitoken/mine/")
    assert secret not in page.content()
    row = page.locator("#df-tokens tr.df-token-active", has_text="trying the API")
    expect(row).to_contain_text("active")
    row.get_by_role("button", name="Revoke trying the API").click()
    assert "requests with it are refused (401)" in messages(page)
    expect(page.locator("#df-tokens tr.df-token-revoked", has_text="trying the API")).to_contain_text("revoked")
    page.screenshot(path=str(screenshot_dir / "api-tokens.png"), full_page=True)

    refused = api.get(f"{live_server.url}/api/cases/T-1042", headers=headers, fail_on_status_code=False)
    assert refused.status == 401 and refused.json()["code"] == "unauthorized"


def test_the_lead_gets_a_403_in_the_admin_look_with_a_way_back(demo, login, live_server, screenshot_dir):
    context, page = login(*LEAD)
    page.goto(f"{live_server.url}/admin/reviews/proposal/{demo.current_proposal_id}/edit/")
    expect(page.locator("#df-403")).to_contain_text("You are signed in as lead")
    expect(page.locator("#site-name")).to_contain_text("decisionflow review")
    page.screenshot(path=str(screenshot_dir / "forbidden.png"), full_page=False)
    page.click("#df-403-back")
    page.wait_for_selector("#df-review")


def test_the_api_docs_list_the_operations_with_no_network(browser, live_server, screenshot_dir, demo):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    blocked = []

    def only_this_machine(route):
        host = urlparse(route.request.url).hostname or ""
        if host in LOCAL_HOSTS:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", only_this_machine)
    try:
        page = context.new_page()
        page.goto(f"{live_server.url}/api/docs")
        operations = page.locator(".opblock-summary-path")
        expect(operations.first).to_be_visible(timeout=15_000)
        paths = {p.strip().replace("\u200b", "") for p in operations.all_inner_texts()}
        assert {
            "/api/cases/{case_id}",
            "/api/cases/{case_id}/decision",
            "/api/cases/{case_id}/edits",
            "/api/operations/{operation_id}",
        } <= paths, paths
        page.screenshot(path=str(screenshot_dir / "api-docs.png"), full_page=False)
        assert blocked == [], blocked
    finally:
        context.close()


def test_the_bulk_confirmation_counts_only_the_rows_that_will_act(demo, login, live_server, screenshot_dir):
    from django.contrib.auth import get_user_model

    reviewer = get_user_model().objects.get(username="reviewer")
    editor = get_user_model().objects.get(username="reviewer2")  # four eyes: not the approver
    edited = Case.objects.get(case_id="T-1150")
    in_thread(
        review_edit,
        case=edited,
        expected_operation_id=edited.current_proposal.operation_id,
        body=edited.current_proposal.body + "\nWe will call you tomorrow.",
        editor=editor,
    )
    approved = Case.objects.get(case_id="T-1077")
    op = in_thread(review_begin, case=approved).operation_id
    in_thread(decision_record, case=approved, operation_id=op, approved=True, reviewer=reviewer, channel="test")
    # T-1042 and T-1103 are pending (load_demo began them); a copy of T-1103 was never begun.
    never = case_import(data={**load_fixture("t1103.json"), "case_id": "T-9103"}).case

    context, page = login(*REVIEWER)
    page.goto(f"{live_server.url}/admin/cases/case/")
    # The sort indicator is on "created", newest first, and on screen at 1280 px.
    created = page.locator("#result_list th.column-created")
    expect(created).to_have_class(re.compile(r"sorted descending"))
    results = page.locator("#changelist .results")
    assert page.evaluate("(el) => el.scrollWidth <= el.clientWidth", results.element_handle())
    box, area = created.bounding_box(), results.bounding_box()
    assert box and area and box["x"] + box["width"] <= area["x"] + area["width"] + 1, (box, area)
    page.check("#action-toggle")
    page.select_option("select[name=action]", "approve_selected")
    page.click("button[name=index]")
    page.wait_for_selector("#df-confirm-rows")
    expect(page.locator("#df-confirm")).to_have_text("Approve 3 proposals")
    expect(page.locator("#df-confirm-rows tbody tr")).to_have_count(5)
    expect(page.locator("tr.df-row-act")).to_have_count(3)
    expect(page.locator("tr[data-case=T-1150] .df-human-edit")).to_contain_text("yes: edited by a person")
    expect(page.locator("tr[data-case=T-1077] .df-outcome")).to_contain_text("skip: already approved by reviewer at")
    expect(page.locator("tr[data-case=T-9103] .df-outcome")).to_contain_text("skip: no review begun")
    # The full identity stays on one line, inside its cell (scrolled, not wrapped or clipped off the page).
    cell = page.locator("tr[data-case=T-1042] .df-op-scroll")
    box = cell.bounding_box()
    # One line box for the text (a scroll bar under it, when the cell is narrower, is fine).
    lines = cell.evaluate(
        "el => { const r = document.createRange(); r.selectNodeContents(el); return r.getClientRects().length; }"
    )
    assert box is not None and lines == 1 and box["x"] + box["width"] <= 1280
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 1280
    page.screenshot(path=str(screenshot_dir / "bulk-confirmation.png"), full_page=True)
    page.click("#df-confirm")
    page.wait_for_selector("ul.messagelist")
    assert "approve selected: 3 done, 0 skipped or refused." in messages(page)

    # One row that acts: singular, and a decline says decline.
    in_thread(review_begin, case=never)
    page.goto(f"{live_server.url}/admin/cases/case/")
    page.locator("#result_list tr", has_text="T-9103").locator("input.action-select").check()
    page.locator("#result_list tr", has_text="T-1077").locator("input.action-select").check()
    page.select_option("select[name=action]", "decline_selected")
    page.click("button[name=index]")
    expect(page.locator("#df-confirm")).to_have_text("Decline 1 proposal")


def test_commit_attempts_and_the_effect_page_fit_1280_px(demo, login, live_server, screenshot_dir):
    from django.contrib.auth import get_user_model

    reviewer = get_user_model().objects.get(username="reviewer")
    editor = get_user_model().objects.get(username="reviewer2")  # four eyes: not the approver
    old = demo.current_proposal.operation_id
    long_line = "The reference for this case is " + "0123456789" * 30 + "."
    edited = in_thread(
        review_edit,
        case=demo,
        expected_operation_id=old,
        body=demo.current_proposal.body + "\n" + long_line,
        editor=editor,
    )
    new = edited.revision.proposal.operation_id
    from core.errors import StaleProposal

    with pytest.raises(StaleProposal):
        in_thread(decision_record, case=demo, operation_id=old, approved=True, reviewer=reviewer, channel="admin")
    in_thread(decision_record, case=demo, operation_id=new, approved=True, reviewer=reviewer, channel="api")

    context, page = login(*REVIEWER)
    page.goto(f"{live_server.url}/admin/effects/commitattempt/")
    stale = page.locator("#result_list tbody tr", has_text="Stale")
    expect(stale.locator("td.field-asked")).to_have_text("approve")
    expect(stale.locator("td.field-outcome_badge .df-outcome-bad")).to_have_text("Stale")
    expect(stale.locator("td.field-attempted")).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))
    detail = stale.locator("td.field-detail_text")
    expect(detail).to_contain_text("is not the current proposal of case T-1042")
    box, results = detail.bounding_box(), page.locator("#changelist .results").bounding_box()
    # Inside the visible part of the list: neither clipped by it nor scrolled out of it.
    assert box is not None and results is not None and box["x"] + box["width"] <= results["x"] + results["width"], (
        box,
        results,
    )
    assert page.evaluate(
        "(el) => el.scrollWidth <= el.clientWidth", page.locator("#changelist .results").element_handle()
    )
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 1280
    page.screenshot(path=str(screenshot_dir / "commit-attempts.png"), full_page=False)

    effect = EffectRecord.objects.get(operation_id=new)
    page.goto(f"{live_server.url}/admin/effects/effectrecord/{effect.pk}/change/")
    body = page.locator(".field-body_pre pre")
    expect(body).to_contain_text(long_line[:40])
    fits = page.evaluate(
        "(el) => el.scrollWidth <= el.clientWidth && el.getBoundingClientRect().right <= 1280",
        body.element_handle(),
    )
    assert fits
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 1280
    page.screenshot(path=str(screenshot_dir / "effect-record.png"), full_page=True)
