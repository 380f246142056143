"""The reads the API shows: a case with its current proposal, and one operation by its key."""

from __future__ import annotations

from django.db.models import QuerySet

from cases.models import Case
from cases.selectors import case_text_fields
from decisionflow.core import text
from decisionflow.core.errors import NotFound
from decisionflow.workflow.selectors import decidable_operation_id
from effects.selectors import delivery_data
from effects.services import operation_reconcile
from reviews.models import PendingReview, Proposal, ReviewDecision
from reviews.selectors import proposal_text_fields

from .models import ApiToken


def tokens_of(user) -> QuerySet[ApiToken]:
    """A user's own tokens, newest first, revoked ones included (the history of their access)."""
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-id")


def case_get(case_id: str, *, detail: bool = False) -> Case:
    """The case with its current proposal (and, with ``detail``, what ``case_data`` shows of it)."""
    related = ("current_proposal__parent", "current_proposal__author") if detail else ("current_proposal",)
    case = Case.objects.select_related(*related).filter(case_id=case_id).first()
    if case is None:
        raise NotFound(f"case {case_id[:100]} does not exist")
    return case


def proposal_data(proposal: Proposal) -> dict:
    return {
        "operation_id": proposal.operation_id,
        "action": proposal.action,
        "origin": proposal.origin,
        "parent_operation_id": proposal.parent.operation_id if proposal.parent is not None else None,
        # A prepared proposal has no human author (older rows may name whoever began it).
        "author": proposal.human_author.get_username() if proposal.human_author is not None else None,
        "created_at": proposal.created_at,
        "body": proposal.body,
        "evidence_id": proposal.evidence_id,
        "policy_id": proposal.policy_id,
        "passages": proposal.passages,
        "findings": proposal.findings,
        "policy": proposal.policy_snapshot,
        "unchecked_sentences": proposal.unchecked_sentences,
        "warnings": text.warnings(proposal_text_fields(proposal)),
    }


def pending_data(operation_id: str) -> dict | None:
    pending = PendingReview.objects.select_related("begun_by").filter(operation_id=operation_id).first()
    if pending is None:
        return None
    return {
        "status": pending.status,
        "workflow_version": pending.workflow_version,
        "created_at": pending.created_at,
        "begun_by": pending.begun_by.get_username() if pending.begun_by is not None else None,
        "begun_channel": pending.begun_channel,
    }


def operation_data(operation_id: str, *, current: bool | None = None) -> dict:
    """What happened to one operation, read from the decision and effect tables (never guessed).

    ``current``: whether it is its case's current operation, when the caller already knows
    (``case_data`` reads the current proposal itself); otherwise it is read.
    """
    row = operation_reconcile(operation_id)
    if row is None:
        raise NotFound(f"no proposal has operation {operation_id}", operation_id=operation_id)
    decision = ReviewDecision.objects.select_related("reviewer").filter(operation_id=operation_id).first()
    if current is None:
        current = Case.objects.filter(case_id=row.case_id, current_proposal__operation_id=operation_id).exists()
    return {
        "operation_id": row.operation_id,
        "case_id": row.case_id,
        "state": row.state,
        "effect_count": row.effects,
        "current": current,
        "decision": None
        if decision is None
        else {
            "approved": decision.approved,
            "reviewer": decision.reviewer.get_username(),
            "decided_at": decision.decided_at,
            "decline_reason": decision.decline_reason,
            "decline_note": decision.decline_note,
            "system_actor": decision.system_actor,
        },
        "delivery": delivery_data(operation_id),
    }


def case_data(case: Case) -> dict:
    """What GET /api/cases/{id} shows; ``case`` from ``case_get(..., detail=True)`` reads its
    proposal with it (any other case reads it here)."""
    proposal = None
    if case.current_proposal_id:
        proposal = case.current_proposal if Case.current_proposal.is_cached(case) else None
        if proposal is None or not (Proposal.parent.is_cached(proposal) and Proposal.author.is_cached(proposal)):
            proposal = Proposal.objects.select_related("parent", "author").get(pk=case.current_proposal_id)
    fields = [(name, value) for name, value in case_text_fields(case) if name == "subject"]
    if proposal is not None:
        fields += [(f"proposal.{name}", value) for name, value in proposal_text_fields(proposal)]
    reconcile = proposal and operation_data(proposal.operation_id, current=True)
    decision = reconcile["decision"] if reconcile else None
    return {
        "case_id": case.case_id,
        "subject": case.subject,
        # Said at the top, as `manage.py begin` says it: a decided case is decided.
        "status": reconcile["state"] if reconcile else "NotStarted",
        "decidable": decision is None,
        "decision": decision,
        "warnings": text.warnings(fields),
        "operation_id": decidable_operation_id(case),
        "proposal": proposal and proposal_data(proposal),
        "pending": proposal and pending_data(proposal.operation_id),
        "reconcile": reconcile,
    }
