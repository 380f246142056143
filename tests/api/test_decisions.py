"""Approve and decline over HTTP: the same service (`decision_record`) as `manage.py resume` and the admin.

Once is tested twice here; concurrently in test_concurrency.py.
"""

from __future__ import annotations

import pytest

from tests.api.conftest import DEMO_OP, assert_error
from tests.conftest import snapshot

DECISION = "/api/cases/T-1042/decision"


def attempts(**filters):
    from effects.models import CommitAttempt

    return list(CommitAttempt.objects.filter(**filters).order_by("id").values_list("outcome", "channel"))


def test_approve_begins_a_never_begun_review_then_replays(api, case, reviewer):
    from effects.models import EffectRecord
    from reviews.models import PendingReview, WorkflowCheckpoint

    assert api.get("/api/cases/T-1042").json()["operation_id"] == DEMO_OP  # computed; nothing written yet
    assert snapshot()["proposals"] == 0

    first = api.post(DECISION, {"operation_id": DEMO_OP, "approved": True})
    assert first.status_code == 200, first.content
    assert first.json() == {
        "status": "Committed",
        "replay": False,
        "effect_count": 1,
        "operation_id": DEMO_OP,
        "outcome": "committed",
        "decline_reason": None,
        "approvals": None,
    }
    assert PendingReview.objects.get(operation_id=DEMO_OP).status == "completed"
    # Begin wrote exactly one checkpoint (the pause); the answered run wrote none.
    assert WorkflowCheckpoint.objects.count() == 1

    after_first = snapshot()
    second = api.post(DECISION, {"operation_id": DEMO_OP, "approved": True})
    assert second.status_code == 200
    assert second.json() == {
        "status": "Committed",
        "replay": True,
        "effect_count": 1,
        "operation_id": DEMO_OP,
        "outcome": "replay",
        "decline_reason": None,
        "approvals": None,
    }
    assert snapshot() == after_first
    assert WorkflowCheckpoint.objects.count() == 1
    assert EffectRecord.objects.filter(operation_id=DEMO_OP).count() == 1
    effect = EffectRecord.objects.get()
    assert effect.reviewer == reviewer  # the authenticated user, never a field in the body
    assert attempts() == [("committed", "api"), ("replay", "api")]

    looked_up = api.get(f"/api/operations/{DEMO_OP}").json()
    assert looked_up["state"] == "Committed"
    assert looked_up["effect_count"] == 1
    assert looked_up["decision"]["approved"] is True
    assert looked_up["decision"]["reviewer"] == "reviewer"
    assert looked_up["decision"]["decided_at"]

    shown = api.get("/api/cases/T-1042").json()
    assert shown["proposal"]["operation_id"] == DEMO_OP
    assert shown["pending"]["status"] == "completed"
    assert shown["reconcile"]["state"] == "Committed"


def test_decline_then_replay_then_conflict(api, proposal):
    declined = api.post(DECISION, {"operation_id": DEMO_OP, "approved": False})
    assert declined.status_code == 200, declined.content
    assert declined.json() == {
        "status": "Declined",
        "replay": False,
        "effect_count": 0,
        "operation_id": DEMO_OP,
        "outcome": "declined",
        "decline_reason": None,
        "approvals": None,
    }
    again = api.post(DECISION, {"operation_id": DEMO_OP, "approved": False})
    assert (again.json()["replay"], again.json()["outcome"], again.json()["status"]) == (True, "replay", "Declined")

    before = snapshot()
    body = assert_error(api.post(DECISION, {"operation_id": DEMO_OP, "approved": True}), 409, "conflicting_decision")
    assert "declined by reviewer" in body["message"]
    assert body["operation_id"] == DEMO_OP
    assert snapshot() == before
    assert api.get(f"/api/operations/{DEMO_OP}").json()["state"] == "Declined"
    assert attempts()[-1] == ("conflict", "api")


