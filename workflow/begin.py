"""Begin: run ``prepare`` and pause at the human step; record the pending review.

One pending review per operation. A case's first begin, the common one, builds its
prepared proposal here, runs the engine to the human step, and stores the proposal, the
case's pointer to it, the pause checkpoint and the pending review together
(``workflow.store``: one statement on PostgreSQL, all or nothing by itself, so there it
takes no lock: it reads, runs and writes, and only a lost race on the pointer goes the
careful way). Every other begin is one transaction that holds the case lock
(``core.locks.case_lock``) and goes the general way: the engine's prepare step finds or
makes the proposal through the ORM.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from agent_framework import WorkflowCheckpoint as EngineCheckpoint
from agent_framework import WorkflowRunState
from django.db import DatabaseError, IntegrityError, OperationalError, connection, transaction
from django.utils import timezone

from cases.models import Case
from core.errors import CaseBusy, DecisionflowError, WorkflowIncompatible
from core.faults import crash_point
from core.locks import lock_not_available
from core.statements import refused_by_server, statement_commits, statement_scope
from effects.services import COMMITTED, DECLINED, operation_reconcile
from engine.checkpoints import DatabaseCheckpointStorage, PauseBuffer, checkpoint_row, encode_checkpoint
from engine.driver import run_on_caller
from engine.graph import WORKFLOW_VERSION, Begin, build_workflow, review_request_id, run_workflow, status_name
from engine.messages import conform, graph_fingerprint
from reviews.models import (
    Channel,
    NotificationKind,
    Origin,
    PendingReview,
    Proposal,
    ReviewDecision,
    WorkflowCheckpoint,
)
from reviews.notifications import channels, notify
from reviews.services import prepared_content
from workflow.bind import bound_checkpoint
from workflow.store import (
    Opened,
    begin_transaction,
    first_begin_read,
    first_begin_write,
    first_proposal_reserve,
)

PAUSED = status_name(WorkflowRunState.IDLE_WITH_PENDING_REQUESTS)


@dataclass(frozen=True)
class BeginResult:
    # "PendingRequests"; for a case whose current proposal is decided, its reconcile state
    # ("Committed", "Declined" or "NoLocalEffectRecorded") and ``decision`` says who and when.
    status: str
    operation_id: str
    checkpoints: int  # checkpoint rows written by this begin (0 when it found one)
    pending_review: PendingReview
    created: bool  # False when begin found an existing pending review for this operation
    decision: ReviewDecision | None = None  # set when the current proposal is already decided


def _existing_begin(case: Case, *, refresh: bool = True) -> BeginResult | None:
    if refresh:
        case.refresh_from_db(fields=["current_proposal"])
    if case.current_proposal_id is None:
        return None
    operation_id = Proposal.objects.values_list("operation_id", flat=True).get(pk=case.current_proposal_id)
    pending = PendingReview.objects.filter(operation_id=operation_id).first()
    if pending is None:
        return None
    return BeginResult(status=PAUSED, operation_id=operation_id, checkpoints=0, pending_review=pending, created=False)


def _decided_and_pruned(pending: PendingReview) -> bool:
    """A completed review whose pause checkpoint was pruned (reviews/retention.py)."""
    return (
        pending.status == PendingReview.Status.COMPLETED
        and not WorkflowCheckpoint.objects.filter(checkpoint_id=pending.checkpoint_id).exists()
    )


def _pause_is_usable(case: Case, pending: PendingReview) -> bool:
    """Whether a recorded pause can be resumed: it passes every binding check."""
    try:
        bound_checkpoint(case, pending)
    except WorkflowIncompatible:
        return False
    return True


def _begin_run(case: Case, actor, *, proposal: Proposal | None = None) -> tuple[str, Any, list, PauseBuffer]:
    session_id = f"ws-{uuid.uuid4().hex}"
    buffer = PauseBuffer()
    begin = Begin(case=case, actor=actor, proposal=proposal)
    workflow = build_workflow(begin=begin, checkpoint_storage=buffer)
    message = conform("start", {"case_pk": case.pk, "actor_pk": getattr(actor, "pk", None), "session_id": session_id})
    try:
        result = run_on_caller(run_workflow, workflow, message=message)
    except (DecisionflowError, DatabaseError):
        raise
    except Exception as exc:
        raise DecisionflowError(f"begin: the workflow failed in prepare: {type(exc).__name__}: {exc}") from exc
    return session_id, result.get_final_state(), result.get_request_info_events(), buffer


def pending_supersede_others(case: Case, operation_id: str) -> None:
    """Mark the case's pending reviews of every other operation superseded (resuming one is
    then refused as stale): what an edit, a publish and a new source version do once they
    make ``operation_id`` current, in their transaction under the case lock."""
    # update() skips auto_now; checkpoint retention counts its window from this time.
    PendingReview.objects.filter(case=case, status=PendingReview.Status.PENDING).exclude(
        operation_id=operation_id
    ).update(status=PendingReview.Status.SUPERSEDED, updated_at=timezone.now())


def begin_under_lock(case: Case, actor, channel: str = Channel.SERVICE, *, refreshed: bool = False) -> BeginResult:
    """Begin the case's current proposal, inside the caller's transaction that holds the
    case lock (``case_lock``): edit and publishing call it after their own writes.

    A pending review that can be resumed is reported as it is (a superseded one becomes live
    again); one that cannot (another workflow version, a missing or refused checkpoint) is
    moved to a new pause. ``refreshed``: the caller read the case's current proposal under
    the lock just now.
    """
    existing = _existing_begin(case, refresh=not refreshed)
    if existing is not None and _decided_and_pruned(existing.pending_review):
        # Nothing is left to resume, and a retried decision is answered without the pause.
        return existing
    if (
        existing is not None
        and existing.pending_review.workflow_version == WORKFLOW_VERSION
        and _pause_is_usable(case, existing.pending_review)
    ):
        if existing.pending_review.status == PendingReview.Status.SUPERSEDED:
            # An edit came back to this very operation (e.g. the text was restored): it is
            # the current proposal again, so its pause is live again.
            PendingReview.objects.filter(pk=existing.pending_review.pk).update(status=PendingReview.Status.PENDING)
            existing.pending_review.refresh_from_db()
        return existing
    try:
        # A savepoint: the proposal, the pause checkpoint and the pending review are written
        # together or not at all, and the caller's transaction stays usable.
        with transaction.atomic():
            return _begin_write(case, actor, existing, channel)
    except IntegrityError:
        # Another process recorded this operation first (the case lock makes that rare).
        raced = _existing_begin(case)
        if raced is not None:
            return raced
        raise


def _begin_write(case: Case, actor, existing: BeginResult | None, channel: str) -> BeginResult:
    # `prepare` works on this very case object, so it points at the new proposal afterwards.
    session_id, state, requests, buffer = _begin_run(case, actor)
    operation_id, request, pause, payload = _pause_of_run(case, state, requests, buffer)
    storage = DatabaseCheckpointStorage()
    try:
        storage.write(pause, payload)
    except DatabaseError as exc:
        raise _not_stored(case, exc) from exc
    fields = {
        "workflow_session_id": session_id,
        "checkpoint_id": pause.checkpoint_id,
        "checkpoint_at": storage.written_at,
        "workflow_version": WORKFLOW_VERSION,
        "graph_fingerprint": graph_fingerprint(),
    }
    if existing is not None:
        # The operation's pending review was recorded by another workflow version, or its
        # checkpoint is gone or refused (the refused row stays, as evidence): this run
        # replaces where it waits. A decision already made stays made: the review core
        # turns a second approval into a replay.
        # A decided operation's pause is moved too (so a retry finds it), but it stays
        # completed: re-pausing never makes a decided review look pending again.
        decided = ReviewDecision.objects.filter(operation_id=operation_id).exists()
        status = PendingReview.Status.COMPLETED if decided else PendingReview.Status.PENDING
        PendingReview.objects.filter(pk=existing.pending_review.pk).update(
            status=status, updated_at=timezone.now(), **fields
        )
        existing.pending_review.refresh_from_db()
        return BeginResult(PAUSED, operation_id, 1, existing.pending_review, True)
    # Who began it is recorded here, not as the proposal's author: the pipeline prepared it.
    pending = PendingReview.objects.create(
        case=case,
        proposal_id=request.data["proposal_pk"],
        operation_id=operation_id,
        begun_by=_begun_by(actor),
        begun_channel=str(channel)[:20],
        **fields,
    )
    # In the same transaction as the pending review; sent by a task worker after commit
    # (nothing at all unless notifications are configured; docs/QUEUE.md).
    notify(case=case, operation_id=operation_id, kind=NotificationKind.REVIEW_BEGUN)
    return BeginResult(PAUSED, operation_id, 1, pending, True)


def _pause_of_run(case: Case, state, requests: list, buffer: PauseBuffer) -> tuple[str, Any, EngineCheckpoint, str]:
    """The begin run's review request and its pause checkpoint, encoded; refused unless the
    run paused at the human step with exactly that request. Nothing is written here."""
    if state != WorkflowRunState.IDLE_WITH_PENDING_REQUESTS or len(requests) != 1:
        raise DecisionflowError(
            f"begin: the workflow ended {status_name(state)} with {len(requests)} review request(s) instead of "
            "pausing at human-review-v1; nothing was recorded"
        )
    request = requests[0]
    operation_id = request.data.get("operation_id")
    if request.request_id != review_request_id(operation_id):
        raise DecisionflowError(f"begin: unexpected review request {request.request_id!r}; nothing was recorded")
    # The engine only logs a warning when a checkpoint save fails, so prove the pause
    # exists: the last checkpoint of this run, carrying the request for this operation.
    pause = buffer.saved[-1] if buffer.saved else None
    if pause is None or request.request_id not in pause.pending_request_info_events:
        raise WorkflowIncompatible(
            f"begin: the pause checkpoint for case {case.case_id} was not saved (the engine only logged a "
            "warning); no pending review was recorded, run begin again"
        )
    try:
        payload = encode_checkpoint(pause)
    except TypeError as exc:
        raise WorkflowIncompatible(
            f"begin: the pause checkpoint for case {case.case_id} holds a value that is not plain JSON ({exc}); "
            "no pending review was recorded"
        ) from exc
    return operation_id, request, pause, payload


def _answer_lost(case: Case, exc: DatabaseError) -> WorkflowIncompatible:
    return WorkflowIncompatible(
        f"begin: the answer to storing the pause of case {case.case_id} was lost ({type(exc).__name__}: {exc}); "
        "it may have been recorded: run begin again, which finds it"
    )


def _not_stored(case: Case, exc: DatabaseError) -> WorkflowIncompatible:
    return WorkflowIncompatible(
        f"begin: the pause checkpoint for case {case.case_id} could not be stored ({type(exc).__name__}: "
        f"{exc}); no pending review was recorded, run begin again"
    )


class _FirstBeginLost(Exception):
    """A first begin met a proposal of its case after all (written without the case lock):
    its transaction rolls back and begin runs again the careful way, which finds it."""


def _begun_by(actor):
    return actor if getattr(actor, "is_authenticated", False) else None


def _begin_first(case: Case, actor, channel: str, opened: Opened) -> BeginResult:
    """The first begin of a case: the proposal is built here and asked about by the engine
    run as it is (no database work inside the run), then stored with the pause and the
    pending review. ``_FirstBeginLost`` when the case had a proposal after all (nothing of
    this begin stands, or its transaction must roll back)."""
    content = prepared_content(case, evidence=opened.evidence, policy=opened.policy)
    proposal = Proposal(origin=Origin.PREPARED, parent=None, author=None, **content)
    if not first_proposal_reserve(case, proposal, opened):
        raise _FirstBeginLost
    session_id, state, requests, buffer = _begin_run(case, actor, proposal=proposal)
    operation_id, _request, pause, payload = _pause_of_run(case, state, requests, buffer)
    if operation_id != proposal.operation_id:
        raise DecisionflowError(f"begin: the review request names {operation_id!r}, not the prepared proposal")
    checkpoint = checkpoint_row(pause, payload)
    pending = PendingReview(
        case=case,
        proposal=proposal,
        operation_id=operation_id,
        workflow_session_id=session_id,
        checkpoint_id=pause.checkpoint_id,
        workflow_version=WORKFLOW_VERSION,
        graph_fingerprint=graph_fingerprint(),
        status=PendingReview.Status.PENDING,
        # Who began it is recorded here, not as the proposal's author: the pipeline prepared it.
        begun_by=_begun_by(actor),
        begun_channel=str(channel)[:20],
    )
    # Killed with everything of begin built and nothing of it committed (on PostgreSQL its
    # write is one statement, a transaction of its own when begin took no lock).
    crash_point("begin-during-checkpoint-save")
    try:
        _proposal, pending = first_begin_write(case, proposal, checkpoint, pending)
    except IntegrityError as exc:
        raise _FirstBeginLost from exc
    except DatabaseError as exc:
        if lock_not_available(exc):
            raise  # CaseBusy, not a storage failure
        if statement_commits() and not refused_by_server(exc):  # the write was its own transaction
            raise _answer_lost(case, exc) from exc
        raise _not_stored(case, exc) from exc
    notify(case=case, operation_id=operation_id, kind=NotificationKind.REVIEW_BEGUN)
    return BeginResult(PAUSED, operation_id, 1, pending, True)


def _begin(case: Case, actor, channel: str, opened: Opened, *, careful: bool) -> BeginResult:
    """``review_begin``'s one transaction, under the case lock."""
    decided = _decided_begin(case, refresh=False)
    if decided is not None:
        return decided
    if opened.current_proposal_id is None and not careful:
        return _begin_first(case, actor, channel, opened)
    return begin_under_lock(case, actor, channel, refreshed=True)


