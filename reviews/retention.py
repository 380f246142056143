"""Checkpoint retention: the one documented deletion path in the review tables.

Recovery needs a checkpoint only while its review waits for a person: ``decision_record``
restores the pending review's pause checkpoint, and nothing else. Once the review is decided
(completed) or superseded by an edit, its checkpoint is dead weight, and so is a checkpoint
no pending review points at any more (a pause that ``begin`` replaced). The rule:

- a checkpoint goes when it was taken before the cutoff (now - the retention window) and no
  pending review needs it: none that points at it is still pending, and none that points at
  it was completed or superseded after the cutoff (so a retry just after a decision still
  finds the pause it was decided from, for the whole window);
- a pending review's pause checkpoint is always kept, whatever its age.

What the history page shows of a checkpoint (its id, when it was taken) lives on the pending
review (``checkpoint_id``, ``checkpoint_at``), so the history stays whole. Decisions, effects
and commit attempts stay append-only; only ``WorkflowCheckpoint`` rows are deleted.

Deletion runs in bounded batches, each its own short transaction, and each batch's DELETE
re-checks the rule in the same statement, so a process killed mid-batch loses only that
batch's (rolled back) work and the next run picks up where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet, Sum
from django.db.models.functions import Length
from django.utils import timezone

from core.durations import duration_parse
from core.errors import InvalidInput
from core.faults import crash_point
from core.locks import cron_lock
from reviews.models import PendingReview, WorkflowCheckpoint

DEFAULT_BATCH_SIZE = 1000
MAX_BATCH_SIZE = 100_000


@dataclass(frozen=True)
class PruneResult:
    cutoff: datetime
    applied: bool  # False: a dry run, nothing was deleted
    rows: int  # deleted (applied) or that would be deleted (dry run)
    payload_chars: int  # their payloads' length, in characters (dry run only; 0 when applied)
    batches: int
    kept_for_pending: int  # pause checkpoints kept because their review is still pending


def _needed(cutoff: datetime) -> QuerySet[PendingReview]:
    """Pending reviews that still need the checkpoint of the outer row."""
    return PendingReview.objects.filter(checkpoint_id=OuterRef("checkpoint_id")).filter(
        Q(status=PendingReview.Status.PENDING) | Q(updated_at__gte=cutoff)
    )


def prunable_checkpoints(cutoff: datetime) -> QuerySet[WorkflowCheckpoint]:
    """The checkpoint rows the retention rule lets go at ``cutoff``."""
    return WorkflowCheckpoint.objects.filter(created_at__lt=cutoff).exclude(Exists(_needed(cutoff)))


def kept_for_pending() -> int:
    return WorkflowCheckpoint.objects.filter(
        Exists(
            PendingReview.objects.filter(checkpoint_id=OuterRef("checkpoint_id"), status=PendingReview.Status.PENDING)
        )
    ).count()


def checkpoints_prune(
    *,
    older_than: timedelta,
    batch_size: int = DEFAULT_BATCH_SIZE,
    apply: bool = False,
    now: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PruneResult:
    """Delete (``apply``) or count (dry run) the checkpoints that recovery no longer needs.

    Applied, it holds the ``prune_checkpoints`` cron lock (a second run raises ``LockBusy``
    at once) and deletes at most ``batch_size`` rows per transaction; ``progress(batch,
    deleted)`` is called after each batch commits. Idempotent: a second run deletes nothing
    more. ``InvalidInput`` for a window that is not positive or a batch size out of range,
    and then nothing is read or written.
    """
    if older_than <= timedelta(0):
        raise InvalidInput(f"the retention window must be positive, not {older_than}")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidInput(f"the batch size must be between 1 and {MAX_BATCH_SIZE:,}, not {batch_size}")
    cutoff = (now or timezone.now()) - older_than
    if not apply:
        totals = prunable_checkpoints(cutoff).aggregate(chars=Sum(Length("payload")))
        rows = prunable_checkpoints(cutoff).count()
        return PruneResult(cutoff, False, rows, totals["chars"] or 0, 0, kept_for_pending())
    deleted = batches = 0
    last_pk = 0
    with cron_lock("prune_checkpoints"):
        while True:
            with transaction.atomic():
                # Walk the primary key: old rows come first, and each batch is an index range.
                ids = list(
                    prunable_checkpoints(cutoff)
                    .filter(pk__gt=last_pk)
                    .order_by("pk")
                    .values_list("pk", flat=True)[:batch_size]
                )
                if not ids:
                    break
                # The rule again, in the DELETE itself: a review that began needing one of
                # these rows since the SELECT keeps it.
                count, _ = prunable_checkpoints(cutoff).filter(pk__in=ids).delete()
                batches += 1
                crash_point(f"prune-checkpoints-batch-{batches}")
            deleted += count
            last_pk = ids[-1]
            if progress is not None:
                progress(batches, count)
    return PruneResult(cutoff, True, deleted, 0, batches, kept_for_pending())


def parse_window(text: str) -> timedelta:
    """``30d``, ``12h``, ``1.5d`` (a bare number is days); ``InvalidInput`` otherwise."""
    try:
        return duration_parse(text, setting="--older-than", bare="d")
    except ImproperlyConfigured as exc:
        raise InvalidInput(str(exc)) from None
