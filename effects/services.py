"""Commit (decision + effect in one transaction), reconciliation, and repair.

The unique constraints on ``operation_id`` are the atomic step of commit: every insert is
attempted, and a unique violation is read back as a replay or a conflict. Nothing checks
first and writes later.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from django.db import IntegrityError, connection, transaction

from cases.models import Case
from decisionflow.core import identity
from decisionflow.core.errors import (
    DecisionflowError,
    InvalidInput,
    NotFound,
    PermissionRefused,
    StaleProposal,
)
from decisionflow.core.faults import crash_point
from reviews.models import Proposal, ReviewDecision

from .models import CommitAttempt, EffectRecord

REVIEW_PERMISSION = "reviews.review_proposal"

COMMITTED = "Committed"
DECLINED = "Declined"
CONFLICTING = "ConflictingDecision"

PENDING = "Pending"
NO_LOCAL_EFFECT = "NoLocalEffectRecorded"


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


def _attempt(*, operation_id, case_id, approved, reviewer, outcome, channel, detail=""):
    # Every call appends one row, through the one-statement insert (no ORM save machinery:
    # this is on every commit's path).
    fields = {
        "operation_id": str(operation_id)[:200],
        "case_id": case_id,
        "approved": approved if isinstance(approved, bool) else None,
        "reviewer": reviewer if getattr(reviewer, "pk", None) else None,
        "outcome": outcome,
        "channel": channel,
        "detail": detail[:2000],
    }
    if connection.features.can_return_columns_from_insert:
        _insert_row(CommitAttempt, fields)
    else:  # SQLite < 3.35
        CommitAttempt.objects.create(**fields)


def _effect_fields(proposal: Proposal, decision: ReviewDecision) -> dict:
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
    raising it, so no savepoint is needed to keep the transaction usable (four round trips
    less per commit; see docs/PERFORMANCE.md). Any other violation still raises.
    """
    if not connection.features.can_return_columns_from_insert:  # SQLite < 3.35
        return _insert_once_savepoint(model, **fields)
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


def _insert_once_savepoint(model, **fields):
    try:
        with transaction.atomic():
            return model.objects.create(**fields)
    except IntegrityError:
        if not model.objects.filter(operation_id=fields["operation_id"]).exists():
            raise
        return None


def _commit(*, operation_id: str, approved: bool, reviewer, channel: str, proposal: Proposal | None) -> CommitResult:
    with transaction.atomic(durable=True):
        # A proposal is write-once, so the row effect_commit already read is still exact;
        # only a miss is looked up again (it may have been created since).
        if proposal is None:
            proposal = Proposal.objects.filter(operation_id=operation_id).first()
        if proposal is None:
            raise NotFound(f"no proposal has operation {operation_id}")
        # The case row lock orders this commit against a concurrent edit of the same case,
        # so "is this still the current proposal?" cannot change before we write.
        case = Case.objects.select_for_update().only("id", "case_id", "current_proposal_id").get(pk=proposal.case_id)
        if case.current_proposal_id != proposal.pk:
            # (No current proposal at all: nothing to look up; filter(pk=None) would match nothing.)
            current = (
                Proposal.objects.filter(pk=case.current_proposal_id).values_list("operation_id", flat=True).first()
                if case.current_proposal_id is not None
                else None
            )
            raise StaleProposal(
                f"stale: {identity.short(operation_id)} is not the current proposal of case "
                f"{case.case_id}; the current one is {identity.short(current or '')}",
                current_operation_id=current,
                case_id=case.case_id,
            )
        crash_point("commit-before-decision")
        new_decision = _insert_once(
            ReviewDecision, operation_id=operation_id, proposal=proposal, approved=approved, reviewer=reviewer
        )
        # Only a decision that was already there needs reading back (one round trip less
        # on the common path; see docs/PERFORMANCE.md).
        decision = new_decision or ReviewDecision.objects.select_related("reviewer").get(operation_id=operation_id)
        attempt = {
            "operation_id": operation_id,
            "case_id": case.pk,
            "approved": approved,
            "reviewer": reviewer,
            "channel": channel,
        }
        if decision.approved != approved:
            _attempt(
                **attempt,
                outcome=CommitAttempt.Outcome.CONFLICT,
                detail=f"already {'approved' if decision.approved else 'declined'} by "
                f"{decision.reviewer.get_username()}",
            )
            effects = EffectRecord.objects.filter(operation_id=operation_id).count()
            return CommitResult(CONFLICTING, False, effects, operation_id, decision)
        if not approved:
            _attempt(
                **attempt, outcome=CommitAttempt.Outcome.DECLINED if new_decision else CommitAttempt.Outcome.REPLAY
            )
            return CommitResult(DECLINED, not new_decision, 0, operation_id, decision)
        crash_point("commit-after-decision")
        new_effect = _insert_once(EffectRecord, **_effect_fields(proposal, decision))
        replay = new_decision is None and new_effect is None
        _attempt(**attempt, outcome=CommitAttempt.Outcome.REPLAY if replay else CommitAttempt.Outcome.COMMITTED)
        return CommitResult(COMMITTED, replay, 1, operation_id, decision)


