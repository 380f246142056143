"""The reads the API shows: a case with its current proposal, and one operation by its key."""

from __future__ import annotations

import functools
from typing import NamedTuple

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import QuerySet

from api.models import ApiToken
from api.rows import Joined, Part
from api.schemas import NOT_STARTED
from cases.models import Case, Policy, SourceVersionJob
from cases.selectors import case_text_fields
from core import text
from core.errors import NotFound
from core.replicas import read_connection
from effects.models import Delivery, EffectRecord
from effects.selectors import delivery_data
from effects.services import operation_state
from reviews.models import PendingReview, Proposal, ReviewDecision, approvals_shown
from reviews.selectors import approvals_of, proposal_text_fields
from workflow.selectors import decidable_operation_id, evidence_changed_refusal


def tokens_of(user) -> QuerySet[ApiToken]:
    """A user's own tokens, newest first, revoked ones included (the history of their access)."""
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-id")


def _only(queryset):
    """The one row a filter on a unique key finds, or None: ``first()`` without its ORDER BY.

    ``first()`` orders by the model's default ordering, which a unique key makes pointless,
    and compiling that ordering was up to half of such a read's CPU time on every request.
    """
    found = list(queryset.order_by()[:1])
    return found[0] if found else None


def _who() -> tuple[str, str]:
    """What the API shows of a user: the key, and the username (a plain field, whose name
    is its attribute's)."""
    user = get_user_model()
    return user._meta.pk.attname, user.USERNAME_FIELD


@functools.cache
def _case_sql() -> tuple[str, Joined]:
    # Raw SQL on every request: the ORM spent 7-14 times as much CPU compiling the same
    # select_related as the statement costs on a cursor (docs/PERFORMANCE.md, "third pass").
    user = get_user_model()
    parts = Joined(
        Part.of(Case, "c"),
        Part.of(Proposal, "p"),
        Part.of(Proposal, "pp", ("id", "operation_id")),
        Part.of(user, "u", _who()),
        # The case's policy version: what a case never begun computes its decidable
        # operation from (and what begin, if this request begins it, prepares with).
        Part.of(Policy, "po"),
    )
    q = connection.ops.quote_name
    sql = (
        f"SELECT {parts.sql} FROM {q(Case._meta.db_table)} c "
        f"LEFT JOIN {q(Proposal._meta.db_table)} p ON p.id = c.current_proposal_id "
        f"LEFT JOIN {q(Proposal._meta.db_table)} pp ON pp.id = p.parent_id "
        f"LEFT JOIN {q(user._meta.db_table)} u ON u.{q(str(user._meta.pk.column))} = p.author_id "
        f"JOIN {q(Policy._meta.db_table)} po ON po.id = c.policy_id "
        "WHERE c.case_id = %s"
    )
    return sql, parts


def case_get(case_id: str) -> Case:
    """The case with its policy version and its current proposal, and what ``case_data``
    shows of the proposal's parent (its operation) and author (the username): one statement."""
    sql, parts = _case_sql()
    # Raw SQL, so the router's choice is taken here: the replica for the read-only case view.
    with read_connection().cursor() as cursor:
        cursor.execute(sql, [case_id])
        row = cursor.fetchone()
    if row is None:
        raise NotFound(f"case {case_id[:100]} does not exist")
    case, proposal, parent, author, policy = parts.instances(row)
    Case.policy.field.set_cached_value(case, policy)
    if proposal is not None:
        Proposal.parent.field.set_cached_value(proposal, parent)
        Proposal.author.field.set_cached_value(proposal, author)
    Case.current_proposal.field.set_cached_value(case, proposal)
    return case


def _warnings_out(warnings: text.Warnings) -> dict:
    """The API's ``warnings`` (at most ``text.MARKERS_LISTED`` per field), their full count,
    and the fields whose list was cut."""
    return {
        "warnings": warnings,
        "warnings_total": warnings.total,
        "warnings_omitted": warnings.omitted(),
    }


def proposal_data(proposal: Proposal, *, warnings: text.Warnings | None = None) -> dict:
    """The proposal as the API shows it; ``warnings``: its text markers, when the caller
    found them already."""
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
        **_warnings_out(text.warnings(proposal_text_fields(proposal)) if warnings is None else warnings),
    }


