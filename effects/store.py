"""The commit's storage: every statement ``effect_commit`` sends, behind one small interface.

A store reads what a commit depends on, and writes what ``effects.services`` decided from
it, only while the case is still as read. It decides nothing: which rows to write, and what
the outcome and its wording are, come in as arguments. Every statement is compiled by the ORM
(querysets, and ``core.statements.insert`` for the inserts); the row read back is converted
by the same query's compiler and turned into models with ``Model.from_db``.

PostgreSQL and SQLite implement the same interface (tests/effects/test_store_contract.py
runs one suite on both). They differ in how they keep the case as read until the write
(PostgreSQL: a compare-and-swap on the case row inside the write; SQLite: one transaction
holding the database's write lock) and in how many statements travel at once; the rows they
write are the same.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol, cast

from django.contrib.auth import get_user_model
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Exists, Model, OuterRef, Subquery
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.db.models.sql import Query, UpdateQuery

from cases.models import Case, EvidenceChange
from core import chain
from core.locks import lock_not_available
from core.statements import bound_cursor, database, insert, loaded, statement_commits, statement_scope
from effects.delivery import delivery_fields
from effects.models import CommitAttempt, Delivery, EffectRecord
from reviews.models import Approval, PendingReview, Proposal, ReviewDecision

# PostgreSQL's unique_violation (a unique key refused a row) and not_null_violation.
UNIQUE_VIOLATION = "23505"
NOT_NULL_VIOLATION = "23502"


class CaseLocked(Exception):
    """Another transaction held the case (its row, or the whole SQLite database) past the
    commit's lock timeout. Nothing of the write stands."""


@dataclass(frozen=True)
class Target:
    """What a commit of one operation depends on, read in one snapshot."""

    proposal: Proposal  # with the fields its effect copies
    case_label: str  # the case's own id (T-1042)
    current_proposal_id: int | None
    # The policy version the case is under now (its row, identity and label): a publish
    # switches it for every undecided case at once, before it prepares each one again.
    case_policy_pk: int
    case_policy_id: str
    case_policy_label: str
    # The operation a new source version left without one of its passages (the case's
    # ``evidence_hold``, "" when none), and the reason of this operation's latest mark
    # (None: not marked). The guard holds the first as read, as it holds the policy.
    evidence_hold: str
    evidence_changed: str | None
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
    # A new approval of a policy that needs several (the Nth comes with its decision).
    approval: Approval | None = None
    # False when nothing but the attempt row is new: the transaction may skip the WAL flush.
    flush: bool = True
    # The operation has a pending review to complete.
    complete_pending: bool = True
    # The read the new rows were decided from: they are written only while the case row is
    # still as it read (its current proposal and policy). Required with a new decision, effect or
    # approval.
    basis: Target | None = None


@dataclass(frozen=True)
class Written:
    """Whether each insert the unique keys allowed was made (None: not asked for)."""

    decision_pk: int | None
    effect_pk: int | None
    approval_pk: int | None = None


class CommitStore(Protocol):
    def transaction(self, *, durable: bool = True) -> Any:
        """What holds a read and its write together (a context manager); ``CaseLocked``
        when it cannot begin. ``durable=False`` only for a caller that may already be in a
        transaction (repair)."""

    def read(self, operation_id: str) -> Target | None:
        """The target of ``operation_id``, in one snapshot; None: no such proposal."""

    def current_operation(self, target: Target) -> str | None:
        """The operation of the case's current proposal (for a stale answer)."""

    def approvals(self, operation_id: str) -> list[int]:
        """The reviewers who approved ``operation_id`` so far, in the order they did (a
        policy that needs several approvers only)."""

    def write_commits(self) -> bool:
        """Whether ``write()`` is a transaction of its own, committed when it returns: a
        failure while it runs may then have been applied."""

    def write(self, writes: Writes, *, lock_timeout_ms: int) -> Written:
        """Insert the rows of ``writes`` and complete the operation's pending review, all or
        nothing; no row at all (Written(None, None)) when a unique key refused one or the
        case moved on from ``writes.basis``. Every lock wait is bounded by the timeout."""


def attempt_append(attempt: CommitAttempt) -> None:
    """One attempt row, outside a commit (a refusal): one INSERT, in the caller's
    transaction if there is one. Its references are not checked by the database, so it
    waits for no lock on the case or the user."""
    attempt.save(force_insert=True)


