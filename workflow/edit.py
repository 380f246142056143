"""Edit: revise the current proposal and begin the workflow for the new one."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cases.models import Case
from core.errors import DecisionflowError
from core.locks import case_lock
from effects.services import reviewer_check
from reviews.models import Channel
from reviews.services import RevisionResult, proposal_revise
from workflow.begin import BeginResult, begin_under_lock, pending_supersede_others
from workflow.decide import refusal_record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EditResult:
    revision: RevisionResult
    begun: BeginResult | None  # None when nothing changed, or when beginning failed
    begin_error: DecisionflowError | None = None  # the edit is saved even then


def review_edit(
    *,
    case: Case,
    expected_operation_id: str,
    body: str | None = None,
    source_versions: dict[str, int] | None = None,
    editor,
    channel: str = Channel.SERVICE,
) -> EditResult:
    """Revise the current proposal (``proposal_revise``) and begin the workflow for the new one.

    The editor needs the review permission. A stale ``expected_operation_id`` is refused
    and writes nothing. When the revision changes the identity, the case's other pending
    reviews are marked superseded (resuming one is refused as stale by the review core),
    and the workflow is begun for the case's current proposal (the new one, unless another
    edit came in between).

    Every refusal (no permission, bad input, stale or decided, a busy case) is answered as
    its error class and recorded as one commit attempt on ``expected_operation_id``, marked
    as an edit (``refusal_record``), as a refused decision is.

    Transactions: two, each holding the case lock (``case_lock``). The revision commits
    before begin runs: if begin fails (``CaseBusy`` included), the new proposal is saved and
    current, and the result says so (``begin_error``); the first decision on it, or
    ``manage.py begin``, begins it.
    """
    try:
        reviewer_check(editor)
        with case_lock(case.case_id):
            revision = proposal_revise(
                case=case,
                expected_operation_id=expected_operation_id,
                body=body,
                source_versions=source_versions,
                editor=editor,
            )
            if revision.changed:
                pending_supersede_others(case, revision.proposal.operation_id)
    except DecisionflowError as exc:
        refusal_record(
            case=case,
            operation_id=str(expected_operation_id),
            approved=None,
            reviewer=editor,
            channel=channel,
            error=exc,
            edit=True,
        )
        raise
    if not revision.changed:
        return EditResult(revision, None)
    try:
        # A transaction of its own, under the case lock again: whatever begin meets (a busy
        # case included), the revision above is saved.
        with case_lock(case.case_id):
            begun = begin_under_lock(case, editor, channel)
    except DecisionflowError as exc:
        # Not a warning on the console: every channel reports it to the person who edited.
        log.info("edit of case %s saved; beginning its review failed: %s", case.case_id, exc.message)
        return EditResult(revision, None, exc)
    return EditResult(revision, begun)
