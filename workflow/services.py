"""Begin, edit, and the one decision service that every channel calls.

The admin's Approve and Decline, ``POST /api/cases/{id}/decision`` and ``manage.py resume``
all call ``decision_record`` with the same rules: the same "begin if needed", the same
outcome enum, the same error classes. They differ only in how they parse and show.

A decision, in order, on one screen:

1. The pending review of the named operation, with its checkpoint row, in one query.
2. Begin if needed: the named operation is the case's decidable one (its current proposal,
   or the one ``begin`` would prepare) and has no pending review yet. Only this takes the
   case lock, waited for at most ``DECISIONFLOW_DECISION_LOCK_TIMEOUT`` seconds.
3. Bind before running: the pending review's pause checkpoint is loaded, its HMAC checked,
   and it must hold exactly one pending request, for this case and this operation, from
   this workflow version and graph, and nothing else in flight. Otherwise the resume is
   refused (``WorkflowIncompatible``) and nothing runs.
4. One engine run, one sync-to-async crossing: ``run(checkpoint_id=…, responses=…)``
   restores the bound checkpoint and answers it; its commit step calls ``effect_commit``
   with the reviewer the channel authenticated. ``effect_commit`` takes the case row lock
   (bounded by ``lock_timeout``: ``CaseBusy``), writes in one statement and marks the
   pending review completed in the same transaction.
5. The truth after a fault: once the commit step has started, any failure is
   ``OutcomeUncertain``; only the effect store (reconcile) can say what happened.

The engine runs on the calling thread (``driver.run_on_caller``), and the executors' ORM
work runs there too, between loop iterations (``driver.on_caller``), so all database work
uses the caller's connection and transaction (and, in tests, the test transaction), with no
thread started.
"""

from __future__ import annotations

import enum
import functools
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from agent_framework import WorkflowCheckpoint as EngineCheckpoint
from agent_framework import WorkflowRunState
from agent_framework.exceptions import WorkflowCheckpointException
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from cases.models import Case, Policy
from cases.selectors import evidence_rows, evidence_sql
from core import faults, identity
from core.errors import (
    CaseBusy,
    ConflictingDecision,
    DecisionflowError,
    FourEyesRefused,
    InvalidInput,
    NotFound,
    OutcomeUncertain,
    StaleProposal,
    WorkflowIncompatible,
)
from core.faults import crash_point
from core.locks import (
    LOCK_NOT_AVAILABLE,
    CaseTransactionLock,
    case_lock,
    case_transaction_lock,
    sqlite_bounded_wait,
)
from core.observability import CHECKPOINT_REFUSED, counts_refusals, observed_decision
from core.prepared import PreparedStatement, begin_in_query_string
from effects.models import CommitAttempt
from effects.services import (
    COMMITTED,
    CONFLICTING,
    DECLINED,
    CommitResult,
    attempt_record,
    decline_reason_check,
    effect_commit,
    operation_reconcile,
    reviewer_check,
)
from engine.checkpoints import (
    BoundCheckpoint,
    DatabaseCheckpointStorage,
    PauseBuffer,
    encode_checkpoint,
    payload_digest,
)
from engine.driver import run_on_caller
from engine.graph import (
    FAULTS,
    GRAPH_SIGNATURE_HASH,
    HUMAN_REVIEW_ID,
    WORKFLOW_VERSION,
    Answer,
    Begin,
    build_workflow,
    resume_workflow,
    review_request_id,
    status_name,
)
from engine.messages import conform, graph_fingerprint, short_fingerprint
from reviews.models import (
    Channel,
    NotificationKind,
    Origin,
    PendingReview,
    Proposal,
    ReviewDecision,
    WorkflowCheckpoint,
)
from reviews.notifications import notify
from reviews.services import RevisionResult, prepared_content, proposal_revise
from workflow.selectors import decidable_operation_id

log = logging.getLogger(__name__)

PAUSED = status_name(WorkflowRunState.IDLE_WITH_PENDING_REQUESTS)


class Outcome(enum.StrEnum):
    """How a decision ended, for every channel. A refusal is an error class instead."""

    COMMITTED = "committed"  # the first approval: decision and effect written
    DECLINED = "declined"  # the first decline: decision written, no effect
    REPLAY = "replay"  # the same decision again: nothing new written


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


@dataclass(frozen=True)
class DecisionResult:
    outcome: Outcome
    commit: CommitResult  # the review core's receipt, exactly as it returned it
    checkpoint_id: str  # the pause checkpoint the answer was bound to
    begun: bool  # this call began the review first

    @property
    def operation_id(self) -> str:
        return self.commit.operation_id


@dataclass(frozen=True)
class EditResult:
    revision: RevisionResult
    begun: BeginResult | None  # None when nothing changed, or when beginning failed
    begin_error: DecisionflowError | None = None  # the edit is saved even then


# --- begin ------------------------------------------------------------------------------


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
        _bound_checkpoint(case, pending)
    except WorkflowIncompatible:
        return False
    return True


async def _run(workflow, **kwargs):
    return await workflow.run(**kwargs)


