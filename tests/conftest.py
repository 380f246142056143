"""Shared fixtures: the demo case, users with and without the review permission."""

from __future__ import annotations

import io
import os
import re
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connections

os.environ.setdefault("DEBUG", "1")

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "cases" / "demo"


# True whether the SQLite run is alone or one of `make test`'s two (tests/run_both.sh), which
# cannot know at collection whether its PostgreSQL twin found a server.
POSTGRES_ONLY = (
    "PostgreSQL only: this run is on SQLite; `make test` also runs the suite on PostgreSQL "
    "when a server answers at TEST_POSTGRES_URL"
)


# `make test` runs both suites at once, and these tests would do the same thing twice.
SQLITE_RUN_ONLY = (
    "the same on either database: only the SQLite run has it (`make test` runs both; `make test-sqlite` runs it)"
)


def pytest_collection_modifyitems(config, items):
    from django.db import connection

    if connection.vendor != "postgresql":
        skip = pytest.mark.skip(reason=POSTGRES_ONLY)
        for item in items:
            if "postgres" in item.keywords:
                item.add_marker(skip)
    if connection.vendor != "sqlite":
        once = pytest.mark.skip(reason=SQLITE_RUN_ONLY)
        for item in items:
            if "any_database" in item.keywords:
                item.add_marker(once)


# The one way past the append-only triggers (effects/migrations/0003), for the test suite's
# own flush only: Django empties every table after a transactional test (TransactionTestCase,
# pytest-django's transactional_db and live_server), with TRUNCATE on PostgreSQL and DELETE
# on SQLite, and the triggers refuse both. The application never turns this on
# (tests/effects/test_append_only.py checks the source tree and a live connection).
MAINTENANCE_FLUSH_ON = "SET LOCAL decisionflow.maintenance_flush = 'on'"
MAINTENANCE_FLUSH_OFF = "SET LOCAL decisionflow.maintenance_flush = 'off'"


