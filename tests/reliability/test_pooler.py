"""Behind PgBouncer, quick version: the two-host load through Debian's real pgbouncer.

Each supported pool mode (transaction, session) runs reliability/load.py with ``--pooler``
on the test database: two gunicorn hosts connect through a private PgBouncer of 4 server
connections, the driver and reconcile connect directly. It must show no duplicate, no 5xx
answer at all (no fault is injected, so an ``outcome_uncertain`` is a false one), a replay
for an approval another request had committed, /readyz 200, the documented ``case_busy``
for a held case and then its commit, and no advisory lock left held on the server.
``make reliability`` runs the same for longer (reliability/run.py).

Statement mode cannot run a transaction of several statements: a host started behind it
says so in one start-up line, and its /readyz answers 503 naming the pooler.

PgBouncer comes from `make pgbouncer`; without it these tests skip, or fail when
``DECISIONFLOW_REQUIRE_POSTGRES=1`` (CI).
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys

import pytest

from reliability import pooler
from tests.conftest import ROOT
from tests.reliability.conftest import database_url, record

pytestmark = [pytest.mark.postgres]

QUICK_SECONDS = os.environ.get("DECISIONFLOW_POOLER_SECONDS", "4")


@pytest.fixture
def pgbouncer_installed():
    if pooler.binary() is None:
        message = "pgbouncer is not installed: `make pgbouncer` installs Debian's package (as root)"
        if os.environ.get("DECISIONFLOW_REQUIRE_POSTGRES") == "1":
            pytest.fail(message + ", and DECISIONFLOW_REQUIRE_POSTGRES=1 requires it")
        pytest.skip(message)


def admin_url() -> str:
    return database_url().rsplit("/", 1)[0] + "/postgres"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_two_hosts_behind_pgbouncer_settle_with_no_false_uncertain(mode, pgbouncer_installed, tmp_path):
    out = tmp_path / "load.json"
    env = {k: v for k, v in os.environ.items() if k != "DECISIONFLOW_FAULT_INJECTION"}
    argv = [sys.executable, "reliability/load.py", "--database-url", database_url(), "--pooler", mode]
    argv += ["--seconds", QUICK_SECONDS, "--clients", "4", "--workers", "1", "--threads", "4"]
    argv += ["--rounds-per-client", "12", "--json", str(out), "--log-dir", str(tmp_path)]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    figures = {k: summary[k] for k in ("requests", "server_errors", "outcome_uncertain", "duplicates", "pooler")}
    assert proc.returncode == 0, (figures, [f[:200] for f in summary["failures"]])
    # The approve scenario sends every approval a third time, after it committed: a replay.
    assert summary["scenarios"].get("approve", 0) > 0 and summary["effects"] > 0
    assert summary["server_errors"] == 0 and summary["outcome_uncertain"] == 0
    assert summary["duplicates"] == 0 and summary["disagreements"] == 0 and summary["unexpected_errors"] == 0
    assert summary["errors"] == sum(summary["expected_409"].values())
    probes = summary["pooler"]
    assert probes["mode"] == mode and set(probes["readyz"].values()) == {200}
    assert probes["held_case_probes_passed"] == probes["held_case_probes"] == 2
    assert probes["advisory_locks_left"] == 0
    record(
        "pooler",
        mode=mode,
        default_pool_size=probes["default_pool_size"],
        advisory_locks_left=probes["advisory_locks_left"],
        held_case_probes_passed=probes["held_case_probes_passed"],
        **{
            k: summary[k]
            for k in (
                "seconds",
                "requests",
                "errors",
                "server_errors",
                "outcome_uncertain",
                "expected_409",
                "effects",
                "duplicates",
                "requests_per_second",
            )
        },
    )


def get(port: int, path: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(pooler.HOST, port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": pooler.HOST})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


@pytest.mark.django_db(transaction=True)
def test_statement_mode_is_named_at_start_up_and_by_readyz(pgbouncer_installed, tmp_path):
    from reliability import load

    with pooler.PgBouncer(server_url=admin_url(), mode="statement", log_path=tmp_path / "pgbouncer.log") as bouncer:
        port = load.free_port()
        servers = load.Servers(bouncer.url(database_url().rsplit("/", 1)[1]), [port], 1, 2, tmp_path)
        try:
            servers.wait_ready()
            status, body = get(port, "/readyz")
        finally:
            servers.stop()
    assert status == 503, body
    assert body["checks"]["database"]["ok"] is True and body["checks"]["migrations"] == {"ok": True}
    pooler_check = body["checks"]["pooler"]
    assert pooler_check["ok"] is False and "statement mode" in pooler_check["error"], pooler_check
    started = [line for line in (tmp_path / f"gunicorn-{port}.log").read_text().splitlines() if "start-up:" in line]
    assert len(started) == 1 and "transaction blocks not allowed" in started[0], started


@pytest.mark.django_db
def test_readyz_checks_the_pooler_once_per_connection(client):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from decisionflow import health

    def probes(queries) -> int:
        return sum("pg_backend_pid" in q["sql"] for q in queries)

    health._pooler_verdicts.clear()  # this connection may have been checked by an earlier test
    with CaptureQueriesContext(connection) as first:
        assert client.get("/readyz").json()["checks"]["pooler"] == {"ok": True}
    with CaptureQueriesContext(connection) as second:
        assert client.get("/readyz").json()["checks"]["pooler"] == {"ok": True}
    assert probes(first.captured_queries) == 2
    assert probes(second.captured_queries) == 0


@pytest.mark.django_db(transaction=True)
def test_prepared_statements_are_turned_off_on_a_connection_a_pooler_answers(pgbouncer_installed, tmp_path):
    from django.db import connection, connections

    from core.poolers import prepared_statements

    connection.close()
    connection.ensure_connection()  # direct: the server process itself holds the backend key
    assert connection.connection.prepare_threshold is not None
    assert prepared_statements(connection)["on"] is True
    with pooler.PgBouncer(server_url=admin_url(), mode="transaction", log_path=tmp_path / "pgbouncer.log") as bouncer:
        settings = {**connection.settings_dict, "HOST": pooler.HOST, "PORT": bouncer.port}
        pooled = type(connections["default"])(settings, alias="pooled")
        try:
            pooled.ensure_connection()
            state = prepared_statements(pooled)
            assert pooled.connection.prepare_threshold is None
            assert state["on"] is False and state["why"].startswith("a pooler answers for PostgreSQL"), state
        finally:
            pooled.close()
