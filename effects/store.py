"""The commit's storage: every statement ``effect_commit`` sends, behind one small interface.

A store reads what a commit depends on, under the case row lock, and writes what
``effects.services`` decided from it. It decides nothing: which rows to write, and what the
outcome and its wording are, come in as arguments. Every statement is compiled by the ORM
(querysets and ``InsertQuery``); the row read back is converted by the same query's
compiler and turned into models with ``Model.from_db``.

PostgreSQL and SQLite implement the same interface (tests/effects/test_store_contract.py
runs one suite on both). They differ in how they lock and how many statements travel at
once; the rows they write are the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol, TypeVar, cast

from django.contrib.auth import get_user_model
from django.db import OperationalError, connection, transaction
from django.db.models import Exists, Model, OuterRef, Subquery
from django.db.models.constants import OnConflict
from django.db.models.functions import Now
from django.db.models.sql import InsertQuery, Query, UpdateQuery

from cases.models import Case
from core.locks import lock_not_available
from effects.delivery import delivery_fields
from effects.models import CommitAttempt, Delivery, EffectRecord
from reviews.models import PendingReview, Proposal, ReviewDecision

M = TypeVar("M", bound=Model)


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

    def params_for(self, operation_id: str) -> tuple:
        return tuple(operation_id if p == _OPERATION else p for p in self.params)

    def rows(self, raw: list) -> list[tuple]:
        if not raw or not self.converters:
            return raw
        return [tuple(row) for row in self.compiler.apply_converters(raw, self.converters)]


def _row_of(model: type[Model], operation_id: str) -> Subquery:
    """The id of ``model``'s row of ``operation_id``: a row written earlier in the same
    transaction, whose id the client does not know yet."""
    return Subquery(model._default_manager.filter(operation_id=operation_id).order_by().values("pk"))


class _Insert:
    """The INSERT of a row of ``model`` as the ORM compiles it for ``save()``. Each row's
    values go through the same compiler (``pre_save`` fills the timestamps). The references
    in ``by_operation`` (attname, model) are read by the operation: their row is written
    earlier in the same query string. With ``ignore_conflicts``, a row that a unique key
    refuses is skipped and RETURNING answers nothing."""

    def __init__(self, model: type[Model], *, ignore_conflicts: bool, returning: bool, by_operation=()):
        self.fields = [f for f in model._meta.local_concrete_fields if not f.primary_key]
        self.by_operation = {name: _Query(_row_of(target, _OPERATION).query) for name, target in by_operation}
        shape = model(**{name: _row_of(target, _OPERATION) for name, target in by_operation})
        query = InsertQuery(model, on_conflict=OnConflict.IGNORE if ignore_conflicts else None)
        query.insert_values(self.fields, [shape])
        self.compiler = query.get_compiler(connection=connection)
        self.compiler.returning_fields = [model._meta.pk] if returning else None
        [(self.sql, _)] = self.compiler.as_sql()

    def params_for(self, obj: Model, operation_id: str) -> list:
        params: list = []
        for f in self.fields:
            if f.attname in self.by_operation:
                params += self.by_operation[f.attname].params_for(operation_id)
            else:
                params.append(self.compiler.prepare_value(f, self.compiler.pre_save_val(f, obj)))
        return params


@cache
def _insert(model: type[Model], ignore_conflicts: bool, returning: bool, by_operation: tuple = ()) -> _Insert:
    return _Insert(model, ignore_conflicts=ignore_conflicts, returning=returning, by_operation=by_operation)


@cache
def _completion() -> _Query:
    """Complete the operation's pending review: ``QuerySet.update()``'s own statement.
    (update() skips auto_now: updated_at is the database's clock.)"""
    pending = PendingReview.objects.filter(operation_id=_OPERATION, status=PendingReview.Status.PENDING)
    query = cast(UpdateQuery, pending.query.chain(UpdateQuery))
    query.add_update_values({"status": PendingReview.Status.COMPLETED, "updated_at": Now()})
    return _Query(query)


def _statements(writes: Writes) -> list[tuple[str, list, bool]]:
    """The commit's writes in order: (sql, params, returns a row). The unique keys stay the
    atomic step: a row they refuse is skipped, and the caller is told (``Written``)."""
    out = []
    operation_id = writes.attempt.operation_id
    new_decision = writes.decision is not None
    if writes.decision is not None:
        insert = _insert(ReviewDecision, True, True)
        out.append((insert.sql, insert.params_for(writes.decision, operation_id), True))
    if writes.effect is not None:
        decided = (("decision_id", ReviewDecision),) if new_decision else ()
        insert = _insert(EffectRecord, True, True, decided)
        out.append((insert.sql, insert.params_for(writes.effect, operation_id), True))
        if writes.delivery:
            insert = _insert(Delivery, True, False, (*decided, ("effect_id", EffectRecord)))
            out.append((insert.sql, insert.params_for(Delivery(**delivery_fields(writes.effect)), operation_id), False))
    insert = _insert(CommitAttempt, False, False)
    out.append((insert.sql, insert.params_for(writes.attempt, operation_id), False))
    if writes.complete_pending:
        completion = _completion()
        out.append((completion.sql, list(completion.params_for(operation_id)), False))
    return out


_PROPOSAL = ["id", "case_id", "operation_id", "action", "body", "evidence_id", "passages", "policy_id"]
_PROPOSAL += ["policy_snapshot"]
_DECISION = ["id", "approved", "reviewer_id", "decided_at", "decline_reason", "decline_note", "system_actor"]


@cache
def _reads(locked: bool) -> tuple[_Query, _Query]:
    """What a commit reads of its operation, in two simple statements (each is planned anew
    on every call): the case with the operation's proposal; the standing decision with its
    reviewer's username, whether its effect exists and whether a pending review is open.
    ``locked``: the first one locks the case row FOR NO KEY UPDATE (not FOR UPDATE: it
    leaves the FOR KEY SHARE that the foreign keys of the commit's own rows take on the case
    row, while commits and edits, which update the row, still exclude each other). A locked
    row is read at its latest version, and the proposal beside it never changes, so what it
    returns is what the lock protects; the decision is read by the next statement, whose
    snapshot is taken once the lock is granted. Compiled inside a transaction, as the ORM
    requires of select_for_update()."""
    proposal = (
        Case.objects.filter(proposals__operation_id=_OPERATION)
        .order_by()
        .values_list(*(f"proposals__{name}" for name in _PROPOSAL), "case_id", "current_proposal_id")
    )
    if locked:
        proposal = proposal.select_for_update(no_key=True, of=("self",))
    decision = (
        ReviewDecision.objects.filter(operation_id=_OPERATION)
        .order_by()
        .annotate(
            effect_exists=Exists(EffectRecord.objects.filter(operation_id=OuterRef("operation_id"))),
            pending_open=Exists(
                PendingReview.objects.filter(operation_id=OuterRef("operation_id"), status=PendingReview.Status.PENDING)
            ),
        )
        .values_list(*_DECISION, f"reviewer__{get_user_model().USERNAME_FIELD}", "effect_exists", "pending_open")
    )
    return _Query(proposal.query), _Query(decision.query)


def _instance(model: type[M], values: dict[str, Any]) -> M:
    """A model instance of a row read from the database (``from_db`` takes the values in
    the model's own field order; the fields not given are deferred)."""
    names = [f.attname for f in model._meta.concrete_fields if f.attname in values]
    return model.from_db(connection.alias, names, [values[name] for name in names])


def stored(obj: M, pk: int) -> M:
    """``obj`` as the row it was inserted as, with the id the database gave it."""
    values = {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}
    return _instance(type(obj), {**values, type(obj)._meta.pk.attname: pk})


def _target(reads: tuple[_Query, _Query], results: list[list]) -> Target | None:
    """The target from the rows of ``reads``, each converted by its own query."""
    proposals, decisions = (query.rows(raw) for query, raw in zip(reads, results, strict=True))
    if not proposals:
        return None
    width = len(_PROPOSAL)
    proposal = _instance(Proposal, dict(zip(_PROPOSAL, proposals[0][:width], strict=True)))
    case_label, current_proposal_id = proposals[0][width:]
    decision, effect_exists, pending_open = None, False, False
    if decisions:
        *decided, username, effect_exists, pending_open = decisions[0]
        values = dict(zip(_DECISION, decided, strict=True))
        decision = _instance(
            ReviewDecision, {**values, "operation_id": proposal.operation_id, "proposal_id": proposal.pk}
        )
        user = get_user_model()
        decision.reviewer = _instance(user, {"id": decision.reviewer_id, user.USERNAME_FIELD: username})
    return Target(
        proposal=proposal,
        case_label=case_label,
        current_proposal_id=current_proposal_id,
        decision=decision,
        effect_exists=bool(effect_exists),
        pending_open=bool(pending_open),
    )


class _Store:
    def current_operation(self, target: Target) -> str | None:
        if target.current_proposal_id is None:
            return None
        return Proposal.objects.filter(pk=target.current_proposal_id).values_list("operation_id", flat=True).first()


# -- PostgreSQL ------------------------------------------------------------------------------


def _send(statements: list[tuple[str, Sequence[Any]]]) -> list[list[tuple] | None]:
    """Every statement in one query string, one round trip; each one's rows (None for a
    statement that returns none). A lock wait past the timeout is ``CaseLocked``."""
    with connection.cursor() as cursor:
        try:
            cursor.execute("; ".join(s for s, _ in statements), [p for _, ps in statements for p in ps])
        except OperationalError as exc:
            if lock_not_available(exc):
                raise CaseLocked from exc
            raise
        raw, results = cursor.cursor, []
        for _ in statements:
            results.append(raw.fetchall() if raw.description is not None else None)
            raw.nextset()
    return results


class PostgresCommitStore(_Store):
    """Two query strings inside Django's durable transaction: the lock and the reads, then
    every write. Django's psycopg cursor binds parameters client-side, so several statements
    share one query and one round trip; the server runs them in order, and under READ
    COMMITTED each takes its own snapshot when it starts: the reads take theirs once the
    lock is granted, so every decision committed by whoever held the case is in them. The
    lock timeout bounds every lock wait of the transaction, the writes' included. Nothing
    outlives the transaction (``SET LOCAL`` only), so a pooler in transaction mode sees
    nothing of it; nothing is prepared."""

    def transaction(self, *, durable: bool = True):
        return transaction.atomic(durable=durable)

    def read(self, operation_id: str, *, lock_timeout_ms: int | None) -> Target | None:
        reads = _reads(lock_timeout_ms is not None)
        statements: list[tuple[str, Sequence[Any]]] = [(query.sql, query.params_for(operation_id)) for query in reads]
        if lock_timeout_ms is not None:
            statements.insert(0, ("SET LOCAL lock_timeout = %s", (f"{lock_timeout_ms}ms",)))
        results = _send(statements)[-len(reads) :]
        return _target(reads, [rows or [] for rows in results])

    def write(self, writes: Writes) -> Written:
        statements = _statements(writes)
        if not writes.flush:
            statements.insert(0, ("SET LOCAL synchronous_commit = off", [], False))
        # Sent here, not through _send: the write is on every approval's route, one frame fewer
        # (tests/architecture/test_route.py).
        returned = []
        with connection.cursor() as cursor:
            try:
                cursor.execute("; ".join(s for s, _, _ in statements), [p for _, ps, _ in statements for p in ps])
            except OperationalError as exc:
                if lock_not_available(exc):
                    raise CaseLocked from exc
                raise
            raw = cursor.cursor
            for _, _, returns in statements:
                if returns:
                    row = raw.fetchone()
                    returned.append(row[0] if row else None)
                raw.nextset()
        return _written(writes, returned)


def _written(writes: Writes, returned: list) -> Written:
    found = iter(returned)
    decision_pk = next(found) if writes.decision is not None else None
    effect_pk = next(found) if writes.effect is not None else None
    return Written(decision_pk=decision_pk, effect_pk=effect_pk)


# -- SQLite ----------------------------------------------------------------------------------


class SqliteCommitStore(_Store):
    """One statement at a time. Settings open every transaction with BEGIN IMMEDIATE, so the
    transaction holds the database's write lock from its first statement: it is the case
    lock, and no other writer runs between the read and the writes. (SQLite's form of a
    skipped insert, INSERT OR IGNORE, skips a row that any constraint refuses; the commit
    takes any skipped insert for a lost race and reads again, so a refusal other than the
    unique key's still ends in an error.)"""

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
        reads, results = _reads(False), []
        with connection.cursor() as cursor:
            for query in reads:
                cursor.execute(query.sql, query.params_for(operation_id))
                results.append(cursor.fetchall())
        return _target(reads, results)

    def write(self, writes: Writes) -> Written:
        returned = []
        with connection.cursor() as cursor:
            for sql, params, returns in _statements(writes):
                cursor.execute(sql, params)
                if returns:
                    row = cursor.fetchone()
                    returned.append(row[0] if row else None)
        return _written(writes, returned)


def commit_store() -> CommitStore:
    return PostgresCommitStore() if connection.vendor == "postgresql" else SqliteCommitStore()
