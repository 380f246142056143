"""Operations endpoints: ``/healthz``, ``/readyz`` and ``/metrics`` (docs/DEPLOY.md).

- ``GET /healthz``: the process is up and answers. No database, no authentication.
- ``GET /readyz``: the database answers, every migration this code knows is applied, and a
  transaction stays on one server session (a pooler in statement mode fails this); 503
  otherwise. No authentication. The JSON body says which check failed.
- ``GET /metrics``: Prometheus text. Only for a request that passes each guard configured: its
  address in ``DECISIONFLOW_METRICS_ALLOW``, and ``Authorization: Bearer
  $DECISIONFLOW_METRICS_TOKEN``. A 403 names the check that failed.

All three are never cached (``Cache-Control: no-store``).

``OperationsMiddleware`` answers these three paths before Django's host validation and HTTPS
redirect: a load balancer's health check and a Prometheus scrape reach a backend by its
address (``Host: 10.0.0.5:8000``) over plain HTTP, and must get the answer, not a 400 for an
unknown host or a 301 to https. The answers name no host and link nowhere, so skipping the
host check there is safe. The URLconf routes the same views, for ``reverse()`` and for a
deployment that drops the middleware.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
import os
import time
import weakref
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache

from core.errors import MetricsRefused
from core.observability import metrics_initialise

log = logging.getLogger(__name__)


@functools.cache
def known_migrations() -> frozenset[tuple[str, str]]:
    """Every migration of this code, read from disk once per process (it cannot change
    under a running process); the readiness check compares it with the database."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    return frozenset(loader.graph.nodes)


def _database_check(alias: str) -> dict:
    started = time.perf_counter()
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        # The class only: the message names hosts and users, and this page is public.
        log.warning("readyz: the database did not answer: %s: %s", type(exc).__name__, exc)
        return {"ok": False, "error": f"{type(exc).__name__}: the database did not answer"}
    return {"ok": True, "ms": round((time.perf_counter() - started) * 1000, 2)}


def _migrations_check(alias: str) -> dict:
    connection = connections[alias]
    try:
        recorder = MigrationRecorder(connection)
        applied = set(recorder.applied_migrations()) if recorder.has_table() else set()
    except DatabaseError as exc:
        log.warning("readyz: could not read the applied migrations: %s: %s", type(exc).__name__, exc)
        return {"ok": False, "error": f"{type(exc).__name__}: could not read the applied migrations"}
    missing = sorted(f"{app}.{name}" for app, name in known_migrations() - applied)
    if missing:
        return {
            "ok": False,
            "error": f"{len(missing)} migration(s) not applied; run `manage.py migrate`",
            "unapplied": missing[:50],
        }
    return {"ok": True}


# PgBouncer's answer to BEGIN in statement pooling mode, which hands every statement to
# whichever server connection is free: a transaction of several statements cannot exist.
_STATEMENT_POOLING = "transaction blocks not allowed"
UNSUPPORTED_POOLER = (
    "the database connection does not keep a transaction on one server session ({found}): "
    "a pooler in statement mode? decisionflow needs session or transaction pooling (docs/DEPLOY.md)"
)
# The verdict per open psycopg connection: a pool mode cannot change under a connection that
# is already open, so each connection is checked once and /readyz then costs a lookup.
_pooler_verdicts: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def _pooler_check(alias: str) -> dict:
    """Whether two statements of one transaction run on one server session.

    Every decision is a transaction of several statements. PgBouncer in statement mode
    refuses the BEGIN (and closes the connection); anything else that moved a transaction
    between server sessions would show two backend pids. Session and transaction pooling,
    and a direct connection, pass. Run once per database connection.
    """
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return {"ok": True}
    connection.ensure_connection()
    verdict = _pooler_verdicts.get(connection.connection)
    if verdict is not None:
        return verdict
    raw = connection.connection
    try:
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            first = cursor.fetchone()[0]
            cursor.execute("SELECT pg_backend_pid()")
            second = cursor.fetchone()[0]
    except DatabaseError as exc:
        if _STATEMENT_POOLING not in str(exc):
            raise
        # The pooler has closed this connection; the next check opens and tries a new one.
        connection.close()
        return {"ok": False, "error": UNSUPPORTED_POOLER.format(found=f"the pooler answered {str(exc).strip()!r}")}
    if first != second:
        verdict = {"ok": False, "error": UNSUPPORTED_POOLER.format(found=f"backend {first}, then {second}")}
    else:
        verdict = {"ok": True}
    _pooler_verdicts[raw] = verdict
    return verdict