def effect_commit(*, operation_id: str, approved: bool, reviewer, channel: str = "service") -> CommitResult:
    """Record a reviewer's decision on one operation and, for an approval, write its effect.

    One durable transaction: when this returns, the decision and the effect are committed.
    The first approval writes both; the same approval again writes nothing and says
    ``replay``; the opposite decision is ``ConflictingDecision`` and never an update.
    Refusals (not a boolean, no permission, unknown or stale operation) raise and write
    no decision or effect. Every call, refused or not, appends a ``CommitAttempt``.
    """
    # The whole (immutable) proposal, read once: the attempt row needs its case and the
    # commit reuses it instead of reading it again inside the transaction.
    # No ORDER BY: operation_id is unique, so the model's default ordering is only cost.
    proposal = next(iter(Proposal.objects.filter(operation_id=str(operation_id)).order_by()[:1]), None)
    case_id = proposal.case_id if proposal is not None else None
    attempt = {
        "operation_id": operation_id,
        "case_id": case_id,
        "approved": approved,
        "reviewer": reviewer,
        "channel": channel,
    }
    try:
        # bool only: 1, "true" or None are not consent.
        if type(approved) is not bool:
            raise InvalidInput(f"approved must be true or false, not {approved!r}: an omitted decision is not consent")
        if not identity.is_operation_id(operation_id):
            raise InvalidInput(f"{str(operation_id)[:100]!r} is not an operation identity (op-v1- and 64 hex digits)")
        reviewer_check(reviewer)
        result = _commit(
            operation_id=operation_id, approved=approved, reviewer=reviewer, channel=channel, proposal=proposal
        )
    except DecisionflowError as exc:
        outcome = CommitAttempt.Outcome.STALE if isinstance(exc, StaleProposal) else CommitAttempt.Outcome.REFUSED
        _attempt(**attempt, outcome=outcome, detail=exc.message)
        raise
    except Exception as exc:
        _attempt(**attempt, outcome=CommitAttempt.Outcome.FAILED, detail=f"{type(exc).__name__}: {exc}")
        raise
    crash_point("commit-after-transaction")
    return result


class ReconcileRow(NamedTuple):
    # A NamedTuple, not a dataclass: reconcile builds one per operation, a million per cron
    # run, and a tuple is several times cheaper to make.
    case_id: str
    operation_id: str
    state: str
    effects: int

    def as_dict(self) -> dict:
        return {"case": self.case_id, "operation_id": self.operation_id, "state": self.state, "effects": self.effects}


def _state(approved, has_effect) -> str:
    if approved is None:
        return PENDING
    if not approved:
        return DECLINED
    return COMMITTED if has_effect else NO_LOCAL_EFFECT


# The same classification as _state, in SQL, so the set-based query returns finished rows.
_STATE_SQL = f"""
    CASE WHEN d.id IS NULL THEN '{PENDING}'
         WHEN NOT d.approved THEN '{DECLINED}'
         WHEN e.id IS NULL THEN '{NO_LOCAL_EFFECT}'
         ELSE '{COMMITTED}' END
"""


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
        SELECT c.case_id, p.operation_id, {_STATE_SQL}, CASE WHEN e.id IS NULL THEN 0 ELSE 1 END
        FROM {Proposal._meta.db_table} p
        JOIN {Case._meta.db_table} c ON c.id = p.case_id
        LEFT JOIN {ReviewDecision._meta.db_table} d ON d.operation_id = p.operation_id
        LEFT JOIN {EffectRecord._meta.db_table} e ON e.operation_id = p.operation_id
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
        while rows := cursor.fetchmany(chunk_size):
            yield from map(ReconcileRow._make, rows)


def operation_reconcile(operation_id: str) -> ReconcileRow | None:
    """One operation by its key, whether or not it is still current (None if unknown)."""
    row = Proposal.objects.filter(operation_id=operation_id).values_list("case__case_id", "operation_id").first()
    if row is None:
        return None
    decision = ReviewDecision.objects.filter(operation_id=operation_id).values_list("approved", flat=True).first()
    effects = EffectRecord.objects.filter(operation_id=operation_id).count()
    return ReconcileRow(row[0], row[1], _state(decision, effects > 0), effects)


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
            if _insert_once(EffectRecord, **_effect_fields(decision.proposal, decision)):
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