# -- the statements, each compiled once by the ORM ------------------------------------------

# Places for a statement's parameters while it is compiled: every statement of a commit is
# about one operation (and one case), so its SQL is the same for all of them and is compiled
# once; each call's parameters put the values where these stand. (Never sent.)
_OPERATION = "\x00operation"
_CASE = "\x00case"
_CURRENT = "\x00current"
_POLICY = "\x00policy"
_HOLD = "\x00hold"


class _Query:
    """A statement about one operation: its SQL as the ORM's compiler writes it, and that
    compiler's reading of the rows (the fields' own converters: JSON, timestamps, booleans)."""

    def __init__(self, query: Query, *, lock: str = ""):
        self.compiler = query.get_compiler(connection=connection)
        sql, params = self.compiler.as_sql()
        self.sql, self.params = f"{sql} {lock}" if lock else sql, tuple(params)
        # What results_iter() would look up on every call, looked up once (a statement that
        # selects nothing has none).
        self.width = getattr(self.compiler, "col_count", 0)
        selected = [s[0] for s in (self.compiler.select or [])[: self.width]]
        self.converters = self.compiler.get_converters(selected) if selected else {}

    def params_for(self, places: dict[str, Any]) -> list:
        return [places.get(p, p) if isinstance(p, str) else p for p in self.params]

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


@cache
def _guard() -> _Query:
    """The case row as the commit's read saw it (its id, current proposal, policy and evidence
    hold), locked FOR NO KEY UPDATE: not FOR UPDATE, which would wait for the FOR KEY SHARE
    that the foreign keys of concurrent attempt rows take, while commits and edits, which take
    FOR NO KEY UPDATE or update the row, still exclude each other. A row being changed is
    waited for, then compared again at its new version (READ COMMITTED's recheck), so an
    edit, a publish's switch of the case's policy or a new source version's mark of its
    evidence (``Case.evidence_hold``) that committed first leaves the guard empty. The lock
    clause is the backend's own (``for_update_sql``): select_for_update() compiles only
    inside a transaction, and this statement is compiled once, wherever the first commit runs."""
    case = Case.objects.filter(
        pk=RawSQL("%s", (_CASE,)),
        current_proposal_id=RawSQL("%s", (_CURRENT,)),
        policy_id=RawSQL("%s", (_POLICY,)),
        evidence_hold=RawSQL("%s", (_HOLD,)),
    )
    return _Query(
        case.order_by().values_list("current_proposal_id").query, lock=connection.ops.for_update_sql(no_key=True)
    )


# The write's new rows take their proposal from the guard: an empty guard (the case moved
# on) leaves it NULL, and the column's NOT NULL refuses the whole statement.
_GUARDED = ("proposal_id", "guard", "current_proposal_id")


def _write(writes: Writes, timeout: str) -> tuple[str, list]:
    """The whole write as one statement, and its parameters: the guard on the case row when
    the write has a new decision or effect, each new row's INSERT (the ORM's) under a name,
    the pending review's UPDATE, and the new ids.

    PostgreSQL runs every data-modifying part of a WITH whether or not it is read, all in one
    snapshot, so a row names one written beside it by its part's name (``RETURNING id``),
    never by a lookup. The final SELECT sets the lock timeout first (``set_config(…, true)``:
    this transaction only); the guard and the inserts it reads run after it, and the parts
    nobody reads once it is done, so the timeout bounds every lock wait of the statement: the
    case row, the unique keys, the foreign keys checked at its end. Without ``flush``, the
    commit may skip the WAL flush. Each part's text is compiled once per process, so a given
    shape is the same text every time (psycopg prepares it by its text)."""
    parts: list[tuple[str, str, list]] = []
    if writes.decision is not None or writes.effect is not None or writes.approval is not None:
        basis = writes.basis
        assert basis is not None, "a new decision, effect or approval is written only from a read"
        guard = _guard()
        places = {
            _CASE: basis.proposal.case_id,
            _CURRENT: basis.current_proposal_id,
            _POLICY: basis.case_policy_pk,
            _HOLD: basis.evidence_hold,
        }
        parts.append(("guard", guard.sql, guard.params_for(places)))
    if writes.approval is not None:
        statement = insert(Approval, by_name=(_GUARDED,))
        parts.append(("approval", statement.sql, statement.params_for(writes.approval)))
    if writes.decision is not None:
        statement = insert(ReviewDecision, by_name=(_GUARDED,))
        parts.append(("decision", statement.sql, statement.params_for(writes.decision)))
    if writes.effect is not None:
        decided = (("decision_id", "decision"),) if writes.decision is not None else ()
        if writes.decision is not None:
            chain.follows(writes.effect, writes.decision)
        statement = insert(EffectRecord, by_name=decided or (_GUARDED,))
        parts.append(("effect", statement.sql, statement.params_for(writes.effect)))
        if writes.delivery:
            statement = insert(Delivery, by_name=(*decided, ("effect_id", "effect")))
            parts.append(("delivery", statement.sql, statement.params_for(Delivery(**delivery_fields(writes.effect)))))
    statement = insert(CommitAttempt, returning=False)
    parts.append(("attempt", statement.sql, statement.params_for(writes.attempt)))
    if writes.complete_pending:
        completion = _completion()
        parts.append(("completion", completion.sql, completion.params_for({_OPERATION: writes.attempt.operation_id})))
    params = [p for _, _, part in parts for p in part]
    return _joined(tuple((name, sql) for name, sql, _ in parts), writes.flush), [*params, timeout]