def pooler_check_at_start(alias: str = "default") -> None:
    """At start-up, say in one log line when the pooler in front of the database is one
    decisionflow cannot run behind (the same check as /readyz). A database that does not
    answer yet is /readyz's to report; the connection opened here is closed again."""
    try:
        verdict = _pooler_check(alias)
    except DatabaseError as exc:
        log.warning("start-up: the pooler check did not run (the database did not answer: %s)", type(exc).__name__)
        verdict = {"ok": True}
    finally:
        connections[alias].close()
    if not verdict["ok"]:
        log.error("start-up: %s", verdict["error"])


@never_cache
def healthz(request) -> JsonResponse:
    """The process is up: no database, nothing that can be slow."""
    return JsonResponse({"status": "ok"})


@never_cache
def readyz(request) -> JsonResponse:
    """Ready to serve: the database answers, its schema is this code's, and a transaction
    stays on one server session (else 503).

    Body: ``{"status": "ok"|"unavailable", "checks": {"database": {...}, "migrations": {...},
    "pooler": {...}}}``; each check has ``ok`` and, when it failed, ``error``.
    """
    database = _database_check("default")
    if database["ok"]:
        migrations = _migrations_check("default")
        try:
            pooler = _pooler_check("default")
        except DatabaseError as exc:
            log.warning("readyz: the pooler check failed: %s: %s", type(exc).__name__, exc)
            pooler = {"ok": False, "error": f"{type(exc).__name__}: the pooler check failed"}
    else:
        migrations = {"ok": False, "error": "not checked: the database did not answer"}
        pooler = {"ok": False, "error": "not checked: the database did not answer"}
    ready = database["ok"] and migrations["ok"] and pooler["ok"]
    checks = {"database": database, "migrations": migrations, "pooler": pooler}
    body = {"status": "ok" if ready else "unavailable", "checks": checks}
    return JsonResponse(body, status=200 if ready else 503)


def metrics_client_check(request) -> None:
    """Raise ``MetricsRefused`` unless the request passes every guard that is configured
    (and at least one is); it names each check that failed."""
    allow = getattr(settings, "DECISIONFLOW_METRICS_ALLOW", [])
    token = getattr(settings, "DECISIONFLOW_METRICS_TOKEN", "")
    if not allow and not token:
        raise MetricsRefused.not_configured()
    refused_address = None
    if allow:
        try:
            address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
        except ValueError:
            refused_address = "(not an IP address)"
        else:
            if not any(address in ipaddress.ip_network(net, strict=False) for net in allow):
                refused_address = str(address)
    token_sent = None
    if token:
        sent = request.META.get("HTTP_AUTHORIZATION", "")
        # Compared in constant time whatever was sent, so the answer's timing says nothing
        # about how much of the token a guess got right.
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            token_sent = bool(sent)
    if refused_address is not None or token_sent is not None:
        raise MetricsRefused.checks_failed(
            address=refused_address, token_sent=token_sent, both_set=bool(allow) and bool(token)
        )


def _registry():
    import prometheus_client
    from prometheus_client import multiprocess

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Every process of this host (workers, finished cron commands) wrote its own file;
        # a fresh registry sums them at each scrape.
        registry = prometheus_client.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return prometheus_client.REGISTRY


@never_cache
def metrics(request) -> HttpResponse:
    """Prometheus metrics, for allowed clients only (403 JSON otherwise)."""
    if not getattr(settings, "DECISIONFLOW_METRICS", False):
        return JsonResponse(
            {
                "code": "metrics_off",
                "message": "metrics are off: set PROMETHEUS_MULTIPROC_DIR (or DECISIONFLOW_METRICS=1 for one process)",
            },
            status=404,
        )
    try:
        metrics_client_check(request)
    except MetricsRefused as exc:
        return JsonResponse(
            {"code": exc.code, "message": exc.message, "failed": exc.details["failed"]}, status=exc.http_status
        )
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    # Imported here: wsgi.py imports this module before the apps (and their models) load.
    from reviews.models import Channel

    # Every series of ours at zero until its first event: a fresh server's dashboards show 0.
    metrics_initialise(channels=Channel.values)
    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)


ROUTES = {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics}


class OperationsMiddleware:
    """Answers /healthz, /readyz and /metrics before host validation and the HTTPS redirect.

    Place it first, or right after django-prometheus's "before" middleware.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        view = ROUTES.get(request.path_info)
        if view is None:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            response = JsonResponse(
                {"code": "method_not_allowed", "message": "GET only"}, status=405, headers={"Allow": "GET, HEAD"}
            )
            response["Cache-Control"] = "no-store"
            return response
        return view(request)
