"""What every task worker runs around its backend's loop (``db_worker``, ``rqworker``).

Each sweep runs once at start, then in a thread of its own every so many seconds:

- with a helpdesk configured, the delivery sweep (effects.tasks.delivery_sweep_and_enqueue),
  every ``DECISIONFLOW_DELIVERY_SWEEP_INTERVAL`` seconds, so a lost enqueue or a worker
  killed mid-send only delays a delivery;
- with escalation steps configured (``DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY``), the due
  escalation steps (workflow.escalation.escalation_sweep), every
  ``DECISIONFLOW_ESCALATION_SWEEP_INTERVAL`` seconds, as ``sla_report`` runs them from cron.

Several workers sweeping at once is harmless: every delivery move is a conditional UPDATE and
the claim lets one try through; every escalation step is a ``ReviewEscalation`` row unique on
(operation, step), inserted first in the step's transaction.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import close_old_connections, connections

from core.tracing import tracing_start, tracing_stop
from effects.delivery import delivery_configured
from effects.tasks import delivery_sweep_and_enqueue
from workflow.escalation import SETTING as ESCALATION_SETTING
from workflow.escalation import escalation_sweep

log = logging.getLogger(__name__)


def _delivery_sweep() -> None:
    done = delivery_sweep_and_enqueue()
    if done["unknown"] or done["enqueued"]:
        log.info("delivery sweep: unknown=%s enqueued=%s", done["unknown"], done["enqueued"])


def _escalation_sweep() -> None:
    done = escalation_sweep()
    if done:
        log.info("escalation sweep: %s", " ".join(f"{outcome}={count}" for outcome, count in sorted(done.items())))


def _sweep_once(name: str, sweep: Callable[[], None]) -> None:
    try:
        sweep()
    except Exception:
        # The next round tries again; the worker itself keeps running tasks.
        log.exception("%s sweep failed", name)


def _sweep_forever(stop: threading.Event, interval: float, name: str, sweep: Callable[[], None]) -> None:
    while not stop.wait(interval):
        close_old_connections()
        _sweep_once(name, sweep)
    connections.close_all()


def _sweeps() -> list[tuple[str, float, Callable[[], None]]]:
    """The sweeps a worker runs: (name, interval in seconds, the sweep)."""
    found = []
    if delivery_configured():
        found.append(("delivery", float(settings.DECISIONFLOW_DELIVERY_SWEEP_INTERVAL), _delivery_sweep))
    # A wrong plan is logged each round (and stops sla_report): the worker goes on sending
    # notifications and deliveries meanwhile.
    if getattr(settings, ESCALATION_SETTING, None):
        found.append(("escalation", float(settings.DECISIONFLOW_ESCALATION_SWEEP_INTERVAL), _escalation_sweep))
    return found


@contextmanager
def worker_running(*, once: bool) -> Iterator[None]:
    """Tracing (when on) and the sweeps, around a worker's loop; ``once`` (a batch or burst
    run) sweeps at start only."""
    stop = threading.Event()
    tracing_start(service="decisionflow-worker")  # when tracing is on (docs/DEPLOY.md)
    for name, interval, sweep in _sweeps():
        _sweep_once(name, sweep)
        close_old_connections()
        if not once:
            threading.Thread(
                target=_sweep_forever, args=(stop, interval, name, sweep), name=f"{name}-sweep", daemon=True
            ).start()
    try:
        yield
    finally:
        stop.set()
        tracing_stop()  # the last spans are sent before the process ends
