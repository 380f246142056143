"""The delivery task for Django's task framework (django-tasks; docs/DELIVERY.md).

``deliver`` is enqueued once the commit that wrote the delivery is durable, again after a
failed try (deferred by the backoff, where the backend can defer), and by the sweep for a
delivery whose enqueue was lost or whose worker died. Enqueueing twice is harmless: the
claim lets one worker through.
"""

from __future__ import annotations

import contextvars
import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone
from django_tasks import task, task_backends

from core.tracing import Attr, SpanName, carrier, traced
from effects import delivery

log = logging.getLogger(__name__)


@task()
def deliver(operation_id: str, trace: dict[str, str] | None = None) -> str:
    """One try of one delivery; returns what it did (the task result keeps it). ``trace`` is
    the enqueuer's trace context (core.tracing.carrier): the try joins that trace."""
    with traced(SpanName.DELIVER, {Attr.OPERATION: operation_id}, parent=trace) as span:
        done, delay = delivery.delivery_attempt(operation_id=operation_id)
        span.set({Attr.DELIVERY: done})
        if delay is not None:
            delivery_enqueue(operation_id, delay=delay)  # in this trace too
    return done


def delivery_enqueue(operation_id: str, *, delay: timedelta | None = None, traceparent: str = "") -> None:
    """Enqueue one try once the caller's transaction commits (at once outside one), with the
    caller's trace context in its arguments when tracing is on. A broker is not rolled back
    with the database: enqueued earlier, a worker could look for the row before it exists.
    ``traceparent``: the approval's, stored on the delivery, for an enqueue outside the
    approval (the sweep, a repair): the try joins that trace, even from a process that does
    not trace. Never raises: a lost enqueue only delays the delivery (the sweep finds it),
    and the commit that called it has already succeeded."""
    # Run in the caller's context, so that an enqueue at an outer commit still joins the
    # caller's trace (and its span names the case).
    caller = contextvars.copy_context()
    transaction.on_commit(lambda: caller.run(_enqueue, operation_id, delay, traceparent))


def _enqueue(operation_id: str, delay: timedelta | None, traceparent: str) -> None:
    stored = {"traceparent": traceparent} if traceparent else None
    with traced(SpanName.ENQUEUE, {Attr.OPERATION: operation_id}, parent=stored):
        context = carrier() or stored
        traced_args = {"trace": context} if context else {}
        try:
            if delay is None:
                deliver.enqueue(operation_id, **traced_args)
            elif task_backends[deliver.backend].supports_defer:
                deliver.using(run_after=timezone.now() + delay).enqueue(operation_id, **traced_args)
            # A backend that cannot defer (the immediate one): the sweep enqueues it when due.
        except Exception:
            log.exception("could not enqueue the delivery of %s; the sweep will", operation_id)


def delivery_sweep_and_enqueue() -> dict[str, int]:
    """The sweep (delivery.delivery_sweep), and an enqueue for each delivery it hands back.
    Run by every task worker (workflow.workers) and by ``reconcile --repair``."""
    unknown, due = delivery.delivery_sweep()
    traceparents = delivery.delivery_traceparents(due)
    for operation_id in due:
        delivery_enqueue(operation_id, traceparent=traceparents.get(operation_id, ""))
    return {"unknown": unknown, "enqueued": len(due)}
