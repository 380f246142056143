"""`manage.py db_worker`: django-tasks-db's task worker, plus the sweeps every worker runs
(workflow.workers: the delivery sweep and the due escalation steps).

The same command and options as django-tasks-db's own (the workflow app is listed before
it, so this one is found first).
"""

from __future__ import annotations

import os
from contextlib import nullcontext

from django.utils.autoreload import DJANGO_AUTORELOAD_ENV
from django_tasks_db.management.commands import db_worker

from workflow.workers import worker_running


class Command(db_worker.Command):
    help = (
        "Run a task worker (django-tasks-db): sends the review notifications and delivers approved "
        "replies to the helpdesk. With DECISIONFLOW_DELIVERY_URL set it also sweeps the deliveries "
        "every DECISIONFLOW_DELIVERY_SWEEP_INTERVAL seconds (docs/DELIVERY.md); with "
        "DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY set it takes the due escalation steps every "
        "DECISIONFLOW_ESCALATION_SWEEP_INTERVAL seconds, once per review and step (docs/QUEUE.md)."
    )

    def handle(self, *args, **options):
        reloading = options.get("reload") and not options.get("batch")
        # Under --reload the parent only restarts the child: the child sweeps.
        in_worker = not reloading or os.environ.get(DJANGO_AUTORELOAD_ENV) == "true"
        around = worker_running(once=bool(options.get("batch"))) if in_worker else nullcontext()
        with around:
            return super().handle(*args, **options)