def pending_data(operation_id: str) -> dict | None:
    return _pending_view(_only(PendingReview.objects.select_related("begun_by").filter(operation_id=operation_id)))


def edit_pending_data(operation_id: str, pending: PendingReview | None, editor) -> dict | None:
    """``pending_data`` after an edit: the pending review its begin returned (``pending``),
    without reading it again when it is this operation's and was begun by the editor (or
    by no one); otherwise read."""
    if pending is None or pending.operation_id != operation_id or pending.begun_by_id not in (None, editor.pk):
        return pending_data(operation_id)
    PendingReview.begun_by.field.set_cached_value(pending, editor if pending.begun_by_id is not None else None)
    return _pending_view(pending)


def _pending_view(pending: PendingReview | None) -> dict | None:
    if pending is None:
        return None
    return {
        "status": pending.status,
        "workflow_version": pending.workflow_version,
        "created_at": pending.created_at,
        "begun_by": pending.begun_by.get_username() if pending.begun_by is not None else None,
        "begun_channel": pending.begun_channel,
    }


class _Operation(NamedTuple):
    decision: ReviewDecision | None
    has_effect: bool
    delivery: Delivery | None
    pending: PendingReview | None


@functools.cache
def _operation_sql() -> tuple[str, Joined]:
    # Each table is joined on the operation's key, as reconcile's own set-based query joins
    # them (effects/services.py); every key is unique, so a row or none from each.
    user = get_user_model()
    who = _who()
    parts = Joined(
        Part.of(ReviewDecision, "d"),
        Part.of(user, "r", who),
        Part.of(EffectRecord, "e", ("id",)),
        Part.of(Delivery, "dl"),
        Part.of(PendingReview, "pr"),
        Part.of(user, "b", who),
    )
    q = connection.ops.quote_name
    user_pk = q(str(user._meta.pk.column))
    sql = (
        f"SELECT {parts.sql} FROM (SELECT %s AS operation_id) k "
        f"LEFT JOIN {q(ReviewDecision._meta.db_table)} d ON d.operation_id = k.operation_id "
        f"LEFT JOIN {q(user._meta.db_table)} r ON r.{user_pk} = d.reviewer_id "
        f"LEFT JOIN {q(EffectRecord._meta.db_table)} e ON e.operation_id = k.operation_id "
        f"LEFT JOIN {q(Delivery._meta.db_table)} dl ON dl.operation_id = k.operation_id "
        f"LEFT JOIN {q(PendingReview._meta.db_table)} pr ON pr.operation_id = k.operation_id "
        f"LEFT JOIN {q(user._meta.db_table)} b ON b.{user_pk} = pr.begun_by_id"
    )
    return sql, parts


def _operation_read(operation_id: str) -> _Operation:
    """The operation's decision (with its reviewer), whether its effect exists, its delivery
    and its pending review (with who began it): one statement, one snapshot.

    Read one by one (``operation_reconcile``, then the decision, the delivery again for its
    panel, the pending review), they would be six queries that could straddle a commit.
    """
    sql, parts = _operation_sql()
    with read_connection().cursor() as cursor:
        cursor.execute(sql, [operation_id])
        row = cursor.fetchone()
    decision, reviewer, effect, delivery, pending, begun_by = parts.instances(row)
    if decision is not None:
        ReviewDecision.reviewer.field.set_cached_value(decision, reviewer)
    if pending is not None:
        PendingReview.begun_by.field.set_cached_value(pending, begun_by)
    return _Operation(decision, effect is not None, delivery, pending)


def _operation_view(
    *, case_id: str, operation_id: str, current: bool, found: _Operation, policy_snapshot: dict | None
) -> dict:
    decision = found.decision
    # Under a policy that needs several approvers, how far an undecided operation's are.
    approvals = (0, 1)
    if decision is None:
        approvals = approvals_of(operation_id=operation_id, policy_snapshot=policy_snapshot)
    return {
        "operation_id": operation_id,
        "case_id": case_id,
        # reconcile's own classification (effects/services.py), from the rows just read.
        "state": operation_state(decision.approved if decision is not None else None, found.has_effect, approvals[0]),
        "approvals": approvals_shown(*approvals) if decision is None else None,
        "effect_count": 1 if found.has_effect else 0,  # at most one: effect_unique_operation
        "current": current,
        "decision": None if decision is None else decision_data(decision),
        "delivery": delivery_data(found.delivery),
    }