def _begin_run(
    case: Case, actor, *, first: bool = False, proposal: Proposal | None = None
) -> tuple[str, Any, list, PauseBuffer]:
    session_id = f"ws-{uuid.uuid4().hex}"
    buffer = PauseBuffer()
    begin = Begin(case=case, actor=actor, first=first, proposal=proposal)
    workflow = build_workflow(begin=begin, checkpoint_storage=buffer)
    message = conform("start", {"case_pk": case.pk, "actor_pk": getattr(actor, "pk", None), "session_id": session_id})
    try:
        result = run_on_caller(_run, workflow, message=message)
    except (DecisionflowError, DatabaseError):
        raise
    except Exception as exc:
        raise DecisionflowError(f"begin: the workflow failed in prepare: {type(exc).__name__}: {exc}") from exc
    return session_id, result.get_final_state(), result.get_request_info_events(), buffer


def _begin_locked(
    case: Case, actor, channel: str = Channel.SERVICE, *, refreshed: bool = False, careful: bool = False
) -> BeginResult:
    # ``refreshed``: the caller read the case's current proposal under the lock just now.
    # ``careful``: a first begin already lost a race with a writer that skipped the case lock.
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
    # Read under the case lock: the case has no proposal yet, so its first one needs no savepoint.
    first = not careful and existing is None and case.current_proposal_id is None
    try:
        # One durable transaction: the proposal, the pause checkpoint and the pending review
        # are written together or not at all.
        with transaction.atomic():
            if first and connection.vendor == "postgresql":
                return _begin_first(case, actor, channel, _begin_open(case))
            return _begin_write(case, actor, existing, channel, first=first)
    except (IntegrityError, _FirstBeginLost):
        # Another process recorded this operation first (the case lock makes that rare).
        raced = _existing_begin(case)
        if raced is not None:
            return raced
        if not first:
            raise
    # A proposal of this case existed after all (written without the case lock): begin
    # again the careful way, which finds it.
    with transaction.atomic():
        return _begin_write(case, actor, _existing_begin(case), channel)


def _begin_write(
    case: Case, actor, existing: BeginResult | None, channel: str = Channel.SERVICE, *, first: bool = False
) -> BeginResult:
    # `prepare` works on this very case object, so it points at the new proposal afterwards.
    session_id, state, requests, buffer = _begin_run(case, actor, first=first)
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
        begun_by=actor if getattr(actor, "is_authenticated", False) else None,
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


def _not_stored(case: Case, exc: DatabaseError) -> WorkflowIncompatible:
    return WorkflowIncompatible(
        f"begin: the pause checkpoint for case {case.case_id} could not be stored ({type(exc).__name__}: "
        f"{exc}); no pending review was recorded, run begin again"
    )


# --- begin on PostgreSQL: three round trips ----------------------------------------------
#
# review_begin on PostgreSQL sends (core/prepared.py for the BEGIN and PREPARE):
#   1. one query string: BEGIN; SET LOCAL lock_timeout; the case's advisory lock for this
#      transaction; the case's current proposal and policy (and, for a case without a
#      proposal, the new proposal's id from the table's sequence); its passages and findings;
#   2. for a case's first proposal (the common begin), after the engine run: one statement
#      that inserts the proposal, points the case at it (compare-and-swap from none), inserts
#      the pause checkpoint and the pending review;
#   3. COMMIT.
# A case that has a proposal goes the general way (``_begin_locked``) inside the same
# transaction, under the same lock. SQLite keeps the ORM path, under its file lock.


class _FirstBeginLost(Exception):
    """A first begin met a proposal of its case after all (written without the case lock):
    its transaction rolls back and begin runs again the careful way, which finds it."""


# Parameters of begin's statements, in the order PREPARE declares them.
_BEGIN_TYPES = {
    "case": "bigint",
    "proposal": "bigint",
    "action": "text",
    "body": "text",
    "passages": "jsonb",
    "findings": "jsonb",
    "policy_snapshot": "jsonb",
    "evidence_id": "text",
    "policy_id": "text",
    "operation_id": "text",
    "now": "timestamptz",
    "checkpoint_id": "text",
    "workflow_name": "text",
    "graph_signature_hash": "text",
    "previous_checkpoint_id": "text",
    "iteration_count": "integer",
    "payload": "text",
    "digest": "text",
    "session_id": "text",
    "workflow_version": "text",
    "graph_fingerprint": "text",
    "begun_by": "bigint",
    "begun_channel": "text",
}


@functools.cache
def _begin_case_read() -> PreparedStatement:
    # The sequence value only for a case without a proposal: its first one is built with it.
    return PreparedStatement(
        f"SELECT c.current_proposal_id, pol.name, pol.label, pol.parameters, "
        f"CASE WHEN c.current_proposal_id IS NULL "
        f"THEN nextval(pg_get_serial_sequence('{Proposal._meta.db_table}', 'id')) END "
        f"FROM {Case._meta.db_table} c JOIN {Policy._meta.db_table} pol ON pol.id = c.policy_id "
        "WHERE c.id = %(case)s",
        _BEGIN_TYPES,
    )


@functools.cache
def _begin_evidence_read() -> PreparedStatement:
    return PreparedStatement(evidence_sql("%(case)s"), _BEGIN_TYPES)


def _insert_sql(model, values: dict[str, str], *, select_from: str | None = None) -> str:
    """``INSERT`` of one row of ``model`` naming every column: a column added to the model
    without a value here fails at the first begin, instead of being left to its default."""
    columns = [f.column for f in model._meta.concrete_fields]
    missing = set(columns) - set(values) - {"id"}
    if missing or set(values) - set(columns):
        raise ImproperlyConfigured(f"begin's insert into {model._meta.db_table}: columns {sorted(missing)} unset")
    named = list(values)
    rows = (
        f"SELECT {', '.join(values.values())} FROM {select_from}"
        if select_from
        else (f"VALUES ({', '.join(values.values())})")
    )
    return f"INSERT INTO {model._meta.db_table} ({', '.join(named)}) {rows}"


@functools.cache
def _begin_write_statement() -> PreparedStatement:
    """The proposal, the case's pointer to it, the pause checkpoint and the pending review.

    Returns the pending review's id, or NULL when the case had a current proposal after all
    (the pointer did not move): the caller then rolls the whole transaction back. A unique
    violation (the operation's proposal or pending review exists) fails it likewise.
    """
    proposal = _insert_sql(
        Proposal,
        {
            "id": "%(proposal)s",
            "case_id": "%(case)s",
            "action": "%(action)s",
            "body": "%(body)s",
            "passages": "%(passages)s",
            "findings": "%(findings)s",
            "policy_snapshot": "%(policy_snapshot)s",
            "evidence_id": "%(evidence_id)s",
            "policy_id": "%(policy_id)s",
            "operation_id": "%(operation_id)s",
            "origin": f"'{Origin.PREPARED.value}'",
            "parent_id": "NULL",
            "author_id": "NULL",
            "unchecked_sentences": "'[]'",
            "created_at": "%(now)s",
        },
    )
    checkpoint = _insert_sql(
        WorkflowCheckpoint,
        {
            "checkpoint_id": "%(checkpoint_id)s",
            "workflow_name": "%(workflow_name)s",
            "graph_signature_hash": "%(graph_signature_hash)s",
            "previous_checkpoint_id": "%(previous_checkpoint_id)s",
            "iteration_count": "%(iteration_count)s",
            "payload": "%(payload)s",
            "digest": "%(digest)s",
            "created_at": "%(now)s",
        },
    )
    pending = _insert_sql(
        PendingReview,
        {
            "case_id": "%(case)s",
            "proposal_id": "p.id",
            "operation_id": "%(operation_id)s",
            "workflow_session_id": "%(session_id)s",
            "checkpoint_id": "%(checkpoint_id)s",
            "checkpoint_at": "%(now)s",
            "workflow_version": "%(workflow_version)s",
            "graph_fingerprint": "%(graph_fingerprint)s",
            "status": f"'{PendingReview.Status.PENDING.value}'",
            "begun_by_id": "%(begun_by)s",
            "begun_channel": "%(begun_channel)s",
            "created_at": "%(now)s",
            "updated_at": "%(now)s",
            "claimed_by_id": "NULL",
            "claimed_at": "NULL",
            "claim_expires_at": "NULL",
        },
        # Only once the case points at this proposal: never a pending review beside another current one.
        select_from="proposal p WHERE EXISTS (SELECT FROM pointer)",
    )
    return PreparedStatement(
        f"WITH proposal AS ({proposal} RETURNING id), "
        f"pointer AS (UPDATE {Case._meta.db_table} SET current_proposal_id = (SELECT id FROM proposal) "
        "WHERE id = %(case)s AND current_proposal_id IS NULL RETURNING id), "
        f"pause AS ({checkpoint}), "
        f"pending AS ({pending} RETURNING id) "
        "SELECT (SELECT id FROM pending)",
        _BEGIN_TYPES,
    )


@dataclass(frozen=True)
class _Opened:
    """What begin's first query string read under the case lock."""

    current_proposal_id: int | None
    policy: dict
    proposal_pk: int | None  # the first proposal's id, drawn when the case has none
    evidence: tuple[list[dict], list[dict]]


def _set_current_proposal_id(case: Case, pk: int | None) -> None:
    """The caller's case object follows the row read under the lock (as refresh_from_db would)."""
    if case.current_proposal_id != pk:
        if Case.current_proposal.is_cached(case):
            Case.current_proposal.field.delete_cached_value(case)
        case.current_proposal_id = pk


def _begin_open(case: Case, lock: CaseTransactionLock | None = None) -> _Opened:
    """The first query string of a begin transaction on PostgreSQL (call first thing inside
    ``transaction.atomic()``): BEGIN, the case lock (``lock``; None when the caller holds the
    session lock) and the reads, in one round trip."""
    with connection.cursor() as cursor:
        begin = begin_in_query_string()  # before any PREPARE: those run outside the transaction
        statements = [] if lock is None else [lock.sql]
        statements += [_begin_case_read().call_sql(cursor), _begin_evidence_read().call_sql(cursor)]
        _begin_write_statement().call_sql(cursor)  # prepared now, for the write after the run
        query = "; ".join(statements)
        cursor.execute(f"BEGIN; {query}" if begin else query, {**(lock.params if lock else {}), "case": case.pk})
        if lock is not None:
            lock.granted()
        results = []
        while True:
            if cursor.description is not None:
                results.append(cursor.fetchall())
            if not cursor.nextset():
                break
    (case_rows, evidence) = results[-2:]
    if not case_rows:
        raise NotFound(f"case {case.case_id} does not exist")
    current, name, label, parameters, proposal_pk = case_rows[0]
    _set_current_proposal_id(case, current)
    if isinstance(parameters, str):
        parameters = json.loads(parameters)
    policy = {"name": name, "label": label, "parameters": parameters}
    return _Opened(current, policy, proposal_pk, evidence_rows(evidence))