@cache
def _joined(parts: tuple[tuple[str, str], ...], flush: bool) -> str:
    """The write's text for one shape of parts: joined once, the same string every time."""
    answers = ["set_config('lock_timeout', %s, true)"]
    answers += [f"(SELECT id FROM {name})" for name, _ in parts if name in ("approval", "decision", "effect")]
    if not flush:
        answers.append("set_config('synchronous_commit', 'off', true)")
    body = ", ".join(f"{name} AS ({sql})" for name, sql in parts)
    return f"WITH {body} SELECT {', '.join(answers)}"


_PROPOSAL = ["id", "case_id", "operation_id", "action", "body", "evidence_id", "passages", "policy_id"]
_PROPOSAL += ["policy_snapshot", "row_hash"]
_DECISION = ["id", "approved", "reviewer_id", "decided_at", "decline_reason", "decline_note", "system_actor"]
_DECISION += ["row_hash"]


@cache
def _read() -> _Query:
    """What a commit reads of its operation, in one statement and one snapshot: the case with
    the operation's proposal and the case's policy version and evidence hold, the reason of the
    operation's latest evidence mark, the standing decision with its reviewer's username,
    whether its effect exists and whether a pending review is open. It
    takes no lock: whatever of it the write depends on, the write checks as it writes (the
    case row by the guard, a decision or effect written since by their unique keys)."""
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
            evidence_changed=Subquery(
                EvidenceChange.objects.filter(operation_id=OuterRef("proposals__operation_id"))
                .order_by("-pk")
                .values("reason")[:1]
            ),
        )
    )
    names = [f"proposals__{name}" for name in _PROPOSAL] + ["case_id", "current_proposal_id"]
    names += ["policy_id", "policy__policy_id", "policy__label", "evidence_hold", "evidence_changed"]
    names += [decision + name for name in _DECISION] + [f"{decision}reviewer__{get_user_model().USERNAME_FIELD}"]
    names += ["effect_exists", "pending_open"]
    return _Query(read.values_list(*names).query)


def _target(read: _Query, raw: list) -> Target | None:
    """The target from the row of ``read``, converted by its own query."""
    rows = read.rows(raw)
    if not rows:
        return None
    values = iter(rows[0])
    proposal = loaded(Proposal, {name: next(values) for name in _PROPOSAL})
    case_label, current_proposal_id = next(values), next(values)
    case_policy_pk, case_policy_id, case_policy_label = next(values), next(values), next(values)
    evidence_hold, evidence_changed = next(values), next(values)
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
        case_policy_pk=case_policy_pk,
        case_policy_id=case_policy_id,
        case_policy_label=case_policy_label,
        evidence_hold=evidence_hold,
        evidence_changed=evidence_changed,
        decision=decision,
        effect_exists=bool(effect_exists) and decision is not None,
        pending_open=bool(pending_open) and decision is not None,
    )


