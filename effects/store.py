"""The commit's storage: every statement ``effect_commit`` sends, behind one small interface.

A store reads what a commit depends on, under the case row lock, and writes what
``effects.services`` decided from it. It decides nothing: which rows to write, and what the
outcome and its wording are, come in as arguments. Every statement is compiled by the ORM
(querysets, and ``core.statements.insert`` for the inserts); the row read back is converted
by the same query's compiler and turned into models with ``Model.from_db``.

PostgreSQL and SQLite implement the same interface (tests/effects/test_store_contract.py
runs one suite on both). They differ in how they lock and how many statements travel at
once; the rows they write are the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol, cast

from django.contrib.auth import get_user_model
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Exists, Model, OuterRef
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.db.models.sql import Query, UpdateQuery

from cases.models import Case
from core.locks import lock_not_available
from core.statements import bound_cursor, insert, loaded
from effects.delivery import delivery_fields
from effects.models import CommitAttempt, Delivery, EffectRecord
from reviews.models import PendingReview, Proposal, ReviewDecision

# PostgreSQL's unique_violation: a unique key refused a row.
UNIQUE_VIOLATION = "23505"


class CaseLocked(Exception):
    """Another transaction held the case (its row, or the whole SQLite database) past the
    commit's lock timeout. Raised inside the transaction, so that it rolls back."""


@dataclass(frozen=True)
class Target:
    """What a commit of one operation depends on, read under the case row lock."""

    proposal: Proposal  # with the fields its effect copies
    case_label: str  # the case's own id (T-1042)
    current_proposal_id: int | None
    decision: ReviewDecision | None  # the decision that stands, its reviewer's username loaded
    # Known only with a decision: without one there is no effect (it references the
    # decision), and a new decision completes any pending review anyway.
    effect_exists: bool
    pending_open: bool  # the operation has a pending review still pending


@dataclass(frozen=True)
class Writes:
    """What the service decided that this commit writes, in its transaction."""

    attempt: CommitAttempt
    decision: ReviewDecision | None = None  # a new decision
    effect: EffectRecord | None = None  # a new effect (its decision may be the new one)
    delivery: bool = False  # the new effect's delivery row
    # False when nothing but the attempt row is new: the transaction may skip the WAL flush.
    flush: bool = True
    # The operation has a pending review to complete.
    complete_pending: bool = True


@dataclass(frozen=True)
class Written:
    """Whether each insert the unique keys allowed was made (None: not asked for)."""

    decision_pk: int | None
    effect_pk: int | None


class CommitStore(Protocol):
    def transaction(self, *, durable: bool = True) -> Any:
        """The commit's one transaction (a context manager); ``CaseLocked`` when it cannot
        begin. ``durable=False`` only for a caller that may already be in one (repair)."""

    def read(self, operation_id: str, *, lock_timeout_ms: int | None) -> Target | None:
        """Lock the case of ``operation_id`` and read the target; None: no such proposal.
        ``lock_timeout_ms`` None: a plain read, without the lock."""

    def current_operation(self, target: Target) -> str | None:
        """The operation of the case's current proposal (for a stale answer)."""

    def write(self, writes: Writes) -> Written:
        """Insert the rows of ``writes`` and complete the operation's pending review."""


def attempt_append(attempt: CommitAttempt) -> None:
    """One attempt row, outside a commit (a refusal): one INSERT, in the caller's
    transaction if there is one. Its references are not checked by the database, so it
    waits for no lock on the case or the user."""
    attempt.save(force_insert=True)


# -- the statements, each compiled once by the ORM ------------------------------------------

# The operation's place while a statement is compiled: every statement of a commit is about
# one operation, so its SQL is the same for all of them and is compiled once; each call's
# parameters put the operation where this stands. (Never sent: not an operation identity.)
_OPERATION = "\x00operation"
# The lock timeout's place, the same way (``lock_timeout`` as PostgreSQL writes it: "3000ms").
_TIMEOUT = "\x00timeout"


