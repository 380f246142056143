"""Edit: revise the current proposal and begin the workflow for the new one."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from cases.models import Case
from core.errors import DecisionflowError
from core.locks import case_lock
from effects.services import reviewer_check
from reviews.models import Channel
from reviews.services import RevisionResult, proposal_revise
from workflow.begin import BeginResult, begin_under_lock, pending_supersede_others, review_begin
from workflow.decide import refusal_record
from workflow.selectors import decidable_operation_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EditResult:
    revision: RevisionResult
    begun: BeginResult | None  # None when nothing changed, not asked for, or when beginning failed
    begin_error: DecisionflowError | None = None  # the edit is saved even then


def revision_begun(
    *,
    case: Case,
    expected_operation_id: str,
    actor,
    channel: str,
    permitted: Callable[[object], None],
    revise: Callable[[], RevisionResult],
    begin: bool = True,
    act: str = "edit",
) -> EditResult:
    """Run ``revise`` (a ``reviews.services`` revision of the current proposal) under the
    case lock, supersede the case's other pending reviews when it changed the identity, and
    begin the workflow for the case's current proposal (unless ``begin`` is False).

    ``permitted`` raises when ``actor`` may not make this change. Every refusal is answered
    as its error class and recorded as one commit attempt on ``expected_operation_id``,
    marked as an edit (``refusal_record``), as a refused decision is.

    Transactions: two, each holding the case lock (``case_lock``). The revision commits
    before begin runs: if begin fails (``CaseBusy`` included), the new proposal is saved and
    current, and the result says so (``begin_error``); the first decision on it, or
    ``manage.py begin``, begins it.

    A case never begun (imported with ``begin: false``, or by ``load_case``) has no proposal
    to revise yet. When ``expected_operation_id`` is the identity its case file gives, the
    review is begun first, as the first decision on it would be, so the revision supersedes
    the prepared proposal and the history shows both.
    """
    try:
        permitted(actor)
        if case.current_proposal_id is None and expected_operation_id == decidable_operation_id(case):
            review_begin(case=case, actor=actor, channel=channel)
            case.refresh_from_db(fields=["current_proposal"])
        with case_lock(case.case_id):
            revision = revise()
            if revision.changed:
                pending_supersede_others(case, revision.proposal.operation_id)
    except DecisionflowError as exc:
        refusal_record(
            case=case,
            operation_id=str(expected_operation_id),
            approved=None,
            reviewer=actor,
            channel=channel,
            error=exc,
            edit=True,
        )
        raise
    if not revision.changed or not begin:
        return EditResult(revision, None)
    try:
        # A transaction of its own, under the case lock again: whatever begin meets (a busy
        # case included), the revision above is saved.
        with case_lock(case.case_id):
            begun = begin_under_lock(case, actor, channel)
    except DecisionflowError as exc:
        # Not a warning on the console: every channel reports it to whoever made the change.
        log.info("%s of case %s saved; beginning its review failed: %s", act, case.case_id, exc.message)
        return EditResult(revision, None, exc)
    return EditResult(revision, begun)


def review_edit(
    *,
    case: Case,
    expected_operation_id: str,
    body: str | None = None,
    source_versions: dict[str, int] | None = None,
    editor,
    channel: str = Channel.SERVICE,
) -> EditResult:
    """Revise the current proposal (``proposal_revise``) and begin the workflow for the new one
    (``revision_begun``: the case lock, the other pending reviews superseded, refusals
    recorded, begin in a transaction of its own).

    The editor needs the review permission. A stale ``expected_operation_id`` is refused
    and writes nothing. When the revision changes the identity, the case's other pending
    reviews are marked superseded (resuming one is refused as stale by the review core),
    and the workflow is begun for the case's current proposal (the new one, unless another
    edit came in between).
    """
    return revision_begun(
        case=case,
        expected_operation_id=expected_operation_id,
        actor=editor,
        channel=channel,
        permitted=reviewer_check,
        revise=lambda: proposal_revise(
            case=case,
            expected_operation_id=expected_operation_id,
            body=body,
            source_versions=source_versions,
            editor=editor,
        ),
    )
