"""The bulk runs' shape (a policy publish, a new source version): the cases still to do, a
bounded batch at a time.

Each batch is read anew, by primary key after the last case handled, from the database's
own answer to "which cases still need it": a case done by this run (or another) drops out,
so a second run finds nothing (idempotent) and a run killed part-way is finished by the next
(resumable), with nothing done twice and nothing left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from django.conf import settings
from django.db.models import QuerySet

from cases.models import Case


def batch_size(batch: int | None = None) -> int:
    """``batch`` if given, else ``DECISIONFLOW_PUBLISH_BATCH`` (100); at least 1."""
    return max(1, batch or int(getattr(settings, "DECISIONFLOW_PUBLISH_BATCH", 100)))


def cases_in_batches(still_to_do: Callable[[], QuerySet[Case]], *, size: int) -> Iterator[Case]:
    """Every case of ``still_to_do()``, in primary-key order, ``size`` at a time."""
    last_pk = 0
    while True:
        chunk = list(still_to_do().filter(pk__gt=last_pk).order_by("pk")[:size])
        if not chunk:
            return
        for case in chunk:
            last_pk = case.pk
            yield case