class _Query:
    """A statement about one operation: its SQL as the ORM's compiler writes it, and that
    compiler's reading of the rows (the fields' own converters: JSON, timestamps, booleans)."""

    def __init__(self, query: Query):
        self.compiler = query.get_compiler(connection=connection)
        sql, params = self.compiler.as_sql()
        self.sql, self.params = sql, tuple(params)
        # What results_iter() would look up on every call, looked up once (a statement that
        # selects nothing has none).
        selected = [s[0] for s in (self.compiler.select or [])[: getattr(self.compiler, "col_count", 0)]]
        self.converters = self.compiler.get_converters(selected) if selected else {}

    def params_for(self, operation_id: str, timeout: str | None = None) -> tuple:
        places = {_OPERATION: operation_id, _TIMEOUT: timeout}
        return tuple(places.get(p, p) if isinstance(p, str) else p for p in self.params)

    def rows(self, raw: list) -> list[tuple]:
        if not raw or not self.converters:
            return raw
        return [tuple(row) for row in self.compiler.apply_converters(raw, self.converters)]


@cache
def _completion() -> _Query:
    """Complete the operation's pending review: ``QuerySet.update()``'s own statement.
    (update() skips auto_now: updated_at is the database's clock.)"""
    pending = PendingReview.objects.filter(operation_id=_OPERATION, status=PendingReview.Status.PENDING)
    query = cast(UpdateQuery, pending.query.chain(UpdateQuery))
    query.add_update_values({"status": PendingReview.Status.COMPLETED, "updated_at": Now()})
    return _Query(query)


def _write(writes: Writes) -> tuple[str, list]:
    """The whole write as one statement, and its parameters: each new row's INSERT (the
    ORM's) under a name, the pending review's UPDATE, and the new ids. PostgreSQL runs every
    data-modifying part of a WITH whether or not it is read, all in one snapshot, so a row
    names one written beside it by its part's name (``RETURNING id``), never by a lookup.
    Without ``flush``, the transaction may skip the WAL flush (``set_config(…, true)``: this
    transaction only). Each part's text is compiled once per process, so a given shape is
    the same text every time (psycopg prepares it by its text)."""
    parts: list[tuple[str, str, list]] = []
    if writes.decision is not None:
        statement = insert(ReviewDecision)
        parts.append(("decision", statement.sql, statement.params_for(writes.decision)))
    if writes.effect is not None:
        by_name = (("decision_id", "decision"),) if writes.decision is not None else ()
        statement = insert(EffectRecord, by_name=by_name)
        parts.append(("effect", statement.sql, statement.params_for(writes.effect)))
        if writes.delivery:
            statement = insert(Delivery, by_name=(*by_name, ("effect_id", "effect")))
            parts.append(("delivery", statement.sql, statement.params_for(Delivery(**delivery_fields(writes.effect)))))
    statement = insert(CommitAttempt, returning=False)
    parts.append(("attempt", statement.sql, statement.params_for(writes.attempt)))
    if writes.complete_pending:
        completion = _completion()
        parts.append(("completion", completion.sql, list(completion.params_for(writes.attempt.operation_id))))
    ids = [f"(SELECT id FROM {name})" for name, _, _ in parts if name in ("decision", "effect")]
    if not writes.flush:
        ids.append("set_config('synchronous_commit', 'off', true)")
    body = ", ".join(f"{name} AS ({sql})" for name, sql, _ in parts)
    return f"WITH {body} SELECT {', '.join(ids) or 'NULL'}", [p for _, _, params in parts for p in params]


_PROPOSAL = ["id", "case_id", "operation_id", "action", "body", "evidence_id", "passages", "policy_id"]
_PROPOSAL += ["policy_snapshot"]
_DECISION = ["id", "approved", "reviewer_id", "decided_at", "decline_reason", "decline_note", "system_actor"]


