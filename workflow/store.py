"""Begin's storage: the reads of a case, and the write of a first begin.

A case's first begin writes four rows that stand or fall together: the prepared proposal,
the case's pointer to it (compare-and-swap from none), the pause checkpoint and the pending
review. ``workflow/begin.py`` decides every rule and builds the rows as model instances;
this module only reads and stores them, behind four functions:

- ``first_begin_read(case)`` (PostgreSQL): what a first begin reads, with no lock and no
  transaction of its own; None when the case has a proposal (that begin takes the lock).
- ``begin_transaction(case)``: the transaction that holds the case lock, opened with the
  case's current proposal, policy and evidence, and for a case without a proposal the id
  its first proposal will have (PostgreSQL draws it from the table's sequence; SQLite has
  none until the insert).
- ``first_proposal_reserve(case, proposal, opened)``: the proposal gets its id before the
  engine run asks about it (its review request names it). SQLite inserts it here.
- ``first_begin_write(case, proposal, checkpoint, pending)``: the rest; ``IntegrityError``
  when the case had a proposal after all, and then nothing of it stands.

On PostgreSQL the write is one statement: the ORM's own INSERT of each instance
(``core.statements.insert``: as ``save()`` sends them), joined as data-modifying CTEs with
the pointer's UPDATE, so the four rows cost one round trip instead of four (measured: 1.35 ms
against 2.41 ms for the four saves). The pending review takes its case from the pointer's
UPDATE, so a pointer that did not move (another begin came first) leaves it NULL and the
whole statement writes nothing: the statement is all or nothing by itself, so a first begin
can send it as a transaction of its own (Django's autocommit), after a read that took no
lock, and a lost race costs only the retry under the lock. The statements' texts are built
once per process and bound on the server, so psycopg may prepare them on a direct connection
(core/poolers.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import IntegrityError, connection
from django.db.models import Model

from cases.models import Case, Policy
from cases.selectors import evidence_rows, evidence_sql
from core.errors import NotFound
from core.locks import case_lock, decision_lock_timeout, lock_timeout_ms
from core.statements import bound_cursor, insert, stored
from reviews.models import PendingReview, Proposal, WorkflowCheckpoint


@dataclass(frozen=True)
class Opened:
    """What begin reads of its case under the case lock."""

    current_proposal_id: int | None
    policy: dict  # name, label, parameters: what a prepared proposal snapshots
    evidence: tuple[list[dict], list[dict]]  # its passages and findings (``cases.selectors``)
    proposal_pk: int | None  # PostgreSQL: the first proposal's id, drawn when the case has none


@contextmanager
def begin_transaction(case: Case) -> Iterator[Opened]:
    """Begin's one transaction: the case lock (``case_lock``), and under it the case's current
    proposal, policy and evidence (on PostgreSQL in the lock's round trip). The caller's
    case object follows the row read, as ``refresh_from_db`` would."""
    reads = [(_case_read_sql(connection.vendor), [case.pk]), (evidence_sql(), [case.pk, case.pk])]
    with case_lock(case.case_id, reads=reads) as (rows, evidence):
        if not rows:
            raise NotFound(f"case {case.case_id} does not exist")
        current, policy_pk, name, label, parameters, proposal_pk = rows[0]
        _follow(case, current, policy_pk)
        yield Opened(current, _policy(name, label, parameters), evidence_rows(evidence), proposal_pk)


def _follow(case: Case, current: int | None, policy_pk: int) -> None:
    """The caller's case object follows the row read, as ``refresh_from_db`` would (each
    descriptor drops a cached object of another id)."""
    if case.current_proposal_id != current:
        case.current_proposal_id = current
    if case.policy_id != policy_pk:
        case.policy_id = policy_pk


def first_begin_read(case: Case) -> Opened | None:
    """PostgreSQL: what a case's first begin reads (``begin_transaction``'s reads), in one
    statement and one snapshot, with no lock and no transaction of its own; bound on the
    server, so psycopg may prepare it. None when the case has a proposal or is gone: that
    begin takes the case lock."""
    with bound_cursor() as cursor:
        cursor.execute(_first_read_sql(), [case.pk, case.pk, case.pk])
        rows = cursor.fetchall()
    if not rows or rows[0][0] is not None:
        return None
    _, policy_pk, name, label, parameters, proposal_pk = rows[0][:6]
    _follow(case, None, policy_pk)
    evidence = [row[6:] for row in rows if row[6] is not None]
    return Opened(None, _policy(name, label, parameters), evidence_rows(evidence), proposal_pk)


@functools.cache
def _first_read_sql() -> str:
    """The case read and the evidence read as one statement: each evidence row carries the
    case's columns (the case read is a CTE, so the sequence is drawn once)."""
    columns = "kind, position, pk, source_id, version, quotation, finding, clause"
    return (
        f"WITH c AS ({_case_read_sql('postgresql')}) SELECT c.*, e.* FROM c "
        f"LEFT JOIN ({evidence_sql()}) AS e({columns}) ON true ORDER BY e.kind, e.position, e.pk"
    )


def _policy(name: str, label: str, parameters) -> dict:
    field = Policy._meta.get_field("parameters")
    return {"name": name, "label": label, "parameters": field.from_db_value(parameters, field.cached_col, connection)}


