"""Begin's storage: the reads of a case under its lock, and the write of a first begin.

A case's first begin writes four rows that stand or fall together: the prepared proposal,
the case's pointer to it (compare-and-swap from none), the pause checkpoint and the pending
review. ``workflow/begin.py`` decides every rule and builds the rows as model instances;
this module only reads and stores them, behind three functions that both databases
implement:

- ``case_open(case)``: the case's current proposal and policy, and for a case without a
  proposal the id its first proposal will have (PostgreSQL draws it from the table's
  sequence; SQLite has none until the insert).
- ``first_proposal_reserve(proposal, opened)``: the proposal gets its id before the engine
  run asks about it (its review request names it). SQLite inserts it here.
- ``first_begin_write(proposal, checkpoint, pending)``: the rest; False when the case had a
  proposal after all (written without the case lock), and the caller rolls back.

On PostgreSQL the write is one statement: the ORM's own INSERT of each instance (values
converted as ``save()`` converts them), joined as data-modifying CTEs with the pointer's
UPDATE, so the four rows cost one round trip instead of four (docs/PERFORMANCE.md, begin).
Every statement is sent as it is: nothing is prepared on the session, so a pooler in
transaction mode works.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from django.db import IntegrityError, connection, models
from django.db.models import Model, Q
from django.db.models.expressions import RawSQL
from django.db.models.sql import InsertQuery, UpdateQuery

from cases.models import Case
from core.errors import NotFound
from reviews.models import PendingReview, Proposal, WorkflowCheckpoint

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class Opened:
    """What begin reads of its case under the case lock."""

    current_proposal_id: int | None
    policy: dict  # name, label, parameters: what a prepared proposal snapshots
    proposal_pk: int | None  # PostgreSQL: the first proposal's id, drawn when the case has none


def case_open(case: Case) -> Opened:
    """The case's current proposal and policy, read under the caller's case lock; the
    caller's case object follows the row (as ``refresh_from_db`` would)."""
    row = _case_row(case)
    if row is None:
        raise NotFound(f"case {case.case_id} does not exist")
    current, name, label, parameters, proposal_pk = row
    if case.current_proposal_id != current:
        case.current_proposal_id = current  # the descriptor drops a cached proposal of another id
    return Opened(current, {"name": name, "label": label, "parameters": parameters}, proposal_pk)


def _case_row(case: Case):
    rows = Case.objects.filter(pk=case.pk)
    if connection.vendor == "postgresql":
        # A sequence value only for a case without a proposal: its first one is built with it.
        table = connection.ops.quote_name(Proposal._meta.db_table)
        drawn = RawSQL("nextval(pg_get_serial_sequence(%s, 'id'))", [table], output_field=models.BigIntegerField())
        rows = rows.annotate(next_pk=models.Case(models.When(current_proposal__isnull=True, then=drawn)))
        return rows.values_list(
            "current_proposal_id", "policy__name", "policy__label", "policy__parameters", "next_pk"
        ).first()
    found = rows.values_list("current_proposal_id", "policy__name", "policy__label", "policy__parameters").first()
    return None if found is None else (*found, None)


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
) -> tuple[Proposal, PendingReview] | None:
    """Store a first begin's rows; the stored proposal and pending review, or None when the
    case had a proposal after all (the caller's transaction must then roll back). The
    pending review keeps the pause checkpoint's time (``checkpoint_at``): the checkpoint
    row itself may be pruned once the review is decided."""
    if connection.vendor != "postgresql":
        checkpoint.save(force_insert=True)
        pending.checkpoint_at = checkpoint.created_at
        pending.save(force_insert=True)
        return proposal, pending
    proposal_sql, proposal_params = _insert(proposal)
    checkpoint_sql, checkpoint_params = _insert(checkpoint)
    pending.checkpoint_at = checkpoint.created_at  # set by the insert's pre_save, just now
    pending_sql, pending_params = _insert(pending, returning=True)
    pointer_sql, pointer_params = _pointer_sql(case, proposal)
    # Data-modifying CTEs all run, whatever the final SELECT reads; the foreign keys are
    # checked at the end of the statement, when every row is in.
    sql = (
        f"WITH proposal AS ({proposal_sql}), pointer AS ({pointer_sql} RETURNING 1), "
        f"pause AS ({checkpoint_sql}), pending AS ({pending_sql}) "
        "SELECT (SELECT * FROM pending), EXISTS (SELECT FROM pointer)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, (*proposal_params, *pointer_params, *checkpoint_params, *pending_params))
        pending_pk, moved = cursor.fetchone()
    if not moved:
        return None
    pending.pk = pending_pk
    stored_proposal = _stored(proposal)
    case.current_proposal = stored_proposal
    stored_pending = _stored(pending)
    stored_pending.case, stored_pending.proposal = case, stored_proposal
    return stored_proposal, stored_pending


def _pointer_update(case: Case, proposal: Proposal) -> int:
    moved = Case.objects.filter(pk=case.pk, current_proposal__isnull=True).update(current_proposal=proposal)
    if moved:
        case.current_proposal = proposal
    return moved


def _pointer_sql(case: Case, proposal: Proposal) -> tuple[str, tuple]:
    """The ORM's compare-and-swap of the case's pointer, from none to ``proposal``."""
    query = UpdateQuery(Case)
    query.add_update_values({"current_proposal": proposal})
    query.add_q(Q(pk=case.pk, current_proposal__isnull=True))
    sql, params = query.get_compiler(connection=connection).as_sql()
    return sql, tuple(params)


def _insert(obj: Model, *, returning: bool = False) -> tuple[str, tuple]:
    """The ORM's own INSERT of one instance (what ``save(force_insert=True)`` sends): every
    concrete field, an unset primary key left to the database, ``pre_save`` applied."""
    model = type(obj)
    fields = [f for f in model._meta.concrete_fields if not (f.primary_key and obj.pk is None)]
    query = InsertQuery(model)
    query.insert_values(fields, [obj])
    compiler = query.get_compiler(connection=connection)
    compiler.returning_fields = [model._meta.pk] if returning else None
    ((sql, params),) = compiler.as_sql()
    return sql, tuple(params)


def _stored(obj: M) -> M:
    """The instance as the ORM loads a stored row (``Model.from_db``), from the values it was
    inserted with."""
    names = [f.attname for f in obj._meta.concrete_fields]
    return type(obj).from_db(connection.alias, names, [getattr(obj, name) for name in names])
