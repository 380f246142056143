"""Intake: a case brought in by the pipeline, its identity checked, and its review begun.

The one service behind ``POST /api/cases`` (docs/INTAKE.md). ``load_case`` imports the same
files through ``cases.services.case_import``, without the identity check or the begin.
"""

from __future__ import annotations

from dataclasses import dataclass

from cases.models import Case
from cases.services import ImportResult, case_import, validate_case_data
from core.errors import DecisionflowError, OperationIdMismatch
from reviews.models import Channel
from reviews.services import file_operation_id
from workflow.begin import BeginResult, review_begin


@dataclass(frozen=True)
class IntakeResult:
    case: Case
    created: bool  # False: the same case file came in before (nothing new was written)
    operation_id: str  # the identity of the case's prepared proposal
    begun: BeginResult | None  # None when not asked for, or when beginning failed
    begin_error: DecisionflowError | None = None  # the case is in even then


def case_intake(
    *, data: dict, actor, operation_id: str | None = None, begin: bool = True, channel: str = Channel.SERVICE
) -> IntakeResult:
    """Import one case file (``case_import``: validated, all or nothing, the same content
    again a no-op) and, unless ``begin`` is False, begin its review, so the queue shows it.

    ``operation_id``: the identity the pipeline computed for the file's prepared proposal
    (docs/PROTOCOL.md). When it is not ours, ``OperationIdMismatch`` names both, before
    anything is written. A begin that fails (``CaseBusy``, say) leaves the case imported:
    the result says so (``begin_error``), and the first decision, or ``manage.py begin``,
    begins it.
    """
    validate_case_data(data)
    ours = file_operation_id(data)
    if operation_id is not None and operation_id != ours:
        raise OperationIdMismatch.of(sent=operation_id, ours=ours)
    imported: ImportResult = case_import(data=data)
    if not begin:
        return IntakeResult(imported.case, imported.created, ours, None)
    try:
        begun = review_begin(case=imported.case, actor=actor, channel=channel)
    except DecisionflowError as exc:
        return IntakeResult(imported.case, imported.created, ours, None, exc)
    return IntakeResult(imported.case, imported.created, begun.operation_id, begun)