# -- the read, made ahead ---------------------------------------------------------------------


@dataclass
class ReadAhead:
    """A commit's read of ``operation_id``, made by an earlier statement of the same call
    (``read_beside``), for the store's next read of that operation to take once."""

    operation_id: str
    target: Target | None
    taken: bool = False


# Set by the caller around the work that ends in the commit (workflow/answer.py); a mutable
# holder, so that the engine's copied contexts see it taken.
_AHEAD: contextvars.ContextVar[ReadAhead | None] = contextvars.ContextVar("decisionflow_read_ahead", default=None)


def read_beside(sql: str, params: Sequence[Any], operation_id: str) -> tuple[tuple | None, ReadAhead | None]:
    """Run ``sql`` (one row at most, plain columns) and, on PostgreSQL, the commit's read of
    ``operation_id`` with it, as one statement: ``sql``'s row (None: none) and the read, for
    ``read_ahead``. Elsewhere only ``sql`` runs, and the read is None: SQLite's store must read
    inside its write transaction, where the database's write lock keeps the case as read.

    A read made ahead is as good as one made at the commit: the store's read takes no lock,
    and the write goes ahead only while the case row is as read (the guard) and no decision
    or effect was written since (their unique keys); otherwise the commit reads again."""
    db = database()
    if db.vendor != "postgresql":
        with db.cursor() as cursor:
            cursor.execute(sql, list(params))
            return cursor.fetchone(), None
    read = _read()
    combined = _beside(sql)
    with bound_cursor() as cursor:
        cursor.execute(combined, [*params, *read.params_for({_OPERATION: operation_id})])
        row = cursor.fetchone()
    if row is None:
        return None, None
    own, found = tuple(row[: len(row) - read.width]), row[len(row) - read.width :]
    # The LEFT JOIN's empty side: no proposal of that operation (its id is never NULL).
    target = _target(read, [found]) if found[0] is not None else None
    return own, ReadAhead(operation_id, target)


@cache
def _beside(sql: str) -> str:
    return f"SELECT * FROM ({sql}) own LEFT JOIN ({_read().sql}) ahead ON true"


@contextmanager
def read_ahead(ahead: ReadAhead | None) -> Iterator[None]:
    """Within the block, the store's first read of ``ahead``'s operation is ``ahead``'s."""
    token = _AHEAD.set(ahead)
    try:
        yield
    finally:
        _AHEAD.reset(token)


def _taken_ahead(operation_id: str) -> ReadAhead | None:
    ahead = _AHEAD.get()
    if ahead is None or ahead.taken or ahead.operation_id != operation_id:
        return None
    ahead.taken = True
    return ahead


class _Store:
    def current_operation(self, target: Target) -> str | None:
        if target.current_proposal_id is None:
            return None
        return Proposal.objects.filter(pk=target.current_proposal_id).values_list("operation_id", flat=True).first()

    def approvals(self, operation_id: str) -> list[int]:
        found = Approval.objects.filter(operation_id=operation_id).order_by("ordinal")
        return list(found.values_list("reviewer_id", flat=True))

    def read(self, operation_id: str) -> Target | None:
        read = _read()
        with bound_cursor() as cursor:
            cursor.execute(read.sql, read.params_for({_OPERATION: operation_id}))
            return _target(read, cursor.fetchall())


def _refused(exc: IntegrityError) -> bool:
    """Whether a unique key refused a row: another writer committed this operation's row."""
    return getattr(exc.__cause__, "sqlstate", None) == UNIQUE_VIOLATION or "UNIQUE constraint failed" in str(exc)


def _moved_on(exc: IntegrityError) -> bool:
    """Whether the guard refused the write: the case row was no longer as read, so a new
    row's proposal (``_GUARDED``) came out NULL."""
    cause = exc.__cause__
    diag = getattr(cause, "diag", None)
    return (
        getattr(cause, "sqlstate", None) == NOT_NULL_VIOLATION
        and getattr(diag, "column_name", None) == "proposal_id"
        and getattr(diag, "table_name", None)
        in (ReviewDecision._meta.db_table, EffectRecord._meta.db_table, Approval._meta.db_table)
    )


def _nothing_written() -> Written:
    """The answer of a write that wrote nothing; in a transaction, it must roll back too."""
    if connection.in_atomic_block:
        transaction.set_rollback(True)
    return Written(decision_pk=None, effect_pk=None)


