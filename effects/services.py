"""Commit (decision + effect in one transaction), reconciliation, and repair.

The unique constraints on ``operation_id`` are the atomic step of commit: every insert is
attempted, and a conflict is read back as a replay or a conflict. Nothing checks first and
writes later.

On PostgreSQL a commit is two round trips, half as many as two bare inserts: one query
string with BEGIN, ``SET LOCAL lock_timeout``, the statement that locks the case row and
the one data-modifying statement (proposal lookup, decision, effect, attempt row, pending
review), both prepared once per session; then COMMIT. SQLite runs the same steps through
the ORM in one IMMEDIATE transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any, NamedTuple

import psycopg
from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, Error, OperationalError, connection, connections, transaction
from django.utils import timezone

from cases.models import Case
from core import identity, text
from core.errors import (
    CaseBusy,
    DecisionflowError,
    DecisionOmitted,
    InvalidInput,
    NotFound,
    OutcomeUncertain,
    PermissionRefused,
    RefusalReason,
    StaleProposal,
)
from core.faults import crash_point
from core.locks import decision_lock_timeout
from core.observability import observed_commit
from core.outcomes import OperationState, ReceiptStatus
from core.prepared import PreparedStatement, begin_in_query_string
from effects.delivery import delivery_attempt, delivery_configured, delivery_fields, duration_setting, worker_name
from effects.models import CommitAttempt, Delivery, DeliveryState, EffectRecord
from effects.tasks import delivery_enqueue, delivery_sweep_and_enqueue
from reviews.models import HUMAN_DECLINE_REASONS, DeclineReason, PendingReview, Proposal, ReviewDecision, SystemActor

log = logging.getLogger(__name__)

REVIEW_PERMISSION = "reviews.review_proposal"

# A receipt's status (``CommitResult.status``), and the reconcile state repair looks for.
COMMITTED = ReceiptStatus.COMMITTED
DECLINED = ReceiptStatus.DECLINED
CONFLICTING = ReceiptStatus.CONFLICTING
NO_LOCAL_EFFECT = OperationState.NO_LOCAL_EFFECT

# PostgreSQL's lock_not_available: a lock wait outlasted lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"


@dataclass(frozen=True)
class CommitResult:
    status: str
    replay: bool
    effect_count: int
    operation_id: str
    decision: ReviewDecision | None = field(default=None, compare=False)

    def receipt(self) -> dict:
        """The compact receipt the commands print: exactly these three keys."""
        return {"Status": self.status, "Replay": self.replay, "EffectCount": self.effect_count}


def reviewer_check(reviewer) -> None:
    if reviewer is None or not getattr(reviewer, "is_authenticated", False) or not reviewer.is_active:
        raise PermissionRefused("a decision needs an authenticated, active reviewer")
    if not reviewer.has_perm(REVIEW_PERMISSION):
        raise PermissionRefused(f"{reviewer.get_username()} does not have the review permission")


def _attempt(
    *, operation_id, case_id, approved, reviewer, outcome, channel, detail="", reason=None, decline=(None, None)
):
    # Every call appends one row, through the one-statement insert (no ORM save machinery:
    # this is on every commit's path).
    _insert_row(
        CommitAttempt,
        _attempt_fields(operation_id, case_id, approved, reviewer, outcome, channel, detail, reason, decline),
    )


def _attempt_fields(
    operation_id, case_id, approved, reviewer, outcome, channel, detail, reason=None, decline=(None, None)
) -> dict:
    decline_reason, decline_note = decline
    return {
        "operation_id": str(operation_id)[:200],
        "case_id": case_id,
        "approved": approved if isinstance(approved, bool) else None,
        "reviewer": reviewer if getattr(reviewer, "pk", None) else None,
        "outcome": outcome,
        "channel": channel,
        "detail": detail[:2000],
        "reason": RefusalReason(reason).value if reason else None,
        # Only a known reason is kept: a refused attempt may carry anything at all.
        "decline_reason": decline_reason if decline_reason in DeclineReason.values else None,
        "decline_note": decline_note[:2000] if isinstance(decline_note, str) else None,
    }


DECLINE_NOTE_MAX = 2000


def decline_reason_check(*, approved, decline_reason, decline_note, system_actor=None) -> None:
    """Refuse a decline reason that is not one of the documented set (docs/QUEUE.md).

    A reason goes with a decline only; ``expired`` is the system actor's alone, and the
    system actor gives nothing else (the database's ``decision_expired_iff_system_actor``
    says the same). The note is optional free text under the text policy.
    """
    if decline_reason is None and decline_note is None and system_actor is None:
        return
    if approved is not False:
        raise InvalidInput("a decline reason or note goes with a decline only", field="reason")
    if system_actor is not None:
        if system_actor not in SystemActor.values or decline_reason != DeclineReason.EXPIRED:
            raise InvalidInput(f"the system actor {system_actor!r} may only decline with reason expired")
    elif decline_reason is not None and decline_reason not in HUMAN_DECLINE_REASONS:
        raise InvalidInput(
            f"unknown decline reason {str(decline_reason)[:40]!r}; the reasons are {', '.join(HUMAN_DECLINE_REASONS)}"
            " (expired is reserved for the system)",
            field="reason",
        )
    if decline_note is not None:
        text.check_text(decline_note, field="note", max_length=DECLINE_NOTE_MAX)


def attempt_record(
    *,
    operation_id,
    case: Case | None,
    approved,
    reviewer,
    channel: str,
    outcome: str,
    detail: str = "",
    reason: str | None = None,
) -> None:
    """Append one ``CommitAttempt`` for a call that ended before a commit could record it.

    It never waits for the case row, which is often the very reason the call was refused
    (``CaseBusy``): the row's references are not checked by the database (migration 0009),
    so no lock is taken on the case or the user. One statement, in the caller's transaction
    if there is one (autocommit otherwise).
    """
    _attempt(
        operation_id=operation_id,
        case_id=case.pk if case is not None else None,
        approved=approved,
        reviewer=reviewer,
        channel=channel,
        outcome=outcome,
        detail=detail,
        reason=reason,
    )


def _effect_fields(proposal: Proposal, decision: ReviewDecision) -> dict:
    # PostgreSQL's commit statement builds the same row in SQL (_commit_sql); keep them alike.
    return {
        "operation_id": proposal.operation_id,
        "decision": decision,
        "case_id": proposal.case_id,
        "proposal": proposal,
        "action": proposal.action,
        "body": proposal.body,
        "evidence_id": proposal.evidence_id,
        "source_versions": {p["source_id"]: p["version"] for p in proposal.passages},
        "policy_id": proposal.policy_id,
        "policy_snapshot": proposal.policy_snapshot,
        "reviewer_id": decision.reviewer_id,
    }


def _insert_once(model, **fields):
    """Insert a write-once row and return it; None when the unique key already holds one.

    One statement, ``INSERT ... ON CONFLICT (operation_id) DO NOTHING RETURNING id``: the
    unique key is still the atomic step, but the database absorbs the conflict instead of
    raising it, so no savepoint is needed to keep the transaction usable. Any other
    violation still raises. (RETURNING needs SQLite 3.35 or later.)
    """
    return _insert_row(model, fields, on_conflict="operation_id")


def _insert_row(model, fields: dict, *, on_conflict: str | None = None):
    """One INSERT ... RETURNING id for a new row of ``model`` (a write-once model: no save()
    logic or signals to skip); with ``on_conflict``, a conflict on that unique column
    inserts nothing and returns None."""
    obj = model(**fields)
    opts = model._meta
    columns = [f for f in opts.local_concrete_fields if not f.primary_key]
    qn = connection.ops.quote_name
    # pre_save fills auto_now_add timestamps on obj, exactly as Model.save() would.
    values = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in columns]
    conflict = f"ON CONFLICT ({qn(opts.get_field(on_conflict).column)}) DO NOTHING " if on_conflict else ""
    sql = (
        f"INSERT INTO {qn(opts.db_table)} ({', '.join(qn(f.column) for f in columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))}) {conflict}RETURNING {qn(opts.pk.column)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        row = cursor.fetchone()
    if row is None:
        return None
    obj.pk = row[0]
    obj._state.adding = False
    obj._state.db = connection.alias
    return obj


@dataclass
class _Call:
    """One call of effect_commit: what its attempt row needs, learnt as the commit goes."""

    operation_id: Any
    approved: Any
    reviewer: Any
    channel: str
    decline_reason: str | None = None
    decline_note: str | None = None
    system_actor: str | None = None
    case_pk: int | None = None
    case_known: bool = False
    # True once this call's attempt row is written, or must not be tried again.
    recorded: bool = False
    # True once COMMIT may have been sent: from then on only the effect store knows.
    commit_sent: bool = False

    def record(self, outcome: str, detail: str = "", reason: str | None = None) -> None:
        if not self.case_known and identity.is_operation_id(self.operation_id):
            # Only refusals before the commit get here; the commit learns the case itself.
            found = Proposal.objects.filter(operation_id=self.operation_id).order_by()
            self.case_pk = next(iter(found.values_list("case_id", flat=True)[:1]), None)
        _attempt(
            operation_id=self.operation_id,
            case_id=self.case_pk,
            approved=self.approved,
            reviewer=self.reviewer,
            outcome=outcome,
            channel=self.channel,
            detail=detail,
            reason=reason,
            decline=(self.decline_reason, self.decline_note),
        )
        self.recorded = True


def _result(outcome: str, *, approved: bool, effect_count: int, operation_id: str, decision) -> CommitResult:
    if outcome == CommitAttempt.Outcome.CONFLICT:
        return CommitResult(CONFLICTING, False, effect_count, operation_id, decision)
    status = COMMITTED if approved else DECLINED
    return CommitResult(status, outcome == CommitAttempt.Outcome.REPLAY, effect_count, operation_id, decision)


def _stale(operation_id: str, case_label: str, current: str | None) -> StaleProposal:
    return StaleProposal(
        f"stale: {identity.short(operation_id)} is not the current proposal of case "
        f"{case_label}; the current one is {identity.short(current or '')}",
        current_operation_id=current,
        case_id=case_label,
    )


def _not_found(operation_id: str) -> NotFound:
    return NotFound(f"no proposal has operation {operation_id}")


class _CaseLockTimeout(Exception):
    """The case row stayed locked past lock_timeout; raised inside the transaction so that
    it rolls back, and answered as CaseBusy outside it."""


def _lock_timeout_ms() -> int:
    # lock_timeout = 0 would mean "wait forever": the shortest wait PostgreSQL takes is 1 ms.
    return max(1, round(decision_lock_timeout() * 1000))


def _is_lock_timeout(exc: BaseException) -> bool:
    return getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE


# FOR NO KEY UPDATE, not FOR UPDATE: it does not block the FOR KEY SHARE that the foreign
# keys of the commit's own rows (decision, effect, delivery) and of other tables take on the
# case row. Commits and edits (which update the row) still exclude each other. It returns
# the case row's id only to say that the lock was granted; what the commit needs of the
# case and the proposal, the commit statement reads after it.
_LOCK_SQL = f"""
    SELECT c.id
    FROM {Proposal._meta.db_table} p JOIN {Case._meta.db_table} c ON c.id = p.case_id
    WHERE p.operation_id = %(operation_id)s
    FOR NO KEY UPDATE OF c
