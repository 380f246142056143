"""Begin, edit, and the one decision service that every channel calls.

The admin's Approve and Decline, ``POST /api/cases/{id}/decision`` and ``manage.py resume``
all call ``decision_record`` with the same rules: the same "begin if needed", the same
outcome enum, the same error classes. They differ only in how they parse and show.

A decision, in order, on one screen:

1. The pending review of the named operation, with its checkpoint row, in one query.
2. Begin if needed: the named operation is the case's decidable one (its current proposal,
   or the one ``begin`` would prepare) and has no pending review yet. Only this takes the
   case lock, waited for at most ``DECISIONFLOW_DECISION_LOCK_TIMEOUT`` seconds.
3. Who may decide: the reviewer groups of the operation's policy (``group_check``), and, where
   the policy lets only the assignee decide, the assignee (``assignee_check``); four eyes
   comes after the binding, also before anything runs.
4. Bind before running: the pending review's pause checkpoint is loaded, its HMAC checked,
   and it must hold exactly one pending request, for this case and this operation, from
   this workflow version and graph, and nothing else in flight. Otherwise the resume is
   refused (``WorkflowIncompatible``) and nothing runs.
5. One engine run: ``answering`` restores the bound checkpoint and answers it, and the run
   goes as far as its commit step, which asks for its write: ``effect_commit`` with the
   reviewer the channel authenticated, made here, on this function's stack, while the
   engine's loop is stopped (``driver.hosted``); the run then goes on to its end.
   ``effect_commit`` takes the case row lock (bounded by ``lock_timeout``: ``CaseBusy``),
   writes in one statement and marks the pending review completed in the same transaction.
6. The truth after a fault: once the commit step has started, any failure is
   ``OutcomeUncertain``; only the effect store (reconcile) can say what happened.

The engine runs on the calling thread (``driver.hosted``), and the executors' ORM work
runs there too, between loop iterations (``driver.on_caller``), so all database work
uses the caller's connection and transaction (and, in tests, the test transaction), with no
thread started.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import DatabaseError

from cases.models import Case
from core import faults, identity
from core.errors import (
    CaseBusy,
    DecisionflowError,
    InvalidInput,
    OutcomeUncertain,
    StaleProposal,
    WorkflowIncompatible,
)
from core.locks import sqlite_bounded_wait
from core.observability import REFUSALS_UNRECORDED, decision_observed
from core.outcomes import DecisionOutcome
from effects.models import CommitAttempt
from effects.services import (
    AWAITING_APPROVAL,
    CONFLICTING,
    DECLINED,
    CommitResult,
    attempt_record,
    conflict_refusal,
    decline_reason_check,
    effect_commit,
    reviewer_check,
)
from engine.graph import FAULTS
from reviews.models import PendingReview
from workflow.answer import answering
from workflow.assignment import assignee_check
from workflow.begin import review_begin
from workflow.bind import bound_checkpoint, no_pending_review, pause_pruned, pending_with_checkpoint
from workflow.four_eyes import four_eyes_check
from workflow.reviewer_groups import group_check
from workflow.selectors import decidable_operation_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecisionResult:
    outcome: DecisionOutcome  # one of RETURNED; a refusal is an error class instead
    commit: CommitResult  # the review core's receipt, exactly as it returned it
    checkpoint_id: str  # the pause checkpoint the answer was bound to
    begun: bool  # this call began the review first

    @property
    def operation_id(self) -> str:
        return self.commit.operation_id


def _check_fault(fault: str | None) -> None:
    if fault is None:
        return
    if fault not in FAULTS:
        raise InvalidInput(f"unknown fault {fault!r}; the faults are {', '.join(FAULTS)}")
    if not faults.enabled():
        raise InvalidInput(f"the fault {fault} is accepted only when DECISIONFLOW_FAULT_INJECTION=1")


def _outcome(commit: CommitResult) -> DecisionOutcome:
    if commit.replay:
        return DecisionOutcome.REPLAY
    if commit.status == AWAITING_APPROVAL:
        return DecisionOutcome.AWAITING_APPROVAL
    return DecisionOutcome.DECLINED if commit.status == DECLINED else DecisionOutcome.COMMITTED


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
    alike). Returns the outcome (committed, declined, replay, or awaiting_approval: an
    approval recorded under a policy that needs more distinct approvers, nothing decided
    yet; ``commit.approvals_shown`` says how far, "1 of 2 approvals"); every refusal is an error
    class carrying its exit code and HTTP status: ``StaleProposal``, ``NotFound``,
    ``PermissionRefused``, ``InvalidInput``, ``WorkflowIncompatible`` (the pause fails a
    binding check: nothing ran), ``NotInGroup`` (the operation's policy names reviewer groups
    and ``reviewer`` is in none), ``NotAssignee`` (the policy lets only the assignee decide,
    and the review is somebody else's), ``CaseBusy`` (another action held the case past the
    timeout), ``ConflictingDecision`` (the opposite decision stands; it carries the
    receipt), ``Withdrawn`` (an approval of a review the pipeline withdrew) and ``OutcomeUncertain`` (the commit may have happened: ask reconcile).

    Invariant: one decision and at most one effect per operation, whatever the channel,
    however often it is called. Every refusal writes no decision and no effect, and is
    recorded as a commit attempt.

    A decline may carry ``decline_reason`` (one of ``HUMAN_DECLINE_REASONS``) and
    a free-text ``decline_note``; an unknown reason is refused (``InvalidInput``) before
    anything runs. A second decline is a replay: the first reason stands.
    """
    # One metric increment and one JSON event line per call, whatever the outcome.
    with decision_observed(
        case=case, operation_id=operation_id, channel=channel, reviewer=reviewer, approved=approved
    ) as seen:
        operation_id = str(operation_id)
        _check_fault(fault)  # a test-only switch, refused before the decision is looked at
        answer_started = False
        try:
            decline_reason_check(approved=approved, decline_reason=decline_reason, decline_note=decline_note)
            with sqlite_bounded_wait():
                pending = pending_with_checkpoint(case, operation_id, reviewer)
                begun = False
                if pending is None and identity.is_operation_id(operation_id):
                    pending, begun = _begin_if_decidable(case, operation_id, reviewer, channel)
                if pending is None:
                    raise no_pending_review(case, operation_id)
                group_check(policy_snapshot=pending.policy_snapshot, reviewer=reviewer, operation_id=operation_id)
                assignee_check(pending=pending, policy_snapshot=pending.policy_snapshot, reviewer=reviewer)
                # Decided, and its pause checkpoint pruned since (reviews/retention.py): the decision
                # stands, so the review core answers a retry (replay or conflict) without the engine,
                # exactly as the answered run's commit step would.
                pruned = pause_pruned(pending)
                checkpoint = None if pruned else bound_checkpoint(case, pending)
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
                    with answering(
                        checkpoint,
                        operation_id=operation_id,
                        approved=approved,
                        reviewer=reviewer,
                        channel=channel,
                        fault=fault,
                        decline_reason=decline_reason,
                        decline_note=decline_note,
                        ahead=pending.read_ahead,
                    ) as step:
                        # The engine restored the pause and answered it; its commit step waits
                        # while its write (effect_commit, with the step's arguments) runs here.
                        commit = step.made(step.write())
        except OutcomeUncertain:
            raise
        except DecisionflowError as exc:
            if not answer_started or isinstance(exc, WorkflowIncompatible):
                # The review core records its own refusals; these happened before it ran.
                refusal_record(
                    case=case,
                    operation_id=operation_id,
                    approved=approved,
                    reviewer=reviewer,
                    channel=channel,
                    error=exc,
                )
            raise
        if commit.status == CONFLICTING:
            raise conflict_refusal(commit)
        seen.result = DecisionResult(
            outcome=_outcome(commit), commit=commit, checkpoint_id=pending.checkpoint_id, begun=begun
        )
        return seen.result


