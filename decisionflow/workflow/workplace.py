"""The admin workplace's one write path for decisions: begin if needed, then resume.

Approve and Decline in the admin resume the case's pending review through
``decisionflow.workflow.review_resume`` (channel ``admin``), exactly like
``manage.py resume``: there is no second commit path. What this module adds is only what a
web page needs around that call:

- a proposal that is the case's current one but whose review was never begun (an import
  without ``begin``, or an edit whose begin failed) is begun on the reviewer's first
  Approve or Decline, so the reviewer never meets a dead end;
- every way the call can end becomes one ``DecideOutcome``; a failure that may have
  happened after the commit wrote (a lost receipt, a crash, anything unexpected) is never
  reported as success or as failure: the outcome is read back from the effect store.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TypedDict

from cases.models import Case
from decisionflow.core.errors import ConflictingDecision, DecisionflowError, OutcomeUncertain, StaleProposal
from effects.services import CONFLICTING, DECLINED, CommitResult, ReconcileRow, operation_reconcile
from reviews.models import PendingReview

log = logging.getLogger(__name__)

COMMITTED = "committed"
DECLINED_KIND = "declined"
REPLAY = "replay"
CONFLICT = "conflict"
STALE = "stale"
REFUSED = "refused"
UNCERTAIN = "uncertain"


@dataclass(frozen=True)
class DecideOutcome:
    kind: str
    operation_id: str
    approved: bool
    result: CommitResult | None = None
    error: DecisionflowError | None = None
    # Only for ``uncertain``: what the decision and effect tables say now, or why they
    # could not be read.
    reconciled: ReconcileRow | None = None
    reconcile_error: str | None = None
    begun: bool = False
    # Only for ``stale``: the case's current operation, to link to.
    current_operation_id: str | None = None


class _Base(TypedDict):
    """The fields every ``DecideOutcome`` of one decision shares."""

    operation_id: str
    approved: bool


def _current_operation(case: Case) -> str | None:
    return Case.objects.filter(pk=case.pk).values_list("current_proposal__operation_id", flat=True).first()


def _uncertain(base: _Base, error: DecisionflowError, begun: bool) -> DecideOutcome:
    """Read the outcome back from the effect store; never guess it from the exception."""
    try:
        row = operation_reconcile(base["operation_id"])
    except Exception as exc:  # noqa: BLE001 - the database itself may be what failed
        log.exception("reconciling %s after a failed decision also failed", base["operation_id"])
        return DecideOutcome(
            UNCERTAIN, **base, error=error, begun=begun, reconcile_error=f"{type(exc).__name__}: {exc}"
        )
    return DecideOutcome(UNCERTAIN, **base, error=error, reconciled=row, begun=begun)


def _begin_if_needed(case: Case, operation_id: str, actor) -> bool:
    """Begin the review of the current proposal when it has never been begun.

    Only the case's current proposal is ever begun; a stale identity is left to
    ``review_resume`` to refuse, so a stale click writes nothing here either.
    """
    from decisionflow.workflow.services import review_begin

    if _current_operation(case) != operation_id:
        return False
    if PendingReview.objects.filter(operation_id=operation_id).exists():
        return False
    review_begin(case=case, actor=actor)
    return True


def proposal_decide(*, case: Case, operation_id: str, approved: bool, reviewer) -> DecideOutcome:
    """Approve or decline ``operation_id`` of ``case`` as ``reviewer`` through the workflow.

    Invariant: writes happen only inside ``review_begin``/``review_resume``; every refusal
    (stale, conflict, permission, version) writes no decision and no effect. Never raises
    for an expected outcome; the caller renders the returned outcome.
    """
    from decisionflow.workflow.services import review_resume

    begun = False
    base: _Base = {"operation_id": operation_id, "approved": approved}
    try:
        begun = _begin_if_needed(case, operation_id, reviewer)
        resumed = review_resume(
            case=case, operation_id=operation_id, approved=approved, reviewer=reviewer, channel="admin"
        )
        result = resumed.result
    except StaleProposal as exc:
        # A stale refusal from the workflow's own check does not name the current operation.
        current = exc.current_operation_id or _current_operation(case)
        return DecideOutcome(STALE, **base, error=exc, begun=begun, current_operation_id=current)
    except ConflictingDecision as exc:
        return DecideOutcome(CONFLICT, **base, error=exc, begun=begun)
    except OutcomeUncertain as exc:
        return _uncertain(base, exc, begun)
    except DecisionflowError as exc:
        return DecideOutcome(REFUSED, **base, error=exc, begun=begun)
    except Exception as exc:  # noqa: BLE001 - any failure: the effect store decides, not the exception
        log.exception("admin decision on %s failed; reconciling", operation_id)
        return _uncertain(base, OutcomeUncertain(f"{type(exc).__name__}: {exc}"), begun)
    if result is None:
        # Silence is not success.
        return _uncertain(base, OutcomeUncertain("the workflow returned no commit result"), begun)
    if result.status == CONFLICTING:
        kind = CONFLICT
    elif result.replay:
        kind = REPLAY
    elif result.status == DECLINED:
        kind = DECLINED_KIND
    else:
        kind = COMMITTED
    return DecideOutcome(kind, **base, result=result, begun=begun)