def test_a_decline_reason_is_stored_and_a_replay_with_another_keeps_the_first(api, proposal):
    from effects.models import CommitAttempt
    from reviews.models import ReviewDecision

    first = api.post(DECISION, {"operation_id": DEMO_OP, "approved": False, "reason": "tone", "note": "too curt"})
    assert first.status_code == 200, first.content
    assert (first.json()["outcome"], first.json()["decline_reason"]) == ("declined", "tone")
    second = api.post(DECISION, {"operation_id": DEMO_OP, "approved": False, "reason": "policy"})
    assert second.status_code == 200, second.content
    # A replay: the first reason stands, and the answer says which one that is.
    assert (second.json()["outcome"], second.json()["decline_reason"]) == ("replay", "tone")
    decision = ReviewDecision.objects.get(operation_id=DEMO_OP)
    assert (decision.decline_reason, decision.decline_note) == ("tone", "too curt")
    # Each attempt row keeps what its own call asked for.
    assert list(
        CommitAttempt.objects.filter(operation_id=DEMO_OP).order_by("id").values_list("outcome", "decline_reason")
    ) == [("declined", "tone"), ("replay", "policy")]
    looked_up = api.get(f"/api/operations/{DEMO_OP}").json()["decision"]
    assert (looked_up["decline_reason"], looked_up["decline_note"], looked_up["system_actor"]) == (
        "tone",
        "too curt",
        None,
    )


def test_a_note_with_hidden_characters_is_refused_and_no_decision_is_written(api, proposal):
    from reviews.models import ReviewDecision

    response = api.post(DECISION, {"operation_id": DEMO_OP, "approved": False, "reason": "tone", "note": "ok\u202e"})
    body = assert_error(response, 400, "invalid_request")
    assert body["message"].startswith("note: U+202E")
    assert not ReviewDecision.objects.exists()


def test_stale_decision_409_names_the_current_operation(api, proposal, reviewer, editor):
    from workflow.begin import review_begin
    from workflow.edit import review_edit

    review_begin(case=proposal.case, actor=reviewer)
    edited = review_edit(
        case=proposal.case, expected_operation_id=DEMO_OP, body=proposal.body + "\nOne more line.", editor=editor
    )
    new_op = edited.revision.proposal.operation_id
    before = snapshot()

    for approved in (True, False):
        body = assert_error(api.post(DECISION, {"operation_id": DEMO_OP, "approved": approved}), 409, "stale_proposal")
        assert body["current_operation_id"] == new_op
    assert snapshot() == before
    assert api.get(f"/api/operations/{DEMO_OP}").json() | {"decision": None} == {
        "operation_id": DEMO_OP,
        "case_id": "T-1042",
        "state": "Pending",
        "effect_count": 0,
        "approvals": None,
        "current": False,
        "decision": None,
        "delivery": None,
    }
    # The current operation is decided normally.
    assert api.post(DECISION, {"operation_id": new_op, "approved": True}).json()["status"] == "Committed"


def test_operation_of_another_case_is_not_found(api, proposal, make_user):
    """Naming a real operation under the wrong case is refused and writes nothing."""
    from cases.services import case_import
    from tests.conftest import load_fixture

    case_import(data=load_fixture("t1077.json"))
    before = snapshot()
    assert_error(api.post("/api/cases/T-1077/decision", {"operation_id": DEMO_OP, "approved": True}), 404, "not_found")
    assert snapshot() == before


def test_fault_header_is_ignored_without_fault_injection(api, proposal, settings):
    settings.DECISIONFLOW_FAULT_INJECTION = False
    response = api.post(
        DECISION, {"operation_id": DEMO_OP, "approved": True}, headers={"X-Decisionflow-Fault": "lose-receipt"}
    )
    assert response.status_code == 200
    assert response.json()["replay"] is False


def test_unknown_fault_is_refused_with_fault_injection(api, proposal, settings):
    settings.DECISIONFLOW_FAULT_INJECTION = True
    before = snapshot()
    assert_error(
        api.post(
            DECISION, {"operation_id": DEMO_OP, "approved": True}, headers={"X-Decisionflow-Fault": "crash-everything"}
        ),
        400,
        "invalid_request",
    )
    assert snapshot() == before


