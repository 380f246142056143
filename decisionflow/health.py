"""Operations endpoints: ``/healthz``, ``/readyz`` and ``/metrics`` (docs/DEPLOY.md).

- ``GET /healthz``: the process is up and answers. No database, no authentication.
- ``GET /readyz``: the database answers and every migration this code knows is applied;
  503 otherwise. No authentication. The JSON body says which check failed.
- ``GET /metrics``: Prometheus text. Only for an address in ``DECISIONFLOW_METRICS_ALLOW``
  and/or a request carrying ``Authorization: Bearer $DECISIONFLOW_METRICS_TOKEN``.

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

from django.conf import settings
from django.db import DatabaseError, connections
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache

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


@never_cache
def healthz(request) -> JsonResponse:
    """The process is up: no database, nothing that can be slow."""
    return JsonResponse({"status": "ok"})


@never_cache
def readyz(request) -> JsonResponse:
    """Ready to serve: the database answers and its schema is this code's (else 503).

    Body: ``{"status": "ok"|"unavailable", "checks": {"database": {...}, "migrations": {...}}}``;
    each check has ``ok`` and, when it failed, ``error``.
    """
    database = _database_check("default")
    if database["ok"]:
        migrations = _migrations_check("default")
    else:
        migrations = {"ok": False, "error": "not checked: the database did not answer"}
    ready = database["ok"] and migrations["ok"]
    body = {"status": "ok" if ready else "unavailable", "checks": {"database": database, "migrations": migrations}}
    return JsonResponse(body, status=200 if ready else 503)


def _client_allowed(request) -> bool:
    """Whether the request passes every guard that is configured (and at least one is)."""
    allow = getattr(settings, "DECISIONFLOW_METRICS_ALLOW", [])
    token = getattr(settings, "DECISIONFLOW_METRICS_TOKEN", "")
    if not allow and not token:
        return False
    if allow:
        try:
            address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
        except ValueError:
            return False
        if not any(address in ipaddress.ip_network(net, strict=False) for net in allow):
            return False
    if token:
        sent = request.META.get("HTTP_AUTHORIZATION", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            return False
    return True


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
    if not _client_allowed(request):
        return JsonResponse(
            {
                "code": "forbidden",
                "message": "metrics are served only to the addresses in DECISIONFLOW_METRICS_ALLOW and/or "
                "with the bearer token in DECISIONFLOW_METRICS_TOKEN",
            },
            status=403,
        )
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

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
