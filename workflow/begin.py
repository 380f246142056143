"""Begin: run ``prepare`` and pause at the human step; record the pending review.

One pending review per operation. On PostgreSQL a case's first begin is one transaction:
BEGIN, the case lock and the reads, one write statement, COMMIT. SQLite runs the ORM path
under its file lock.
"""

from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass
from typing import Any

from agent_framework import WorkflowCheckpoint as EngineCheckpoint
from agent_framework import WorkflowRunState
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from cases.models import Case, Policy
from cases.selectors import evidence_rows, evidence_sql
from core.errors import DecisionflowError, NotFound, WorkflowIncompatible
from core.faults import crash_point
from core.locks import LOCK_NOT_AVAILABLE, CaseTransactionLock, case_lock, case_transaction_lock
from core.prepared import PreparedStatement, begin_in_query_string
from effects.services import COMMITTED, DECLINED, operation_reconcile
from engine.checkpoints import DatabaseCheckpointStorage, PauseBuffer, encode_checkpoint, payload_digest
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
from reviews.notifications import notify
from reviews.services import prepared_content
from workflow.bind import bound_checkpoint

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


def _begin_run(
    case: Case, actor, *, first: bool = False, proposal: Proposal | None = None
) -> tuple[str, Any, list, PauseBuffer]:
    session_id = f"ws-{uuid.uuid4().hex}"
    buffer = PauseBuffer()
    begin = Begin(case=case, actor=actor, first=first, proposal=proposal)
    workflow = build_workflow(begin=begin, checkpoint_storage=buffer)
    message = conform("start", {"case_pk": case.pk, "actor_pk": getattr(actor, "pk", None), "session_id": session_id})
    try:
        result = run_on_caller(run_workflow, workflow, message=message)
    except (DecisionflowError, DatabaseError):
        raise
    except Exception as exc:
        raise DecisionflowError(f"begin: the workflow failed in prepare: {type(exc).__name__}: {exc}") from exc
    return session_id, result.get_final_state(), result.get_request_info_events(), buffer


def begin_under_lock(
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


#
# review_begin on PostgreSQL sends (core/prepared.py for the BEGIN and PREPARE):
#   1. one query string: BEGIN; SET LOCAL lock_timeout; the case's advisory lock for this
#      transaction; the case's current proposal and policy (and, for a case without a
#      proposal, the new proposal's id from the table's sequence); its passages and findings;
#   2. for a case's first proposal (the common begin), after the engine run: one statement
#      that inserts the proposal, points the case at it (compare-and-swap from none), inserts
#      the pause checkpoint and the pending review;
#   3. COMMIT.
# A case that has a proposal goes the general way (``begin_under_lock``) inside the same
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
                return begin_under_lock(case, actor, channel, refreshed=True)
        except _FirstBeginLost:
            pass
        with transaction.atomic():
            _begin_lock(lock)
            decided = _decided_begin(case)
            if decided is not None:
                return decided
            return begin_under_lock(case, actor, channel, refreshed=True, careful=True)


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
        return begin_under_lock(case, actor, channel, refreshed=True)


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