def _begin_lock(lock: CaseTransactionLock) -> None:
    """Only BEGIN and the case lock, in one round trip (the careful second try reads with the ORM)."""
    with connection.cursor() as cursor:
        begin = begin_in_query_string()
        cursor.execute(f"BEGIN; {lock.sql}" if begin else lock.sql, lock.params)
    lock.granted()


def _begin_first(case: Case, actor, channel: str, opened: _Opened) -> BeginResult:
    """The first begin of a case on PostgreSQL, inside the transaction ``_begin_open`` began:
    the proposal is built here, asked about by the engine run, and written with the pause and
    the pending review in one statement. ``_FirstBeginLost`` when the case had a proposal
    after all (the transaction must roll back)."""
    if opened.proposal_pk is None:
        raise _FirstBeginLost  # the case has a proposal by now: the general way finds it
    now = timezone.now()
    content = prepared_content(case, evidence=opened.evidence, policy=opened.policy)
    proposal = Proposal(
        id=opened.proposal_pk, origin=Origin.PREPARED, parent=None, author=None, created_at=now, **content
    )
    session_id, state, requests, buffer = _begin_run(case, actor, proposal=proposal)
    operation_id, _request, pause, payload = _pause_of_run(case, state, requests, buffer)
    if operation_id != proposal.operation_id:
        raise DecisionflowError(f"begin: the review request names {operation_id!r}, not the prepared proposal")
    begun_by = actor if getattr(actor, "is_authenticated", False) else None
    fingerprint, begun_channel = graph_fingerprint(), str(channel)[:20]
    params: dict[str, Any] = {
        "case": case.pk,
        "proposal": proposal.pk,
        "action": proposal.action,
        "body": proposal.body,
        "passages": json.dumps(proposal.passages),
        "findings": json.dumps(proposal.findings),
        "policy_snapshot": json.dumps(proposal.policy_snapshot),
        "evidence_id": proposal.evidence_id,
        "policy_id": proposal.policy_id,
        "operation_id": operation_id,
        "now": now,
        "checkpoint_id": pause.checkpoint_id,
        "workflow_name": pause.workflow_name,
        "graph_signature_hash": pause.graph_signature_hash,
        "previous_checkpoint_id": pause.previous_checkpoint_id,
        "iteration_count": pause.iteration_count,
        "payload": payload,
        "digest": payload_digest(payload),
        "session_id": session_id,
        "workflow_version": WORKFLOW_VERSION,
        "graph_fingerprint": fingerprint,
        "begun_by": getattr(begun_by, "pk", None),
        "begun_channel": begun_channel,
    }
    try:
        with connection.cursor() as cursor:
            cursor.execute(_begin_write_statement().call_sql(cursor), params)
            (pending_pk,) = cursor.fetchone()
    except IntegrityError as exc:
        raise _FirstBeginLost from exc
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            raise  # CaseBusy (CaseTransactionLock.waits), not a storage failure
        raise _not_stored(case, exc) from exc
    if pending_pk is None:
        raise _FirstBeginLost
    # Issue 7: killed with the pause checkpoint (and all of begin) written, not committed.
    crash_point("begin-during-checkpoint-save")
    proposal._state.adding, proposal._state.db = False, connection.alias
    case.current_proposal = proposal  # the caller's object follows, as proposal_create's CAS does
    pending = PendingReview(
        id=pending_pk,
        case=case,
        proposal=proposal,
        operation_id=operation_id,
        workflow_session_id=session_id,
        checkpoint_id=pause.checkpoint_id,
        checkpoint_at=now,
        workflow_version=WORKFLOW_VERSION,
        graph_fingerprint=fingerprint,
        status=PendingReview.Status.PENDING,
        begun_by=begun_by,
        begun_channel=begun_channel,
        created_at=now,
        updated_at=now,
    )
    pending._state.adding, pending._state.db = False, connection.alias
    notify(case=case, operation_id=operation_id, kind=NotificationKind.REVIEW_BEGUN)
    return BeginResult(PAUSED, operation_id, 1, pending, True)


def _begin_postgresql(case: Case, actor, channel: str) -> BeginResult:
    """``review_begin`` on PostgreSQL: one transaction, which holds the case lock."""
    lock = case_transaction_lock(case.case_id)
    with lock.waits():
        try:
            with transaction.atomic():
                opened = _begin_open(case, lock)
                if opened.proposal_pk is not None:
                    return _begin_first(case, actor, channel, opened)
                # The case has a proposal: the general way, under the lock this transaction holds.
                decided = _decided_begin(case, refresh=False)
                if decided is not None:
                    return decided
                return _begin_locked(case, actor, channel, refreshed=True)
        except _FirstBeginLost:
            pass
        with transaction.atomic():
            _begin_lock(lock)
            decided = _decided_begin(case)
            if decided is not None:
                return decided
            return _begin_locked(case, actor, channel, refreshed=True, careful=True)


