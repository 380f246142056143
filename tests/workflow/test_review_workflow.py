"""review_begin / decision_record / review_edit in-process (what the admin and the API call),
the binding checks a pause must pass before anything runs, and the JSON-only checkpoint store."""

from __future__ import annotations

import hashlib
import json
import threading

import pytest
from django.db import DatabaseError, connections

from core.errors import (
    CaseBusy,
    ConflictingDecision,
    InvalidInput,
    NotFound,
    OutcomeUncertain,
    PermissionRefused,
    StaleProposal,
    WorkflowIncompatible,
)
from core.outcomes import DecisionOutcome as Outcome
from effects.models import CommitAttempt, EffectRecord
from engine import checkpoints as store
from engine.graph import HUMAN_REVIEW_ID, WORKFLOW_VERSION, Commit, HumanReview
from reviews.models import PendingReview, Proposal, ReviewDecision, WorkflowCheckpoint
from workflow.begin import review_begin
from workflow.decide import decision_record
from workflow.edit import review_edit
from workflow.selectors import decidable_operation_id


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


def decide(case, operation_id, reviewer, *, approved=True, channel="command", fault=None):
    return decision_record(
        case=case, operation_id=operation_id, approved=approved, reviewer=reviewer, channel=channel, fault=fault
    )


def refused_attempt(reason):
    """The one attempt row a refusal before the review core ran leaves behind: its reason,
    and the refusal's own words once, without its code in front."""
    attempt = CommitAttempt.objects.get()
    assert (attempt.outcome, attempt.reason) == ("refused", reason), (attempt.outcome, attempt.reason, attempt.detail)
    assert attempt.detail and not attempt.detail.startswith(("forbidden: ", "workflow_incompatible: ", "case_busy: "))
    return attempt


def test_begin_pauses_with_one_durable_checkpoint_and_records_the_pending_review(case, begun):
    assert (begun.status, begun.checkpoints, begun.created) == ("PendingRequests", 1, True)
    assert begun.operation_id == case.current_proposal.operation_id
    pending = begun.pending_review
    assert (pending.operation_id, pending.workflow_version, pending.status) == (
        begun.operation_id,
        WORKFLOW_VERSION,
        "pending",
    )
    assert pending.workflow_session_id.startswith("ws-")
    # Only the pause is written: the checkpoints before it stay in memory.
    assert list(WorkflowCheckpoint.objects.values_list("checkpoint_id", flat=True)) == [pending.checkpoint_id]
    loaded = store.DatabaseCheckpointStorage().load_sync(pending.checkpoint_id)
    assert set(loaded.pending_request_info_events) == {f"review:{begun.operation_id}"}
    request = loaded.pending_request_info_events[f"review:{begun.operation_id}"]
    assert request.data["operation_id"] == begun.operation_id and request.data["case_id"] == "T-1042"
    assert request.data["case_pk"] == case.pk and request.data["workflow_version"] == WORKFLOW_VERSION
    assert not any(loaded.messages.values())  # a pause: nothing in flight
    row = WorkflowCheckpoint.objects.get(checkpoint_id=pending.checkpoint_id)
    assert row.graph_signature_hash == loaded.graph_signature_hash and len(row.graph_signature_hash) == 64
    assert "__pickled__" not in row.payload and json.loads(row.payload)["format"] == store.FORMAT
    # The digest is an HMAC keyed from SECRET_KEY, not a bare hash anyone could recompute.
    assert row.digest == store.payload_digest(row.payload)
    assert row.digest != hashlib.sha256(row.payload.encode()).hexdigest()
    assert row.digest != store.payload_digest(row.payload, secret="another-secret")


def test_begin_twice_finds_the_pending_review_and_writes_nothing(case, begun):
    before = (counts(), WorkflowCheckpoint.objects.count())
    again = review_begin(case=case)
    assert (again.created, again.operation_id, again.pending_review.pk, again.checkpoints) == (
        False,
        begun.operation_id,
        begun.pending_review.pk,
        0,
    )
    assert (counts(), WorkflowCheckpoint.objects.count()) == before


def _fail_the_pause_insert(execute, sql, params, many, context):
    """The database refuses the statement that stores the pause: the ORM's checkpoint insert
    (SQLite), or the first begin's one write statement (PostgreSQL, workflow/store.py)."""
    if sql.startswith('INSERT INTO "reviews_workflowcheckpoint"') or (
        sql.startswith("WITH proposal AS (") and '"reviews_workflowcheckpoint"' in sql
    ):
        raise DatabaseError("disk full")
    return execute(sql, params, many, context)