"""

# Outcomes that write nothing but their attempt row (see _commit_sql's last column).
_NOTHING_NEW = (CommitAttempt.Outcome.REPLAY.value, CommitAttempt.Outcome.CONFLICT.value)


@cache
def _commit_sql() -> str:
    """The decision, its effect, the attempt row and the pending review, in one statement.

    It runs right after the case row lock, in the same round trip, so the checks the lock
    protects are made here, in SQL: target is the proposal named by the operation, with its
    case; current is target only while it is still the case's current proposal (empty when
    the operation is unknown or stale, and then nothing below writes). new_decision is the
    atomic step; standing is the decision that holds (just inserted, or the one already
    there); new_effect is written only for an approval whose standing decision is an
    approval; the attempt's outcome is computed from both; and the pending review is
    completed for every outcome that reaches a decision. One write-once CTE per row; a new
    row of the commit joins as one more CTE.

    The statement always returns one row: the target (NULLs when unknown), the current
    proposal's operation for a stale answer, then the outcome (NULL when nothing was
    decided). Its last column turns ``synchronous_commit`` off for this transaction only when
    the outcome wrote nothing but its audit row (a replay or a conflict that completed no
    pending review): see docs/PERFORMANCE.md. A fresh decision or effect is always flushed.
    A new CTE that can write on a replay or a conflict must join that condition; a new
    parameter goes into _PARAMETER_TYPES.
    """
    user = get_user_model()
    username = next(f.column for f in user._meta.concrete_fields if f.name == user.USERNAME_FIELD)
    outcome = CommitAttempt.Outcome
    return _compact(f"""
    WITH target AS (
        SELECT p.id, p.case_id, p.action, p.body, p.evidence_id, p.passages, p.policy_id, p.policy_snapshot,
               c.case_id AS case_label, c.current_proposal_id
        FROM {Proposal._meta.db_table} p JOIN {Case._meta.db_table} c ON c.id = p.case_id
        WHERE p.operation_id = %(operation_id)s
    ), current AS (
        SELECT * FROM target WHERE current_proposal_id = id
    ), new_decision AS (
        INSERT INTO {ReviewDecision._meta.db_table} (
            operation_id, proposal_id, approved, reviewer_id, decided_at, decline_reason, decline_note, system_actor
        )
        SELECT %(operation_id)s, cur.id, %(approved)s, %(reviewer)s, %(now)s,
               %(decline_reason)s, %(decline_note)s, %(system_actor)s
        FROM current cur
        -- A replay skips the insert's conflict machinery when its snapshot already holds the
        -- decision; ON CONFLICT stays the atomic step for any decision the snapshot lacks.
        WHERE NOT EXISTS (SELECT FROM {ReviewDecision._meta.db_table} WHERE operation_id = %(operation_id)s)
        ON CONFLICT (operation_id) DO NOTHING
        RETURNING id, approved, reviewer_id, decided_at, decline_reason, decline_note, system_actor
    ), standing AS (
        SELECT id, approved, reviewer_id, decided_at, decline_reason, decline_note, system_actor, TRUE AS is_new
        FROM new_decision
        UNION ALL
        SELECT id, approved, reviewer_id, decided_at, decline_reason, decline_note, system_actor, FALSE
        FROM {ReviewDecision._meta.db_table}
        WHERE operation_id = %(operation_id)s AND EXISTS (SELECT FROM current) AND NOT EXISTS (SELECT FROM new_decision)
    ), new_effect AS (
        INSERT INTO {EffectRecord._meta.db_table} (
            operation_id, decision_id, case_id, proposal_id, action, body, evidence_id,
            source_versions, policy_id, policy_snapshot, reviewer_id, recorded_at
        )
        SELECT %(operation_id)s, s.id, p.case_id, p.id, p.action, p.body, p.evidence_id,
               COALESCE(
                   (SELECT jsonb_object_agg(x ->> 'source_id', x -> 'version') FROM jsonb_array_elements(p.passages) x),
                   '{{}}'::jsonb
               ),
               p.policy_id, p.policy_snapshot, s.reviewer_id, %(now)s
        FROM standing s CROSS JOIN current p
        WHERE s.approved AND %(approved)s
          -- Likewise: a replay neither builds the row nor tries it when the effect is there.
          AND (s.is_new OR NOT EXISTS (SELECT FROM {EffectRecord._meta.db_table} WHERE operation_id = %(operation_id)s))
        ON CONFLICT (operation_id) DO NOTHING
        RETURNING id
    ), new_delivery AS (
        -- The approval's second effect, queued for the workers: only with a new effect (a
        -- new approval, never a replay, conflict or decline) and a helpdesk configured.
        INSERT INTO {Delivery._meta.db_table} (
            operation_id, case_id, decision_id, effect_id, state, tries, next_try_at,
            lease_owner, reference, reason, created_at, updated_at
        )
        SELECT %(operation_id)s, cur.case_id, s.id, e.id, '{DeliveryState.QUEUED.value}', 0, %(now)s,
               '', '', '', %(now)s, %(now)s
        FROM new_effect e CROSS JOIN standing s CROSS JOIN current cur
        WHERE %(deliver)s
        ON CONFLICT (operation_id) DO NOTHING
    ), outcome AS (
        SELECT s.*, CASE
            WHEN s.approved <> %(approved)s THEN '{outcome.CONFLICT.value}'
            WHEN s.is_new AND s.approved THEN '{outcome.COMMITTED.value}'
            WHEN s.is_new THEN '{outcome.DECLINED.value}'
            WHEN EXISTS (SELECT FROM new_effect) THEN '{outcome.COMMITTED.value}'
            ELSE '{outcome.REPLAY.value}'
        END AS outcome
        FROM standing s
    ), attempt AS (
        INSERT INTO {CommitAttempt._meta.db_table}
            (operation_id, case_id, approved, reviewer_id, outcome, channel, detail, attempted_at,
             decline_reason, decline_note)
        SELECT %(operation_id)s, (SELECT case_id FROM current), %(approved)s, %(reviewer)s, o.outcome, %(channel)s,
               CASE WHEN o.outcome = '{outcome.CONFLICT.value}'
                    THEN 'already ' || CASE WHEN o.approved THEN 'approved' ELSE 'declined' END || ' by '
                         || (SELECT u.{username} FROM {user._meta.db_table} u WHERE u.id = o.reviewer_id)
                    ELSE '' END,
               %(now)s, %(decline_reason)s, %(decline_note)s
        FROM outcome o
    ), completed AS (
        UPDATE {PendingReview._meta.db_table} SET status = '{PendingReview.Status.COMPLETED.value}', updated_at = %(now)s
        WHERE operation_id = %(operation_id)s AND status = '{PendingReview.Status.PENDING.value}'
          AND EXISTS (SELECT FROM standing)
        RETURNING 1
    )
    SELECT t.case_id, t.case_label, t.current_proposal_id, t.id,
           CASE WHEN t.current_proposal_id IS DISTINCT FROM t.id
                THEN (SELECT operation_id FROM {Proposal._meta.db_table} WHERE id = t.current_proposal_id) END,
           o.outcome, o.id, o.approved, o.reviewer_id, o.decided_at, o.decline_reason, o.decline_note, o.system_actor,
           CASE WHEN o.outcome = '{outcome.CONFLICT.value}'
                THEN (SELECT count(*) FROM {EffectRecord._meta.db_table} WHERE operation_id = %(operation_id)s)
                WHEN o.approved THEN 1 ELSE 0 END,
           CASE WHEN o.outcome IN ('{_NOTHING_NEW[0]}', '{_NOTHING_NEW[1]}') AND NOT EXISTS (SELECT FROM completed)
                THEN set_config('synchronous_commit', 'off', true) END
    FROM (SELECT) one LEFT JOIN target t ON TRUE LEFT JOIN outcome o ON TRUE
    """)


def _compact(sql: str) -> str:
    """The statement without its indentation, as PREPARE sends it and the query log shows it."""
    return "\n".join(line.strip() for line in sql.splitlines() if line.strip())


# The parameters of the commit's statements, in the order PREPARE declares them, with their
# types (each %(name)s of a statement becomes its $n).
_PARAMETER_TYPES = {
    "operation_id": "text",
    "approved": "boolean",
    "reviewer": "bigint",
    "channel": "text",
    "now": "timestamptz",
    "decline_reason": "text",
    "decline_note": "text",
    "system_actor": "text",
    "deliver": "boolean",
}

_LOCK = PreparedStatement(_compact(_LOCK_SQL), _PARAMETER_TYPES)


@cache
def _commit_statement() -> PreparedStatement:
    return PreparedStatement(_commit_sql(), _PARAMETER_TYPES)


def _commit_postgresql(call: _Call) -> CommitResult:
    db = connections[DEFAULT_DB_ALIAS]
    operation_id, approved, reviewer = call.operation_id, call.approved, call.reviewer
    params = {
        "operation_id": operation_id,
        "approved": approved,
        "reviewer": reviewer.pk,
        "channel": call.channel,
        "now": timezone.now(),
        "decline_reason": call.decline_reason,
        "decline_note": call.decline_note,
        "system_actor": call.system_actor,
        "deliver": delivery_configured(),
    }
    try:
        db.ensure_connection()
        if db.in_atomic_block or not db.autocommit:
            # Inside an outer transaction (a test's): atomic() makes a savepoint; our BEGIN
            # leads the query string only when psycopg has sent nothing yet (core/prepared.py).
            with transaction.atomic(durable=True), db.cursor() as cursor:
                begin = begin_in_query_string()
                proposal_pk, decided = _commit_statements(db, cursor, call, params, begin=begin)
                call.commit_sent = True
        else:
            proposal_pk, decided = _commit_own_transaction(db, call, params)
    except _CaseLockTimeout as timeout:
        raise _busy(call) from timeout.__cause__
    outcome, decision_pk, decision_approved, reviewer_pk, decided_at, *declined, effect_count, _ = decided
    decision = ReviewDecision.from_db(
        db.alias,
        [
            "id",
            "operation_id",
            "proposal_id",
            "approved",
            "reviewer_id",
            "decided_at",
            "decline_reason",
            "decline_note",
            "system_actor",
        ],
        [decision_pk, operation_id, proposal_pk, decision_approved, reviewer_pk, decided_at, *declined],
    )
    if reviewer_pk == reviewer.pk:
        decision.reviewer = reviewer
    return _result(outcome, approved=approved, effect_count=effect_count, operation_id=operation_id, decision=decision)


def _commit_own_transaction(db, call: _Call, params: dict) -> tuple[int, tuple]:
    """The usual case, Django in autocommit: the transaction is this function's own.

    Our BEGIN leads the statements' query string, and COMMIT is Django's commit(), exactly
    what ``atomic(durable=True)`` would send, without its bookkeeping on the way in and out
    (switching Django and psycopg out of autocommit and back costs more client time than
    the whole replay's server work; docs/PERFORMANCE.md). Django stays in autocommit
    throughout, and no other code runs inside. Any failure before COMMIT rolls back here,
    as atomic() would, and closes the connection when even the rollback fails.
    """
    pg = db.connection
    with db.cursor() as cursor:
        try:
            proposal_pk, decided = _commit_statements(db, cursor, call, params, begin=True)
            call.commit_sent = True
            # Django's own commit() and rollback(): psycopg's, logged as atomic() logs them.
            # psycopg goes by the server's transaction status, not by its autocommit flag.
            db.commit()
        except BaseException:
            # Still in a transaction: a statement failed, or COMMIT raised without ending it.
            # Either way roll back, as atomic() does (and the outcome of a failed COMMIT stays
            # unknown to the caller: call.commit_sent).
            if pg.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                try:
                    db.rollback()
                except Error:
                    db.close()
            raise
    return proposal_pk, decided


def _commit_statements(db, cursor, call: _Call, params: dict, *, begin: bool) -> tuple[int, tuple]:
    """Send the commit's one query string and read its answer; the caller commits.

    Returns the proposal's id and the decided columns of the statement's row. Raises
    NotFound and StaleProposal (the statement wrote nothing), and _CaseLockTimeout.
    """
    pg = db.connection
    operation_id = call.operation_id
    lock_sql, commit_sql = _LOCK.call_sql(cursor, pg), _commit_statement().call_sql(cursor, pg)
    crash_point("commit-before-decision")
    # One query string, one round trip: BEGIN, the lock timeout, the case row lock,
    # and the commit statement (Django's psycopg cursor binds parameters client-side,
    # so several statements may share one query). The server runs them in order, and
    # under READ COMMITTED each statement takes its own snapshot when it starts: the
    # commit statement's is taken once the lock was granted, so every decision
    # committed before then is in it. The lock timeout bounds every lock wait of this
    # transaction. Any wait in this query string is on a row of this case (the case
    # row, or the decision, effect or pending review of this very operation, held by
    # a transaction still running): CaseBusy, and the transaction rolled back. At
    # COMMIT (the deferred foreign-key checks) it is a failure like any other.
    query = _query_string(lock_sql, commit_sql, _lock_timeout_ms(), begin)
    try:
        cursor.execute(query, params)
    except OperationalError as exc:
        if _is_lock_timeout(exc):
            raise _CaseLockTimeout from exc
        raise
    # Every result is in already: read them on psycopg's cursor, past Django's wrapper.
    raw = cursor.cursor
    while raw.nextset():
        pass  # past BEGIN, SET and the lock statement, to the commit statement's row
    returned = raw.fetchone()
    call.case_known = True
    case_pk, case_label, current_proposal_id, proposal_pk, current_operation_id, *decided = returned
    if case_pk is None:
        raise _not_found(operation_id)
    call.case_pk = case_pk
    # The case row lock orders this commit against a concurrent edit of the same case,
    # so "is this still the current proposal?" could not change before the statement.
    if current_proposal_id != proposal_pk:
        raise _stale(operation_id, case_label, current_operation_id)
    # Every CTE of the statement reads one snapshot, taken when it starts. When the
    # decision insert loses ON CONFLICT to a transaction that committed after that
    # snapshot, the read of the standing decision cannot see the winner, so the
    # statement could not tell a replay from a conflict. The case row lock is what
    # prevents that: every commit of this operation holds it, so any decision
    # committed before we got the lock is in this statement's snapshot. Only a writer
    # that skips the lock can still win in between; the statement then decides
    # nothing (outcome NULL) and writes nothing, and running it again, with a new
    # snapshot, is exact.
    if decided[0] is None:
        cursor.execute(commit_sql, params)
        decided = cursor.cursor.fetchone()[5:]
        if decided[0] is None:
            raise RuntimeError(f"the decision of {operation_id} is neither insertable nor readable")
    crash_point("commit-after-decision")
    return proposal_pk, tuple(decided)


@cache
def _query_string(lock_sql: str, commit_sql: str, timeout_ms: int, begin: bool) -> str:
    query = f"SET LOCAL lock_timeout = '{timeout_ms}ms'; {lock_sql}; {commit_sql}"
    return f"BEGIN; {query}" if begin else query


def _busy(call: _Call) -> CaseBusy:
    """The answer to a case locked past the timeout, once the transaction rolled back.

    PostgreSQL: the attempt row is written without waiting for that same row lock. SQLite: the lock is the whole database's, so no row can be
    written without waiting for it; the attempt is logged instead of recorded.
    """
    # A plain read: it waits for no row lock (nor, on SQLite, for another writer).
    found = Case.objects.filter(proposals__operation_id=call.operation_id).order_by().values_list("pk", "case_id")[:1]
    case_pk, case_label = next(iter(found), (None, "?"))
    message = f"another action on case {case_label} is in progress; try again"
    what = identity.short(str(call.operation_id))
    call.recorded = True  # either way: another try would wait on the same lock
    if connection.vendor != "postgresql":
        log.warning("busy attempt on %s not recorded (the database is locked): %s", what, message)
        return CaseBusy(message, case_id=case_label)
    try:
        # The same plain insert as every attempt row: its references are not checked
        # (migration 0009), so it takes no lock on the case row that made this call busy.
        _attempt(
            operation_id=call.operation_id,
            case_id=case_pk,
            approved=call.approved,
            reviewer=call.reviewer,
            channel=call.channel,
            outcome=CommitAttempt.Outcome.REFUSED,
            detail=f"busy: {message}",
            reason=RefusalReason.BUSY,
        )
    except Exception:
        # The refusal stands without its audit row.
        log.exception("could not record the busy attempt on %s", what)
    return CaseBusy(message, case_id=case_label)


def _commit_orm(call: _Call) -> CommitResult:
    """SQLite: the same commit through the ORM. No row locks here: settings open every
    transaction with BEGIN IMMEDIATE, so it holds the database's write lock from its first
    statement, and commits and edits run one at a time."""
    began = False
    try:
        with transaction.atomic(durable=True):
            began = True
            outcome, effect_count, decision = _commit_orm_writes(call)
            crash_point("commit-after-decision")
            call.commit_sent = True
    except OperationalError as exc:
        # BEGIN IMMEDIATE waited out the busy timeout behind another writer and nothing ran:
        # SQLite's form of PostgreSQL's lock timeout on the case row.
        if began or "database is locked" not in str(exc):
            raise
        raise _busy(call) from None
    return _result(
        outcome, approved=call.approved, effect_count=effect_count, operation_id=call.operation_id, decision=decision
    )


def _commit_orm_writes(call: _Call) -> tuple[str, int, ReviewDecision]:
    """The reads and writes of one SQLite commit, inside its transaction."""
    operation_id, approved, reviewer = call.operation_id, call.approved, call.reviewer
    # No ORDER BY: operation_id is unique, so the model's default ordering is only cost.
    proposal = next(
        iter(Proposal.objects.select_related("case").filter(operation_id=operation_id).order_by()[:1]), None
    )
    call.case_known = True
    if proposal is None:
        raise _not_found(operation_id)
    case = proposal.case
    call.case_pk = case.pk
    if case.current_proposal_id != proposal.pk:
        # A statement of its own (SQLite's one write lock keeps it consistent with the read
        # above); no current proposal at all: nothing to look up.
        current = (
            Proposal.objects.filter(pk=case.current_proposal_id).values_list("operation_id", flat=True).first()
            if case.current_proposal_id is not None
            else None
        )
        raise _stale(operation_id, case.case_id, current)
    crash_point("commit-before-decision")
    new_decision = _insert_once(
        ReviewDecision,
        operation_id=operation_id,
        proposal=proposal,
        approved=approved,
        reviewer=reviewer,
        decline_reason=call.decline_reason,
        decline_note=call.decline_note,
        system_actor=call.system_actor,
    )
    # Only a decision that was already there needs reading back.
    decision = new_decision or ReviewDecision.objects.select_related("reviewer").get(operation_id=operation_id)
    detail = ""
    if decision.approved != approved:
        outcome = CommitAttempt.Outcome.CONFLICT
        detail = f"already {'approved' if decision.approved else 'declined'} by {decision.reviewer.get_username()}"
        effect_count = EffectRecord.objects.filter(operation_id=operation_id).count()
    elif not approved:
        outcome = CommitAttempt.Outcome.DECLINED if new_decision else CommitAttempt.Outcome.REPLAY
        effect_count = 0
    else:
        new_effect = _insert_once(EffectRecord, **_effect_fields(proposal, decision))
        if new_effect is not None and delivery_configured():
            # The approval's second effect, as in the PostgreSQL statement's new_delivery.
            _insert_once(Delivery, **delivery_fields(new_effect))
        replay = new_decision is None and new_effect is None
        outcome = CommitAttempt.Outcome.REPLAY if replay else CommitAttempt.Outcome.COMMITTED
        effect_count = 1
    _attempt(
        operation_id=operation_id,
        case_id=case.pk,
        approved=approved,
        reviewer=reviewer,
        outcome=outcome,
        channel=call.channel,
        detail=detail,
        decline=(call.decline_reason, call.decline_note),
    )
    # update() skips auto_now, hence updated_at by hand.
    PendingReview.objects.filter(operation_id=operation_id, status=PendingReview.Status.PENDING).update(
        status=PendingReview.Status.COMPLETED, updated_at=timezone.now()
    )
    return outcome, effect_count, decision


def _uncertain(call: _Call, exc: Exception) -> OutcomeUncertain:
    what = identity.short(str(call.operation_id))
    return OutcomeUncertain(
        f"outcome uncertain: the COMMIT of {what} failed ({type(exc).__name__}) and may have been applied; "
        f"run `manage.py reconcile` to see whether it committed",
        operation_id=call.operation_id,
        error=f"{type(exc).__name__}: {exc}",
    )


def _record_failure(call: _Call, exc: Exception) -> None:
    """The FAILED attempt row, written only when the commit is known to have rolled back.

    Never raises: the caller re-raises ``exc``, which must not be masked by the audit row.
    """
    what = identity.short(str(call.operation_id))
    if call.commit_sent:
        # COMMIT itself failed: it may have been applied (with its own attempt row) or not,
        # and only the effect store can tell. A "failed" row could be a lie.
        log.warning("commit of %s failed at COMMIT (%s); outcome unknown, no attempt recorded", what, exc)
        return
    if connection.connection is None or connection.needs_rollback:
        # The rollback failed and Django dropped the connection (or an outer block must
        # roll back first): the server rolled back, but there is nothing to write with.
        log.warning("commit of %s failed (%s) on an unusable connection; no attempt recorded", what, exc)
        return
    try:
        call.record(CommitAttempt.Outcome.FAILED, f"{type(exc).__name__}: {exc}", RefusalReason.FAILED)
    except Exception:
        log.exception("could not record the failed attempt of %s", what)


@observed_commit  # commit latency by outcome
def effect_commit(
    *,
    operation_id: str,
    approved: bool,
    reviewer,
    channel: str = "service",
    decline_reason: str | None = None,
    decline_note: str | None = None,
    system_actor: str | None = None,
) -> CommitResult:
    """Record a reviewer's decision on one operation and, for an approval, write its effect.

    One durable transaction: when this returns, the decision and the effect are committed,
    and the operation's pending review, if any, is marked completed with them. The first
    approval writes both; the same approval again writes nothing and says ``replay``; the
    opposite decision is ``ConflictingDecision`` and never an update. Refusals (not a
    boolean, no permission, unknown or stale operation, ``CaseBusy`` when another action
    holds the case row longer than ``decision_lock_timeout()``) raise and write no decision
    or effect. Every call, refused or not, appends a ``CommitAttempt``; a failure is
    recorded as ``failed`` only when the transaction is known to have rolled back; a
    failure once COMMIT was sent (it may have been applied) raises ``OutcomeUncertain``.

    A decline may carry ``decline_reason`` (``DeclineReason``) and ``decline_note``; they are
    stored with the decision, and a replay keeps the first (its attempt row keeps its own).
    ``system_actor`` names a system decision (only ``sla-expiry``, declining with reason
    ``expired``): the reviewer is then that actor's own user row and needs no permission.
    """
    call = _Call(operation_id, approved, reviewer, channel, decline_reason, decline_note, system_actor)
    try:
        # bool only: 1, "true" or None are not consent.
        if type(approved) is not bool:
            raise DecisionOmitted(
                f"approved must be true or false, not {approved!r}: an omitted decision is not consent"
            )
        if not identity.is_operation_id(operation_id):
            raise InvalidInput(f"{str(operation_id)[:100]!r} is not an operation identity (op-v1- and 64 hex digits)")
        decline_reason_check(
            approved=approved, decline_reason=decline_reason, decline_note=decline_note, system_actor=system_actor
        )
        if system_actor is None:
            reviewer_check(reviewer)
        elif getattr(reviewer, "pk", None) is None:
            raise PermissionRefused(f"the system actor {system_actor} needs its user row")
        result = _commit_postgresql(call) if connection.vendor == "postgresql" else _commit_orm(call)
    except DecisionflowError as exc:
        if not call.recorded:
            outcome = CommitAttempt.Outcome.STALE if isinstance(exc, StaleProposal) else CommitAttempt.Outcome.REFUSED
            call.record(outcome, exc.message, exc.reason)
        raise
    except Exception as exc:
        _record_failure(call, exc)
        if call.commit_sent:
            # COMMIT was sent and failed (a lost connection, most likely): it may have been
            # applied. Every caller, not only the workflow's, reports that as uncertain.
            raise _uncertain(call, exc) from exc
        raise
    crash_point("commit-after-transaction")
    if result.status == COMMITTED and not result.replay and delivery_configured():
        # After the durable transaction: the worker must see the row. A lost enqueue (the
        # process stops right here) only delays the delivery: the sweep finds it.
        delivery_enqueue(result.operation_id)
    return result


class ReconcileRow(NamedTuple):
    # A NamedTuple, not a dataclass: reconcile builds one per operation, a million per cron
    # run, and a tuple is several times cheaper to make.
    case_id: str
    operation_id: str
    state: str
    effects: int
    # Why a declined operation was declined (None otherwise, or when no reason was given).
    decline_reason: str | None = None
    # The delivery to the helpdesk (docs/DELIVERY.md): its state's label (None: there is
    # none), the helpdesk's reference once Delivered, and when it was written (the approval).
    delivery: str | None = None
    delivery_reference: str | None = None
    delivery_since: Any = None

    def as_dict(self) -> dict:
        found = {
            "case": self.case_id,
            "operation_id": self.operation_id,
            "state": self.state,
            "effects": self.effects,
            "decline_reason": self.decline_reason,
        }
        if self.delivery is not None:
            # Only with a delivery: without a helpdesk the lines stay exactly as before.
            found.update(delivery=self.delivery, delivery_reference=self.delivery_reference or None)
        return found


def operation_state(approved: bool | None, has_effect: bool) -> str:
    """An operation's reconcile state from its decision (None: undecided) and whether its
    effect exists. The one classification: ``_STATE_SQL`` says the same in SQL."""
    if approved is None:
        return OperationState.PENDING
    if not approved:
        return OperationState.DECLINED
    return OperationState.COMMITTED if has_effect else OperationState.NO_LOCAL_EFFECT


# The same classification as operation_state, in SQL, so the set-based query returns finished rows.
_STATE_SQL = f"""
    CASE WHEN d.id IS NULL THEN '{OperationState.PENDING}'
         WHEN NOT d.approved THEN '{OperationState.DECLINED}'
         WHEN e.id IS NULL THEN '{OperationState.NO_LOCAL_EFFECT}'
         ELSE '{OperationState.COMMITTED}' END
"""


# The delivery's state as reconcile prints it: its label (Queued, Unknown, Delivered, ...).
_DELIVERY_SQL = (
    "CASE dl.state "
    + " ".join(f"WHEN '{state.value}' THEN '{state.label}'" for state in DeliveryState)
    + " ELSE dl.state END"
)


class DeliveryAlert(NamedTuple):
    """What reconcile alerts on, for deliveries (each its own exit bit, docs/COMMANDS.md)."""

    unknown: int  # Unknown longer than DECISIONFLOW_DELIVERY_UNKNOWN_ALERT after the approval
    rejected: int  # Rejected: the helpdesk refused the reply for good
    queued: int  # Queued or Sending longer than DECISIONFLOW_DELIVERY_QUEUED_ALERT


def delivery_alert(rows: Iterable[ReconcileRow], *, now=None) -> DeliveryAlert:
    """Count the deliveries among ``rows`` that someone should look at."""
    now = now or timezone.now()
    unknown_after = duration_setting("DECISIONFLOW_DELIVERY_UNKNOWN_ALERT", "15m")
    queued_after = duration_setting("DECISIONFLOW_DELIVERY_QUEUED_ALERT", "15m")
    unknown = rejected = queued = 0
    for row in rows:
        if row.delivery is None:
            continue
        age = now - row.delivery_since
        if row.delivery == DeliveryState.UNKNOWN.label and age > unknown_after:
            unknown += 1
        elif row.delivery == DeliveryState.REJECTED.label:
            rejected += 1
        elif row.delivery in (DeliveryState.QUEUED.label, DeliveryState.SENDING.label) and age > queued_after:
            queued += 1
    return DeliveryAlert(unknown, rejected, queued)


def deliveries_repair(*, operation_ids: Iterable[str]) -> list[tuple[str, str]]:
    """``reconcile --repair`` for deliveries: the sweep (Sending past its lease -> Unknown;
    stale Queued ones enqueued again), then each Unknown delivery among ``operation_ids`` is
    tried now, in this process: looked up, and resent with the same key when the lookup
    cannot settle it. Each try is bounded by the delivery timeouts. Returns (operation,
    outcome) for each one tried."""
    delivery_sweep_and_enqueue()
    wanted = list(operation_ids)
    unknown = Delivery.objects.filter(operation_id__in=wanted, state=DeliveryState.UNKNOWN).order_by("created_at")
    done = []
    for operation_id in unknown.values_list("operation_id", flat=True):
        outcome, delay = delivery_attempt(
            operation_id=operation_id, worker=f"reconcile@{worker_name()}", due_only=False
        )
        if delay is not None:
            delivery_enqueue(operation_id, delay=delay)
        done.append((operation_id, outcome))
    return done


def operations_reconcile(
    *, case_ids: Iterable[str] | None = None, operation_ids: Iterable[str] | None = None, chunk_size: int = 2000
) -> Iterator[ReconcileRow]:
    """What really happened to each operation, read from the decision and effect tables.

    Runs nothing and guesses nothing. The operations are each case's current proposal and
    every proposal that has a decision; a superseded proposal that was never decided can
    never be committed, so it is not an operation to report.

    One set-based query, streamed (a server-side cursor on PostgreSQL), so a cron run over
    a million operations holds one chunk in memory at a time. Raw SQL on purpose: it is the
    hot path of reconcile and a plain anti-join is what the database plans best.
    """
    where, params = [], []
    for column, values in (("c.case_id", case_ids), ("p.operation_id", operation_ids)):
        if values is not None:
            values = list(values)
            if not values:
                return
            where.append(f"{column} IN ({', '.join(['%s'] * len(values))})")
            params += values
    sql = f"""
        SELECT c.case_id, p.operation_id, {_STATE_SQL}, CASE WHEN e.id IS NULL THEN 0 ELSE 1 END, d.decline_reason,
               {_DELIVERY_SQL}, dl.reference, dl.created_at
        FROM {Proposal._meta.db_table} p
        JOIN {Case._meta.db_table} c ON c.id = p.case_id
        LEFT JOIN {ReviewDecision._meta.db_table} d ON d.operation_id = p.operation_id
        LEFT JOIN {EffectRecord._meta.db_table} e ON e.operation_id = p.operation_id
        LEFT JOIN {Delivery._meta.db_table} dl ON dl.operation_id = p.operation_id
        WHERE (d.id IS NOT NULL OR c.current_proposal_id = p.id)
        {"AND " + " AND ".join(where) if where else ""}
        ORDER BY c.case_id, p.id
    """
    with transaction.atomic(), connection.chunked_cursor() as cursor:
        if connection.vendor == "postgresql":
            # A server-side cursor is planned for the first rows by default (index-driven
            # nested loops), which took 3x longer over a million operations than the
            # hash-join-and-sort plan chosen when the planner aims at the whole result.
            with connection.cursor() as setting:
                setting.execute("SET LOCAL cursor_tuple_fraction = 1.0")
        cursor.execute(sql, params)
        converters = connection.ops.get_db_converters(Delivery._meta.get_field("created_at").get_col("dl"))
        while rows := cursor.fetchmany(chunk_size):
            for row in rows:
                if row[5] is not None and converters:
                    # SQLite returns the timestamp as text: the field's own converter reads it.
                    since = row[7]
                    for convert in converters:
                        since = convert(since, None, connection)
                    row = (*row[:7], since)
                yield ReconcileRow._make(row)


def operation_reconcile(operation_id: str) -> ReconcileRow | None:
    """One operation by its key, whether or not it is still current (None if unknown)."""
    row = Proposal.objects.filter(operation_id=operation_id).values_list("case__case_id", "operation_id").first()
    if row is None:
        return None
    decided = ReviewDecision.objects.filter(operation_id=operation_id).values_list("approved", "decline_reason").first()
    approved, reason = decided if decided is not None else (None, None)
    effects = EffectRecord.objects.filter(operation_id=operation_id).count()
    found = Delivery.objects.filter(operation_id=operation_id).values_list("state", "reference", "created_at").first()
    delivery = (DeliveryState(found[0]).label, found[1], found[2]) if found else (None, None, None)
    return ReconcileRow(row[0], row[1], operation_state(approved, effects > 0), effects, reason, *delivery)


def effects_repair(*, rows: Iterable[ReconcileRow], dry_run: bool = True) -> list[ReconcileRow]:
    """Write the missing effect of each ``NoLocalEffectRecorded`` operation.

    Idempotent: the effect's unique key makes a second run (or a concurrent one) a no-op.
    Each operation is its own transaction, so a crash mid-way leaves every operation either
    repaired or untouched. Returns the operations that needed repair.
    """
    repaired = []
    for row in rows:
        if row.state != NO_LOCAL_EFFECT:
            continue
        repaired.append(row)
        if dry_run:
            continue
        with transaction.atomic():
            decision = ReviewDecision.objects.select_related("proposal", "reviewer").get(operation_id=row.operation_id)
            repaired_effect = _insert_once(EffectRecord, **_effect_fields(decision.proposal, decision))
            if repaired_effect is not None and delivery_configured():
                _insert_once(Delivery, **delivery_fields(repaired_effect))
            if repaired_effect is not None:
                _attempt(
                    operation_id=row.operation_id,
                    case_id=decision.proposal.case_id,
                    approved=True,
                    reviewer=decision.reviewer,
                    outcome=CommitAttempt.Outcome.COMMITTED,
                    channel="repair",
                    detail="reconcile --repair wrote the missing effect",
                )
        crash_point("repair-midway")
    return repaired
