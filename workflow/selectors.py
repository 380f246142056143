"""Reads about cases that span the review and effect tables: status and history.

Status is computed in the database with ``Exists``/``Subquery`` annotations, so a
changelist page costs the same number of queries at 10 rows as at 100,000.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, TypedDict

from django.db.models import Case as Conditional
from django.db.models import CharField, Exists, Model, OuterRef, QuerySet, Subquery, Value, When

from cases.models import Case, EvidenceChange, reviewer_groups
from core.errors import EvidenceChanged
from core.outcomes import DecisionOutcome
from core.text import when
from effects.models import CommitAttempt, EffectRecord
from effects.services import ReconcileRow, evidence_refusal, operations_reconcile
from reviews.models import (
    Approval,
    Notification,
    Origin,
    PendingReview,
    Proposal,
    ReviewAssignment,
    ReviewClaimEvent,
    ReviewDecision,
    ReviewEscalation,
)
from reviews.selectors import RECHECK_FLAG, evidence_moves, policy_change, proposal_diff
from reviews.services import prepared_content

if TYPE_CHECKING:
    # A type-checking-only dependency (requirements/test.in), used in annotations only.
    from django_stubs_ext import WithAnnotations

NOT_STARTED = "not_started"
PENDING_REVIEW = "pending_review"
COMMITTED = DecisionOutcome.COMMITTED.value
DECLINED = DecisionOutcome.DECLINED.value
NEEDS_ATTENTION = "needs_attention"

STATUS_CHOICES = [
    (PENDING_REVIEW, "Pending review"),
    (COMMITTED, DecisionOutcome.COMMITTED.label),
    (DECLINED, DecisionOutcome.DECLINED.label),
    (NEEDS_ATTENTION, "Needs attention"),
    (NOT_STARTED, "Not started"),
]
STATUS_LABELS = dict(STATUS_CHOICES)


class CaseStatus(TypedDict):
    """The annotations ``cases_with_status`` adds to each case."""

    current_operation_id: str | None
    decision_approved: bool | None
    decision_reviewer: str | None
    decision_at: datetime | None
    has_effect: bool
    has_pending_review: bool
    last_attempt_outcome: str | None
    review_status: str


def cases_with_status(queryset: QuerySet[Case] | None = None) -> QuerySet[WithAnnotations[Case, CaseStatus]]:
    """Cases annotated with ``review_status`` and the current decision, all in one query.

    Everything is about the case's *current* proposal:

    - ``not_started``: the case has no proposal yet (``begin`` has not run);
    - ``committed``: approved, and the effect record exists;
    - ``declined``: declined (there is no effect);
    - ``needs_attention``: approved but no effect recorded (reconcile says
      ``NoLocalEffectRecorded``), or undecided while its latest commit attempt failed;
    - ``pending_review``: everything else, i.e. waiting for a reviewer.
    """
    queryset = Case.objects.all() if queryset is None else queryset
    current = OuterRef("current_proposal_id")
    decision = ReviewDecision.objects.filter(proposal_id=current)
    last_attempt = CommitAttempt.objects.filter(
        case_id=OuterRef("pk"), operation_id=OuterRef("current_proposal__operation_id")
    ).order_by("-attempted_at", "-id")
    return queryset.annotate(
        current_operation_id=Subquery(Proposal.objects.filter(pk=current).values("operation_id")[:1]),
        decision_approved=Subquery(decision.values("approved")[:1]),
        decision_reviewer=Subquery(decision.values("reviewer__username")[:1]),
        decision_at=Subquery(decision.values("decided_at")[:1]),
        has_effect=Exists(EffectRecord.objects.filter(proposal_id=current)),
        has_pending_review=Exists(
            PendingReview.objects.filter(proposal_id=current, status=PendingReview.Status.PENDING)
        ),
        last_attempt_outcome=Subquery(last_attempt.values("outcome")[:1]),
    ).annotate(
        review_status=Conditional(
            When(current_proposal__isnull=True, then=Value(NOT_STARTED)),
            When(decision_approved=True, has_effect=True, then=Value(COMMITTED)),
            When(decision_approved=True, then=Value(NEEDS_ATTENTION)),
            When(decision_approved=False, then=Value(DECLINED)),
            When(last_attempt_outcome=CommitAttempt.Outcome.FAILED, then=Value(NEEDS_ATTENTION)),
            default=Value(PENDING_REVIEW),
            output_field=CharField(),
        )
    )


@dataclass(frozen=True)
class HistoryEvent:
    at: datetime
    kind: str  # proposal, pending_review, escalation, assignment, claim, attempt, approval, decision, effect, notification
    obj: Model
    # For proposals: the body diff and the evidence moves against the parent.
    diff: list[str] = field(default_factory=list)
    moves: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class CaseHistory:
    case: Case
    events: list[HistoryEvent]
    reconcile: list[ReconcileRow]


_ORDER = {
    "proposal": 0,
    "pending_review": 1,
    "escalation": 2,
    "assignment": 2,
    "claim": 3,
    "attempt": 4,
    "approval": 5,
    "decision": 6,
    "effect": 7,
    "notification": 8,
}


def case_history(case: Case) -> CaseHistory:
    """The case's whole timeline, oldest first, and its current reconcile state.

    A fixed number of queries whatever the history's length: one per table.
    """
    events: list[HistoryEvent] = []
    proposals = list(Proposal.objects.filter(case=case).select_related("author", "parent").order_by("created_at", "id"))
    for proposal in proposals:
        events.append(
            HistoryEvent(proposal.created_at, "proposal", proposal, proposal_diff(proposal), evidence_moves(proposal))
        )
    for review in (
        PendingReview.objects.filter(case=case)
        .select_related("proposal", "begun_by")
        .defer("proposal__body", "proposal__passages", "proposal__findings")
    ):
        # Where it stood at begin: the groups its policy names (no row is written for that).
        review.begun_groups = list(reviewer_groups(review.proposal.policy_snapshot.get("parameters")))
        events.append(HistoryEvent(review.created_at, "pending_review", review))
    for move in ReviewAssignment.objects.filter(case=case).select_related("by", "to_user", "meant_for"):
        events.append(HistoryEvent(move.at, "assignment", move))
    for step in ReviewEscalation.objects.filter(case=case):
        events.append(HistoryEvent(step.at, "escalation", step))
    for attempt in CommitAttempt.objects.filter(case=case).select_related("reviewer"):
        events.append(HistoryEvent(attempt.attempted_at, "attempt", attempt))
    # Two-person approval: each approval before the decision it adds up to.
    for approval in Approval.objects.filter(proposal__case=case).select_related("reviewer"):
        events.append(HistoryEvent(approval.approved_at, "approval", approval))
    for decision in ReviewDecision.objects.filter(proposal__case=case).select_related("reviewer"):
        events.append(HistoryEvent(decision.decided_at, "decision", decision))
    for effect in EffectRecord.objects.filter(case=case).select_related("reviewer").defer("body"):
        events.append(HistoryEvent(effect.recorded_at, "effect", effect))
    for claim in ReviewClaimEvent.objects.filter(case=case).select_related("user"):
        events.append(HistoryEvent(claim.at, "claim", claim))
    # One line per notification, at the time it was recorded, with its state now.
    for notification in Notification.objects.filter(case=case):
        events.append(HistoryEvent(notification.created_at, "notification", notification))
    # Within one transaction the timestamps can tie; show cause before consequence.
    events.sort(key=lambda e: (e.at, _ORDER[e.kind], e.obj.pk))
    return CaseHistory(case, events, list(operations_reconcile(case_ids=[case.case_id])))


def evidence_changed_refusal(case: Case, proposal: Proposal) -> EvidenceChanged | None:
    """The refusal an approval of ``proposal`` would get because a new source version no
    longer holds its evidence (``evidence_refusal``, the commit's own rule), or None."""
    if not case.evidence_hold:
        return None  # nothing marked: no need to read a reason
    marks = EvidenceChange.objects.filter(operation_id=proposal.operation_id).order_by("-pk")
    reason = marks.values_list("reason", flat=True).first()
    return evidence_refusal(
        hold=case.evidence_hold, operation_id=proposal.operation_id, reason=reason, case_id=case.case_id
    )


def decidable_operation_id(case: Case) -> str:
    """The operation a decision must name now: the current proposal's, or, before the review
    was ever begun, the identity ``begin`` will give the prepared proposal (computed, not written)."""
    if case.current_proposal_id:
        current = case.current_proposal if Case.current_proposal.is_cached(case) else None
        if current is not None:  # loaded with the case: no query
            return current.operation_id
        return Proposal.objects.values_list("operation_id", flat=True).get(pk=case.current_proposal_id)
    return prepared_content(case)["operation_id"]


@dataclass(frozen=True)
class BulkRow:
    """One row of the bulk confirmation: what confirming will do to this case, and why."""

    case: Case
    operation_id: str | None
    human_edit: bool
    acts: bool  # True: the decision is sent; False: the row is skipped
    reason: str  # why it is skipped ("" when it acts)
    status_label: str  # the case's review status, as the case list shows it
    # Lines a reviewer must read before confirming (e.g. text markers, four-eyes); each is
    # plain text, shown in the row's warnings cell.
    warnings: list[str] = field(default_factory=list)


def bulk_decision_plan(cases: list, *, approved: bool) -> list[BulkRow]:
    """What a bulk Approve or Decline of these cases will do, row by row (one query).

    ``cases`` come from ``cases_with_status``. A case acts only when its current proposal
    exists and is undecided; every other row says why it is skipped. The decision service
    checks each row again when the reviewer confirms, so the plan can only be too hopeful
    (a row decided meanwhile becomes a replay or a conflict), never write more. An undecided
    proposal whose findings the review page flags for re-checking after a policy change
    (``policy_change``'s own rule) carries that flag among its warnings.
    """
    # The cases' proposals, for the current one's origin and its chain back to the policy
    # it replaced (one query).
    chain = {
        p.pk: p
        for p in Proposal.objects.filter(case_id__in=[c.pk for c in cases if c.current_proposal_id]).only(
            "pk", "case_id", "parent_id", "origin", "policy_id", "policy_snapshot", "findings"
        )
    }
    # The marks of held operations, read only when some case has one.
    held = {case.evidence_hold for case in cases if approved and case.evidence_hold}
    marks = dict(
        EvidenceChange.objects.filter(operation_id__in=held).order_by("pk").values_list("operation_id", "reason")
    )
    rows = []
    for case in cases:
        operation_id = case.current_operation_id
        current = chain.get(case.current_proposal_id) if case.current_proposal_id else None
        human_edit = current is not None and current.origin == Origin.HUMAN_EDIT
        refusal = (
            evidence_refusal(
                hold=case.evidence_hold, operation_id=operation_id, reason=marks.get(operation_id), case_id=case.case_id
            )
            if operation_id and case.evidence_hold
            else None
        )
        if not operation_id:
            reason = "no review begun: open the case and start its review first"
        elif approved and refusal is not None and case.decision_approved is None:
            reason = f"{refusal.details['reason']}: an approval waits for a re-draft or an edit"
        elif case.decision_approved is not None:
            done = "approved" if case.decision_approved else "declined"
            reason = f"already {done} by {case.decision_reviewer} at {when(case.decision_at)}"
            if case.decision_approved != approved:
                reason += "; " + ("an approval" if approved else "a decline") + " now would be refused as a conflict"
        else:
            reason = ""
        warnings = []
        if current is not None and case.decision_approved is None:
            warnings += _recheck_warnings(current, case.depends_on, chain)
        rows.append(
            BulkRow(case, operation_id, human_edit, not reason, reason, STATUS_LABELS[case.review_status], warnings)
        )
    return rows


def _recheck_warnings(proposal: Proposal, depends_on: list[str] | None, chain: dict[int, Proposal]) -> list[str]:
    """The review page's flag on the findings of a proposal whose policy changed under them."""
    change = policy_change(proposal, depends_on, chain=chain)
    if change is None or not change["recheck"] or not proposal.findings:
        return []
    count = len(proposal.findings)
    return [
        f"{RECHECK_FLAG}: {count} finding{'s' if count != 1 else ''}, policy {change['from_label']} → {change['to_label']}"
    ]