@functools.cache
def _case_read_sql(vendor: str) -> str:
    """The case's current proposal and policy; on PostgreSQL, for a case without a proposal,
    also the id its first proposal will have, drawn from the table's sequence.

    Written here rather than as a queryset: compiling that queryset took about 0.8 ms per
    begin, eight times what the database spent planning and answering it.
    """
    qn = connection.ops.quote_name
    current = _column(Case, "current_proposal")
    drawn = (
        f"CASE WHEN c.{current} IS NULL THEN nextval(pg_get_serial_sequence("
        f"'{qn(Proposal._meta.db_table)}', '{Proposal._meta.pk.column}')) END"
        if vendor == "postgresql"
        else "NULL"
    )
    columns = ", ".join(f"p.{_column(Policy, name)}" for name in ("name", "label", "parameters"))
    return (
        f"SELECT c.{current}, c.{_column(Case, 'policy')}, {columns}, {drawn} FROM {qn(Case._meta.db_table)} c "
        f"JOIN {qn(Policy._meta.db_table)} p ON p.{_column(Policy, 'pk')} = c.{_column(Case, 'policy')} "
        f"WHERE c.{_column(Case, 'pk')} = %s"
    )


def _column(model: type[Model], name: str) -> str:
    """A field's column (``pk``: the primary key's), quoted for this database."""
    (field,) = (f for f in model._meta.concrete_fields if f.name == name or (name == "pk" and f.primary_key))
    return connection.ops.quote_name(str(field.column))


def first_proposal_reserve(case: Case, proposal: Proposal, opened: Opened) -> bool:
    """Give a case's first proposal its id before the engine run; False when the case has a
    proposal after all."""
    if connection.vendor == "postgresql":
        if opened.proposal_pk is None:
            return False
        proposal.pk = opened.proposal_pk
        return True
    try:
        proposal.save(force_insert=True)
    except IntegrityError:
        return False
    return _pointer_update(case, proposal) == 1


def first_begin_write(
    case: Case, proposal: Proposal, checkpoint: WorkflowCheckpoint, pending: PendingReview
) -> tuple[Proposal, PendingReview]:
    """Store a first begin's rows; the stored proposal and pending review. ``IntegrityError``
    when the case had a proposal after all (PostgreSQL: nothing of the statement stands;
    SQLite: the caller's transaction must roll back). The pending review keeps the pause
    checkpoint's time (``checkpoint_at``): the checkpoint row itself may be pruned once the
    review is decided."""
    if connection.vendor != "postgresql":
        checkpoint.save(force_insert=True)
        pending.checkpoint_at = checkpoint.created_at
        pending.save(force_insert=True)
        return proposal, pending
    proposal_insert = insert(Proposal, with_pk=True, returning=False)
    pause_insert = insert(WorkflowCheckpoint, with_pk=checkpoint.pk is not None, returning=False)
    pending_insert = insert(PendingReview, by_name=(("case_id", "pointer"),))
    params = [*proposal_insert.params_for(proposal), proposal.pk, case.pk, case.policy_id]
    params += pause_insert.params_for(checkpoint)
    pending.checkpoint_at = checkpoint.created_at  # set by the checkpoint's pre_save, just now
    params += pending_insert.params_for(pending)
    # Data-modifying CTEs all run, whatever the final SELECT reads; it sets the lock timeout
    # first (this transaction only), then reads the pending review, whose case comes from
    # the pointer's UPDATE (the only part that can wait for a lock: the case row). The
    # foreign keys are checked at the end of the statement, when every row is in.
    sql = (
        f"WITH proposal AS ({proposal_insert.sql}), pointer AS ({_pointer_sql()} RETURNING {_column(Case, 'pk')}), "
        f"pause AS ({pause_insert.sql}), pending AS ({pending_insert.sql}) "
        "SELECT set_config('lock_timeout', %s, true), (SELECT * FROM pending)"
    )
    with bound_cursor() as cursor:
        cursor.execute(sql, [*params, f"{lock_timeout_ms(decision_lock_timeout())}ms"])
        _, pending_pk = cursor.fetchone()
    pending.pk = pending_pk
    stored_proposal = stored(proposal)
    case.current_proposal = stored_proposal
    stored_pending = stored(pending)
    stored_pending.case, stored_pending.proposal = case, stored_proposal
    return stored_proposal, stored_pending


def _pointer_update(case: Case, proposal: Proposal) -> int:
    moved = Case.objects.filter(pk=case.pk, current_proposal__isnull=True).update(current_proposal=proposal)
    if moved:
        case.current_proposal = proposal
    return moved


@functools.cache
def _pointer_sql() -> str:
    """The compare-and-swap of a case's pointer, from none to its first proposal, while the
    case is still on the policy the proposal was prepared under (a publish moves a case
    without a proposal to the new version)."""
    current, table = _column(Case, "current_proposal"), connection.ops.quote_name(Case._meta.db_table)
    return (
        f"UPDATE {table} SET {current} = %s "
        f"WHERE {_column(Case, 'pk')} = %s AND {current} IS NULL AND {_column(Case, 'policy')} = %s"
    )