@cache
def _read(locked: bool) -> _Query:
    """What a commit reads of its operation, in one statement: the case with the operation's
    proposal, the standing decision with its reviewer's username, whether its effect exists
    and whether a pending review is open.

    ``locked``: it locks the case row FOR NO KEY UPDATE (not FOR UPDATE: it leaves the FOR
    KEY SHARE that the foreign keys of the commit's own rows take on the case row, while
    commits and edits, which update the row, still exclude each other), waiting at most the
    lock timeout, which the statement sets for its transaction (``set_config(…, true)``) as it
    produces the row, before the row is locked. A locked row is read at its latest version,
    so the case's current proposal is what the lock protects. The rest is read in the
    statement's snapshot, which a wait for the lock makes older than the holder's commit: a
    decision or effect that holder wrote may be missing. Then the commit's insert meets the
    unique key, writes nothing, and the commit reads again (``Written``), in a new snapshot
    that has it. Compiled inside a transaction, as the ORM requires of select_for_update()."""
    decision = "proposals__decisions__"
    read = (
        Case.objects.filter(proposals__operation_id=_OPERATION)
        .order_by()
        .annotate(
            effect_exists=Exists(EffectRecord.objects.filter(operation_id=OuterRef("proposals__operation_id"))),
            pending_open=Exists(
                PendingReview.objects.filter(
                    operation_id=OuterRef("proposals__operation_id"), status=PendingReview.Status.PENDING
                )
            ),
        )
    )
    names = [f"proposals__{name}" for name in _PROPOSAL] + ["case_id", "current_proposal_id"]
    names += [decision + name for name in _DECISION] + [f"{decision}reviewer__{get_user_model().USERNAME_FIELD}"]
    names += ["effect_exists", "pending_open"]
    if locked:
        read = read.annotate(timeout=RawSQL("set_config('lock_timeout', %s, true)", (_TIMEOUT,)))
        read = read.select_for_update(no_key=True, of=("self",))
        names.append("timeout")
    return _Query(read.values_list(*names).query)


def _target(read: _Query, raw: list) -> Target | None:
    """The target from the row of ``read``, converted by its own query."""
    rows = read.rows(raw)
    if not rows:
        return None
    values = iter(rows[0])
    proposal = loaded(Proposal, {name: next(values) for name in _PROPOSAL})
    case_label, current_proposal_id = next(values), next(values)
    decided = {name: next(values) for name in _DECISION}
    username, effect_exists, pending_open = next(values), next(values), next(values)
    decision = None
    if decided["id"] is not None:
        decision = loaded(
            ReviewDecision, {**decided, "operation_id": proposal.operation_id, "proposal_id": proposal.pk}
        )
        user = get_user_model()
        decision.reviewer = loaded(user, {"id": decision.reviewer_id, user.USERNAME_FIELD: username})
    return Target(
        proposal=proposal,
        case_label=case_label,
        current_proposal_id=current_proposal_id,
        decision=decision,
        effect_exists=bool(effect_exists) and decision is not None,
        pending_open=bool(pending_open) and decision is not None,
    )


class _Store:
    def current_operation(self, target: Target) -> str | None:
        if target.current_proposal_id is None:
            return None
        return Proposal.objects.filter(pk=target.current_proposal_id).values_list("operation_id", flat=True).first()


# -- PostgreSQL ------------------------------------------------------------------------------


@contextmanager
def _lock_wait_bounded() -> Iterator[None]:
    """A lock wait past the transaction's lock timeout is ``CaseLocked``."""
    try:
        yield
    except OperationalError as exc:
        if lock_not_available(exc):
            raise CaseLocked from exc
        raise


def _refused(exc: IntegrityError) -> bool:
    """Whether a unique key refused a row: another writer committed this operation's row."""
    return getattr(exc.__cause__, "sqlstate", None) == UNIQUE_VIOLATION or "UNIQUE constraint failed" in str(exc)