def test_begin_rolls_back_whole_when_the_pause_cannot_be_stored(case):
    """Begin is one transaction: proposal, pause checkpoint and pending review, or none of them."""
    from django.db import connection

    with (
        connection.execute_wrapper(_fail_the_pause_insert),
        pytest.raises(WorkflowIncompatible, match="could not be stored .*disk full.*no pending review was recorded"),
    ):
        review_begin(case=case)
    case.refresh_from_db()
    assert case.current_proposal_id is None
    assert (counts(), WorkflowCheckpoint.objects.count()) == ((0, 0, 0, 0), 0)
    assert review_begin(case=case).checkpoints == 1  # and a rerun then works


def test_begin_reads_the_case_once_and_its_first_proposal_takes_no_savepoint(case):
    """Begin on a case without a proposal: one read of the case (its current proposal and
    policy), one of its evidence (on PostgreSQL both in one statement), and its writes with
    no savepoint of their own (the test's transaction turns the case lock's transaction, or
    on PostgreSQL the lock-free first begin's write, into the one savepoint)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        review_begin(case=case)
    sql = [q["sql"] for q in captured.captured_queries]
    assert sum('FROM "cases_case"' in s for s in sql) == 1, sql
    assert sum("cases_selectedpassage" in s or "cases_finding" in s for s in sql) == 1, sql
    assert [s.split(" ", 1)[0] for s in sql].count("SAVEPOINT") == 1, sql
    writes = [s for s in sql if s.startswith(("INSERT", "UPDATE", "WITH proposal"))]
    if connection.vendor == "postgresql":
        # All four rows in one statement, after the one read, without the case lock (round
        # trips with real transactions: tests/workflow/test_begin_postgres.py).
        assert len(writes) == 1 and writes[0].startswith('WITH proposal AS (INSERT INTO "reviews_proposal"'), sql
        assert sql[0].startswith("WITH c AS (") and not any("pg_advisory" in s for s in sql), sql
    else:
        tables = [s.split('"')[1] for s in writes]
        assert tables == ["reviews_proposal", "cases_case", "reviews_workflowcheckpoint", "reviews_pendingreview"], sql


def test_begin_finds_a_proposal_that_exists_though_the_case_points_at_none(case, reviewer):
    """The savepoint-free first insert meets an existing proposal (written without the case
    lock): begin rolls back and begins again the careful way, which finds it."""
    from cases.models import Case
    from reviews.services import proposal_create

    proposal = proposal_create(case=case)
    Case.objects.filter(pk=case.pk).update(current_proposal=None)
    case.refresh_from_db()
    begun = review_begin(case=case)
    assert (begun.created, begun.operation_id, begun.pending_review.proposal_id) == (
        True,
        proposal.operation_id,
        proposal.pk,
    )
    assert Proposal.objects.count() == 1 and PendingReview.objects.count() == 1
    assert WorkflowCheckpoint.objects.count() == 1
    case.refresh_from_db()
    assert case.current_proposal_id == proposal.pk
    assert decide(case, begun.operation_id, reviewer).outcome == Outcome.COMMITTED


def test_begin_refuses_a_pause_that_is_not_plain_json_and_writes_nothing(case, monkeypatch):
    """The buffer keeps the run's checkpoints unencoded; the pause is encoded by the host,
    which refuses it when it is not plain JSON, before anything is written."""
    from engine import graph as engine

    real = engine._review_request

    def with_a_tuple(message, case, proposal):
        return {**real(message, case, proposal), "session_id": ("not", "json")}

    monkeypatch.setattr(engine, "_review_request", with_a_tuple)
    with pytest.raises(WorkflowIncompatible, match="not plain JSON .*no pending review was recorded"):
        review_begin(case=case)
    assert (counts(), WorkflowCheckpoint.objects.count()) == ((0, 0, 0, 0), 0)


def test_begin_refuses_when_the_engine_only_logged_a_failed_pause_save(case, monkeypatch):
    """agent-framework only logs a warning when a checkpoint save fails: begin proves the pause exists."""
    real_save = store.PauseBuffer.save

    async def drop_the_pause(self, checkpoint):
        if checkpoint.pending_request_info_events:
            raise OSError("disk full")
        return await real_save(self, checkpoint)

    monkeypatch.setattr(store.PauseBuffer, "save", drop_the_pause)
    with pytest.raises(WorkflowIncompatible, match="pause checkpoint for case T-1042 was not saved"):
        review_begin(case=case)
    assert (counts(), WorkflowCheckpoint.objects.count()) == ((0, 0, 0, 0), 0)


def test_a_decision_commits_once_then_replays_and_a_conflict_is_an_error(case, begun, reviewer, caplog):
    first = decide(case, begun.operation_id, reviewer)
    assert (first.outcome, first.begun, first.checkpoint_id) == (
        Outcome.COMMITTED,
        False,
        begun.pending_review.checkpoint_id,
    )
    assert first.commit.receipt() == {"Status": "Committed", "Replay": False, "EffectCount": 1}
    assert first.commit.decision.reviewer == reviewer and first.operation_id == begun.operation_id
    second = decide(case, begun.operation_id, reviewer, channel="admin")
    assert second.outcome == Outcome.REPLAY
    assert second.commit.receipt() == {"Status": "Committed", "Replay": True, "EffectCount": 1}
    with pytest.raises(ConflictingDecision, match="already approved by reviewer") as conflict:
        decide(case, begun.operation_id, reviewer, approved=False)
    assert (conflict.value.exit_code, conflict.value.http_status, conflict.value.code) == (
        3,
        409,
        "conflicting_decision",
    )
    assert conflict.value.result.status == "ConflictingDecision"
    assert conflict.value.result.receipt() == {"Status": "ConflictingDecision", "Replay": False, "EffectCount": 1}
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (1, 1)
    assert PendingReview.objects.get().status == "completed"
    assert list(CommitAttempt.objects.order_by("id").values_list("outcome", "channel")) == [
        ("committed", "command"),
        ("replay", "admin"),
        ("conflict", "command"),
    ]
    # Answered runs keep their checkpoints in memory: the pause is still the only row, and
    # no save failed (a failed save would only have been logged by the engine).
    assert list(WorkflowCheckpoint.objects.values_list("checkpoint_id", flat=True)) == [
        begun.pending_review.checkpoint_id
    ]
    assert "Failed to create checkpoint" not in caplog.text


def test_a_decline_is_a_result_not_an_error(case, begun, reviewer):
    declined = decide(case, begun.operation_id, reviewer, approved=False)
    assert declined.outcome == Outcome.DECLINED
    assert declined.commit.receipt() == {"Status": "Declined", "Replay": False, "EffectCount": 0}
    assert EffectRecord.objects.count() == 0
    assert decide(case, begun.operation_id, reviewer, approved=False).outcome == Outcome.REPLAY


@pytest.mark.parametrize("approved", [None, 1, "true", [True]])
def test_a_non_boolean_decision_is_refused_by_the_review_core(case, begun, reviewer, approved):
    with pytest.raises(InvalidInput, match="not consent"):
        decide(case, begun.operation_id, reviewer, approved=approved)
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)
    attempt = CommitAttempt.objects.get()
    assert (attempt.outcome, attempt.approved, attempt.operation_id) == ("refused", None, begun.operation_id)


def test_a_reviewer_without_permission_is_refused_by_the_review_core(case, begun, lead):
    with pytest.raises(PermissionRefused):
        decide(case, begun.operation_id, lead)
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)
    assert CommitAttempt.objects.get().outcome == "refused"


def test_a_decision_on_a_never_begun_case_begins_it_first(case, reviewer):
    """Every channel alike: the decidable operation of a case nobody began is begun, then decided."""
    op = decidable_operation_id(case)  # computed, nothing written
    assert counts() == (0, 0, 0, 0)
    decided = decide(case, op, reviewer)
    assert (decided.begun, decided.outcome, decided.operation_id) == (True, Outcome.COMMITTED, op)
    case.refresh_from_db()
    assert case.current_proposal.operation_id == op
    pending = PendingReview.objects.get()
    assert (pending.operation_id, pending.checkpoint_id, pending.status) == (op, decided.checkpoint_id, "completed")
    assert WorkflowCheckpoint.objects.count() == 1
    assert counts() == (1, 1, 1, 1)
    again = decide(case, op, reviewer)
    assert (again.begun, again.outcome) == (False, Outcome.REPLAY)


def test_a_current_proposal_whose_review_was_never_begun_is_begun_by_its_decision(case, reviewer):
    from reviews.services import proposal_create

    op = proposal_create(case=case).operation_id
    decided = decide(case, op, reviewer, approved=False)
    assert (decided.begun, decided.outcome) == (True, Outcome.DECLINED)
    assert PendingReview.objects.get().operation_id == op


def test_without_the_permission_a_decision_begins_nothing(case, lead):
    with pytest.raises(PermissionRefused):
        decide(case, decidable_operation_id(case), lead)
    assert (counts(), WorkflowCheckpoint.objects.count()) == ((0, 0, 0, 0), 0)
    refused_attempt("no_permission")


def test_an_operation_neither_pending_nor_decidable_is_not_found(case, begun, reviewer):
    unknown = "op-v1-" + "0" * 64
    with pytest.raises(NotFound, match="no pending review for case T-1042") as error:
        decide(case, unknown, reviewer)
    assert "run begin first" not in error.value.message and error.value.exit_code == 1
    assert error.value.http_status == 404
    with pytest.raises(NotFound):
        decide(case, "op-v1-not-an-identity", reviewer)
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count(), PendingReview.objects.count()) == (0, 0, 1)
    assert list(CommitAttempt.objects.values_list("outcome", flat=True)) == ["refused", "refused"]
    assert all(
        reason == "not_found" and detail.startswith("no pending review for case T-1042")
        for reason, detail in CommitAttempt.objects.values_list("reason", "detail")
    )


def test_the_fault_is_refused_unless_fault_injection_is_on(case, begun, reviewer, settings):
    settings.DECISIONFLOW_FAULT_INJECTION = False
    with pytest.raises(InvalidInput, match="DECISIONFLOW_FAULT_INJECTION"):
        decide(case, begun.operation_id, reviewer, fault="lose-receipt")
    settings.DECISIONFLOW_FAULT_INJECTION = True
    with pytest.raises(InvalidInput, match="unknown fault 'crash'"):
        decide(case, begun.operation_id, reviewer, fault="crash")
    assert (ReviewDecision.objects.count(), CommitAttempt.objects.count()) == (0, 0)

    with pytest.raises(
        OutcomeUncertain, match=r"^outcome uncertain: the commit step failed after it may have written \(LostReceipt\)"
    ) as lost:
        decide(case, begun.operation_id, reviewer, fault="lose-receipt")
    assert lost.value.exit_code == 42 and lost.value.http_status == 500
    assert lost.value.details["operation_id"] == begun.operation_id
    assert EffectRecord.objects.count() == 1  # committed; only the receipt is missing
    replay = decide(case, begun.operation_id, reviewer)
    assert replay.outcome == Outcome.REPLAY
    assert replay.commit.receipt() == {"Status": "Committed", "Replay": True, "EffectCount": 1}


def test_an_answered_run_that_never_reaches_the_commit_step_writes_nothing(case, begun, reviewer, monkeypatch):
    from agent_framework import response_handler

    # Explicit types: this module's annotations are strings (from __future__ import annotations).
    @response_handler(request=dict, response=dict, output=dict)
    async def drops_the_answer(self, original_request, response, ctx) -> None:
        return None  # sends nothing: the run ends IDLE, no output, no failure

    monkeypatch.setattr(HumanReview, "answer", drops_the_answer)
    with pytest.raises(WorkflowIncompatible, match="before the commit step; nothing was written"):
        decide(case, begun.operation_id, reviewer)
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)
    refused_attempt("checkpoint")


def test_an_answered_run_that_ends_in_silence_after_the_commit_step_started_is_uncertain(
    case, begun, reviewer, monkeypatch
):
    from agent_framework import handler

    @handler(input=dict, workflow_output=dict)
    async def says_nothing(self, decision, ctx) -> None:
        self.current_answer().commit_started = True  # the commit may have run; no receipt comes back

    monkeypatch.setattr(Commit, "commit", says_nothing)
    with pytest.raises(OutcomeUncertain, match="without a receipt; run `manage.py reconcile`"):
        decide(case, begun.operation_id, reviewer)
    assert CommitAttempt.objects.count() == 0  # uncertain is not a refusal: nothing is claimed


def test_edit_supersedes_the_pending_review_and_begins_the_new_proposal(case, begun, reviewer):
    edited = review_edit(
        case=case,
        expected_operation_id=begun.operation_id,
        body=begun.pending_review.proposal.body + " Thank you.",
        editor=reviewer,
    )
    revision, new = edited.revision, edited.begun
    assert edited.begin_error is None
    assert revision.changed and new.created and new.operation_id == revision.proposal.operation_id
    assert new.checkpoints == 1
    assert dict(PendingReview.objects.values_list("operation_id", "status")) == {
        begun.operation_id: "superseded",
        new.operation_id: "pending",
    }
    with pytest.raises(StaleProposal) as stale:
        decide(case, begun.operation_id, reviewer)
    assert stale.value.current_operation_id == new.operation_id
    assert CommitAttempt.objects.get().outcome == "stale"

    before = counts()
    with pytest.raises(StaleProposal):
        review_edit(case=case, expected_operation_id=begun.operation_id, body="Other.", editor=reviewer)
    unchanged = review_edit(
        case=case,
        expected_operation_id=new.operation_id,
        body=revision.proposal.body.replace("\n", "\r\n"),
        editor=reviewer,
    )
    assert (unchanged.revision.changed, unchanged.begun, unchanged.begin_error) == (False, None, None)
    assert counts() == before


def test_an_edit_whose_begin_fails_is_saved_and_says_so(case, begun, reviewer, editor, monkeypatch):
    def full_disk(self, checkpoint, payload=None):
        raise DatabaseError("disk full")

    monkeypatch.setattr(store.DatabaseCheckpointStorage, "write", full_disk)
    edited = review_edit(case=case, expected_operation_id=begun.operation_id, body="Hello, edited.", editor=editor)
    assert edited.revision.changed and edited.begun is None
    assert isinstance(edited.begin_error, WorkflowIncompatible) and "disk full" in edited.begin_error.message
    new_op = edited.revision.proposal.operation_id
    case.refresh_from_db()
    assert case.current_proposal.operation_id == new_op  # saved and current
    assert dict(PendingReview.objects.values_list("operation_id", "status")) == {begun.operation_id: "superseded"}
    monkeypatch.undo()
    # The first decision on the new proposal begins its review.
    decided = decide(case, new_op, reviewer)
    assert (decided.begun, decided.outcome) == (True, Outcome.COMMITTED)


def test_edit_needs_the_review_permission(case, begun, lead):
    before = counts()
    with pytest.raises(PermissionRefused):
        review_edit(case=case, expected_operation_id=begun.operation_id, body="Edited.", editor=lead)
    assert counts() == before


def test_a_pending_review_from_another_version_is_refused_and_begin_moves_it(case, begun, reviewer):
    PendingReview.objects.update(workflow_version="review-v0")
    with pytest.raises(WorkflowIncompatible, match="review-v0"):
        decide(case, begun.operation_id, reviewer)
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)
    refused_attempt("checkpoint")
    moved = review_begin(case=case)
    assert (moved.pending_review.pk, moved.created, moved.checkpoints) == (begun.pending_review.pk, True, 1)
    assert moved.pending_review.workflow_version == WORKFLOW_VERSION
    assert moved.pending_review.checkpoint_id != begun.pending_review.checkpoint_id
    assert decide(case, begun.operation_id, reviewer).commit.status == "Committed"


# --- binding the pause before anything runs ---------------------------------------------


def _pause_row(begun):
    return WorkflowCheckpoint.objects.get(checkpoint_id=begun.pending_review.checkpoint_id)


def _store(row, payload):
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(payload=payload, digest=store.payload_digest(payload))


def _rewrite(begun, change):
    """Change the stored pause checkpoint as someone holding the secret could (a valid HMAC)."""
    checkpoint = store.DatabaseCheckpointStorage().load_sync(begun.pending_review.checkpoint_id)
    change(checkpoint)
    _store(_pause_row(begun), store.encode_checkpoint(checkpoint))


def _refused_and_nothing_ran(case, begun, reviewer, match):
    with pytest.raises(WorkflowIncompatible, match=match) as error:
        decide(case, begun.operation_id, reviewer)
    assert error.value.exit_code == 5 and error.value.http_status == 409
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)
    assert PendingReview.objects.get().status == "pending"
    refused_attempt("checkpoint")
    return error.value


def test_a_checkpoint_that_fails_its_hmac_is_refused(case, begun, reviewer):
    row = _pause_row(begun)
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(payload=row.payload.replace("T-1042", "T-1043"))
    _refused_and_nothing_ran(case, begun, reviewer, "corrupt or was modified.*HMAC")


def test_a_bare_sha256_digest_is_refused(case, begun, reviewer):
    """A bare SHA-256 digest (anyone who can write the table can compute one) does not verify."""
    row = _pause_row(begun)
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(digest=hashlib.sha256(row.payload.encode()).hexdigest())
    _refused_and_nothing_ran(case, begun, reviewer, "corrupt or was modified.*HMAC")


def test_a_checkpoint_signed_with_another_secret_is_refused_unless_it_is_a_fallback(case, begun, reviewer, settings):
    row = _pause_row(begun)
    old_secret = "the-secret-before-rotation"
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(digest=store.payload_digest(row.payload, secret=old_secret))
    settings.SECRET_KEY_FALLBACKS = []
    _refused_and_nothing_ran(case, begun, reviewer, "another SECRET_KEY")
    settings.SECRET_KEY_FALLBACKS = [old_secret]  # rotated: the old key still verifies
    assert decide(case, begun.operation_id, reviewer).outcome == Outcome.COMMITTED


def test_a_pickle_marker_is_refused_and_never_unpickled(case, begun, reviewer):
    row = _pause_row(begun)
    document = json.loads(row.payload)
    document["state"]["evil"] = {"__pickled__": "gASVAAAAAAAAAAB9lC4=", "__type__": "builtins:dict"}
    _store(row, json.dumps(document))
    _refused_and_nothing_ran(case, begun, reviewer, "pickle marker")


def test_a_checkpoint_whose_request_names_another_operation_is_refused(case, begun, reviewer):
    """A checkpoint rewritten with a valid HMAC still cannot change what is approved."""
    other = "op-v1-" + "a" * 64
    row = _pause_row(begun)
    _store(row, row.payload.replace(begun.operation_id, other))
    error = _refused_and_nothing_ran(
        case, begun, reviewer, f"does not belong to case T-1042 and operation {begun.operation_id[:18]}"
    )
    assert f"review:{other}" in error.message and "nothing ran" in error.message
    assert not ReviewDecision.objects.filter(operation_id=other).exists()


def test_a_checkpoint_whose_request_names_another_case_is_refused(case, begun, reviewer):
    def other_case_id(checkpoint):
        checkpoint.pending_request_info_events[f"review:{begun.operation_id}"].data["case_id"] = "T-1043"

    _rewrite(begun, other_case_id)
    _refused_and_nothing_ran(case, begun, reviewer, "does not belong to case T-1042")


def test_a_checkpoint_whose_request_names_another_case_row_is_refused(case, begun, reviewer):
    """The case is bound by its external ID and by its primary key."""

    def other_case_pk(checkpoint):
        checkpoint.pending_request_info_events[f"review:{begun.operation_id}"].data["case_pk"] = case.pk + 1000

    _rewrite(begun, other_case_pk)
    _refused_and_nothing_ran(case, begun, reviewer, "does not belong to case T-1042")


def test_a_checkpoint_with_a_second_pending_request_is_refused(case, begun, reviewer):
    other = "op-v1-" + "b" * 64

    def two_requests(checkpoint):
        events = checkpoint.pending_request_info_events
        events[f"review:{other}"] = events[f"review:{begun.operation_id}"]

    _rewrite(begun, two_requests)
    _refused_and_nothing_ran(case, begun, reviewer, "does not belong to case T-1042")


def test_a_checkpoint_whose_request_comes_from_another_step_is_refused(case, begun, reviewer):
    row = _pause_row(begun)
    document = json.loads(row.payload)
    event = document["pending_request_info_events"][f"review:{begun.operation_id}"]
    assert event["source_executor_id"] == HUMAN_REVIEW_ID
    event["source_executor_id"] = "prepare"
    _store(row, json.dumps(document))
    _refused_and_nothing_ran(case, begun, reviewer, "does not belong to case T-1042")


def test_a_checkpoint_holding_a_message_in_flight_is_refused(case, begun, reviewer):
    """A checkpoint saved mid-commit still carries the approval it was delivering: never replay it."""
    from agent_framework import WorkflowMessage

    def in_flight(checkpoint):
        approval = {
            "case_id": case.case_id,
            "operation_id": begun.operation_id,
            "approved": True,
            "reviewer_pk": reviewer.pk,
            "channel": "forged",
        }
        checkpoint.messages[HUMAN_REVIEW_ID] = [
            WorkflowMessage(data=approval, source_id=HUMAN_REVIEW_ID, target_id="commit")
        ]

    _rewrite(begun, in_flight)
    _refused_and_nothing_ran(case, begun, reviewer, "1 message\\(s\\) in flight")


def test_a_checkpoint_from_another_graph_is_refused(case, begun, reviewer):
    other_graph = "0" * 64

    def set_graph(checkpoint):
        checkpoint.graph_signature_hash = other_graph

    _rewrite(begun, set_graph)
    WorkflowCheckpoint.objects.filter(pk=_pause_row(begun).pk).update(graph_signature_hash=other_graph)
    _refused_and_nothing_ran(case, begun, reviewer, "incompatible workflow graph")


def test_a_request_from_another_workflow_version_is_refused(case, begun, reviewer):
    row = _pause_row(begun)
    _store(row, row.payload.replace(f'"workflow_version":"{WORKFLOW_VERSION}"', '"workflow_version":"review-v0"'))
    _refused_and_nothing_ran(case, begun, reviewer, "review-v0")


def test_a_missing_pause_checkpoint_is_refused_and_begin_pauses_again(case, begun, reviewer):
    WorkflowCheckpoint.objects.filter(checkpoint_id=begun.pending_review.checkpoint_id).delete()
    _refused_and_nothing_ran(case, begun, reviewer, "does not exist")
    again = review_begin(case=case)
    assert (again.pending_review.pk, again.created, again.checkpoints) == (begun.pending_review.pk, True, 1)
    assert again.pending_review.checkpoint_id != begun.pending_review.checkpoint_id
    assert decide(case, begun.operation_id, reviewer).commit.status == "Committed"


def test_a_refused_pause_is_paused_again_by_the_first_begin(case, begun, reviewer):
    """Begin does not report a pause it could not resume: it moves the pending review."""
    row = _pause_row(begun)
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(payload=row.payload.replace("T-1042", "T-1043"))
    again = review_begin(case=case)
    assert (again.created, again.checkpoints) == (True, 1)
    assert again.pending_review.checkpoint_id != row.checkpoint_id
    assert WorkflowCheckpoint.objects.filter(pk=row.pk).exists()  # the refused row stays, as evidence
    assert decide(case, begun.operation_id, reviewer).outcome == Outcome.COMMITTED


# --- the checkpoint store ----------------------------------------------------------------


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
    from core.locks import case_lock

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


def test_a_decision_that_must_begin_a_busy_case_answers_busy_within_its_timeout(committed_case, reviewer, settings):
    """Beginning takes the case lock, waited for DECISIONFLOW_DECISION_LOCK_TIMEOUT: then busy, nothing written."""
    import time

    from tests.conftest import case_held_elsewhere

    op = decidable_operation_id(committed_case)
    settings.DECISIONFLOW_DECISION_LOCK_TIMEOUT = 0.3
    with case_held_elsewhere(committed_case.case_id):
        started = time.monotonic()
        with pytest.raises(CaseBusy, match="another action on case T-1042 is in progress; try again") as busy:
            decide(committed_case, op, reviewer)
        assert time.monotonic() - started < 3
    assert (busy.value.code, busy.value.exit_code, busy.value.http_status) == ("case_busy", 6, 409)
    assert (counts(), WorkflowCheckpoint.objects.count()) == ((0, 0, 0, 0), 0)
    refused_attempt("busy")
    decided = decide(committed_case, op, reviewer)  # free again: the same request now goes through
    assert (decided.begun, decided.outcome) == (True, Outcome.COMMITTED)


def test_an_edit_back_to_an_earlier_text_revives_its_pending_review(case, begun, reviewer):
    body = begun.pending_review.proposal.body
    edited = review_edit(
        case=case, expected_operation_id=begun.operation_id, body=body + " More.", editor=reviewer
    ).begun
    back = review_edit(case=case, expected_operation_id=edited.operation_id, body=body, editor=reviewer)
    assert back.revision.changed and back.begun.operation_id == begun.operation_id
    assert (back.begun.created, back.begun.checkpoints) == (False, 0)
    assert dict(PendingReview.objects.values_list("operation_id", "status")) == {
        begun.operation_id: "pending",
        edited.operation_id: "superseded",
    }
    assert decide(case, begun.operation_id, reviewer).commit.status == "Committed"
    assert PendingReview.objects.get(operation_id=begun.operation_id).status == "completed"