@pytest.fixture(scope="session", autouse=True)
def _admin_registered():
    """The admin registers its pages when the URLs load (SimpleAdminConfig), as a web worker
    does when it starts (decisionflow/wsgi.py); a test may read the registry first."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - loading is the point


@pytest.fixture(scope="session", autouse=True)
def _flush_past_append_only_triggers():
    from django.db.backends.base.operations import BaseDatabaseOperations

    from core.append_only import SQLITE_MAINTENANCE_FLUSH, sqlite_guard_install

    flush = BaseDatabaseOperations.execute_sql_flush

    def execute_sql_flush(self, sql_list):
        connection = self.connection
        if connection.vendor == "postgresql":
            if sql_list and _may_skip_triggers(connection):
                return flush(self, _deletes(connection, sql_list))
            # One transaction runs the whole list, so SET LOCAL ends with it; the last
            # statement turns it off again in case that transaction is an outer one's savepoint.
            return flush(self, [MAINTENANCE_FLUSH_ON, *sql_list, MAINTENANCE_FLUSH_OFF])
        if connection.vendor != "sqlite":
            return flush(self, sql_list)
        connection.ensure_connection()
        connection.connection.create_function(SQLITE_MAINTENANCE_FLUSH, 0, lambda: 1)
        try:
            return flush(self, sql_list)
        finally:
            sqlite_guard_install(None, connection)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(BaseDatabaseOperations, "execute_sql_flush", execute_sql_flush)
        yield


_TRUNCATE = re.compile(r"^TRUNCATE (?P<tables>.+?);?$", re.S)
# What migrate made and every test reads alike: the flush's post_migrate finds them whole and
# writes nothing, where emptied it wrote them all again after each test.
_KEPT = frozenset({"django_content_type", "auth_permission"})
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # the flush command's style, on a terminal


def _may_skip_triggers(connection) -> bool:
    """A superuser (the local server's and CI's ``postgres``) may set session_replication_role."""
    if not hasattr(connection, "_df_superuser"):
        with connection.cursor() as cursor:
            cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            connection._df_superuser = bool(cursor.fetchone()[0])
    return connection._df_superuser


def _deletes(connection, sql_list: list[str]) -> list[str]:
    """Django's flush as DELETEs with the triggers skipped (the foreign keys' and the
    append-only ones: ``session_replication_role = replica``, for this transaction only).
    TRUNCATE gives every table and index a new file and took 1-2 s per transactional test
    on a busy machine, ~330 s of a PostgreSQL run; a DELETE of a test's few rows is
    milliseconds. Anything but a plain TRUNCATE list (sequence resets) is kept as it is."""
    out = ["SET LOCAL session_replication_role = replica"]
    for sql in sql_list:
        found = _TRUNCATE.match(_COLOUR.sub("", sql).strip())
        if found is None or " RESTART " in sql or " CASCADE" in sql:
            out.append(sql)
            continue
        tables = [table.strip() for table in found["tables"].split(",")]
        out += [f"DELETE FROM {table}" for table in tables if table.strip('"') not in _KEPT]
    return [*out, "SET LOCAL session_replication_role = origin"]


@contextmanager
def held_elsewhere(hold):
    """Hold ``hold()`` (a lock's context manager) in another thread, on its own database
    connection, for as long as the block runs: another action in progress on the case."""
    held, release = threading.Event(), threading.Event()

    def holder():
        try:
            with hold():
                held.set()
                release.wait(20)
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10), "the other thread never got the lock"
    try:
        yield
    finally:
        release.set()
        thread.join(10)


def case_held_elsewhere(case_id: str):
    """Another action in progress on the case, held in another thread.

    On PostgreSQL that is what an edit holds: ``case_lock`` itself (a transaction holding the
    case's advisory lock) and the case row (``FOR NO KEY UPDATE``), which a commit's write
    and a first begin's pointer wait for. On SQLite only the case's file lock: any SQLite
    transaction also holds the whole database's write lock, so the refused request could not
    record its attempt while a real action runs, and these tests are about the case lock.
    """
    from django.db import connection

    from core.locks import named_lock

    if connection.vendor == "postgresql":
        return held_elsewhere(lambda: _edit_in_progress(case_id))
    return held_elsewhere(lambda: named_lock(f"case:{case_id}", what=f"case {case_id}", timeout=5))


@contextmanager
def _edit_in_progress(case_id: str):
    from cases.models import Case
    from core.locks import case_lock

    with case_lock(case_id, timeout=5):
        list(Case.objects.select_for_update(no_key=True).filter(case_id=case_id).values_list("pk"))
        yield


def pending_review_of(proposal):
    """A pending review of ``proposal``'s operation, as a begin records it (without a real
    pause checkpoint: for the commit, which only completes it)."""
    from reviews.models import PendingReview

    return PendingReview.objects.create(
        case=proposal.case,
        proposal=proposal,
        operation_id=proposal.operation_id,
        workflow_session_id="session-1",
        checkpoint_id="checkpoint-1",
        workflow_version="test",
    )


@contextmanager
def commit_lost(*, times: int | None = None):
    """The connection drops just as a decision's commit goes out, ``times`` times (None: every
    time): at COMMIT where the commit is a transaction (SQLite), at the write where the write
    commits as it runs (PostgreSQL in autocommit, effects/store.py). Nothing reaches the
    server: the one case a client cannot tell from a commit whose answer was lost. Yields the
    list of the failures so far."""
    from django.db import OperationalError, connection

    failures: list[bool] = []

    def lose() -> bool:
        if times is not None and len(failures) >= times:
            return False
        failures.append(True)
        raise OperationalError("server closed the connection unexpectedly")

    def write_lost(execute, sql, params, many, context):
        if sql.startswith("WITH") and 'INSERT INTO "effects_commitattempt"' in sql:
            lose()
        return execute(sql, params, many, context)

    if connection.vendor == "postgresql":
        with connection.execute_wrapper(write_lost):
            yield failures
        return
    commit = connection._commit

    def commit_or_lose(*args, **kwargs):
        lose()
        return commit(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(connection, "_commit", commit_or_lose)
        yield failures


@contextmanager
def http_server(handler):
    """A local HTTP server answering with ``handler`` (a ``BaseHTTPRequestHandler``) on a
    free port of 127.0.0.1, in a thread, for the block: its base URL."""
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def database_url() -> str:
    """A DATABASE_URL naming the database this test process is using right now.

    Tests that start manage.py (or gunicorn) in a child process hand it this, so the child
    reads and writes the same test database.
    """
    from urllib.parse import quote

    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    auth = quote(s.get("USER") or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    host = s.get("HOST") or "127.0.0.1"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}{'@' if auth else ''}{host}{port}/{s['NAME']}"


def snapshot() -> dict:
    """What a refusal must leave alone: proposals, decisions, effects, pauses and pointers.

    Commit attempts are left out on purpose: they are the audit log, and a refusal the
    review core sees appends one.
    """
    from cases.models import Case
    from effects.models import EffectRecord
    from reviews.models import PendingReview, Proposal, ReviewDecision

    return {
        "proposals": Proposal.objects.count(),
        "decisions": ReviewDecision.objects.count(),
        "effects": EffectRecord.objects.count(),
        "pending": sorted(PendingReview.objects.values_list("operation_id", "status")),
        "pointers": sorted(Case.objects.values_list("case_id", "current_proposal_id")),
    }


def load_fixture(name: str = "t1042.json") -> dict:
    import json

    return json.loads((DEMO / name).read_text())


@pytest.fixture
def t1042_data():
    return load_fixture("t1042.json")


@pytest.fixture
def case(db, t1042_data):
    from cases.services import case_import

    return case_import(data=t1042_data).case


@pytest.fixture
def groups(db):
    from django.contrib.auth.models import Group, Permission

    from reviews.groups import ensure_review_groups

    return ensure_review_groups(Group, Permission)


@pytest.fixture
def make_user(db, groups):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from reviews.groups import BILLING_REVIEWERS

    reviewers, leads = groups
    billing, _ = Group.objects.get_or_create(name=BILLING_REVIEWERS)

    def make(username="reviewer", *, group="reviewers", password="pw-T1042-test", billing_reviewer=True):
        """A staff user in ``group``. A reviewer is also a billing reviewer, as the demo's is
        (the demo's billing-reply, T-1077, is decided by that group only), unless
        ``billing_reviewer=False``."""
        user = get_user_model().objects.create_user(username=username, password=password, is_staff=True)
        if group == "reviewers":
            user.groups.add(reviewers)
            if billing_reviewer:
                user.groups.add(billing)
        elif group == "leads":
            user.groups.add(leads)
        elif group == "pipeline":
            from django.contrib.auth.models import Group

            from reviews.groups import PIPELINE

            user.groups.add(Group.objects.get(name=PIPELINE))
        return user

    return make


@pytest.fixture
def reviewer(make_user):
    return make_user("reviewer")


@pytest.fixture
def editor(make_user):
    """A second reviewer: four eyes means the person who edits is not the one who approves."""
    return make_user("editor")


@pytest.fixture
def lead(make_user):
    return make_user("lead", group="leads")


@pytest.fixture
def pipeline(make_user):
    """A pipeline service user: the intake permission, never the review one."""
    return make_user("pipeline", group="pipeline")


class Terminal(io.StringIO):
    """A standard output that says it is a terminal: the bulk commands show their bar."""

    def isatty(self):
        return True


def command_run(name: str, *args, stdout=None) -> tuple[int, str, str]:
    """Run command ``name`` with ``call_command``: its exit code, stdout and stderr."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    out, err = stdout or io.StringIO(), io.StringIO()
    code = 0
    try:
        call_command(name, *args, stdout=out, stderr=err)
    except CommandError as exc:
        code = exc.returncode
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def proposal(case):
    from reviews.services import proposal_create

    return proposal_create(case=case)


def race(calls):
    """Start every call at once, each on its own thread and connection; return (results, exceptions)."""
    barrier = threading.Barrier(len(calls))
    results, errors = [None] * len(calls), []

    def run(index, call):
        try:
            barrier.wait()
            results[index] = call()
        except Exception as exc:  # noqa: BLE001 - the test asserts there are none
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors
