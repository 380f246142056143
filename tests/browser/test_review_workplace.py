"""The review workplace in a real browser: approve and replay, a stale tab after an edit,
an evidence-only change, a support lead who may only read, and HTML escaping.

Each test drives Chromium against the live server, as a reviewer or a support lead would.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from core.identity import short
from effects.models import EffectRecord
from reviews.models import Origin, Proposal, ReviewDecision
from tests.browser.conftest import LEAD, REVIEWER, in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def open_case(page, live_server, case_id):
    """From the cases list, follow the case's link to its review page."""
    page.goto(f"{live_server.url}/admin/cases/case/")
    page.get_by_role("link", name=case_id, exact=True).click()
    page.wait_for_selector("#df-review")


def messages(page) -> str:
    return page.locator("ul.messagelist").inner_text()


def test_approve_shows_receipt_then_replay_and_one_effect(demo, login, live_server, screenshot_dir):
    context, page = login(*REVIEWER)
    open_case(page, live_server, "T-1042")
    op = demo.current_proposal.operation_id
    expect(page.locator("#df-full-op")).to_have_text(op)
    # The body is shown exactly as hashed, line breaks included.
    assert page.locator("#df-body").inner_text() == demo.current_proposal.body
    page.screenshot(path=str(screenshot_dir / "review-page.png"), full_page=True)
    # A second tab opened before the decision still shows the buttons it was served with.
    old_tab = context.new_page()
    open_case(old_tab, live_server, "T-1042")

    page.click("#df-approve")
    page.wait_for_selector("ul.messagelist")
    text = messages(page)
    assert text.startswith("Approved: the support review record was written; ")
    # The receipt is one click away, not in the sentence.
    receipt = page.locator("ul.messagelist details.df-receipt")
    assert '"Status"' not in text and not receipt.locator("code").last.is_visible()
    receipt.locator("summary").click()
    expect(receipt).to_contain_text('receipt={"Status":"Committed","Replay":false,"EffectCount":1}')
    page.locator("ul.messagelist").screenshot(path=str(screenshot_dir / "approved-message.png"))
    expect(page.locator("#df-decision")).to_contain_text("Approved by reviewer")
    # The sentence links to the effect record.
    page.locator("ul.messagelist a", has_text="support review record").click()
    expect(page.locator("body")).to_contain_text(short(op))

    # Decided means decided: the review page now offers no decision buttons, only the
    # decision, who made it and when, with links to the effect and the history.
    page.go_back()
    page.reload()
    expect(page.locator("#df-approve")).to_have_count(0)
    expect(page.locator("#df-decline")).to_have_count(0)
    expect(page.locator("#df-edit")).to_have_count(0)
    expect(page.locator("#df-decided")).to_contain_text("Approved by reviewer at")
    expect(page.locator("#df-decided-effect")).to_have_attribute(
        "href", re.compile(r"/admin/effects/effectrecord/\d+/")
    )
    expect(page.locator("#df-decided-history")).to_have_attribute("href", re.compile(r"/history/$"))
    page.locator("#df-actions").screenshot(path=str(screenshot_dir / "decided.png"))

    # The older tab's Approve is a replay: nothing new is written.
    old_tab.click("#df-approve")
    old_tab.wait_for_selector("ul.messagelist")
    decision = ReviewDecision.objects.get(operation_id=op)
    assert re.search(
        r"Already approved: nothing new was written \(approved by reviewer at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)",
        messages(old_tab),
    )
    expect(old_tab.locator("#df-approve")).to_have_count(0)
    assert decision.reviewer.username == "reviewer"
    assert EffectRecord.objects.filter(operation_id=op).count() == 1

    # The cases list shows T-1042 committed, by whom; T-1077 waits (load_demo began every demo case).
    page.goto(f"{live_server.url}/admin/cases/case/")
    expect(page.locator("#result_list tr", has_text="T-1077")).to_contain_text("Pending review")
    row = page.locator("#result_list tr", has_text="T-1042")
    expect(row).to_contain_text("Committed")
    expect(row).to_contain_text("reviewer")
    page.screenshot(path=str(screenshot_dir / "cases.png"), full_page=False)


def test_stale_tab_after_an_edit_in_another_tab(demo, login, live_server, screenshot_dir):
    context, tab_a = login(*REVIEWER)
    open_case(tab_a, live_server, "T-1042")
    old_op = demo.current_proposal.operation_id

    tab_b = context.new_page()
    tab_b.goto(tab_a.url)
    tab_b.click("#df-edit")
    body = tab_b.locator("#id_body")
    body.fill(
        body.input_value().replace(
            "Kind regards,", "If you need the units stable sooner, reply and we will call you.\n\nKind regards,"
        )
    )
    tab_b.click("#df-save")
    tab_b.wait_for_selector("#df-review")
    assert "Saved as a new proposal" in messages(tab_b)
    new = Proposal.objects.get(case=demo, origin=Origin.HUMAN_EDIT)
    expect(tab_b.locator("#df-full-op")).to_have_text(new.operation_id)
    expect(tab_b.locator("mark.df-unchecked").first).to_contain_text("reply and we will call you")
    # Four eyes: the editor sees why they cannot approve their own edit, not an Approve
    # button that could only fail; Decline stays.
    expect(tab_b.locator("#df-four-eyes")).to_contain_text("another reviewer must approve it")
    assert tab_b.locator("#df-approve").count() == 0
    expect(tab_b.locator("#df-decline")).to_be_visible()
    tab_b.screenshot(path=str(screenshot_dir / "edited-proposal.png"), full_page=True)

    # Tab A still shows the old proposal and its identity; Approve is refused as stale.
    tab_a.click("#df-approve")
    tab_a.wait_for_selector("ul.messagelist")
    text = messages(tab_a)
    assert "stale:" in text and short(new.operation_id) in text
    tab_a.screenshot(path=str(screenshot_dir / "stale-refusal.png"), full_page=False)
    assert ReviewDecision.objects.count() == 0 and EffectRecord.objects.count() == 0
    # The refusal links to the current proposal.
    tab_a.locator("ul.messagelist a.df-current-link").click()
    expect(tab_a.locator("#df-full-op")).to_have_text(new.operation_id)
    assert old_op != new.operation_id


