"""Decided means decided, on every channel: the review page offers no decision buttons,
`begin` prints the real status and creates nothing, and the API's case view says the same."""

from __future__ import annotations

import io
import re
import threading

import pytest
from django.core.management import call_command
from django.db import connections
from django.urls import reverse

from api.services import token_create
from effects.models import EffectRecord
from tests.admin.conftest import counts, messages_of
from workflow.begin import review_begin
from workflow.decide import decision_record

pytestmark = pytest.mark.django_db(transaction=False)

WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


@pytest.fixture(params=[True, False], ids=["approved", "declined"])
def decided(request, case, begun, reviewer):
    decision_record(
        case=case, operation_id=begun.operation_id, approved=request.param, reviewer=reviewer, channel="test"
    )
    case.refresh_from_db()
    return request.param, begun.operation_id


def review_page(client, case):
    return client.get(reverse("admin:reviews_proposal_review", args=[case.current_proposal_id])).content.decode()


def test_the_review_page_of_a_decided_proposal_has_no_decision_buttons(reviewer_client, case, decided):
    approved, op = decided
    page = review_page(reviewer_client, case)
    for button in ('id="df-approve"', 'id="df-decline"', 'id="df-edit"', 'name="decision"', 'id="df-decide-form"'):
        assert button not in page
    verb = "Approved" if approved else "Declined"
    decided_block = re.search(r'<p id="df-decided">(.*?)</p>', page, re.S)
    assert decided_block, page
    text = re.sub(r"<[^>]+>", "", decided_block.group(1))
    assert re.search(rf"{verb}\s+by\s+reviewer\s+at\s+{WHEN}", text), text
    assert 'id="df-decided-history"' in decided_block.group(1)
    # The effect is linked when there is one (an approval), and only then.
    effect = EffectRecord.objects.filter(operation_id=op).first()
    assert (effect is not None) == approved
    if effect is not None:
        assert reverse("admin:effects_effectrecord_change", args=[effect.pk]) in decided_block.group(1)


def test_an_undecided_proposal_still_offers_the_buttons(reviewer_client, case, begun):
    page = review_page(reviewer_client, case)
    assert 'id="df-approve"' in page and 'id="df-decline"' in page and 'id="df-decided"' not in page


def test_begin_on_a_decided_case_prints_its_status_and_creates_nothing(case, decided):
    approved, op = decided
    before = counts()
    for _ in range(2):  # twice: still nothing
        out = io.StringIO()
        call_command("begin", "T-1042", stdout=out)
        lines = out.getvalue().splitlines()
        status = "Committed" if approved else "Declined"
        assert lines[0] == f"begin: status={status} op={op} checkpoints=0"
        verb = "approved" if approved else "declined"
        assert re.fullmatch(
            rf"begin: already {verb} by reviewer at {WHEN}; decided means decided, nothing new was created", lines[1]
        ), lines
        assert "pending" not in out.getvalue()
        assert counts() == before


def test_begin_on_a_decided_case_from_another_workflow_version_still_creates_nothing(case, decided):
    from reviews.models import PendingReview, WorkflowCheckpoint

    PendingReview.objects.update(workflow_version="review-v0")
    before, checkpoints = counts(), WorkflowCheckpoint.objects.count()
    result = review_begin(case=case)
    assert (result.created, result.checkpoints, result.decision is not None) == (False, 0, True)
    assert counts() == before and WorkflowCheckpoint.objects.count() == checkpoints
    assert PendingReview.objects.get().workflow_version == "review-v0"


def test_concurrent_begins_on_a_decided_case_create_nothing(transactional_db, case, reviewer):
    begun = review_begin(case=case)
    decision_record(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer, channel="test")
    before = counts()
    results, errors = [], []

    def run():
        try:
            from cases.models import Case

            results.append(review_begin(case=Case.objects.get(pk=case.pk)))
        except Exception as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [(r.status, r.created, r.checkpoints) for r in results] == [("Committed", False, 0)] * 2
    assert counts() == before


def test_the_admin_begin_button_on_a_decided_case_creates_nothing(reviewer_client, case, decided):
    before = counts()
    response = reviewer_client.post(reverse("admin:cases_case_begin", args=[case.pk]), follow=True)
    said = " ".join(messages_of(response))
    assert re.search(rf"T-1042 is already (approved|declined) by reviewer at {WHEN}", said), said
    assert "nothing new was created" in said and "Review begun" not in said
    assert counts() == before


def test_the_api_case_view_says_decided(client, case, reviewer, decided):
    approved, op = decided
    token = token_create(user=reviewer, name="t")[1]
    body = client.get("/api/cases/T-1042", headers={"Authorization": f"Bearer {token}"}).json()
    assert body["status"] == ("Committed" if approved else "Declined")
    assert body["decidable"] is False
    assert body["decision"]["approved"] is approved and body["decision"]["reviewer"] == "reviewer"
    assert body["decision"]["decided_at"] == body["reconcile"]["decision"]["decided_at"]
    assert body["operation_id"] == op


def test_the_api_case_view_before_and_while_pending(client, case, reviewer):
    token = token_create(user=reviewer, name="t")[1]
    headers = {"Authorization": f"Bearer {token}"}
    fresh = client.get("/api/cases/T-1042", headers=headers).json()
    assert (fresh["status"], fresh["decidable"], fresh["decision"]) == ("NotStarted", True, None)
    review_begin(case=case)
    pending = client.get("/api/cases/T-1042", headers=headers).json()
    assert (pending["status"], pending["decidable"], pending["decision"]) == ("Pending", True, None)
