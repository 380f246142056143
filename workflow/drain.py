"""Drain: move the pending reviews of an older workflow version (or graph) onto this one.

A pending review recorded by another ``WORKFLOW_VERSION`` or another graph fingerprint
(messages.py) is never resumed. ``workflow_drain`` re-begins each one with ``review_begin``,
the service ``manage.py begin`` calls: under the per-case lock, in one transaction per case,
it takes a new pause checkpoint on this version and moves the pending review to it. The
operation identity does not change (the case's content did not), so what the reviewer saw
stays valid and a decision on it resumes the new pause.

Safe to run twice and to kill: each case is its own transaction, and a case already on this
version and graph is no longer a candidate, so a rerun finds exactly the cases not yet moved
(no duplicate: the pending review is updated in place, one per operation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from django.db.models import QuerySet

from core.errors import CaseBusy, DecisionflowError, InvalidInput
from core.faults import crash_point
from engine.messages import graph_fingerprint, short_fingerprint
from engine.names import WORKFLOW_VERSION
from reviews.models import Channel, PendingReview
from workflow.begin import review_begin

DEFAULT_BATCH_SIZE = 100
MAX_BATCH_SIZE = 10_000


@dataclass(frozen=True)
class DrainItem:
    case_id: str
    operation_id: str
    from_version: str
    from_fingerprint: str
    # "would" (dry run), "re-begun", "unchanged" (another run moved it first), or "refused"
    outcome: str
    detail: str = ""

    def as_dict(self) -> dict:
        return {
            "case": self.case_id,
            "operation_id": self.operation_id,
            "from_version": self.from_version,
            "from_fingerprint": self.from_fingerprint,
            "outcome": self.outcome,
            "detail": self.detail,
        }


@dataclass
class DrainResult:
    applied: bool
    candidates: int  # pending reviews on another version or graph when the run started
    rebegun: int = 0
    unchanged: int = 0
    batches: int = 0
    refused: list[DrainItem] = field(default_factory=list)
    busy_only: bool = True  # every refusal was a busy case (try again)

    @property
    def to_version(self) -> str:
        return WORKFLOW_VERSION

    @property
    def to_fingerprint(self) -> str:
        return graph_fingerprint()


def drain_candidates(*, from_version: str | None = None) -> QuerySet[PendingReview]:
    """Pending reviews this code will not resume: another version, or another graph."""
    pending = PendingReview.objects.filter(status=PendingReview.Status.PENDING).exclude(
        workflow_version=WORKFLOW_VERSION, graph_fingerprint=graph_fingerprint()
    )
    if from_version is not None:
        pending = pending.filter(workflow_version=from_version)
    return pending


def _item(pending: PendingReview, outcome: str, detail: str = "") -> DrainItem:
    return DrainItem(
        case_id=pending.case.case_id,
        operation_id=pending.operation_id,
        from_version=pending.workflow_version,
        from_fingerprint=short_fingerprint(pending.graph_fingerprint),
        outcome=outcome,
        detail=detail,
    )


def _batches(from_version: str | None, batch_size: int) -> Iterator[list[PendingReview]]:
    # Keyset over the primary key: a case refused in this run is not retried in it.
    last_pk = 0
    while True:
        batch = list(
            drain_candidates(from_version=from_version)
            .filter(pk__gt=last_pk)
            .select_related("case")
            .order_by("pk")[:batch_size]
        )
        if not batch:
            return
        last_pk = batch[-1].pk
        yield batch


def _drain_one(pending: PendingReview) -> tuple[str, str, DecisionflowError | None]:
    case = pending.case
    case.refresh_from_db(fields=["current_proposal"])
    if case.current_proposal_id != pending.proposal_id:
        # Only the case's current operation is decidable; an older pause is history.
        error = InvalidInput(f"not the current proposal of case {case.case_id}; left as it is")
        return "refused", error.message, error
    try:
        result = review_begin(case=case, channel=Channel.COMMAND)
    except DecisionflowError as exc:
        return "refused", exc.message, exc
    if result.operation_id != pending.operation_id:
        error = InvalidInput(
            f"case {case.case_id} now prepares another operation ({result.operation_id}); its review was begun "
            "on that one and this pause was left as it is"
        )
        return "refused", error.message, error
    return ("re-begun" if result.created else "unchanged"), "", None


def workflow_drain(
    *,
    from_version: str | None = None,
    apply: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    report: Callable[[DrainItem], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> DrainResult:
    """Re-begin on this workflow version every pending review recorded by another version or graph.

    Dry run unless ``apply``: ``report`` gets one item per pending review that would move,
    and nothing is written. Applied: in batches of ``batch_size``, each case through
    ``review_begin`` (its own transaction, under its case lock, waiting at most the decision
    lock timeout: a busy case is reported and left for the next run); ``report`` gets each
    refusal, ``progress(n)`` counts cases done. Invariant: the same operation, one pending
    review per operation, nothing decided is touched. Idempotent and resumable.
    """
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidInput(f"the batch size must be between 1 and {MAX_BATCH_SIZE:,}, not {batch_size}")
    if from_version is not None and not from_version.strip():
        raise InvalidInput("--from needs a workflow version, e.g. review-v1")
    result = DrainResult(applied=apply, candidates=drain_candidates(from_version=from_version).count())
    if not apply:
        for pending in drain_candidates(from_version=from_version).select_related("case").order_by("pk").iterator():
            if report is not None:
                report(_item(pending, "would"))
        return result
    for batch in _batches(from_version, batch_size):
        for pending in batch:
            outcome, detail, error = _drain_one(pending)
            if outcome == "re-begun":
                result.rebegun += 1
            elif outcome == "unchanged":
                result.unchanged += 1
            else:
                result.refused.append(_item(pending, outcome, detail))
                result.busy_only = result.busy_only and isinstance(error, CaseBusy)
                if report is not None:
                    report(result.refused[-1])
            if progress is not None:
                progress(1)
        result.batches += 1
        # Killed between two batches (each case already committed on its own).
        crash_point(f"drain-workflow-batch-{result.batches}")
    return result
