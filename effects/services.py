"""Commit (decision + effect in one transaction), reconciliation, and repair.

The commit reads what it depends on (effects/store.py), decides here, in Python, what that
makes it (not found, stale, a first decision, a replay, a conflict), and has the store write
exactly that, only while the case is still as read. The unique constraints on
``operation_id`` stay the atomic step: an insert they refuse is read back, never assumed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.utils import timezone

from cases.models import MOST_APPROVALS, Case, approvals_required
from core import chain, identity, text
from core.errors import (
    CaseBusy,
    ConflictingDecision,
    DecisionflowError,
    DecisionOmitted,
    EvidenceChanged,
    InvalidInput,
    NotFound,
    OutcomeUncertain,
    PermissionRefused,
    RefusalReason,
    StaleProposal,
    Withdrawn,
)
from core.faults import crash_point
from core.locks import decision_lock_timeout, lock_timeout_ms
from core.observability import commit_observed
from core.outcomes import OperationState, ReceiptStatus
from core.statements import refused_by_server, stored
from core.tracing import Attr, annotate
from effects.delivery import delivery_attempt, delivery_configured, duration_setting, worker_name
from effects.models import REPAIR_CHANNEL, CommitAttempt, Delivery, DeliveryState, EffectRecord
from effects.store import CaseLocked, Target, Writes, Written, attempt_append, commit_store
from effects.tasks import delivery_enqueue, delivery_sweep_and_enqueue
from reviews.models import (
    HUMAN_DECLINE_REASONS,
    SYSTEM_DECLINE_REASONS,
    Approval,
    DeclineReason,
    Proposal,
    ReviewDecision,
    approvals_shown,
)

log = logging.getLogger(__name__)

REVIEW_PERMISSION = "reviews.review_proposal"

# A receipt's status (``CommitResult.status``), and the reconcile state repair looks for.
COMMITTED = ReceiptStatus.COMMITTED
DECLINED = ReceiptStatus.DECLINED
AWAITING_APPROVAL = ReceiptStatus.AWAITING_APPROVAL
CONFLICTING = ReceiptStatus.CONFLICTING
NO_LOCAL_EFFECT = OperationState.NO_LOCAL_EFFECT


@dataclass(frozen=True)
class CommitResult:
    status: str
    replay: bool
    effect_count: int
    operation_id: str
    decision: ReviewDecision | None = field(default=None, compare=False)
    # Under a policy that needs several approvers: how many approved so far, of how many.
    approvals: int = 0
    required: int = 1

    @property
    def approvals_shown(self) -> str | None:
        """How far the approvals are ("1 of 2 approvals") under a policy that needs several
        approvers; None otherwise."""
        return approvals_shown(self.approvals, self.required)

    def receipt(self) -> dict:
        """The compact receipt the commands print: exactly these three keys."""
        return {"Status": self.status, "Replay": self.replay, "EffectCount": self.effect_count}


def reviewer_check(reviewer) -> None:
    if reviewer is None or not getattr(reviewer, "is_authenticated", False) or not reviewer.is_active:
        raise PermissionRefused("a decision needs an authenticated, active reviewer")
    if not reviewer.has_perm(REVIEW_PERMISSION):
        raise PermissionRefused(f"{reviewer.get_username()} does not have the review permission")


def _attempt_row(
    *, operation_id, case_id, approved, reviewer, outcome, channel, detail="", reason=None, decline=(None, None)
) -> CommitAttempt:
    """One attempt row, cut to its columns: a refused attempt may carry anything at all."""
    decline_reason, decline_note = decline
    return CommitAttempt(
        operation_id=str(operation_id)[:200],
        case_id=case_id,
        approved=approved if isinstance(approved, bool) else None,
        reviewer_id=getattr(reviewer, "pk", None),
        outcome=outcome,
        channel=channel,
        detail=detail[:2000],
        reason=RefusalReason(reason).value if reason else None,
        # Only a known reason is kept (most attempts carry none: DeclineReason.values is
        # built anew on every read).
        decline_reason=decline_reason
        if decline_reason is not None and decline_reason in DeclineReason.values
        else None,
        decline_note=decline_note[:2000] if isinstance(decline_note, str) else None,
    )


DECLINE_NOTE_MAX = 2000


def decline_reason_check(*, approved, decline_reason, decline_note, system_actor=None) -> None:
    """Refuse a decline reason that is not one of the documented set (docs/QUEUE.md).

    A reason goes with a decline only; each system actor's reason (``SYSTEM_DECLINE_REASONS``)
    is that actor's alone, and a system actor gives nothing else (the database's
    ``decision_system_reason_iff_system_actor`` says the same). The note is optional free
    text under the text policy.
    """
    if decline_reason is None and decline_note is None and system_actor is None:
        return
    if approved is not False:
        raise InvalidInput("a decline reason or note goes with a decline only", field="reason")
    if system_actor is not None:
        own = SYSTEM_DECLINE_REASONS.get(system_actor)
        if own is None or decline_reason != own:
            raise InvalidInput(f"the system actor {system_actor!r} may only decline with reason {own or 'none'}")
    elif decline_reason is not None and decline_reason not in HUMAN_DECLINE_REASONS:
        raise InvalidInput(
            f"unknown decline reason {str(decline_reason)[:40]!r}; the reasons are {', '.join(HUMAN_DECLINE_REASONS)}"
            f" ({', '.join(SYSTEM_DECLINE_REASONS.values())}: reserved for the system)",
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
    (``CaseBusy``): the row's references are not checked by the database, so no lock is
    taken on the case or the user. One statement, in the caller's transaction if there is
    one (autocommit otherwise).
    """
    attempt_append(
        _attempt_row(
            operation_id=operation_id,
            case_id=case.pk if case is not None else None,
            approved=approved,
            reviewer=reviewer,
            channel=channel,
            outcome=outcome,
            detail=detail,
            reason=reason,
        )
    )


