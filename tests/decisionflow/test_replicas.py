"""The read replica's router (core/replicas.py): which pages read it, when they read the
primary instead, and what the staff footer says.

The replica alias is the test database itself (the same connection), or a connection that
cannot answer (a stopped replica); the lag is simulated by patching the probe, except in the
test that runs the real lag query on PostgreSQL. The real standby is in `make reliability`
(reliability/replica.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from unittest import mock

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.http import HttpResponse
from django.test import RequestFactory
from django.urls import reverse

from cases.models import Case
from core import replicas
from core.outcomes import ReadSource
from tests.api.conftest import Api
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db


@pytest.fixture
def replica_on(settings):
    """Routing on, with the replica alias answered by the test database's own connection."""
    settings.DATABASE_REPLICA_URL = "postgres://replica.invalid/decisionflow"
    original = connections[replicas.REPLICA]
    connections[replicas.REPLICA] = connections[DEFAULT_DB_ALIAS]
    replicas.forget_lag()
    yield
    connections[replicas.REPLICA] = original
    replicas.forget_lag()


def _stopped_replica():
    """A connection to a replica that is not there: a closed port, or a file that cannot open."""
    primary = connections[DEFAULT_DB_ALIAS]
    settings_dict = dict(primary.settings_dict)
    if primary.vendor == "postgresql":
        settings_dict.update(HOST="127.0.0.1", PORT=str(_closed_port()), OPTIONS={"connect_timeout": 2})
    else:
        settings_dict.update(NAME="/nonexistent-decisionflow-replica/db.sqlite3")
    # An alias of its own: the test framework forbids unlisted aliases, not new connections.
    return type(primary)(settings_dict, alias="stopped-replica")


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


@pytest.fixture
def demo_case(case):
    """T-1042 with its review begun: a current proposal to read and to decide."""
    from workflow.begin import review_begin

    review_begin(case=case)
    case.refresh_from_db()
    return case


@pytest.fixture
def staff_client(client, reviewer):
    client.force_login(reviewer)
    return client


def _lag(seconds):
    return mock.patch.object(replicas, "measure_lag", return_value=seconds)


def _history(client, case):
    return client.get(reverse("admin:cases_case_history", args=[case.pk]))


def test_near_replica_serves_history_and_footer_shows_its_lag(replica_on, staff_client, case):
    with _lag(0.4) as probe, mock.patch.object(replicas, "LAG_KEEP", 60.0):
        page = _history(staff_client, case)
        again = _history(staff_client, case)
    assert page.status_code == again.status_code == 200
    assert page[replicas.READS_HEADER] == ReadSource.REPLICA
    assert "Read from the replica, 0.4 s behind the primary." in page.text
    assert 'id="df-reads"' in page.text
    # One measurement serves the pages that follow while it stands (LAG_KEEP).
    assert probe.call_count == 1


def test_lagging_replica_sends_reads_to_primary_and_says_live(replica_on, staff_client, case, settings):
    settings.DECISIONFLOW_REPLICA_MAX_LAG = "3s"
    with _lag(12.5):
        page = _history(staff_client, case)
    assert page.status_code == 200
    assert page[replicas.READS_HEADER] == ReadSource.LAGGING
    assert "Live data, read from the primary: the replica is 12.5 s behind, more than 3.0 s." in page.text


def test_every_named_list_reads_the_replica(replica_on, staff_client, demo_case):
    case = demo_case
    names = [
        "admin:cases_case_changelist",
        "admin:reviews_proposal_changelist",
        "admin:reviews_reviewqueueitem_changelist",
    ]
    with _lag(0.0):
        for name in names:
            page = staff_client.get(reverse(name))
            assert page.status_code == 200, name
            assert page[replicas.READS_HEADER] == ReadSource.REPLICA, name
            assert "Read from the replica, 0.0 s behind the primary." in page.text, name
        export = staff_client.get(reverse("admin:cases_case_history_export", args=[case.pk]) + "?format=jsonl")
        assert export.status_code == 200 and export[replicas.READS_HEADER] == ReadSource.REPLICA
        assert b"".join(export.streaming_content)


def test_router_sends_reads_where_the_view_chose_and_writes_to_primary(replica_on):
    router = replicas.ReplicaRouter()
    assert router.db_for_read(Case) is None and Case.objects.all().db == DEFAULT_DB_ALIAS
    token = replicas._reading.set(replicas._entered())
    try:
        assert Case.objects.all().db == replicas.REPLICA
        assert router.db_for_write(Case, instance=Case()) == DEFAULT_DB_ALIAS
        assert not router.allow_migrate(replicas.REPLICA, "cases")
    finally:
        replicas._reading.reset(token)


def test_stopped_replica_page_is_read_from_primary_never_500(replica_on, staff_client, case):
    connections[replicas.REPLICA] = _stopped_replica()
    page = _history(staff_client, case)
    again = _history(staff_client, case)
    assert page.status_code == again.status_code == 200
    assert page[replicas.READS_HEADER] == again[replicas.READS_HEADER] == ReadSource.UNREACHABLE
    assert "Live data, read from the primary: the replica does not answer." in page.text
    assert case.case_id in page.text


