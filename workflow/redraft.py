"""Re-draft: the pipeline replaces a case's current proposal with a new draft, evidence or
findings (``POST /api/cases/{id}/drafts``, docs/INTAKE.md), and the review of the new one
is begun. The edit's machinery (``workflow.edit.revision_begun``) with the pipeline's rules."""

from __future__ import annotations

from cases.models import Case
from core.errors import PermissionRefused
from reviews.groups import INTAKE_PERMISSION, can_intake
from reviews.models import Channel
from reviews.services import proposal_redraft
from workflow.edit import EditResult, revision_begun


def intake_check(actor) -> None:
    if not can_intake(actor):
        name = actor.get_username() if getattr(actor, "is_authenticated", False) else "nobody"
        raise PermissionRefused(f"{name} does not have the intake permission ({INTAKE_PERMISSION}, the Pipeline group)")


def case_redraft(
    *,
    case: Case,
    expected_operation_id: str,
    draft: str | None = None,
    selected_evidence: list[dict] | None = None,
    findings: list[dict] | None = None,
    operation_id: str | None = None,
    begin: bool = True,
    actor,
    channel: str = Channel.SERVICE,
) -> EditResult:
    """Supersede the current proposal with the pipeline's re-draft (``proposal_redraft``)
    and, unless ``begin`` is False, begin the review of the case's current proposal.

    The actor needs the intake permission (the Pipeline group), never the review one. As
    for an edit (``revision_begun``): under the case lock, the case's other pending reviews
    superseded (a tab still open on the old proposal is refused as stale), every refusal
    recorded as an attempt row marked as an edit, and begin in a transaction of its own, so
    a begin that fails leaves the re-draft saved and current (``begin_error``). A decided
    current proposal is refused (``AlreadyDecided``): decided means decided.
    """
    return revision_begun(
        case=case,
        expected_operation_id=expected_operation_id,
        actor=actor,
        channel=channel,
        permitted=intake_check,
        revise=lambda: proposal_redraft(
            case=case,
            expected_operation_id=expected_operation_id,
            draft=draft,
            selected_evidence=selected_evidence,
            findings=findings,
            operation_id=operation_id,
        ),
        begin=begin,
        act="re-draft",
    )
