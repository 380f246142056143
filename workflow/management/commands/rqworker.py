"""`manage.py rqworker`: django-rq's worker for the RQ task backend, plus the sweeps every worker runs.

The same command and options as django-rq's own (this app is listed before it, so this one
is found first), with what django-tasks-rq needs as defaults: its job class, the scheduler
(a retry is a deferred task; not in a ``--burst`` run), and the queue ``default``. Its worker runs each task in its
own process, not a forked child per task, so a task's database connection and trace
exporter are the worker's, and a ``kill -9`` of the worker is the end of its task too: the
delivery's lease runs out and the sweep sends it again, with the same key. It runs the sweeps
``db_worker`` runs (workflow.workers: the delivery sweep, the due escalation steps).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import django_rq
from django.conf import settings
from django.core.management.base import CommandError
from django.db import close_old_connections
from django_rq.management.commands import rqworker
from redis.exceptions import RedisError
from rq.worker import SimpleWorker

from workflow.workers import worker_running


class TaskWorker(SimpleWorker):
    """RQ's in-process worker, with Django's stale connections closed around each task (as
    a web request does), so a restarted database costs one failed task at most."""

    def subscribe(self):
        """RQ's own subscription to the worker's command channel, its thread waking every
        second instead of every 60: on the way out RQ unsubscribes, then redis-py (8.x) waits
        for that thread, which could sit out the rest of its sleep. A burst run, or a worker
        stopped with SIGTERM, then took a minute to end (tests/delivery/test_rq_backend.py)."""
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]  # RQ declares it None
            sleep_time=1, daemon=True, exception_handler=self._pubsub_exception_handler
        )

    def execute_job(self, job, queue):
        close_old_connections()
        try:
            return super().execute_job(job, queue)
        finally:
            close_old_connections()


class Command(rqworker.Command):
    help = (
        "Run a task worker on the RQ backend (DECISIONFLOW_TASKS_BACKEND=django_tasks_rq.RQBackend, "
        "Redis at DECISIONFLOW_TASKS_REDIS_URL): sends the review notifications and delivers approved "
        "replies to the helpdesk. It runs db_worker's sweeps: the deliveries with DECISIONFLOW_DELIVERY_URL "
        "set, the due escalation steps with DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY set (docs/QUEUE.md, "
        "'Workers on RQ')."
    )

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.set_defaults(job_class="django_tasks_rq.Job", worker_class=TaskWorker, with_scheduler=None)

    def handle(self, *args, **options):
        if settings.TASKS["default"]["BACKEND"] != settings.TASKS_RQ_BACKEND:
            raise CommandError(
                f"rqworker runs the RQ backend's tasks, and DECISIONFLOW_TASKS_BACKEND is "
                f"{settings.TASKS['default']['BACKEND']}: run `manage.py db_worker`, or set "
                f"DECISIONFLOW_TASKS_BACKEND={settings.TASKS_RQ_BACKEND} (docs/QUEUE.md)"
            )
        try:
            django_rq.get_connection("default").ping()
        except RedisError as exc:
            where = urlsplit(settings.DECISIONFLOW_TASKS_REDIS_URL)  # never its password
            raise CommandError(
                f"the Redis at DECISIONFLOW_TASKS_REDIS_URL ({where.hostname}:{where.port or 6379}) does not "
                f"answer: {exc}"
            ) from exc
        if options["with_scheduler"] is None:
            # A burst run ends when the queue is empty, so a deferred retry is a long-running
            # worker's (or the sweep's); and RQ's scheduler stalls a burst run that another
            # worker's scheduler holds the lock of, for a minute.
            options["with_scheduler"] = not options["burst"]
        with worker_running(once=bool(options.get("burst"))):
            return super().handle(*args or ("default",), **options)