def review_begin(*, case: Case, actor=None, channel: str = Channel.SERVICE) -> BeginResult:
    """Run ``prepare`` and pause at ``human-review-v1``; record the pending review.

    Invariant: one pending review per operation. Begin for a case that is already pending
    on its current operation reports that pending review and writes nothing, unless that
    pause cannot be resumed (another workflow version, a missing or refused checkpoint):
    then it pauses again and moves the pending review to the new checkpoint. The proposal,
    the pause checkpoint (the only one written) and the pending review commit together;
    ``WorkflowIncompatible`` if the pause could not be stored, and then nothing is
    recorded. Holds the case lock for the whole run (on PostgreSQL, for its one transaction:
    BEGIN, the lock and the reads in one round trip, then for a case's first proposal one
    statement that writes everything, then COMMIT; ``CaseBusy`` after the decision lock
    timeout, for the lock or any row it waits for). ``actor`` and ``channel`` are recorded
    on the pending review as who began it and how; the proposal itself has no human author.

    Decided means decided: for a case whose current proposal is decided, begin writes
    nothing and returns its reconcile state as ``status``, with ``decision``.
    """
    if connection.vendor == "postgresql":
        return _begin_postgresql(case, actor, channel)
    with case_lock(case.case_id):
        decided = _decided_begin(case)
        if decided is not None:
            return decided
        # _decided_begin read the current proposal under this lock: no second read.
        return _begin_locked(case, actor, channel, refreshed=True)


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


# --- bind before running ----------------------------------------------------------------


@functools.cache
def _pending_sql() -> tuple[str, list[str]]:
    # Raw SQL on the hot path of every decision: the ORM spent more time compiling this
    # (a join on a non-foreign key) than the database spent answering it.
    fields = [f.column for f in PendingReview._meta.concrete_fields if f.column]
    columns = [f"pr.{c}" for c in fields] + [f"ck.{c}" for c in DatabaseCheckpointStorage.COLUMNS]
    # Four eyes, without a query of its own on the common path: did the deciding user make any
    # human change in this case? Only then is the proposal's chain read (four_eyes_check).
    changed = (
        f"EXISTS (SELECT 1 FROM {Proposal._meta.db_table} hp WHERE hp.case_id = pr.case_id "
        "AND hp.origin <> %s AND hp.author_id = %s)"
    )
    sql = (
        f"SELECT {', '.join(columns)}, {changed} FROM {PendingReview._meta.db_table} pr "
        f"LEFT JOIN {WorkflowCheckpoint._meta.db_table} ck ON ck.checkpoint_id = pr.checkpoint_id "
        "WHERE pr.case_id = %s AND pr.operation_id = %s"
    )
    return sql, fields


def _pending_with_checkpoint(case: Case, operation_id: str, reviewer=None) -> PendingReview | None:
    """The operation's pending review with its checkpoint row's columns, in one query; its
    ``reviewer_changed_case`` says whether ``reviewer`` made a human change in the case."""
    sql, fields = _pending_sql()
    with connection.cursor() as cursor:
        cursor.execute(sql, [Origin.PREPARED.value, getattr(reviewer, "pk", None), case.pk, operation_id])
        row = cursor.fetchone()
    if row is None:
        return None
    pending = PendingReview.from_db(connection.alias, fields, row[: len(fields)])
    for name, value in zip(DatabaseCheckpointStorage.COLUMNS, row[len(fields) : -1], strict=True):
        setattr(pending, f"checkpoint_{name}", value)
    pending.reviewer_changed_case = bool(row[-1])
    return pending


def _no_pending_review(case: Case, operation_id: str) -> DecisionflowError:
    older = Proposal.objects.filter(case=case, operation_id=operation_id).exists()
    current = decidable_operation_id(case)
    if older and current != operation_id:
        return StaleProposal(
            f"stale: {identity.short(operation_id)} is not the current proposal of case {case.case_id}; "
            f"the current one is {identity.short(current or '')}",
            current_operation_id=current,
        )
    return NotFound(
        f"no pending review for case {case.case_id} and operation {identity.short(operation_id)}; "
        f"the case's decidable operation is {identity.short(current or '')}"
    )


