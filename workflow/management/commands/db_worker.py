"""`manage.py db_worker`: django-tasks-db's task worker, plus the delivery sweep.

The same command and options as django-tasks-db's own (this app is listed before it, so
this one is found first). With a helpdesk configured it also runs the delivery sweep
(effects.tasks.delivery_sweep_and_enqueue): once at start, then every
``DECISIONFLOW_DELIVERY_SWEEP_INTERVAL`` seconds in a thread of its own, so a lost enqueue or
a worker killed mid-send only delays a delivery. Several workers sweeping at once is
harmless: every move is a conditional UPDATE and the claim lets one try through.
"""

from __future__ import annotations

import logging
import os
import threading

from django.conf import settings
from django.db import close_old_connections, connections
from django.utils.autoreload import DJANGO_AUTORELOAD_ENV
from django_tasks_db.management.commands import db_worker

from core.tracing import tracing_start, tracing_stop
from effects.delivery import delivery_configured
from effects.tasks import delivery_sweep_and_enqueue

log = logging.getLogger(__name__)


def _sweep_once() -> None:
    try:
        done = delivery_sweep_and_enqueue()
        if done["unknown"] or done["enqueued"]:
            log.info("delivery sweep: unknown=%s enqueued=%s", done["unknown"], done["enqueued"])
    except Exception:
        # The next round tries again; the worker itself keeps running tasks.
        log.exception("delivery sweep failed")


def _sweep_forever(stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        close_old_connections()
        _sweep_once()
    connections.close_all()


class Command(db_worker.Command):
    help = (
        "Run a task worker (django-tasks-db): sends the review notifications and delivers approved "
        "replies to the helpdesk. With DECISIONFLOW_DELIVERY_URL set it also sweeps the deliveries "
        "every DECISIONFLOW_DELIVERY_SWEEP_INTERVAL seconds (docs/DELIVERY.md)."
    )

    def handle(self, *args, **options):
        reloading = options.get("reload") and not options.get("batch")
        # Under --reload the parent only restarts the child: the child sweeps.
        in_worker = not reloading or os.environ.get(DJANGO_AUTORELOAD_ENV) == "true"
        stop = threading.Event()
        if in_worker:
            tracing_start(service="decisionflow-worker")  # when tracing is on (docs/DEPLOY.md)
        if delivery_configured() and in_worker:
            _sweep_once()
            close_old_connections()
            if not options.get("batch"):
                interval = float(settings.DECISIONFLOW_DELIVERY_SWEEP_INTERVAL)
                threading.Thread(
                    target=_sweep_forever, args=(stop, interval), name="delivery-sweep", daemon=True
                ).start()
        try:
            return super().handle(*args, **options)
        finally:
            stop.set()
            tracing_stop()  # the last spans are sent before the process ends