def review_begin(*, case: Case, actor=None, channel: str = Channel.SERVICE) -> BeginResult:
    """Run ``prepare`` and pause at ``human-review-v1``; record the pending review.

    Invariant: one pending review per operation. Begin for a case that is already pending
    on its current operation reports that pending review and writes nothing, unless that
    pause cannot be resumed (another workflow version, a missing or refused checkpoint):
    then it pauses again and moves the pending review to the new checkpoint. The proposal,
    the pause checkpoint (the only one written) and the pending review commit together;
    ``WorkflowIncompatible`` if the pause could not be stored, and then nothing is
    recorded.

    Transaction: on PostgreSQL, a case's first begin (without notifications to record)
    takes no lock: one read, the engine run, and one write statement that commits as it
    ends and writes nothing if another begin made the case's first proposal meanwhile.
    Every other begin runs in a transaction of its own that holds the case lock for the
    whole run (``case_lock``). Either way ``CaseBusy`` after the decision lock timeout, for
    the lock or any row it waits for. A first begin that meets a proposal made by another
    begin writes nothing and runs once more, the careful way, under the lock. ``actor`` and
    ``channel`` are recorded on the pending review as who began it and how; the proposal
    itself has no human author.

    Decided means decided: for a case whose current proposal is decided, begin writes
    nothing and returns its reconcile state as ``status``, with ``decision``.
    """
    if _unlocked_first_begin(case):
        opened = first_begin_read(case)
        if opened is not None:
            try:
                with statement_scope():
                    return _begin_first(case, actor, channel, opened)
            except _FirstBeginLost:
                pass  # another begin made the case's first proposal: the careful way finds it
            except OperationalError as exc:
                if lock_not_available(exc):
                    raise CaseBusy.held(case.case_id) from exc
                raise
        with begin_transaction(case) as opened:
            return _begin(case, actor, channel, opened, careful=True)
    try:
        with begin_transaction(case) as opened:
            return _begin(case, actor, channel, opened, careful=False)
    except _FirstBeginLost:
        pass
    with begin_transaction(case) as opened:
        return _begin(case, actor, channel, opened, careful=True)