@counts_refusals(CHECKPOINT_REFUSED, WorkflowIncompatible)
def _bound_checkpoint(case: Case, pending: PendingReview) -> EngineCheckpoint:
    """Prove that ``pending``'s checkpoint is the pause of this case's review of this operation.

    Runs before the engine executes anything. Refuses (``WorkflowIncompatible``) a pause of
    another workflow version or graph, a checkpoint whose HMAC does not verify, one whose
    pending request names another case or operation, and one holding any message in flight
    (a checkpoint saved mid-commit still carries the approval it was delivering).
    """
    op = identity.short(pending.operation_id)
    if pending.workflow_version != WORKFLOW_VERSION:
        raise WorkflowIncompatible(
            f"incompatible workflow version: the pending review of {op} was recorded by workflow "
            f"{pending.workflow_version}, this is {WORKFLOW_VERSION}; it will not be resumed across versions. "
            f"Run `manage.py begin {case.case_id}` (or `manage.py drain_workflow --from {pending.workflow_version} "
            f"--apply` for every such case) to pause it again on {WORKFLOW_VERSION}"
        )
    if pending.graph_fingerprint != graph_fingerprint():
        raise WorkflowIncompatible(
            f"incompatible workflow graph: the pending review of {op} was recorded by a graph with the "
            f"fingerprint {short_fingerprint(pending.graph_fingerprint)}, this code's is "
            f"{short_fingerprint(graph_fingerprint())} (executors, edges or message schemas changed); it will "
            f"not be resumed. Run `manage.py drain_workflow --from {pending.workflow_version} --apply` (or "
            f"`manage.py begin {case.case_id}`) to pause it again on this graph"
        )
    where = f"checkpoint {pending.checkpoint_id}"
    # HMAC, JSON only, no pickle; from the columns read with the pending review, if they were.
    columns = {c: getattr(pending, f"checkpoint_{c}", None) for c in DatabaseCheckpointStorage.COLUMNS}
    if columns["payload"] is not None:
        checkpoint = DatabaseCheckpointStorage.from_row(pending.checkpoint_id, columns)
    else:
        checkpoint = DatabaseCheckpointStorage().load_sync(pending.checkpoint_id)
    if checkpoint.graph_signature_hash != GRAPH_SIGNATURE_HASH:
        raise WorkflowIncompatible(
            f"incompatible workflow graph: {where} was saved by another graph "
            f"({checkpoint.graph_signature_hash[:12]}…, this is {GRAPH_SIGNATURE_HASH[:12]}…); nothing ran"
        )
    in_flight = sum(len(messages) for messages in checkpoint.messages.values())
    if in_flight:
        raise WorkflowIncompatible(
            f"{where} is not a pause: it holds {in_flight} message(s) in flight; refusing to resume it, nothing ran"
        )
    wanted = review_request_id(pending.operation_id)
    requests = checkpoint.pending_request_info_events
    request = requests.get(wanted)
    data = request.data if request is not None and isinstance(request.data, dict) else {}
    if (
        set(requests) != {wanted}
        or request is None
        or request.source_executor_id != HUMAN_REVIEW_ID
        or data.get("case_id") != case.case_id
        or data.get("case_pk") != case.pk
        or data.get("operation_id") != pending.operation_id
    ):
        named = ", ".join(sorted(requests)) or "no request"
        raise WorkflowIncompatible(
            f"{where} does not belong to case {case.case_id} and operation {op}: it holds {named[:200]}; "
            "refusing to resume it, nothing ran"
        )
    if data.get("workflow_version") != WORKFLOW_VERSION:
        raise WorkflowIncompatible(
            f"incompatible workflow version: {where} holds a request of workflow "
            f"{data.get('workflow_version')!r}, this is {WORKFLOW_VERSION}; nothing ran"
        )
    if data.get("graph_fingerprint") != graph_fingerprint():
        raise WorkflowIncompatible(
            f"incompatible workflow graph: {where} holds a request of the graph fingerprint "
            f"{short_fingerprint(str(data.get('graph_fingerprint') or ''))}, this code's is "
            f"{short_fingerprint(graph_fingerprint())}; nothing ran"
        )
    return checkpoint


# --- answer -----------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """The decision as the response message carries it. Non-JSON values become their repr,
    so the review core still sees (and refuses, and records) a non-boolean."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def _answer(
    checkpoint: EngineCheckpoint,
    *,
    operation_id: str,
    approved,
    reviewer,
    channel: str,
    fault,
    decline_reason: str | None = None,
    decline_note: str | None = None,
) -> CommitResult:
    """Restore the bound checkpoint and answer its request: one engine run, one crossing."""
    answer = Answer(reviewer=reviewer, fault=fault)
    response = conform(
        "response",
        {
            "approved": _jsonable(approved),
            "reviewer_pk": getattr(reviewer, "pk", None) if getattr(reviewer, "is_authenticated", False) else None,
            "channel": str(channel)[:20],
            "decline_reason": decline_reason,
            "decline_note": decline_note,
        },
    )
    short = identity.short(operation_id)
    # The thread's resume workflow (a fresh one after any failure): see engine.resume_workflow.
    with resume_workflow(answer) as workflow:
        try:
            run = run_on_caller(
                _run,
                workflow,
                checkpoint_id=checkpoint.checkpoint_id,
                responses={review_request_id(operation_id): response},
                checkpoint_storage=BoundCheckpoint(checkpoint),
            )
        except DecisionflowError:
            # Refusals of the review core (stale, not a boolean, no permission, busy) are raised
            # before its transaction writes; it recorded the attempt. OutcomeUncertain passes too.
            raise
        except WorkflowCheckpointException as exc:
            raise WorkflowIncompatible(
                f"resume: checkpoint {checkpoint.checkpoint_id} cannot be restored: {exc}"
            ) from exc
        except Exception as exc:
            if answer.commit_started:
                raise OutcomeUncertain(
                    f"outcome uncertain: the commit step failed after it may have written ({type(exc).__name__}); "
                    f"run `manage.py reconcile` to see whether {short} committed",
                    operation_id=operation_id,
                    error=f"{type(exc).__name__}: {exc}",
                ) from exc
            raise WorkflowIncompatible(
                f"resume: checkpoint {checkpoint.checkpoint_id} could not be restored and answered "
                f"({type(exc).__name__}: {exc}); the commit step did not run"
            ) from exc
        failures = [event for event in run if event.type in ("executor_failed", "failed")]
        if failures or answer.result is None or len(run.get_outputs()) != 1:
            if not answer.commit_started:
                raise WorkflowIncompatible(
                    f"resume: the answered run of checkpoint {checkpoint.checkpoint_id} ended "
                    f"{status_name(run.get_final_state())} before the commit step; nothing was written"
                )
            # Silence is not success.
            raise OutcomeUncertain(
                f"outcome uncertain: the answered run ended {status_name(run.get_final_state())} without a receipt; "
                f"run `manage.py reconcile` to see whether {short} committed",
                operation_id=operation_id,
            )
        return answer.result


# --- the one decision service -----------------------------------------------------------