def _effect_fields(proposal: Proposal, decision: ReviewDecision) -> dict:
    """The effect of an approval: what was approved, copied, so that it stands on its own."""
    return {
        "operation_id": proposal.operation_id,
        "decision_id": decision.pk,
        "case_id": proposal.case_id,
        "proposal_id": proposal.pk,
        "action": proposal.action,
        "body": proposal.body,
        "evidence_id": proposal.evidence_id,
        "source_versions": {p["source_id"]: p["version"] for p in proposal.passages},
        "policy_id": proposal.policy_id,
        "policy_snapshot": proposal.policy_snapshot,
        "reviewer_id": decision.reviewer_id,
    }


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

    def attempt(self, outcome: str, detail: str = "", reason: str | None = None) -> CommitAttempt:
        return _attempt_row(
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

    def record(self, outcome: str, detail: str = "", reason: str | None = None) -> None:
        if not self.case_known and identity.is_operation_id(self.operation_id):
            # Only refusals before the commit get here; the commit learns the case itself.
            found = Proposal.objects.filter(operation_id=self.operation_id).order_by()
            self.case_pk = next(iter(found.values_list("case_id", flat=True)[:1]), None)
        attempt_append(self.attempt(outcome, detail, reason))
        self.recorded = True


# -- the rules of a commit, each decided once ------------------------------------------------


def _arguments_check(call: _Call) -> None:
    """Refuse, before anything is read, a call that could never commit."""
    approved, reviewer, system_actor = call.approved, call.reviewer, call.system_actor
    # bool only: 1, "true" or None are not consent.
    if type(approved) is not bool:
        raise DecisionOmitted(f"approved must be true or false, not {approved!r}: an omitted decision is not consent")
    if not identity.is_operation_id(call.operation_id):
        raise InvalidInput(f"{str(call.operation_id)[:100]!r} is not an operation identity (op-v1- and 64 hex digits)")
    decline_reason_check(
        approved=approved,
        decline_reason=call.decline_reason,
        decline_note=call.decline_note,
        system_actor=system_actor,
    )
    if system_actor is None:
        reviewer_check(reviewer)
    elif getattr(reviewer, "pk", None) is None:
        raise PermissionRefused(f"the system actor {system_actor} needs its user row")


def _not_found(operation_id: str) -> NotFound:
    """No proposal has this operation."""
    return NotFound(f"no proposal has operation {operation_id}")


def _is_stale(target: Target) -> bool:
    """The operation's proposal is no longer its case's current one: it cannot be decided.
    A decision is written only while the case row is as read (the store's guard, which an
    edit's lock excludes), so an edit that commits first makes the commit read again."""
    return target.current_proposal_id != target.proposal.pk


def _policy_moved_on(target: Target) -> bool:
    """A publish has switched the case onto another version of its policy than the one the
    proposal was prepared under: the proposal cannot be decided, although it is still current
    until the publish prepares the case again. The guard also holds the case's policy as
    read, so a switch that commits first makes the commit read again."""
    return not target.proposal.under_policy(target.case_policy_id)


def evidence_refusal(*, hold: str, operation_id: str, reason: str | None, case_id: str) -> EvidenceChanged | None:
    """The refusal an approval of ``operation_id`` gets when a new source version has marked
    it (a quotation or licensed clause it cites is gone from the newer version,
    workflow/sources.py), or None: the case's ``evidence_hold`` names this very operation and
    a mark gives the reason. Refused until a re-draft or an edit makes another proposal
    current; a decline stands. The commit decides it from its read, whose guard holds the
    hold as read (a mark that commits first makes the commit read again); the review page
    asks the same to show the reason instead of Approve."""
    if reason is None or hold != operation_id:
        return None
    return EvidenceChanged.of(operation_id=operation_id, case_id=case_id, reason=reason)


def _is_conflict(standing: ReviewDecision | None, approved: bool) -> bool:
    """The opposite decision stands: refused, never an update."""
    return standing is not None and standing.approved != approved


def _is_replay(standing: ReviewDecision | None, approved: bool, effect_exists: bool) -> bool:
    """The same decision stands, with everything it implies: nothing new to write. An
    approval whose effect is missing is not a replay: the commit writes the effect."""
    return standing is not None and standing.approved == approved and (effect_exists or not approved)


def conflict_refusal(commit: CommitResult) -> ConflictingDecision:
    """The refusal of a commit that found the opposite decision standing: ``Withdrawn`` when
    the pipeline withdrew the review, ``ConflictingDecision`` otherwise. Every channel's
    conflict is told apart here, and only here."""
    decision = commit.decision
    if decision is not None and decision.withdrawn:
        return Withdrawn.of_withdrawal(
            operation_id=commit.operation_id,
            by=decision.reviewer.get_username(),
            at=decision.decided_at,
            reason=decision.decline_note,
            result=commit,
        )
    return ConflictingDecision.of(
        operation_id=commit.operation_id,
        approved=None if decision is None else decision.approved,
        by=None if decision is None else decision.reviewer.get_username(),
        result=commit,
    )


@dataclass(frozen=True)
class Approvals:
    """The approvals an approval adds to, under a policy that needs several approvers."""

    required: int
    by: tuple[int, ...]  # the reviewers (user pks) who approved so far, in order


def _approvals(store, target: Target, approved) -> Approvals | None:
    """The approvals so far of an undecided operation whose policy (the operation's own, so
    fixed by its identity) needs more than one approver, when this call approves; None
    otherwise, without a query: one approver's approval reads exactly what it read before."""
    required = approvals_required(target.proposal.policy_snapshot.get("parameters"))
    if required == 1 or approved is not True or target.decision is not None:
        return None
    return Approvals(required, tuple(store.approvals(target.proposal.operation_id)))


def _is_approval_replay(approvals: Approvals | None, reviewer_pk) -> bool:
    """The same reviewer approves again before the decision: a replay, not a second approver."""
    return approvals is not None and reviewer_pk in approvals.by


def _decided_since_read(approvals: Approvals | None) -> bool:
    """As many approvals as the policy needs, and no decision read: the last approval and its
    decision committed between the commit's read and its read of the approvals."""
    return approvals is not None and len(approvals.by) >= approvals.required


def _is_partial(approvals: Approvals | None) -> bool:
    """This approval is not the last its policy needs: it is recorded, and nothing is decided."""
    return approvals is not None and len(approvals.by) + 1 < approvals.required


def _outcome(target: Target, approved: bool, approvals: Approvals | None = None, reviewer_pk=None) -> str:
    """What a commit of ``approved`` on ``target`` is (a ``CommitAttempt.Outcome``)."""
    if _is_conflict(target.decision, approved):
        return CommitAttempt.Outcome.CONFLICT
    if _is_replay(target.decision, approved, target.effect_exists) or _is_approval_replay(approvals, reviewer_pk):
        return CommitAttempt.Outcome.REPLAY
    if _is_partial(approvals):
        return CommitAttempt.Outcome.AWAITING_APPROVAL
    return CommitAttempt.Outcome.COMMITTED if approved else CommitAttempt.Outcome.DECLINED


def _result(
    outcome: str, *, approved: bool, effect_count: int, operation_id: str, decision, approvals: tuple[int, int] = (0, 1)
) -> CommitResult:
    if outcome == CommitAttempt.Outcome.CONFLICT:
        return CommitResult(CONFLICTING, False, effect_count, operation_id, decision, *approvals)
    status = COMMITTED if approved else DECLINED
    if decision is None:
        status = AWAITING_APPROVAL  # approvals recorded, the decision not yet
    replay = outcome == CommitAttempt.Outcome.REPLAY
    return CommitResult(status, replay, effect_count, operation_id, decision, *approvals)


# -- the commit ------------------------------------------------------------------------------


class _LostRace(Exception):
    """The write wrote nothing: a unique key refused a row the read said was free (another
    commit wrote it after the read), or the case moved on from the read (an edit). Nothing
    of the write stands; the commit is decided again from a fresh read."""


def _is_lost_race(writes: Writes, written: Written) -> bool:
    """A new row the write was given was not written."""
    return (
        (writes.decision is not None and written.decision_pk is None)
        or (writes.effect is not None and written.effect_pk is None)
        or (writes.approval is not None and written.approval_pk is None)
    )


def _approval_row(call: _Call, target: Target, approvals: Approvals) -> Approval:
    """The next approval of ``approvals``: its ordinal is the count read plus one, so another
    approval written since the read takes that ordinal first and this write is refused."""
    proposal = target.proposal
    return Approval(
        operation_id=call.operation_id,
        proposal_id=proposal.pk,
        reviewer_id=call.reviewer.pk,
        ordinal=len(approvals.by) + 1,
        required=approvals.required,
        channel=call.channel,
        approved_at=timezone.now(),
        prev_hash=proposal.row_hash or "",
    )


def _partly_decided(call: _Call, target: Target, outcome: str, approvals: Approvals) -> Writes:
    """The rows of an approval that is not the decision yet: its approval row (none for the
    same reviewer again) and the attempt; the pending review stays open for the next one."""
    approval = _approval_row(call, target, approvals) if outcome == CommitAttempt.Outcome.AWAITING_APPROVAL else None
    return Writes(
        attempt=call.attempt(outcome),
        approval=approval,
        flush=approval is not None,
        complete_pending=False,
        basis=target,
    )


def _decided(
    call: _Call, target: Target, outcome: str, approvals: Approvals | None = None
) -> tuple[Writes, ReviewDecision | None]:
    """The rows a commit with ``outcome`` writes, and the decision that will stand (None: the
    approvals so far are not the decision yet)."""
    if approvals is not None and outcome in (CommitAttempt.Outcome.AWAITING_APPROVAL, CommitAttempt.Outcome.REPLAY):
        return _partly_decided(call, target, outcome, approvals), None
    approved, proposal = call.approved, target.proposal
    detail = ""
    if outcome == CommitAttempt.Outcome.CONFLICT:
        standing = target.decision
        assert standing is not None  # a conflict is with the decision that stands
        detail = ConflictingDecision.standing(approved=standing.approved, by=standing.reviewer.get_username())
    decision = target.decision
    if decision is None:
        decision = ReviewDecision(
            operation_id=call.operation_id,
            proposal_id=proposal.pk,
            approved=approved,
            reviewer_id=call.reviewer.pk,
            decided_at=timezone.now(),
            decline_reason=call.decline_reason,
            decline_note=call.decline_note,
            system_actor=call.system_actor,
            prev_hash=proposal.row_hash or "",
        )
    effect = None
    if outcome == CommitAttempt.Outcome.COMMITTED:
        effect = EffectRecord(**_effect_fields(proposal, decision))
        if target.decision is not None:
            chain.follows(effect, target.decision)  # read with its hash (a new one: the store)
    new = target.decision is None or effect is not None
    writes = Writes(
        attempt=call.attempt(outcome, detail),
        decision=decision if target.decision is None else None,
        # The Nth approval: its row goes with the decision it completes.
        approval=_approval_row(call, target, approvals) if approvals is not None else None,
        effect=effect,
        delivery=effect is not None and delivery_configured(),
        # A replay or a conflict that completes no pending review writes nothing but its
        # audit row, which may skip the WAL flush (docs/PERFORMANCE.md); a new decision,
        # effect or state change is always flushed.
        flush=new or target.pending_open,
        complete_pending=target.decision is None or target.pending_open,
        basis=target,
    )
    return writes, decision


def _answer(
    call: _Call,
    target: Target,
    outcome: str,
    writes: Writes,
    decision: ReviewDecision | None,
    approvals: Approvals | None,
) -> CommitResult:
    counted = (0, 1)
    if approvals is not None:
        # The approvals now: those read, this one if it was written.
        counted = (len(approvals.by) + (writes.approval is not None), approvals.required)
    effect_count = 0
    if decision is not None:
        if decision.reviewer_id == call.reviewer.pk:
            decision.reviewer = call.reviewer
        effect_count = 1 if decision.approved and (target.effect_exists or writes.effect is not None) else 0
    return _result(
        outcome,
        approved=call.approved,
        effect_count=effect_count,
        operation_id=call.operation_id,
        decision=decision,
        approvals=counted,
    )


def _busy(call: _Call) -> CaseBusy:
    """The answer to a case locked past the timeout, once the transaction rolled back.

    PostgreSQL: the attempt row is written without waiting for that same row lock. SQLite:
    the lock is the whole database's, so no row can be written without waiting for it; the
    attempt is logged instead of recorded.
    """
    # A plain read: it waits for no row lock (nor, on SQLite, for another writer).
    found = Case.objects.filter(proposals__operation_id=call.operation_id).order_by().values_list("pk", "case_id")[:1]
    case_pk, case_label = next(iter(found), (None, "?"))
    busy = CaseBusy.held(case_label)
    what = identity.short(str(call.operation_id))
    call.recorded = True  # either way: another try would wait on the same lock
    if connection.vendor != "postgresql":
        log.warning("busy attempt on %s not recorded (the database is locked): %s", what, busy.message)
        return busy
    call.case_pk = case_pk
    try:
        attempt_append(call.attempt(CommitAttempt.Outcome.REFUSED, busy.message, RefusalReason.BUSY))
    except Exception:
        # The refusal stands without its audit row.
        log.exception("could not record the busy attempt on %s", what)
    return busy


def _uncertain(call: _Call, exc: Exception) -> OutcomeUncertain:
    what = identity.short(str(call.operation_id))
    return OutcomeUncertain(
        f"outcome uncertain: the commit of {what} failed ({type(exc).__name__}) and may have been applied; "
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
        # The commit itself failed (COMMIT, or the write that commits as it runs): it may have
        # been applied (with its own attempt row) or not, and only the effect store can tell.
        # A "failed" row could be a lie.
        log.warning("commit of %s failed as it committed (%s); outcome unknown, no attempt recorded", what, exc)
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

    One atomic write: when this returns, the decision and the effect are committed,
    and the operation's pending review, if any, is marked completed with them. The first
    approval writes both; the same approval again writes nothing and says ``replay``; the
    opposite decision is ``ConflictingDecision`` and never an update. Refusals (not a
    boolean, no permission, unknown or stale operation, ``CaseBusy`` when another action
    holds the case row longer than ``decision_lock_timeout()``) raise and write no decision
    or effect. Every call, refused or not, appends a ``CommitAttempt``; a failure is
    recorded as ``failed`` only when the write is known to have rolled back; a failure
    once it may have committed (a connection lost during the write or its COMMIT) raises
    ``OutcomeUncertain``.

    A decline may carry ``decline_reason`` (``DeclineReason``) and ``decline_note``; they are
    stored with the decision, and a replay keeps the first (its attempt row keeps its own).
    ``system_actor`` names a system decision (a ``SystemActor``, declining with its own
    reason): the reviewer is then the user row the caller stands for (``sla-expiry``'s own
    row, the pipeline's service user for a withdrawal) and needs no review permission; the
    caller has checked what that actor may do.
    """
    call = _Call(operation_id, approved, reviewer, channel, decline_reason, decline_note, system_actor)
    with commit_observed(approved=approved, operation_id=operation_id) as seen:  # latency by outcome, and its span
        try:
            _arguments_check(call)
            # Read, decide, write: the write goes ahead only while the case is as read. A
            # write that wrote nothing (another commit or an edit came first) is decided again.
            store = commit_store()
            timeout = lock_timeout_ms(decision_lock_timeout())
            # A lost race is another writer's progress: a decision, or one more approval.
            for _ in range(2 + MOST_APPROVALS):
                try:
                    with store.transaction():
                        target = store.read(operation_id)
                        call.case_known = True
                        if target is None:
                            raise _not_found(operation_id)
                        call.case_pk = target.proposal.case_id
                        annotate({Attr.CASE: target.case_label})
                        if _is_stale(target):
                            raise StaleProposal.superseded(
                                operation_id=operation_id,
                                case_id=target.case_label,
                                current_operation_id=store.current_operation(target),
                            )
                        if _policy_moved_on(target):
                            raise StaleProposal.policy_superseded(
                                operation_id=operation_id,
                                case_id=target.case_label,
                                policy=target.proposal.policy_snapshot.get("name", "?"),
                                prepared_under=target.proposal.policy_snapshot.get("label", "?"),
                                current=target.case_policy_label,
                            )
                        held = evidence_refusal(
                            hold=target.evidence_hold,
                            operation_id=target.proposal.operation_id,
                            reason=target.evidence_changed,
                            case_id=target.case_label,
                        )
                        if approved and held is not None:
                            raise held
                        crash_point("commit-before-decision")
                        approvals = _approvals(store, target, approved)
                        if _decided_since_read(approvals):
                            raise _LostRace
                        outcome = _outcome(target, approved, approvals, getattr(reviewer, "pk", None))
                        writes, decision = _decided(call, target, outcome, approvals)
                        # Decided, nothing written yet; where the write commits as it runs
                        # (PostgreSQL), from its start only the effect store knows.
                        crash_point("commit-after-decision")
                        call.commit_sent = store.write_commits()
                        written = store.write(writes, lock_timeout_ms=timeout)
                        if _is_lost_race(writes, written):
                            call.commit_sent = False
                            raise _LostRace
                        call.commit_sent = True
                except _LostRace:
                    continue
                except CaseLocked:
                    call.commit_sent = False
                    raise _busy(call) from None
                if written.decision_pk is not None and decision is not None:
                    decision = stored(decision, written.decision_pk)
                result = _answer(call, target, outcome, writes, decision, approvals)
                break
            else:
                raise RuntimeError(f"the decision of {operation_id} is neither insertable nor readable")
        except DecisionflowError as exc:
            if not call.recorded:
                refused = (
                    CommitAttempt.Outcome.STALE if isinstance(exc, StaleProposal) else CommitAttempt.Outcome.REFUSED
                )
                call.record(refused, exc.message, exc.reason)
            raise
        except Exception as exc:
            if call.commit_sent and refused_by_server(exc):
                call.commit_sent = False  # the server refused the statement: nothing was applied
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
        seen.result = result
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
    # An undecided operation whose policy needs several approvers: its approvals so far, of
    # how many (0 of 1 otherwise).
    approvals: int = 0
    required: int = 1

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
        if self.approvals:
            # Only while partly approved: every other line stays exactly as before.
            found.update(approvals=self.approvals, approvals_required=self.required)
        return found


def operation_state(approved: bool | None, has_effect: bool, approvals: int = 0) -> str:
    """An operation's reconcile state from its decision (None: undecided), whether its
    effect exists, and how many approvals an undecided one has (a policy that needs several).
    The one classification: reconcile applies it to every row it reads."""
    if approved is None:
        return OperationState.AWAITING_APPROVAL if approvals else OperationState.PENDING
    if not approved:
        return OperationState.DECLINED
    return OperationState.COMMITTED if has_effect else OperationState.NO_LOCAL_EFFECT


# The delivery's state as reconcile prints it: its label (Queued, Unknown, Delivered, ...).
_DELIVERY_LABELS = {state.value: state.label for state in DeliveryState}


class DeliveryAlert(NamedTuple):
    """What reconcile alerts on, for deliveries (each its own exit bit, docs/COMMANDS.md)."""

    unknown: int  # Unknown longer than DECISIONFLOW_DELIVERY_UNKNOWN_ALERT after the approval
    rejected: int  # Rejected: the helpdesk refused the reply for good
    queued: int  # Queued or Sending longer than DECISIONFLOW_DELIVERY_QUEUED_ALERT
    needs_check: int  # NeedsCheck: a person looks at the ticket (the reply may be on it)


def delivery_alert(rows: Iterable[ReconcileRow], *, now=None) -> DeliveryAlert:
    """Count the deliveries among ``rows`` that someone should look at."""
    now = now or timezone.now()
    unknown_after = duration_setting("DECISIONFLOW_DELIVERY_UNKNOWN_ALERT", "15m")
    queued_after = duration_setting("DECISIONFLOW_DELIVERY_QUEUED_ALERT", "15m")
    unknown = rejected = queued = needs_check = 0
    for row in rows:
        if row.delivery is None:
            continue
        age = now - row.delivery_since
        if row.delivery == DeliveryState.UNKNOWN.label and age > unknown_after:
            unknown += 1
        elif row.delivery == DeliveryState.REJECTED.label:
            rejected += 1
        elif row.delivery == DeliveryState.NEEDS_CHECK.label:
            needs_check += 1
        elif row.delivery in (DeliveryState.QUEUED.label, DeliveryState.SENDING.label) and age > queued_after:
            queued += 1
    return DeliveryAlert(unknown, rejected, queued, needs_check)


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
    for operation_id, traceparent in unknown.values_list("operation_id", "traceparent"):
        outcome, delay = delivery_attempt(
            operation_id=operation_id, worker=f"reconcile@{worker_name()}", due_only=False
        )
        if delay is not None:
            delivery_enqueue(operation_id, delay=delay, traceparent=traceparent or "")
        done.append((operation_id, outcome))
    return done


# The approvals of an undecided operation: how many, and of how many (nothing for a decided
# one). The ordinals run 1..n, so the highest is the count. Read from one grouped join, one
# hash lookup per row: as three correlated subqueries (the state, the count, the policy's
# number) they were three index probes per undecided row, ~40% of the server's time for
# reconcile --all over a million operations (docs/PERFORMANCE.md, 8).
_APPROVALS_JOIN = (
    "LEFT JOIN (SELECT operation_id, max(ordinal) AS approvals, max(required) AS required "
    f"FROM {Approval._meta.db_table} GROUP BY operation_id) ap ON ap.operation_id = p.operation_id"
)
_APPROVALS_OF = "CASE WHEN d.id IS NULL THEN ap.{} END"
APPROVALS_SQL, REQUIRED_SQL = _APPROVALS_OF.format("approvals"), _APPROVALS_OF.format("required")


def _reconcile_query(
    select: str,
    *,
    case_ids: Iterable[str] | None,
    operation_ids: Iterable[str] | None,
    delivered: bool = False,
    approvals: bool = False,
) -> tuple[str, list] | None:
    """The operations and what they joined to, one row each in reconcile's order: ``select``
    picks the columns (p: proposal, c: case, d: decision, e: effect, dl: delivery; with
    ``approvals``, ap: the approvals of APPROVALS_SQL and REQUIRED_SQL). None when a filter
    was given with no values (nothing to report)."""
    where, params = ["dl.id IS NOT NULL"] if delivered else [], []
    for column, values in (("c.case_id", case_ids), ("p.operation_id", operation_ids)):
        if values is not None:
            values = list(values)
            if not values:
                return None
            where.append(f"{column} IN ({', '.join(['%s'] * len(values))})")
            params += values
    sql = f"""
        SELECT {select}
        FROM {Proposal._meta.db_table} p
        JOIN {Case._meta.db_table} c ON c.id = p.case_id
        LEFT JOIN {ReviewDecision._meta.db_table} d ON d.operation_id = p.operation_id
        LEFT JOIN {EffectRecord._meta.db_table} e ON e.operation_id = p.operation_id
        LEFT JOIN {Delivery._meta.db_table} dl ON dl.operation_id = p.operation_id
        {_APPROVALS_JOIN if approvals else ""}
        WHERE (d.id IS NOT NULL OR c.current_proposal_id = p.id)
        {"AND " + " AND ".join(where) if where else ""}
        ORDER BY c.case_id, p.id
    """
    return sql, params


def operations_reconcile(
    *,
    case_ids: Iterable[str] | None = None,
    operation_ids: Iterable[str] | None = None,
    delivered: bool = False,
    chunk_size: int = 2000,
) -> Iterator[ReconcileRow]:
    """What really happened to each operation, read from the decision and effect tables.

    Runs nothing and guesses nothing. The operations are each case's current proposal and
    every proposal that has a decision; a superseded proposal that was never decided can
    never be committed, so it is not an operation to report.

    One set-based query, streamed (a server-side cursor on PostgreSQL), so a cron run over
    a million operations holds one chunk in memory at a time. Raw SQL on purpose: it is the
    hot path of reconcile and a plain anti-join is what the database plans best.
    ``delivered``: only the operations that have a delivery.
    """
    query = _reconcile_query(
        "c.case_id, p.operation_id, d.approved, e.id IS NOT NULL, d.decline_reason, dl.state, dl.reference, "
        f"dl.created_at, {APPROVALS_SQL}, {REQUIRED_SQL}",
        case_ids=case_ids,
        operation_ids=operation_ids,
        delivered=delivered,
        approvals=True,
    )
    if query is None:
        return
    sql, params = query
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
            for case_id, operation_id, approved, has_effect, reason, delivery, reference, since, n, of in rows:
                if delivery is not None:
                    # SQLite returns the timestamp as text: the field's own converter reads it.
                    for convert in converters:
                        since = convert(since, None, connection)
                yield ReconcileRow(
                    case_id,
                    operation_id,
                    operation_state(approved, has_effect, n or 0),
                    1 if has_effect else 0,
                    reason,
                    None if delivery is None else _DELIVERY_LABELS.get(delivery, delivery),
                    reference,
                    since,
                    n or 0,
                    of or 1,
                )


def _sql_state() -> tuple[str, list]:
    """operation_state as a SQL CASE over every input it can get: the truth table is read
    from the Python function, so the rule stays written once, there. Nested (the decision,
    then the effect where it matters), so that a row takes two tests at most."""
    whens, params = [], []
    pending, awaiting = operation_state(None, False), operation_state(None, False, 1)
    whens.append(f"WHEN d.approved IS NULL THEN CASE WHEN {APPROVALS_SQL} IS NULL THEN %s ELSE %s END")
    params += [pending, awaiting]
    for approved, decided in ((False, "NOT d.approved"), (True, "d.approved")):
        without, with_effect = operation_state(approved, False), operation_state(approved, True)
        if without == with_effect:
            whens.append(f"WHEN {decided} THEN %s")
            params.append(without)
        else:
            whens.append(f"WHEN {decided} THEN CASE WHEN e.id IS NULL THEN %s ELSE %s END")
            params += [without, with_effect]
    return f"CASE {' '.join(whens)} END", params


def _sql_json_line() -> tuple[str, list]:
    """One reconcile JSON line, built by the database: the same compact text as
    ``json.dumps(row.as_dict(), ensure_ascii=False, separators=(",", ":"))`` (a test holds
    every state, a delivery, and awkward strings to that)."""
    quote = "to_json(({})::text)::text" if connection.vendor == "postgresql" else "json_quote({})"
    state, state_params = _sql_state()
    labels = " ".join("WHEN %s THEN %s" for _ in DeliveryState)
    label_params = [x for state_ in DeliveryState for x in (state_.value, json.dumps(state_.label))]
    line = (
        f"""'{{"case":' || {quote.format("c.case_id")} || ',"operation_id":' || {quote.format("p.operation_id")}"""
        f""" || ',"state":"' || {state} || '","effects":' || CASE WHEN e.id IS NULL THEN '0' ELSE '1' END"""
        f""" || ',"decline_reason":' || COALESCE({quote.format("d.decline_reason")}, 'null')"""
        f""" || CASE WHEN dl.state IS NULL THEN '' ELSE ',"delivery":' || CASE dl.state {labels} ELSE {quote.format("dl.state")} END"""
        f""" || ',"delivery_reference":' || COALESCE({quote.format("NULLIF(dl.reference, '')")}, 'null') END"""
        f""" || COALESCE(',"approvals":' || {APPROVALS_SQL} || ',"approvals_required":' || {REQUIRED_SQL}, '')"""
        " || '}'"
    )
    return line, state_params + label_params


def operations_reconcile_lines(
    *, case_ids: Iterable[str] | None = None, operation_ids: Iterable[str] | None = None, chunk_size: int = 2000
) -> Iterator[bytes]:
    """The operations of ``operations_reconcile`` as reconcile --json prints them, a chunk of
    newline-terminated lines at a time, in UTF-8 (written as they come: no decoding).

    The lines are made by the database and streamed: over a million operations, building a
    Python row and then a line for each cost twice the query itself (docs/PERFORMANCE.md, 8).
    The state comes from operation_state's own truth table.
    """
    line, line_params = _sql_json_line()
    query = _reconcile_query(line, case_ids=case_ids, operation_ids=operation_ids, approvals=True)
    if query is None:
        return
    sql, params = query
    params = line_params + params
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # JIT-compiling the line's expressions took longer than running them: ~0.7 s of a
            # 3 s query over a million operations (docs/PERFORMANCE.md, 8). The sort carries
            # the finished lines; in memory it took 1.9 s where spilled to disk it took 2.1 s
            # (the server's memory for it: up to this much per sorting process, once per run).
            cursor.execute("SET LOCAL jit = off")
            cursor.execute("SET LOCAL work_mem = '64MB'")
            # psycopg's stream in libpq's chunked-rows mode: a result of chunk_size rows at a
            # time, each row made in C, and the query still planned with parallel workers (a
            # server-side cursor's never is). Reading the same lines as COPY data cost the
            # client a Python step per line, 1.0 s of CPU over a million where this costs
            # 0.4 s (docs/PERFORMANCE.md, 8). A libpq older than 17 has no chunked mode: one
            # row at a time, still streamed. (psycopg is loaded already here; imported at the
            # top, a SQLite process would load it for nothing.)
            from psycopg import pq

            rows = cursor.cursor.stream(sql, params, size=chunk_size if pq.version() >= 170000 else 1)
        else:
            cursor.execute(sql, params)
            rows = (row for batch in iter(lambda: cursor.fetchmany(chunk_size), []) for row in batch)
        while chunk := [found for (found,) in islice(rows, chunk_size)]:
            yield ("\n".join(chunk) + "\n").encode()


def operation_reconcile(operation_id: str) -> ReconcileRow | None:
    """One operation by its key, whether or not it is still current (None if unknown)."""
    row = Proposal.objects.filter(operation_id=operation_id).values_list("case__case_id", "operation_id").first()
    if row is None:
        return None
    decided = ReviewDecision.objects.filter(operation_id=operation_id).values_list("approved", "decline_reason").first()
    approved, reason = decided if decided is not None else (None, None)
    approvals, required = 0, 1
    if decided is None:
        found_approvals = Approval.objects.filter(operation_id=operation_id).values_list("ordinal", "required")
        approvals, required = max(found_approvals, default=(0, 1))
    effects = EffectRecord.objects.filter(operation_id=operation_id).count()
    found = Delivery.objects.filter(operation_id=operation_id).values_list("state", "reference", "created_at").first()
    delivery = (DeliveryState(found[0]).label, found[1], found[2]) if found else (None, None, None)
    return ReconcileRow(
        row[0],
        row[1],
        operation_state(approved, effects > 0, approvals),
        effects,
        reason,
        delivery=delivery[0],
        delivery_reference=delivery[1],
        delivery_since=delivery[2],
        approvals=approvals,
        required=required,
    )


def effects_repair(*, rows: Iterable[ReconcileRow], dry_run: bool = True) -> list[ReconcileRow]:
    """Write the missing effect of each ``NoLocalEffectRecorded`` operation.

    Idempotent: each operation is read again, its effect written only while the case is as
    read and its unique key free, and only an approval
    still without its effect is repaired, so a second run (or a concurrent one, or a
    commit) writes nothing; the effect's unique key stays the last word. Each operation is
    its own transaction, so a crash mid-way leaves every operation either repaired or
    untouched. Returns the operations that needed repair.
    """
    repaired = []
    store = commit_store()
    for row in rows:
        if row.state != NO_LOCAL_EFFECT:
            continue
        repaired.append(row)
        if dry_run:
            continue
        try:
            # Not durable: the rows may stream from reconcile's own open transaction.
            with store.transaction(durable=False):
                target = store.read(row.operation_id)
                if target is None or target.decision is None:
                    continue
                decision = target.decision
                if operation_state(decision.approved, target.effect_exists) != NO_LOCAL_EFFECT:
                    continue
                effect = EffectRecord(**_effect_fields(target.proposal, decision))
                chain.follows(effect, decision)
                attempt = _attempt_row(
                    operation_id=row.operation_id,
                    case_id=target.proposal.case_id,
                    approved=True,
                    reviewer=decision.reviewer,
                    outcome=CommitAttempt.Outcome.COMMITTED,
                    channel=REPAIR_CHANNEL,
                    detail="reconcile --repair wrote the missing effect",
                )
                written = store.write(
                    Writes(attempt=attempt, effect=effect, delivery=delivery_configured(), basis=target),
                    lock_timeout_ms=lock_timeout_ms(decision_lock_timeout()),
                )
                if written.effect_pk is None:
                    raise _LostRace
        except _LostRace:
            pass  # another writer wrote the effect first: nothing left to repair
        except CaseLocked:
            raise CaseBusy.held(row.case_id) from None
        crash_point("repair-midway")
    return repaired