def _unlocked_first_begin(case: Case) -> bool:
    """Whether this begin may go without the case lock: PostgreSQL, a case with no proposal
    yet (a first begin, which only the pointer's compare-and-swap can race), and no
    notification to record, which must commit in one transaction with the pending review."""
    return connection.vendor == "postgresql" and case.current_proposal_id is None and not channels()


def _decided_begin(case: Case, *, refresh: bool = True) -> BeginResult | None:
    """A case whose current proposal is decided: its real state, and nothing is written.

    Decided means decided: no new pause, not even when the recorded one is from another
    workflow version (a decision on it could only be a replay or a conflict).
    ``refresh``: False when the caller read the current proposal under the lock just now.
    """
    if refresh:
        case.refresh_from_db(fields=["current_proposal"])
    if case.current_proposal_id is None:
        return None
    decision = ReviewDecision.objects.select_related("reviewer").filter(proposal_id=case.current_proposal_id).first()
    if decision is None:
        return None
    pending = PendingReview.objects.filter(operation_id=decision.operation_id).first()
    if pending is None:  # decided outside the workflow (the review core called directly)
        return None
    row = operation_reconcile(decision.operation_id)
    state = row.state if row is not None else (COMMITTED if decision.approved else DECLINED)
    return BeginResult(state, decision.operation_id, 0, pending, False, decision)
