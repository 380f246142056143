"""review_begin / review_resume / review_edit in-process (what the admin and the API call),
and the JSON-only checkpoint store."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connections

from decisionflow.core.errors import (
    InvalidInput,
    NotFound,
    OutcomeUncertain,
    PermissionRefused,
    StaleProposal,
    WorkflowIncompatible,
)
from decisionflow.workflow import checkpoints as store
from decisionflow.workflow.engine import WORKFLOW_VERSION, HumanReview
from decisionflow.workflow.services import review_begin, review_edit, review_resume
from effects.models import CommitAttempt, EffectRecord
from reviews.models import PendingReview, Proposal, ReviewDecision, WorkflowCheckpoint


@pytest.fixture
def begun(case):
    return review_begin(case=case)


def counts():
    return (
        Proposal.objects.count(),
        ReviewDecision.objects.count(),
        EffectRecord.objects.count(),
        PendingReview.objects.count(),
    )


def test_begin_pauses_with_a_durable_checkpoint_and_records_the_pending_review(case, begun):
    assert (begun.status, begun.checkpoints, begun.created) == ("PendingRequests", 3, True)
    assert begun.operation_id == case.current_proposal.operation_id
    pending = begun.pending_review
    assert (pending.operation_id, pending.workflow_version, pending.status) == (
        begun.operation_id,
        WORKFLOW_VERSION,
        "pending",
    )
    assert pending.workflow_session_id.startswith("ws-")
    loaded = store.DatabaseCheckpointStorage().load_sync(pending.checkpoint_id)
    request = loaded.pending_request_info_events[f"review:{begun.operation_id}"]
    assert request.data["operation_id"] == begun.operation_id and request.data["case_id"] == "T-1042"
    row = WorkflowCheckpoint.objects.get(checkpoint_id=pending.checkpoint_id)
    assert row.graph_signature_hash == loaded.graph_signature_hash and len(row.graph_signature_hash) == 64
    assert "__pickled__" not in row.payload and json.loads(row.payload)["format"] == store.FORMAT


def test_begin_twice_finds_the_pending_review_and_writes_nothing(case, begun):
    before = (counts(), WorkflowCheckpoint.objects.count())
    again = review_begin(case=case)
    assert (again.created, again.operation_id, again.pending_review.pk, again.checkpoints) == (
        False,
        begun.operation_id,
        begun.pending_review.pk,
        3,
    )
    assert (counts(), WorkflowCheckpoint.objects.count()) == before


def test_resume_commits_once_then_replays_and_reports_a_conflict(case, begun, reviewer, caplog):
    first = review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer)
    assert first.request_reemitted and first.result.receipt() == {
        "Status": "Committed",
        "Replay": False,
        "EffectCount": 1,
    }
    assert first.result.decision.reviewer == reviewer
    second = review_resume(
        case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer, channel="admin"
    )
    assert second.result.receipt() == {"Status": "Committed", "Replay": True, "EffectCount": 1}
    conflict = review_resume(case=case, operation_id=begun.operation_id, approved=False, reviewer=reviewer)
    assert conflict.result.status == "ConflictingDecision"
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (1, 1)
    assert PendingReview.objects.get().status == "completed"
    assert list(CommitAttempt.objects.order_by("id").values_list("outcome", "channel")) == [
        ("committed", "command"),
        ("replay", "admin"),
        ("conflict", "command"),
    ]
    # Every checkpoint of every resume was stored (restore, response entry, two supersteps):
    # a save that failed would only have been logged by the engine.
    assert WorkflowCheckpoint.objects.count() == 3 + 3 * 4
    assert "Failed to create checkpoint" not in caplog.text


def test_a_decline_is_a_result_not_an_error(case, begun, reviewer):
    result = review_resume(case=case, operation_id=begun.operation_id, approved=False, reviewer=reviewer).result
    assert result.receipt() == {"Status": "Declined", "Replay": False, "EffectCount": 0}
    assert EffectRecord.objects.count() == 0


@pytest.mark.parametrize("approved", [None, 1, "true", [True]])
def test_a_non_boolean_decision_is_refused_by_the_review_core(case, begun, reviewer, approved):
    with pytest.raises(InvalidInput, match="not consent"):
        review_resume(case=case, operation_id=begun.operation_id, approved=approved, reviewer=reviewer)
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)
    attempt = CommitAttempt.objects.get()
    assert (attempt.outcome, attempt.approved, attempt.operation_id) == ("refused", None, begun.operation_id)


def test_a_reviewer_without_permission_is_refused_by_the_review_core(case, begun, lead):
    with pytest.raises(PermissionRefused):
        review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=lead)
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)
    assert CommitAttempt.objects.get().outcome == "refused"


def test_resume_without_a_pending_review_is_not_found(case, reviewer):
    from reviews.services import proposal_create

    op = proposal_create(case=case).operation_id
    with pytest.raises(NotFound):
        review_resume(case=case, operation_id=op, approved=True, reviewer=reviewer)
    with pytest.raises(NotFound):
        review_resume(case=case, operation_id="op-v1-" + "0" * 64, approved=True, reviewer=reviewer)
    assert ReviewDecision.objects.count() == 0


def test_the_fault_is_refused_unless_fault_injection_is_on(case, begun, reviewer, settings):
    settings.DECISIONFLOW_FAULT_INJECTION = False
    with pytest.raises(InvalidInput, match="DECISIONFLOW_FAULT_INJECTION"):
        review_resume(
            case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer, fault="lose-receipt"
        )
    settings.DECISIONFLOW_FAULT_INJECTION = True
    with pytest.raises(InvalidInput, match="unknown fault"):
        review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer, fault="crash")
    assert (ReviewDecision.objects.count(), CommitAttempt.objects.count()) == (0, 0)

    with pytest.raises(OutcomeUncertain, match="^executor failed: LostReceipt$") as lost:
        review_resume(
            case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer, fault="lose-receipt"
        )
    assert lost.value.exit_code == 42 and lost.value.details["request_reemitted"] is True
    assert EffectRecord.objects.count() == 1  # committed; only the receipt is missing
    replay = review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer)
    assert replay.result.receipt() == {"Status": "Committed", "Replay": True, "EffectCount": 1}


def test_an_answered_run_that_ends_in_silence_is_not_success(case, begun, reviewer, monkeypatch):
    from agent_framework import response_handler

    # Explicit types: this module's annotations are strings (from __future__ import annotations).
    @response_handler(request=dict, response=dict, output=dict)
    async def drops_the_answer(self, original_request, response, ctx) -> None:
        return None  # sends nothing: the run ends IDLE, no output, no failure

    monkeypatch.setattr(HumanReview, "answer", drops_the_answer)
    with pytest.raises(OutcomeUncertain, match="no failure; silence is not success"):
        review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer)
    assert ReviewDecision.objects.count() == 0


def test_edit_supersedes_the_pending_review_and_begins_the_new_proposal(case, begun, reviewer):
    revision, new = review_edit(
        case=case,
        expected_operation_id=begun.operation_id,
        body=begun.pending_review.proposal.body + " Thank you.",
        editor=reviewer,
    )
    assert revision.changed and new.created and new.operation_id == revision.proposal.operation_id
    assert dict(PendingReview.objects.values_list("operation_id", "status")) == {
        begun.operation_id: "superseded",
        new.operation_id: "pending",
    }
    with pytest.raises(StaleProposal):
        review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer)
    assert CommitAttempt.objects.get().outcome == "stale"

    before = counts()
    with pytest.raises(StaleProposal):
        review_edit(case=case, expected_operation_id=begun.operation_id, body="Other.", editor=reviewer)
    unchanged, nothing = review_edit(
        case=case,
        expected_operation_id=new.operation_id,
        body=revision.proposal.body.replace("\n", "\r\n"),
        editor=reviewer,
    )
    assert (unchanged.changed, nothing) == (False, None)
    assert counts() == before


def test_edit_needs_the_review_permission(case, begun, lead):
    before = counts()
    with pytest.raises(PermissionRefused):
        review_edit(case=case, expected_operation_id=begun.operation_id, body="Edited.", editor=lead)
    assert counts() == before


def test_a_pending_review_from_another_version_is_refused_and_begin_moves_it(case, begun, reviewer):
    PendingReview.objects.update(workflow_version="review-v0")
    with pytest.raises(WorkflowIncompatible, match="review-v0"):
        review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer)
    moved = review_begin(case=case)
    assert moved.pending_review.pk == begun.pending_review.pk
    assert moved.pending_review.workflow_version == WORKFLOW_VERSION
    assert moved.pending_review.checkpoint_id != begun.pending_review.checkpoint_id
    assert (
        review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer).result.status
        == "Committed"
    )


# --- the checkpoint store ----------------------------------------------------------------


def _pause_row(begun):
    return WorkflowCheckpoint.objects.get(checkpoint_id=begun.pending_review.checkpoint_id)


def _store(row, payload):
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(payload=payload, digest=store.payload_digest(payload))


def test_a_checkpoint_that_fails_its_digest_is_refused(case, begun, reviewer):
    row = _pause_row(begun)
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(payload=row.payload.replace("T-1042", "T-1043"))
    with pytest.raises(WorkflowIncompatible, match="corrupt or was modified"):
        review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer)
    assert (ReviewDecision.objects.count(), CommitAttempt.objects.count()) == (0, 0)


def test_a_pickle_marker_is_refused_and_never_unpickled(case, begun, reviewer):
    row = _pause_row(begun)
    document = json.loads(row.payload)
    document["state"]["evil"] = {"__pickled__": "gASVAAAAAAAAAAB9lC4=", "__type__": "builtins:dict"}
    _store(row, json.dumps(document))
    with pytest.raises(WorkflowIncompatible, match="pickle marker"):
        review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer)
    assert ReviewDecision.objects.count() == 0


def test_a_request_for_another_operation_is_refused_as_stale(case, begun, reviewer):
    """A checkpoint rewritten with a matching digest still cannot change what is approved."""
    other = "op-v1-" + "a" * 64
    row = _pause_row(begun)
    _store(row, row.payload.replace(begun.operation_id, other))
    with pytest.raises(StaleProposal, match="re-emitted"):
        review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer)
    assert (ReviewDecision.objects.count(), CommitAttempt.objects.count()) == (0, 0)


def test_a_missing_pause_checkpoint_is_refused_and_begin_pauses_again(case, begun, reviewer):
    WorkflowCheckpoint.objects.filter(checkpoint_id=begun.pending_review.checkpoint_id).delete()
    with pytest.raises(WorkflowIncompatible, match="does not exist"):
        review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer)
    again = review_begin(case=case)
    assert (again.pending_review.pk, again.created) == (begun.pending_review.pk, True)
    assert again.pending_review.checkpoint_id != begun.pending_review.checkpoint_id
    assert (
        review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer).result.status
        == "Committed"
    )


def test_the_store_saves_plain_json_only(begun):
    checkpoint = store.DatabaseCheckpointStorage().load_sync(begun.pending_review.checkpoint_id)
    payload = store.encode_checkpoint(checkpoint)
    assert payload == _pause_row(begun).payload  # load and save round-trip exactly
    again = store.decode_checkpoint(
        checkpoint_id=checkpoint.checkpoint_id, payload=payload, digest=store.payload_digest(payload)
    )
    assert store.encode_checkpoint(again) == payload
    for bad in [("a", "tuple"), {1: "int key"}, object(), {"__pickled__": "x"}]:
        checkpoint.state["bad"] = bad
        with pytest.raises(TypeError):
            store.encode_checkpoint(checkpoint)


# --- locks -------------------------------------------------------------------------------


def test_the_case_lock_excludes_another_thread(transactional_db):
    from decisionflow.core.errors import CaseBusy
    from decisionflow.core.locks import case_lock

    held, release, outcome = threading.Event(), threading.Event(), {}

    def holder():
        try:
            with case_lock("T-LOCK"):
                held.set()
                release.wait(10)
        finally:
            connections.close_all()

    def contender():
        try:
            with case_lock("T-LOCK", timeout=0.2):
                outcome["got"] = True
        except CaseBusy as exc:
            outcome["busy"] = exc.message
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)
    other = threading.Thread(target=contender)
    other.start()
    other.join(10)
    release.set()
    thread.join(10)
    assert outcome == {"busy": "another action on case T-LOCK is in progress; try again"}
    with case_lock("T-LOCK", timeout=0):  # released, so free again
        pass


def test_an_edit_back_to_an_earlier_text_revives_its_pending_review(case, begun, reviewer):
    body = begun.pending_review.proposal.body
    _, edited = review_edit(case=case, expected_operation_id=begun.operation_id, body=body + " More.", editor=reviewer)
    revision, back = review_edit(case=case, expected_operation_id=edited.operation_id, body=body, editor=reviewer)
    assert revision.changed and back.operation_id == begun.operation_id and back.created is False
    assert dict(PendingReview.objects.values_list("operation_id", "status")) == {
        begun.operation_id: "pending",
        edited.operation_id: "superseded",
    }
    assert (
        review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer).result.status
        == "Committed"
    )
    assert PendingReview.objects.get(operation_id=begun.operation_id).status == "completed"


def test_a_request_from_another_workflow_version_is_refused(case, begun, reviewer):
    row = _pause_row(begun)
    _store(row, row.payload.replace(f'"workflow_version":"{WORKFLOW_VERSION}"', '"workflow_version":"review-v0"'))
    with pytest.raises(WorkflowIncompatible, match="review-v0"):
        review_resume(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer)
    assert CommitAttempt.objects.count() == 0