def decision_data(decision: ReviewDecision) -> dict:
    """Who decided, when, and why (``DecisionInfoOut``); reads ``decision.reviewer``."""
    return {
        "approved": decision.approved,
        "reviewer": decision.reviewer.get_username(),
        "decided_at": decision.decided_at,
        "decline_reason": decision.decline_reason,
        "decline_note": decision.decline_note,
        "system_actor": decision.system_actor,
    }


def operation_data(operation_id: str) -> dict:
    """What happened to one operation, read from the decision and effect tables (never guessed).

    Two queries (three once its delivery has a try): the proposal with its case (whether it
    is still current comes with it), then the decision with its effect and delivery.
    """
    row = _only(
        Proposal.objects.filter(operation_id=operation_id).values_list(
            "pk", "case__case_id", "case__current_proposal_id", "policy_snapshot"
        )
    )
    if row is None:
        raise NotFound(f"no proposal has operation {operation_id}", operation_id=operation_id)
    pk, case_id, current_pk, policy_snapshot = row
    found = _operation_read(operation_id)
    return _operation_view(
        case_id=case_id,
        operation_id=operation_id,
        current=current_pk == pk,
        found=found,
        policy_snapshot=policy_snapshot,
    )


def case_data(case: Case) -> dict:
    """What GET /api/cases/{id} shows; ``case`` from ``case_get`` reads its
    proposal with it (any other case reads it here)."""
    proposal = None
    if case.current_proposal_id:
        proposal = case.current_proposal if Case.current_proposal.is_cached(case) else None
        if proposal is None or not (Proposal.parent.is_cached(proposal) and Proposal.author.is_cached(proposal)):
            proposal = Proposal.objects.select_related("parent", "author").get(pk=case.current_proposal_id)
    warnings = text.warnings([(name, value) for name, value in case_text_fields(case) if name == "subject"])
    shown = reconcile = pending = None
    if proposal is not None:
        proposal_warnings = text.warnings(proposal_text_fields(proposal))
        # The same markers named "proposal.…": they need not be found twice.
        warnings += proposal_warnings.prefixed("proposal.")
        shown = proposal_data(proposal, warnings=proposal_warnings)
        found = _operation_read(proposal.operation_id)
        reconcile = _operation_view(
            case_id=case.case_id,
            operation_id=proposal.operation_id,
            current=True,
            found=found,
            policy_snapshot=proposal.policy_snapshot,
        )
        pending = _pending_view(found.pending)
    decision = reconcile["decision"] if reconcile else None
    held = evidence_changed_refusal(case, proposal) if proposal is not None and decision is None else None
    return {
        "case_id": case.case_id,
        "subject": case.subject,
        # Said at the top, as `manage.py begin` says it: a decided case is decided.
        "status": reconcile["state"] if reconcile else NOT_STARTED,
        "decidable": decision is None,
        "decision": decision,
        "evidence_changed": held.details["reason"] if held else None,
        **_warnings_out(warnings),
        "operation_id": decidable_operation_id(case),
        "proposal": shown,
        "pending": pending,
        "reconcile": reconcile,
    }


def job_data(job_id: int) -> dict:
    """``GET /api/jobs/{id}``: one job of a new source version, as it stands now."""
    job = SourceVersionJob.objects.select_related("source_version__source").filter(pk=job_id).first()
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job_out(job)


def job_out(job: SourceVersionJob) -> dict:
    return {
        "id": job.pk,
        "state": job.state,
        "source_id": job.source_version.source.source_id,
        "version": job.source_version.version,
        "total": job.total,
        "done": job.done,
        "moved": job.moved,
        "marked": job.marked,
        "failed": job.failed,
        "error": job.error or None,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
    }
