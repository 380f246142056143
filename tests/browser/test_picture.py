"""The picture of where a case stands, on the review and history pages.

One case goes paused -> superseded (an edit) -> committed; another is declined. Each state is
read from the page as a reviewer sees it: the marked node of the SVG, the walked edges, the
words beside it, and the path of proposals.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from core.identity import short
from engine.names import WORKFLOW_VERSION
from reviews.models import PendingReview
from tests.browser.conftest import LEAD, REVIEWER, in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def here(page) -> list[str]:
    """The ids of the marked nodes in the picture (exactly one expected)."""
    return page.eval_on_selector_all("#df-workflow svg g.node.df-here", "els => els.map(e => e.id)")


def walked(page) -> list[str]:
    return page.eval_on_selector_all("#df-workflow svg g.edge.df-walked", "els => els.map(e => e.id)")


def review_page(page, live_server, proposal_pk):
    page.goto(f"{live_server.url}/admin/reviews/proposal/{proposal_pk}/review/")
    page.wait_for_selector("#df-where")


def history_page(page, live_server, case_pk):
    page.goto(f"{live_server.url}/admin/cases/case/{case_pk}/history/")
    page.wait_for_selector("#df-where")


def test_paused_superseded_committed_and_declined(demo, login, live_server, screenshot_dir):
    from django.contrib.auth import get_user_model

    from cases.models import Case
    from workflow.begin import review_begin
    from workflow.decide import decision_record
    from workflow.edit import review_edit

    reviewer = get_user_model().objects.get(username="reviewer")
    # Four eyes: the person who edits is not the one who approves.
    editor = get_user_model().objects.get(username="reviewer2")
    first = demo.current_proposal
    pending = PendingReview.objects.get(operation_id=first.operation_id)
    context, page = login(*REVIEWER)

    # Paused: at the human step, with the pause checkpoint and since when.
    review_page(page, live_server, first.pk)
    assert here(page) == ["df-node-human-review-v1"]
    assert walked(page) == ["df-edge-prepare--human-review-v1"]
    expect(page.locator("#df-where")).to_have_attribute("data-standing", "waiting")
    expect(page.locator("#df-standing")).to_have_text("Waiting for a reviewer")
    # The step is named by its role, and the legend tells its version from the workflow's.
    shown = page.eval_on_selector_all("#df-workflow svg text", "els => els.map(e => e.textContent)")
    assert "human review (step v1)" in shown and not any("human-review-v1" in text for text in shown), shown
    expect(page.locator("#df-workflow-legend")).to_contain_text(f"Workflow {WORKFLOW_VERSION}.")
    expect(page.locator("#df-checkpoint")).to_have_text(pending.checkpoint_id)
    expect(page.locator("#df-where-text")).to_contain_text("Since ")
    assert page.locator("#df-path").count() == 0  # one proposal: no path to show yet
    # Readable at 1280 px: the picture fits the page's width, nothing scrolls sideways.
    box = page.locator("#df-workflow svg").bounding_box()
    assert box is not None and 600 < box["width"] <= 1280 - 40
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    page.locator("#df-where").screenshot(path=str(screenshot_dir / "where-paused.png"))

    # Superseded: an edit makes a newer proposal; the old one's page says so, the new one waits.
    edited = in_thread(
        review_edit,
        case=demo,
        expected_operation_id=first.operation_id,
        body=first.body.replace("Kind regards,", "We will call you on Monday.\n\nKind regards,"),
        editor=editor,
    )
    second = edited.revision.proposal
    review_page(page, live_server, first.pk)
    assert here(page) == ["df-node-superseded"]
    assert set(walked(page)) == {"df-edge-prepare--human-review-v1", "df-edge-human-review-v1--superseded"}
    expect(page.locator("#df-standing")).to_have_text("Superseded by a newer proposal")
    expect(page.locator("#df-where-text")).to_contain_text(short(second.operation_id))
    path = page.locator("#df-path > li")
    expect(path).to_have_count(2)
    expect(path.nth(0)).to_contain_text("Superseded")
    expect(path.nth(1)).to_contain_text("Human edit")
    expect(path.nth(1)).to_contain_text("Waiting for a reviewer")
    review_page(page, live_server, second.pk)
    assert here(page) == ["df-node-human-review-v1"]

    # Committed: the new proposal approved; the history page shows the case's current position.
    in_thread(
        decision_record, case=demo, operation_id=second.operation_id, approved=True, reviewer=reviewer, channel="admin"
    )
    for show in (lambda: review_page(page, live_server, second.pk), lambda: history_page(page, live_server, demo.pk)):
        show()
        assert here(page) == ["df-node-committed"]
        assert set(walked(page)) == {
            "df-edge-prepare--human-review-v1",
            "df-edge-human-review-v1--commit",
            "df-edge-commit--committed",
        }
        expect(page.locator("#df-standing")).to_have_text("Committed")
        expect(page.locator("#df-where-text")).to_contain_text("approved by reviewer")
        expect(page.locator("#df-path > li")).to_have_count(2)
    page.set_viewport_size({"width": 1280, "height": 760})
    page.locator("#df-where").screenshot(path=str(screenshot_dir / "where-committed.png"))

    # Declined: another case, begun and declined; a support lead reads its history.
    other = Case.objects.get(case_id="T-1077")
    begun = in_thread(review_begin, case=other)
    in_thread(
        decision_record, case=other, operation_id=begun.operation_id, approved=False, reviewer=reviewer, channel="admin"
    )
    _lead_context, lead = login(*LEAD)
    history_page(lead, live_server, other.pk)
    assert here(lead) == ["df-node-declined"]
    assert "df-edge-commit--declined" in walked(lead)
    expect(lead.locator("#df-standing")).to_have_text("Declined")
    expect(lead.locator("#df-where-text")).to_contain_text("by reviewer")


def test_not_begun_case_marks_nothing(demo, login, live_server):
    from cases.services import case_import
    from tests.conftest import load_fixture

    # load_demo begins every demo case: a copy imported under another ID is never begun.
    case = case_import(data={**load_fixture("t1150.json"), "case_id": "T-9150"}).case
    _context, page = login(*LEAD)
    history_page(page, live_server, case.pk)
    assert here(page) == [] and walked(page) == []
    expect(page.locator("#df-where-text")).to_contain_text("has not been begun")