class PostgresCommitStore(_Store):
    """Two statements inside Django's durable transaction, both bound on the server
    (``core.statements.bound_cursor``): the lock with the read (``_read``), then the whole write
    (``_write``). The lock timeout bounds every lock wait of the transaction, the
    write's included. The settings are transaction-local (``set_config(…, true)``), so a
    pooler in transaction mode sees nothing of them."""

    def transaction(self, *, durable: bool = True):
        return transaction.atomic(durable=durable)

    def read(self, operation_id: str, *, lock_timeout_ms: int | None) -> Target | None:
        read = _read(lock_timeout_ms is not None)
        with bound_cursor() as cursor, _lock_wait_bounded():
            cursor.execute(read.sql, read.params_for(operation_id, f"{lock_timeout_ms}ms"))
            return _target(read, cursor.fetchall())

    def write(self, writes: Writes) -> Written:
        new_decision, new_effect = writes.decision is not None, writes.effect is not None
        with bound_cursor() as cursor, _lock_wait_bounded():
            try:
                cursor.execute(*_write(writes))
            except IntegrityError as exc:
                if not _refused(exc):
                    raise
                transaction.set_rollback(True)  # the statement wrote nothing; neither may the rest
                return Written(decision_pk=None, effect_pk=None)
            ids = iter(cursor.fetchone())
        return Written(decision_pk=next(ids) if new_decision else None, effect_pk=next(ids) if new_effect else None)


# -- SQLite ----------------------------------------------------------------------------------


class SqliteCommitStore(_Store):
    """The same statements as PostgreSQL's, one at a time. Settings open every transaction with BEGIN
    IMMEDIATE, so the transaction holds the database's write lock from its first statement:
    it is the case lock, and no other writer runs between the read and the writes."""

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[None]:
        began = False
        try:
            with transaction.atomic(durable=durable):
                began = True
                yield
        except OperationalError as exc:
            # BEGIN IMMEDIATE waited out the busy timeout behind another writer and nothing
            # ran: SQLite's form of PostgreSQL's lock timeout on the case row.
            if began or "database is locked" not in str(exc):
                raise
            raise CaseLocked from exc

    def read(self, operation_id: str, *, lock_timeout_ms: int | None) -> Target | None:
        read = _read(False)
        with connection.cursor() as cursor:
            cursor.execute(read.sql, read.params_for(operation_id))
            return _target(read, cursor.fetchall())

    def write(self, writes: Writes) -> Written:
        with connection.cursor() as cursor:
            try:
                for row in _rows(writes):
                    statement = insert(type(row))
                    cursor.execute(statement.sql, statement.params_for(row))
                    row.pk = cursor.fetchone()[0]
            except IntegrityError as exc:
                if not _refused(exc):
                    raise
                transaction.set_rollback(True)  # nothing of this write may stand
                return Written(decision_pk=None, effect_pk=None)
            statement = insert(CommitAttempt, returning=False)
            cursor.execute(statement.sql, statement.params_for(writes.attempt))
            if writes.complete_pending:
                completion = _completion()
                cursor.execute(completion.sql, completion.params_for(writes.attempt.operation_id))
        return Written(decision_pk=getattr(writes.decision, "pk", None), effect_pk=getattr(writes.effect, "pk", None))


def _rows(writes: Writes) -> Iterator[Model]:
    """The new rows of ``writes`` in order, each given the id of the row before it that it
    references once that row is in (the caller inserts each and sets its ``pk``)."""
    if writes.decision is not None:
        yield writes.decision
    if writes.effect is not None:
        if writes.decision is not None:
            writes.effect.decision_id = writes.decision.pk
        yield writes.effect
        if writes.delivery:
            yield Delivery(**delivery_fields(writes.effect))


def commit_store() -> CommitStore:
    return PostgresCommitStore() if connection.vendor == "postgresql" else SqliteCommitStore()