# -- PostgreSQL ------------------------------------------------------------------------------


@contextmanager
def _lock_wait_bounded() -> Iterator[None]:
    """A lock wait past the statement's lock timeout is ``CaseLocked``."""
    try:
        yield
    except OperationalError as exc:
        if lock_not_available(exc):
            raise CaseLocked from exc
        raise


class PostgresCommitStore(_Store):
    """Two statements, each a transaction of its own in Django's autocommit, both bound on the
    server (``core.statements.bound_cursor``): the read (``_read``; a decision's is made ahead,
    with its pending review: ``read_beside``, so the commit sends only its write), then the whole write
    (``_write``), which goes ahead only while the case row is as read (``_guard``). Two round
    trips, no BEGIN and no COMMIT of their own. The settings the write makes are its
    transaction's (``set_config(…, true)``), so a pooler in transaction mode sees nothing of
    them. Inside a caller's transaction (repair, a test's) both run in a savepoint of it."""

    def transaction(self, *, durable: bool = True):
        return statement_scope(durable=durable)

    def write_commits(self) -> bool:
        return statement_commits()

    def read(self, operation_id: str) -> Target | None:
        ahead = _taken_ahead(operation_id)
        return ahead.target if ahead is not None else super().read(operation_id)

    def write(self, writes: Writes, *, lock_timeout_ms: int) -> Written:
        new_decision, new_effect = writes.decision is not None, writes.effect is not None
        new_approval = writes.approval is not None
        with bound_cursor() as cursor, _lock_wait_bounded():
            try:
                cursor.execute(*_write(writes, f"{lock_timeout_ms}ms"))
            except IntegrityError as exc:
                if not (_refused(exc) or _moved_on(exc)):
                    raise
                return _nothing_written()
            _, *ids = cursor.fetchone()
        found = iter(ids)
        return Written(
            approval_pk=next(found) if new_approval else None,
            decision_pk=next(found) if new_decision else None,
            effect_pk=next(found) if new_effect else None,
        )


# -- SQLite ----------------------------------------------------------------------------------


class SqliteCommitStore(_Store):
    """The same statements as PostgreSQL's, one at a time, in one transaction. Settings open
    every transaction with BEGIN IMMEDIATE, so the transaction holds the database's write lock
    from its first statement: it is the case lock, no other writer runs between the read and
    the writes, and the case is as read without a guard."""

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

    def write_commits(self) -> bool:
        return False

    def write(self, writes: Writes, *, lock_timeout_ms: int) -> Written:
        with connection.cursor() as cursor:
            try:
                for row in _rows(writes):
                    statement = insert(type(row))
                    cursor.execute(statement.sql, statement.params_for(row))
                    row.pk = cursor.fetchone()[0]
            except IntegrityError as exc:
                if not _refused(exc):
                    raise
                return _nothing_written()
            statement = insert(CommitAttempt, returning=False)
            cursor.execute(statement.sql, statement.params_for(writes.attempt))
            if writes.complete_pending:
                completion = _completion()
                cursor.execute(completion.sql, completion.params_for({_OPERATION: writes.attempt.operation_id}))
        return Written(
            decision_pk=getattr(writes.decision, "pk", None),
            effect_pk=getattr(writes.effect, "pk", None),
            approval_pk=getattr(writes.approval, "pk", None),
        )


def _rows(writes: Writes) -> Iterator[Model]:
    """The new rows of ``writes`` in order, each given the id of the row before it that it
    references once that row is in (the caller inserts each and sets its ``pk``)."""
    if writes.approval is not None:
        yield writes.approval
    if writes.decision is not None:
        yield writes.decision
    if writes.effect is not None:
        if writes.decision is not None:
            writes.effect.decision_id = writes.decision.pk
            chain.follows(writes.effect, writes.decision)
        yield writes.effect
        if writes.delivery:
            yield Delivery(**delivery_fields(writes.effect))


# The stores hold no state: one of each serves every commit.
_POSTGRES, _SQLITE = PostgresCommitStore(), SqliteCommitStore()


def commit_store() -> CommitStore:
    return _POSTGRES if database().vendor == "postgresql" else _SQLITE