def test_lost_receipt_sequence_over_http(api, proposal, settings):
    """fault -> 500 outcome_uncertain; GET says Committed; the retry is a replay; one effect."""
    from effects.models import EffectRecord

    settings.DECISIONFLOW_FAULT_INJECTION = True
    lost = api.post(
        DECISION, {"operation_id": DEMO_OP, "approved": True}, headers={"X-Decisionflow-Fault": "lose-receipt"}
    )
    body = assert_error(lost, 500, "outcome_uncertain")
    assert body["operation_id"] == DEMO_OP
    assert body["message"].startswith(
        "outcome uncertain: the commit step failed after it may have written (LostReceipt)"
    )
    assert f"GET /api/operations/{DEMO_OP}" in body["message"]
    assert EffectRecord.objects.filter(operation_id=DEMO_OP).count() == 1  # the effect exists; the receipt was lost

    looked_up = api.get(f"/api/operations/{DEMO_OP}")
    assert looked_up.status_code == 200
    assert looked_up.json()["state"] == "Committed"
    assert looked_up.json()["effect_count"] == 1

    retry = api.post(DECISION, {"operation_id": DEMO_OP, "approved": True})
    assert retry.status_code == 200
    assert retry.json() == {
        "status": "Committed",
        "replay": True,
        "effect_count": 1,
        "operation_id": DEMO_OP,
        "outcome": "replay",
        "decline_reason": None,
        "approvals": None,
    }
    assert EffectRecord.objects.filter(operation_id=DEMO_OP).count() == 1
    assert attempts()[-1] == ("replay", "api")


@pytest.mark.django_db(transaction=True)
def test_lost_connection_after_the_commit_over_http(api, proposal, settings):
    """The connection drops right after COMMIT: 500 outcome_uncertain, and the truth is in the effect store.

    Transactional: the fault closes the connection, which a test transaction would not survive.
    """
    from django.db import connection

    from effects.models import EffectRecord

    settings.DECISIONFLOW_FAULT_INJECTION = True
    lost = api.post(
        DECISION, {"operation_id": DEMO_OP, "approved": True}, headers={"X-Decisionflow-Fault": "lose-connection"}
    )
    body = assert_error(lost, 500, "outcome_uncertain")
    assert body["message"].startswith(
        "outcome uncertain: the commit step failed after it may have written (OperationalError)"
    )
    connection.close()
    assert api.get(f"/api/operations/{DEMO_OP}").json()["state"] == "Committed"
    retry = api.post(DECISION, {"operation_id": DEMO_OP, "approved": True})
    assert (retry.status_code, retry.json()["outcome"]) == (200, "replay")
    assert EffectRecord.objects.filter(operation_id=DEMO_OP).count() == 1


def test_session_post_with_csrf_token_is_accepted(reviewer, proposal):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(reviewer)
    client.get("/admin/")  # sets the csrftoken cookie, as the admin page would
    token = client.cookies["csrftoken"].value
    response = client.post(
        DECISION,
        {"operation_id": DEMO_OP, "approved": True},
        content_type="application/json",
        headers={"X-CSRFToken": token},
    )
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "Committed"


@pytest.mark.parametrize("approved", [True, False])
def test_same_path_as_the_resume_command(api, proposal, reviewer, approved):
    """A decision made over HTTP and one made by `manage.py resume` are the same operation: either second is a replay."""
    import io
    import json

    from django.core.management import call_command

    def resume():
        out = io.StringIO()
        verb = "--approve" if approved else "--decline"
        call_command("resume", "T-1042", "--operation-id", DEMO_OP, verb, "--reviewer", "reviewer", stdout=out)
        return json.loads(out.getvalue().split("result=", 1)[1])

    first = api.post(DECISION, {"operation_id": DEMO_OP, "approved": approved})
    assert first.status_code == 200
    assert first.json()["outcome"] == ("committed" if approved else "declined")
    assert resume()["Replay"] is True
    again = api.post(DECISION, {"operation_id": DEMO_OP, "approved": approved})
    assert (again.json()["outcome"], again.json()["replay"]) == ("replay", True)
    assert [channel for _, channel in attempts()] == ["api", "command", "api"]