def _check_fault(fault: str | None) -> None:
    if fault is None:
        return
    if fault not in FAULTS:
        raise InvalidInput(f"unknown fault {fault!r}; the faults are {', '.join(FAULTS)}")
    if not faults.enabled():
        raise InvalidInput(f"the fault {fault} is accepted only when DECISIONFLOW_FAULT_INJECTION=1")


def _outcome(commit: CommitResult) -> Outcome:
    if commit.replay:
        return Outcome.REPLAY
    return Outcome.DECLINED if commit.status == DECLINED else Outcome.COMMITTED


def _conflict(commit: CommitResult) -> ConflictingDecision:
    decision = commit.decision
    if decision is not None:
        done = f"already {'approved' if decision.approved else 'declined'} by {decision.reviewer.get_username()}"
    else:
        done = "already decided the other way"
    return ConflictingDecision(
        f"conflicting decision: {identity.short(commit.operation_id)} was {done}; no decision or effect was written",
        result=commit,
        operation_id=commit.operation_id,
    )


@observed_decision  # one metric increment and one JSON event line per call
def decision_record(
    *,
    case: Case,
    operation_id: str,
    approved: bool,
    reviewer,
    channel: str,
    fault: str | None = None,
    decline_reason: str | None = None,
    decline_note: str | None = None,
) -> DecisionResult:
    """Approve or decline ``operation_id`` of ``case`` as ``reviewer``: the one decision service.

    ``reviewer`` is the user the channel authenticated. Begins the review first when the
    named operation is the case's decidable one and was never begun (for every channel
    alike). Returns the outcome (committed, declined, replay); every refusal is an error
    class carrying its exit code and HTTP status: ``StaleProposal``, ``NotFound``,
    ``PermissionRefused``, ``InvalidInput``, ``WorkflowIncompatible`` (the pause fails a
    binding check: nothing ran), ``CaseBusy`` (another action held the case past the
    timeout), ``ConflictingDecision`` (the opposite decision stands; it carries the
    receipt) and ``OutcomeUncertain`` (the commit may have happened: ask reconcile).

    Invariant: one decision and at most one effect per operation, whatever the channel,
    however often it is called. Every refusal writes no decision and no effect, and is
    recorded as a commit attempt.

    A decline may carry ``decline_reason`` (one of ``DeclineReason``, never ``expired``) and
    a free-text ``decline_note``; an unknown reason is refused (``InvalidInput``) before
    anything runs. A second decline is a replay: the first reason stands.
    """
    operation_id = str(operation_id)
    _check_fault(fault)  # a test-only switch, refused before the decision is looked at
    answer_started = False
    try:
        decline_reason_check(approved=approved, decline_reason=decline_reason, decline_note=decline_note)
        with sqlite_bounded_wait():
            pending = _pending_with_checkpoint(case, operation_id, reviewer)
            begun = False
            if pending is None and identity.is_operation_id(operation_id):
                pending, begun = _begin_if_decidable(case, operation_id, reviewer, channel)
            if pending is None:
                raise _no_pending_review(case, operation_id)
            # Decided, and its pause checkpoint pruned since (reviews/retention.py): the decision
            # stands, so the review core answers a retry (replay or conflict) without the engine,
            # exactly as the answered run's commit step would.
            pruned = _pause_pruned(pending)
            checkpoint = None if pruned else _bound_checkpoint(case, pending)
            if approved is True and pending.reviewer_changed_case:
                four_eyes_check(proposal_pk=pending.proposal_id, reviewer=reviewer, case_pk=case.pk)
            answer_started = True
            if checkpoint is None:
                commit = effect_commit(
                    operation_id=operation_id,
                    approved=approved,
                    reviewer=reviewer,
                    channel=str(channel)[:20],
                    decline_reason=decline_reason,
                    decline_note=decline_note,
                )
            else:
                commit = _answer(
                    checkpoint,
                    operation_id=operation_id,
                    approved=approved,
                    reviewer=reviewer,
                    channel=channel,
                    fault=fault,
                    decline_reason=decline_reason,
                    decline_note=decline_note,
                )
    except OutcomeUncertain:
        raise
    except DecisionflowError as exc:
        if not answer_started or isinstance(exc, WorkflowIncompatible):
            # The review core records its own refusals; these happened before it ran.
            _record_refusal(case, operation_id, approved, reviewer, channel, exc)
        raise
    if commit.status == CONFLICTING:
        raise _conflict(commit)
    return DecisionResult(outcome=_outcome(commit), commit=commit, checkpoint_id=pending.checkpoint_id, begun=begun)


def _pause_pruned(pending: PendingReview) -> bool:
    """A completed review whose checkpoint row is gone (the join found none): pruned."""
    return pending.status == PendingReview.Status.COMPLETED and getattr(pending, "checkpoint_payload", 0) is None


def _begin_if_decidable(case: Case, operation_id: str, reviewer, channel: str) -> tuple[PendingReview | None, bool]:
    """Begin the review of ``operation_id`` if it is the case's decidable operation.

    Only here does a decision take the case lock (begin writes the proposal and the pause);
    a decision on a begun review is ordered by the case row lock inside its commit.
    """
    reviewer_check(reviewer)  # nobody without the permission begins anything
    if operation_id != decidable_operation_id(case):
        return None, False
    with case_lock(case.case_id):
        # Another decision may have begun it while we waited for the lock.
        pending = _pending_with_checkpoint(case, operation_id, reviewer)
        if pending is not None:
            return pending, False
        _begin_locked(case, reviewer, channel)
        return _pending_with_checkpoint(case, operation_id, reviewer), True


