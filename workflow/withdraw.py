"""Withdraw: the pipeline ends a pending review because its ticket was closed elsewhere.

The one service behind ``POST /api/cases/{id}/withdraw`` and ``manage.py withdraw``
(docs/INTAKE.md, "Withdrawals"). A withdrawal is a decline by the system actor
``pipeline-withdraw`` with the reason ``withdrawn``, written by the review core exactly as
the SLA's expiry is (``workflow/queue.py`` ``review_expire``): one commit, its attempt row,
the pending review completed. The decision's reviewer is the pipeline's service user who
asked, so the history names who withdrew it.
"""

from __future__ import annotations

from cases.models import Case
from core import text
from core.errors import DecisionflowError, InvalidInput, PermissionRefused
from effects.services import CONFLICTING, CommitResult, conflict_refusal, effect_commit
from reviews.groups import WITHDRAW_PERMISSION
from reviews.models import Channel, DeclineReason, Proposal, SystemActor
from workflow.bind import no_pending_review
from workflow.decide import refusal_record

# Why the pipeline withdrew it, one line: shown in the review page's banner and the refusal
# of a later approval.
WITHDRAW_REASON_MAX = 500


def withdraw_check(*, actor, reason: str | None) -> None:
    """Refuse a withdrawal that could never be written: who asks, and what it says."""
    if actor is None or not getattr(actor, "is_authenticated", False) or not actor.is_active:
        raise PermissionRefused("a withdrawal needs an authenticated, active pipeline user")
    if not actor.has_perm(WITHDRAW_PERMISSION):
        raise PermissionRefused(
            f"{actor.get_username()} does not have the withdraw permission ({WITHDRAW_PERMISSION}, the Pipeline group)"
        )
    if reason is not None:
        text.check_text(reason, field="reason", one_line=True, max_length=WITHDRAW_REASON_MAX)
        if not reason.strip():
            raise InvalidInput("reason: is blank; leave it out instead; nothing was written", field="reason")


def case_withdraw(
    *, case: Case, operation_id: str, actor, reason: str | None = None, channel: str = Channel.SERVICE
) -> CommitResult:
    """Withdraw the review of ``operation_id``, ``case``'s current proposal, as ``actor``.

    ``actor`` is a pipeline service user with ``cases.withdraw_case``; ``reason`` is an
    optional one-line note. Invariant: the same as every decision's (one decision per
    operation, never updated). The first withdrawal declines it (``withdrawn``, by
    ``pipeline-withdraw``); a withdrawal of an operation already declined (by it or by
    anyone) is a replay, and the first decline and its reason stand. Refusals:
    ``StaleProposal`` (not the case's current proposal: the pipeline saw an older one),
    ``NotFound`` (not this case's operation, or a review never begun), ``ConflictingDecision``
    (it was approved: decided means decided), ``PermissionRefused``, ``InvalidInput``,
    ``CaseBusy``, ``OutcomeUncertain``. Each writes no decision and is recorded as a commit
    attempt. The transaction is the review core's commit (``effect_commit``).
    """
    operation_id = str(operation_id)
    try:
        withdraw_check(actor=actor, reason=reason)
        if not Proposal.objects.filter(case=case, operation_id=operation_id).exists():
            raise no_pending_review(case, operation_id)
    except DecisionflowError as exc:
        refusal_record(case=case, operation_id=operation_id, approved=False, reviewer=actor, channel=channel, error=exc)
        raise
    commit = effect_commit(
        operation_id=operation_id,
        approved=False,
        reviewer=actor,
        channel=str(channel)[:20],
        decline_reason=DeclineReason.WITHDRAWN,
        decline_note=reason,
        system_actor=SystemActor.PIPELINE_WITHDRAW,
    )
    if commit.status == CONFLICTING:
        raise conflict_refusal(commit)
    return commit
