"""/healthz, /readyz and /metrics: each failure mode, the cache header, and who may scrape.

The database-down and never-migrated cases run in a child process whose DATABASE_URL points
at a port nobody listens on, or at an empty SQLite file: the real failure, not a stub.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

READYZ_IN_A_CHILD = """
import django, json
django.setup()
from django.test import Client
response = Client().get("/readyz", headers={"host": "10.9.8.7:8000"})
print(json.dumps({"status": response.status_code, "cache": response["Cache-Control"], "body": response.json()}))
"""


def readyz_child(database_url: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(DATABASE_URL=database_url, DEBUG="1", DJANGO_SETTINGS_MODULE="decisionflow.settings")
    proc = subprocess.run(
        [sys.executable, "-c", READYZ_IN_A_CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_no_store(response_or_header):
    header = response_or_header if isinstance(response_or_header, str) else response_or_header["Cache-Control"]
    assert "no-store" in header


def test_healthz_answers_without_the_database_or_a_known_host(client):
    # No db fixture: pytest-django fails any database access, so this proves none happens.
    response = client.get("/healthz", headers={"host": "10.0.0.5:8000"})
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert_no_store(response)


def test_readyz_is_ready_on_a_migrated_database(db, client):
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"]["ok"] is True and body["checks"]["migrations"] == {"ok": True}
    assert_no_store(response)


def test_readyz_names_a_migration_that_is_not_applied(db, client):
    from django.db.migrations.recorder import MigrationRecorder

    latest = MigrationRecorder.Migration.objects.filter(app="effects").order_by("-name").first()
    latest.delete()  # rolled back with the test
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["database"]["ok"] is True
    migrations = body["checks"]["migrations"]
    assert migrations["ok"] is False and "manage.py migrate" in migrations["error"]
    assert migrations["unapplied"] == [f"effects.{latest.name}"]
    assert_no_store(response)


def test_readyz_on_a_database_that_was_never_migrated(tmp_path):
    result = readyz_child(f"sqlite:///{tmp_path / 'empty.sqlite3'}")
    assert result["status"] == 503
    checks = result["body"]["checks"]
    assert checks["database"]["ok"] is True
    assert checks["migrations"]["ok"] is False
    assert "effects.0001_initial" in checks["migrations"]["unapplied"]
    assert_no_store(result["cache"])


@pytest.mark.parametrize(
    "url",
    [
        "postgres://postgres@127.0.0.1:1/nothing?connect_timeout=3",  # nothing listens on port 1
        "sqlite:////nonexistent-folder/for/readyz/db.sqlite3",  # cannot be opened
    ],
    ids=["postgresql-down", "sqlite-unopenable"],
)
def test_readyz_when_the_database_is_down(url):
    result = readyz_child(url)
    assert result["status"] == 503
    body = result["body"]
    assert body["status"] == "unavailable"
    database = body["checks"]["database"]
    assert database["ok"] is False and database["error"].startswith("OperationalError")
    # The public body names the failure, not the server (host, port, user).
    assert "127.0.0.1" not in database["error"] and "nonexistent" not in database["error"]
    assert body["checks"]["migrations"] == {"ok": False, "error": "not checked: the database did not answer"}
    assert_no_store(result["cache"])


def test_health_endpoints_skip_the_https_redirect_and_refuse_writes(db, client, settings):
    settings.SECURE_SSL_REDIRECT = True
    assert client.get("/readyz").status_code == 200
    assert client.get("/admin/login/").status_code == 301  # everything else still redirects
    response = client.post("/readyz")
    assert response.status_code == 405 and response["Allow"] == "GET, HEAD"


# --- /metrics: who may read it -----------------------------------------------------------------


TOKEN = "s3cret-token"
BOTH = "(DECISIONFLOW_METRICS_ALLOW and DECISIONFLOW_METRICS_TOKEN are both set: a scrape must pass both)"
NOT_LISTED = "the address 127.0.0.1 is not in DECISIONFLOW_METRICS_ALLOW"
NO_TOKEN = "no bearer token was sent (Authorization: Bearer <DECISIONFLOW_METRICS_TOKEN>)"
WRONG_TOKEN = "the bearer token sent is not the one in DECISIONFLOW_METRICS_TOKEN"
OK = None


@pytest.mark.parametrize(
    "allow, token, headers, failed, message",
    [
        # Nothing configured: nobody.
        ([], "", {}, ["not_configured"], "metrics are served to nobody: set DECISIONFLOW_METRICS_ALLOW"),
        (["10.0.0.0/8"], "", {}, ["allow_list"], f"metrics refused: {NOT_LISTED}"),  # the test client is 127.0.0.1
        (["127.0.0.0/8"], "", {}, OK, None),
        ([], TOKEN, {}, ["token"], f"metrics refused: {NO_TOKEN}"),
        ([], TOKEN, {"Authorization": "Bearer wrong"}, ["token"], f"metrics refused: {WRONG_TOKEN}"),
        ([], TOKEN, {"Authorization": f"Bearer {TOKEN}"}, OK, None),
        # Both configured: both needed, and the answer says which one failed.
        (["127.0.0.1"], TOKEN, {}, ["token"], f"metrics refused: {NO_TOKEN} {BOTH}"),
        (["127.0.0.1"], TOKEN, {"Authorization": "Bearer s3cret"}, ["token"], f"metrics refused: {WRONG_TOKEN} {BOTH}"),
        (
            ["10.0.0.0/8"],
            TOKEN,
            {"Authorization": f"Bearer {TOKEN}"},
            ["allow_list"],
            f"metrics refused: {NOT_LISTED} {BOTH}",
        ),
        (
            ["10.0.0.0/8"],
            TOKEN,
            {"Authorization": "Bearer nope"},
            ["allow_list", "token"],
            f"metrics refused: {NOT_LISTED}; and {WRONG_TOKEN} {BOTH}",
        ),
        (["127.0.0.1"], TOKEN, {"Authorization": f"Bearer {TOKEN}"}, OK, None),
    ],
)
def test_metrics_are_served_only_to_allowed_clients(db, client, settings, allow, token, headers, failed, message):
    settings.DECISIONFLOW_METRICS_ALLOW = allow
    settings.DECISIONFLOW_METRICS_TOKEN = token
    response = client.get("/metrics", headers=headers)
    assert response.status_code == (200 if failed is OK else 403)
    assert_no_store(response)
    if failed is OK:
        assert response["Content-Type"].startswith("text/plain")
        assert b"django_http_requests_before_middlewares_total" in response.content
    else:
        body = response.json()
        assert body["code"] == "forbidden" and body["failed"] == failed
        assert body["message"].startswith(message), body["message"]
        assert b"decisionflow_" not in response.content
        # Neither the configured token nor (any part of) the one sent is ever echoed.
        assert b"s3cret" not in response.content and b"nope" not in response.content


METRICS_IN_A_FRESH_CHILD = """
import django, json
django.setup()
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
response = Client().get("/metrics")
assert response.status_code == 200, response.content
samples = [
    [s.name, s.labels, s.value]
    for family in text_string_to_metric_families(response.content.decode())
    for s in family.samples
    if s.name.startswith("decisionflow_")
]
print(json.dumps(samples))
"""


def test_a_fresh_server_shows_every_series_of_ours_at_zero(tmp_path):
    """Before any event, /metrics already has each counter and histogram series of ours at 0,
    for every known label value: a fresh server's dashboards show 0, not a gap. In a new
    process with its own multiprocess folder, as a gunicorn worker starts."""
    from core import observability
    from reviews.models import Channel

    (tmp_path / "metrics").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(
        DEBUG="1",
        DJANGO_SETTINGS_MODULE="decisionflow.settings",
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"),
    )
    proc = subprocess.run(
        [sys.executable, "-c", METRICS_IN_A_FRESH_CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    samples = {(name, frozenset(labels.items())): value for name, labels, value in json.loads(proc.stdout)}
    assert samples and set(samples.values()) == {0.0}

    def has(name, **labels):
        return (name, frozenset(labels.items())) in samples

    outcomes, locks = observability.OUTCOMES, list(observability.LockName)
    assert all(has("decisionflow_decisions_total", channel=c, outcome=o) for c in Channel.values for o in outcomes)
    for outcome in outcomes:
        assert has("decisionflow_decision_seconds_count", outcome=outcome)
        assert has("decisionflow_commit_seconds_count", outcome=outcome)
        assert has("decisionflow_commit_seconds_bucket", outcome=outcome, le="0.001")
    for code in observability.REFUSAL_CODES:
        assert has("decisionflow_decision_refusals_total", code=code)
        assert has("decisionflow_refusal_unrecorded_total", code=code)
    assert {"case_busy", "stale_proposal", "conflicting_decision", "forbidden"} <= set(observability.REFUSAL_CODES)
    assert all(has("decisionflow_lock_wait_seconds_count", lock=lock) for lock in locks)
    assert all(has("decisionflow_busy_refusals_total", lock=lock) for lock in locks)
    assert all(has("decisionflow_reconcile_runs_total", result=r) for r in observability.ReconcileResult)
    assert all(has("decisionflow_reconcile_operations_total", state=s) for s in observability.RECONCILE_STATES)
    assert all(has("decisionflow_sla_reviews_total", action=a) for a in observability.SlaAction)
    assert has("decisionflow_checkpoint_loads_refused_total")
    assert all(
        has("decisionflow_audit_verifications_total", scope=s, verdict=v)
        for s in observability.AuditScope
        for v in observability.AuditResult
    )
    # Every counter and histogram of ours is there; no gauge claims a run that never happened.
    names = {name for name, _ in samples}
    for metric in observability._ALL:
        family = {"Counter": f"{metric.name}_total", "Histogram": f"{metric.name}_count"}.get(metric.kind)
        assert family is None or family in names, metric.name
    assert not any(name.startswith(("decisionflow_reconcile_last", "decisionflow_sla_last")) for name in names)