def refusal_record(
    *, case: Case, operation_id: str, approved, reviewer, channel: str, error: DecisionflowError
) -> None:
    """The attempt row of a decision a channel refused before calling ``decision_record``
    (an authenticated user without the permission, a click without a decision)."""
    _record_refusal(case, operation_id, approved, reviewer, channel, error)


def _record_refusal(case, operation_id, approved, reviewer, channel, exc: DecisionflowError) -> None:
    outcome = CommitAttempt.Outcome.STALE if isinstance(exc, StaleProposal) else CommitAttempt.Outcome.REFUSED
    try:
        attempt_record(
            operation_id=operation_id,
            case=case,
            approved=approved,
            reviewer=reviewer,
            channel=channel,
            outcome=outcome,
            detail=f"{exc.code}: {exc.message}",
            reason=exc.reason,
        )
    except (CaseBusy, DatabaseError) as error:
        # The refusal stands whether or not the audit row could be written (a busy case
        # may still hold the row lock the attempt's foreign key needs).
        log.warning("could not record the refused attempt on %s: %s", operation_id, error)


# --- four eyes --------------------------------------------------------------------------


def four_eyes_enabled() -> bool:
    return bool(getattr(settings, "DECISIONFLOW_FOUR_EYES", True))


def human_changers(proposal_pk: int, case_pk: int | None = None) -> dict[int, Proposal]:
    """Everyone who made a human change in this proposal or in an edit it builds on.

    Maps each person's user pk to the nearest proposal they made. An edit of an edit still
    carries the first editor's sentences, so the whole chain of human proposals counts,
    back to what the pipeline prepared. One query: the case's human proposals only (a case
    nobody edited returns none).
    """
    if case_pk is None:
        case_pk = Proposal.objects.filter(pk=proposal_pk).values_list("case_id", flat=True).first()
    if case_pk is None:
        return {}
    chain = {
        p.pk: p
        for p in Proposal.objects.filter(case_id=case_pk)
        .exclude(origin=Origin.PREPARED)
        .only("pk", "parent_id", "author_id", "origin", "operation_id")
        .order_by()
    }
    changers: dict[int, Proposal] = {}
    current: int | None = proposal_pk
    while current in chain:
        proposal = chain[current]
        if proposal.author_id is not None:
            changers.setdefault(proposal.author_id, proposal)
        current = proposal.parent_id
    return changers


def four_eyes_refusal(*, proposal_pk: int, reviewer, case_pk: int | None = None) -> FourEyesRefused | None:
    """The refusal an approval of this proposal by ``reviewer`` would get, or None.

    Four eyes: whoever made a human change (a body edit or an evidence change) cannot approve
    that proposal; they may decline it. Off with ``DECISIONFLOW_FOUR_EYES=0``.
    """
    pk = getattr(reviewer, "pk", None)
    if pk is None or not four_eyes_enabled():
        return None
    changed = human_changers(proposal_pk, case_pk).get(pk)
    if changed is None:
        return None
    return FourEyesRefused(
        f"four eyes: {reviewer.get_username()} made the {changed.get_origin_display().lower()} "
        f"{identity.short(changed.operation_id)} in this proposal, so another reviewer must approve it "
        "(you may decline it); nothing was written",
        change=changed.get_origin_display().lower(),
        changed_operation_id=changed.operation_id,
    )


def four_eyes_check(*, proposal_pk: int, reviewer, case_pk: int | None = None) -> None:
    refusal = four_eyes_refusal(proposal_pk=proposal_pk, reviewer=reviewer, case_pk=case_pk)
    if refusal is not None:
        raise refusal


# --- edit -------------------------------------------------------------------------------


def review_edit(
    *,
    case: Case,
    expected_operation_id: str,
    body: str | None = None,
    source_versions: dict[str, int] | None = None,
    editor,
    channel: str = Channel.SERVICE,
) -> EditResult:
    """Revise the current proposal (``proposal_revise``) and begin the workflow for the new one.

    The editor needs the review permission. A stale ``expected_operation_id`` is refused
    and writes nothing. When the revision changes the identity, the case's other pending
    reviews are marked superseded (resuming one is refused as stale by the review core),
    and the workflow is begun for the new proposal. The revision commits before begin
    runs: if begin fails, the new proposal is saved and current, and the result says so
    (``begin_error``); the first decision on it, or ``manage.py begin``, begins it.
    """
    reviewer_check(editor)
    with case_lock(case.case_id):
        with transaction.atomic():
            revision = proposal_revise(
                case=case,
                expected_operation_id=expected_operation_id,
                body=body,
                source_versions=source_versions,
                editor=editor,
            )
            if revision.changed:
                # update() skips auto_now; checkpoint retention counts its window from this time.
                PendingReview.objects.filter(case=case, status=PendingReview.Status.PENDING).exclude(
                    operation_id=revision.proposal.operation_id
                ).update(status=PendingReview.Status.SUPERSEDED, updated_at=timezone.now())
        if not revision.changed:
            return EditResult(revision, None)
        try:
            return EditResult(revision, _begin_locked(case, editor, channel))
        except DecisionflowError as exc:
            # Not a warning on the console: every channel reports it to the person who edited.
            log.info("edit of case %s saved; beginning its review failed: %s", case.case_id, exc.message)
            return EditResult(revision, None, exc)