def _begin_if_decidable(case: Case, operation_id: str, reviewer, channel: str) -> tuple[PendingReview | None, bool]:
    """Begin the review of ``operation_id`` if it is the case's decidable operation.

    Only here does a decision take the case lock (begin's transaction: it writes the
    proposal and the pause); a decision on a begun review is ordered by the case row lock
    inside its commit.
    """
    reviewer_check(reviewer)  # nobody without the permission begins anything
    if operation_id != decidable_operation_id(case):
        return None, False
    # Another decision may have begun it while this one waited for the lock: begin then
    # finds that pending review and writes nothing.
    begun = review_begin(case=case, actor=reviewer, channel=channel)
    return pending_with_checkpoint(case, operation_id, reviewer), begun.created


def refusal_record(
    *, case: Case, operation_id: str, approved, reviewer, channel: str, error: DecisionflowError, edit: bool = False
) -> None:
    """The attempt row of a refused decision or edit: the one function every refusal's row is
    written by (the decision service's own refusals, a channel's before it calls a service,
    ``review_edit``'s). ``edit``: the call was an edit (its row says so, ``CommitAttempt.EDIT_DETAIL``).

    The refusal stands whether or not its row could be written (a busy case may still hold
    the row lock the attempt's foreign key needs): a row not written is counted
    (``decisionflow_refusal_unrecorded_total``) and logged at ERROR, and never raised.
    """
    outcome = CommitAttempt.Outcome.STALE if isinstance(error, StaleProposal) else CommitAttempt.Outcome.REFUSED
    # The error's own words, once: ``reason`` already says which refusal it was.
    detail = error.message
    try:
        attempt_record(
            operation_id=operation_id,
            case=case,
            approved=approved,
            reviewer=reviewer,
            channel=channel,
            outcome=outcome,
            detail=CommitAttempt.EDIT_DETAIL + detail if edit else detail,
            reason=error.reason,
        )
    except (CaseBusy, DatabaseError) as failure:
        REFUSALS_UNRECORDED.labels(code=error.code).inc()
        log.error(
            "the refused %s on %s (%s) has no attempt row: %s",
            "edit" if edit else "decision",
            operation_id,
            error.code,
            failure,
        )