def test_api_case_view_reads_replica_and_survives_a_stopped_one(replica_on, client, reviewer, demo_case):
    from api.services import token_create

    api = Api(client, token_create(user=reviewer, name="replica")[1])
    with mock.patch.object(replicas, "REPLICA_READS") as counted, _lag(0.0):
        assert api.get("/api/cases/T-1042").status_code == 200
    counted.labels.assert_called_with(source=ReadSource.REPLICA)
    replicas.forget_lag()
    connections[replicas.REPLICA] = _stopped_replica()
    with mock.patch.object(replicas, "REPLICA_READS") as counted:
        answer = api.get("/api/cases/T-1042")
    assert answer.status_code == 200 and answer.json()["case_id"] == "T-1042"
    counted.labels.assert_called_with(source=ReadSource.UNREACHABLE)


def test_primary_only_paths_never_ask_the_replica(replica_on, client, reviewer, demo_case):
    from api.services import token_create

    api = Api(client, token_create(user=reviewer, name="replica")[1])
    op = demo_case.current_proposal.operation_id
    connections[replicas.REPLICA] = _stopped_replica()
    with mock.patch.object(replicas, "measure_lag", side_effect=AssertionError("asked the replica")):
        decided = api.post("/api/cases/T-1042/decision", {"operation_id": op, "approved": True})
        assert decided.status_code == 200, decided.content
        assert api.get(f"/api/operations/{op}").json()["state"] == "Committed"


def test_after_a_decision_the_session_reads_its_own_write(replica_on, staff_client, demo_case):
    proposal = demo_case.current_proposal
    with _lag(0.0):
        decided = staff_client.post(
            reverse("admin:reviews_proposal_decide", args=[proposal.pk]),
            {"operation_id": proposal.operation_id, "decision": "approve"},
        )
        assert decided.status_code == 302
        cookie = decided.cookies[replicas.OWN_WRITES_COOKIE]
        assert int(cookie["max-age"]) == 6  # the 5 s allowed, plus a measurement's second
        page = _history(staff_client, demo_case)
    assert page[replicas.READS_HEADER] == ReadSource.OWN_WRITE
    assert "Live data, read from the primary: you changed something" in page.text


def test_a_failed_write_does_not_pin_and_without_a_replica_nothing_changes(settings, reviewer, staff_client, case):
    middleware = replicas.OwnWritesMiddleware(lambda request: HttpResponse(status=403))
    request = RequestFactory().post("/x")
    request.user = reviewer
    settings.DATABASE_REPLICA_URL = "postgres://replica.invalid/decisionflow"
    assert replicas.OWN_WRITES_COOKIE not in middleware(request).cookies
    settings.DATABASE_REPLICA_URL = ""
    page = _history(staff_client, case)
    assert page.status_code == 200 and replicas.READS_HEADER not in page and 'id="df-reads"' not in page.text


def test_the_footer_is_for_staff_only(replica_on, client, case, make_user):
    user = make_user("outsider")
    user.is_staff = False
    user.save()
    client.force_login(user)
    with _lag(0.0):
        page = client.get(reverse("admin:cases_case_history", args=[case.pk]))
    assert 'id="df-reads"' not in page.text


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_the_real_lag_query_reads_zero_on_a_server_that_replays_nothing():
    # A primary (not in recovery) is no lag; the standby's branches run in make reliability.
    assert replicas.measure_lag(DEFAULT_DB_ALIAS) == 0.0
    with connection.cursor() as cursor:
        cursor.execute(replicas.LAG_SQL)
        (lag,) = cursor.fetchone()
        assert isinstance(lag, float)


def _settings_with(env: dict) -> subprocess.CompletedProcess:
    """The served settings (not the test ones) read in a child with ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "DJANGO_SETTINGS"))}
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "r = s.DATABASES.get('replica'); "
        "print(r and r['OPTIONS'], s.DATABASE_ROUTERS, 'core.replicas.OwnWritesMiddleware' in s.MIDDLEWARE)"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**base, "DEBUG": "1", "DJANGO_SETTINGS_MODULE": "decisionflow.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_replica_settings_need_postgresql_and_set_a_bounded_connect():
    on_sqlite = _settings_with({"DATABASE_REPLICA_URL": "postgres://postgres@127.0.0.1:5/replica"})
    assert on_sqlite.returncode != 0
    assert "DATABASE_REPLICA_URL: a read replica needs DATABASE_URL on PostgreSQL" in on_sqlite.stderr
    on = _settings_with(
        {
            "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/decisionflow",
            "DATABASE_REPLICA_URL": "postgres://postgres@127.0.0.1:5433/decisionflow",
            "DATABASE_REPLICA_CONNECT_TIMEOUT": "3",
        }
    )
    assert on.returncode == 0, on.stderr
    assert on.stdout.split() == ["{'connect_timeout':", "3}", "['core.replicas.ReplicaRouter']", "True"]
    off = _settings_with({"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/decisionflow"})
    assert off.stdout.split() == ["None", "[]", "False"]


def test_the_docs_name_every_read_source_and_no_other():
    import re

    deploy = (ROOT / "docs" / "DEPLOY.md").read_text(encoding="utf-8")
    row = next(line for line in deploy.splitlines() if line.startswith("| `decisionflow_replica_reads_total`"))
    labels = set(re.findall(r"`([a-z_]+)`", row.split("|")[3])) - {"source"}
    assert labels == set(ReadSource.values)
    section = deploy.split("## Read replicas", 1)[1].split("\n## ", 1)[0]
    shown = {line.rsplit("`", 2)[1] for line in section.splitlines() if line.startswith("| ") and line.endswith("` |")}
    assert shown == set(ReadSource.values)