def test_evidence_only_change_with_identical_text_refuses_the_old_tab(demo, login, live_server):
    context, tab_a = login(*REVIEWER)
    open_case(tab_a, live_server, "T-1042")
    visible_before = tab_a.locator("#df-body").inner_text()

    tab_b = context.new_page()
    tab_b.goto(tab_a.url)
    tab_b.click("#df-edit")
    tab_b.select_option("select[name=source_0]", "4")  # HOLD-7: version 2 -> 4, same quotation
    tab_b.click("#df-save")
    tab_b.wait_for_selector("#df-moves")
    expect(tab_b.locator("#df-moves")).to_contain_text("HOLD-7")
    expect(tab_b.locator("#df-moves")).to_contain_text("identical")
    assert tab_b.locator("#df-body").inner_text() == visible_before  # the text did not change
    new = Proposal.objects.get(case=demo, origin=Origin.EVIDENCE_CHANGE)

    tab_a.click("#df-approve")
    tab_a.wait_for_selector("ul.messagelist")
    text = messages(tab_a)
    assert "stale:" in text and short(new.operation_id) in text
    assert ReviewDecision.objects.count() == 0 and EffectRecord.objects.count() == 0


def test_support_lead_reads_history_sees_no_button_and_a_forged_post_gets_403(demo, login, live_server, screenshot_dir):
    from django.contrib.auth import get_user_model

    from workflow.decide import decision_record
    from workflow.edit import review_edit

    reviewer = get_user_model().objects.get(username="reviewer")
    second = get_user_model().objects.get(username="reviewer2")  # four eyes: one edits, the other approves
    old = demo.current_proposal
    edited = in_thread(
        review_edit,
        case=demo,
        expected_operation_id=old.operation_id,
        body=old.body.replace("Kind regards,", "We will call you on Monday.\n\nKind regards,"),
        editor=second,
    )
    new = edited.revision.proposal
    from core.errors import StaleProposal

    with pytest.raises(StaleProposal):  # a stale tab's approval: refused, recorded in the history
        in_thread(
            decision_record, case=demo, operation_id=old.operation_id, approved=True, reviewer=reviewer, channel="admin"
        )
    for approved in (True, True):  # committed, then a replay
        in_thread(
            decision_record,
            case=demo,
            operation_id=new.operation_id,
            approved=approved,
            reviewer=reviewer,
            channel="admin",
        )

    context, page = login(*LEAD)
    page.goto(f"{live_server.url}/admin/cases/case/{demo.pk}/history/")
    timeline = page.locator("#df-timeline")
    expect(timeline).to_contain_text("Human edit")
    expect(timeline).to_contain_text("Replay")
    expect(timeline).to_contain_text("Stale")
    expect(page.locator("#df-reconcile")).to_contain_text("Committed")
    page.screenshot(path=str(screenshot_dir / "history.png"), full_page=True)

    page.goto(f"{live_server.url}/admin/reviews/proposal/{new.pk}/review/")
    # Decided: everyone, the lead included, reads the decision instead of any buttons.
    expect(page.locator("#df-decided")).to_contain_text("Approved by reviewer at")
    assert page.locator("#df-approve").count() == 0 and page.locator("#df-decline").count() == 0
    assert page.locator("#df-edit").count() == 0

    # A forged POST with a valid session and CSRF token: the lead gets 403, nothing is written.
    before = (ReviewDecision.objects.count(), EffectRecord.objects.count())
    status = page.evaluate(
        """async ([url, op]) => {
            const token = document.cookie.match(/csrftoken=([^;]+)/)[1];
            const response = await fetch(url, {
                method: "POST",
                headers: {"X-CSRFToken": token, "Content-Type": "application/x-www-form-urlencoded"},
                body: new URLSearchParams({operation_id: op, decision: "decline"}),
            });
            return response.status;
        }""",
        [f"/admin/reviews/proposal/{new.pk}/decide/", new.operation_id],
    )
    assert status == 403
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == before


def test_html_in_draft_and_quotation_is_shown_escaped(demo, login, live_server, screenshot_dir):
    from cases.models import Case
    from workflow.begin import review_begin

    case = Case.objects.get(case_id="T-1150")
    in_thread(review_begin, case=case)
    context, page = login(*REVIEWER)
    open_case(page, live_server, "T-1150")
    # Shown as text, never parsed as an element.
    expect(page.locator("#df-body")).to_contain_text("rich-text fields such as <notes>.")
    expect(page.locator("#df-findings")).to_contain_text("CSV exports omit rich-text fields such as <notes>.")
    expect(page.locator("h1, .breadcrumbs, #df-review").first).to_be_visible()
    assert page.locator("notes").count() == 0
    page.screenshot(path=str(screenshot_dir / "escaped-html.png"), full_page=True)
