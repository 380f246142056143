"""Append-only, completely: no TRUNCATE (PostgreSQL) and no DELETE (both) of decisions and
effects, and the test suite's flush is the one way past (effects/migrations/0004)."""

from __future__ import annotations

import importlib
import os
import re
import sqlite3
import subprocess
from pathlib import Path

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction

from effects.models import CommitAttempt, EffectRecord
from effects.services import effect_commit
from reviews.models import Proposal, ReviewDecision
from tests.conftest import ROOT
from tests.workflow.conftest import child_env, manage_argv

TABLES = ["reviews_proposal", "reviews_reviewdecision", "effects_effectrecord", "effects_commitattempt"]
MODELS = [Proposal, ReviewDecision, EffectRecord, CommitAttempt]
MIGRATION = importlib.import_module("effects.migrations.0004_append_only_truncate_and_delete")


@pytest.fixture
def committed(proposal, reviewer):
    """One row in each append-only table (a DELETE trigger fires per row)."""
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert all(model.objects.exists() for model in MODELS)
    return proposal


def counts() -> list[int]:
    return [model.objects.count() for model in MODELS]


@pytest.mark.parametrize("table", TABLES)
def test_raw_delete_is_refused_on_every_database(committed, table):
    before = counts()
    for sql in (f"DELETE FROM {table}", f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table})"):
        with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql)
    assert counts() == before


@pytest.fixture
def committed_now(committed):
    """On PostgreSQL, a TRUNCATE in the transaction that inserted the rows first needs their
    deferred foreign-key checks run (else: "pending trigger events")."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    return committed


@pytest.mark.postgres
@pytest.mark.parametrize("table", TABLES)
def test_truncate_is_refused_on_postgres(committed_now, table):
    before = counts()
    for sql in (f"TRUNCATE {table} CASCADE", f"TRUNCATE {table} RESTART IDENTITY CASCADE"):
        refused = pytest.raises(IntegrityError, match=f"TRUNCATE on {table} is refused")
        with refused, transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql)
    assert counts() == before


@pytest.mark.postgres
def test_truncate_cascading_from_a_case_is_refused_on_postgres(committed_now):
    """The issue's example: a TRUNCATE ... CASCADE from a table above wiped decisions and effects."""
    before = counts()
    for table in ("cases_case", "cases_policy", "auth_user"):
        refused = pytest.raises(IntegrityError, match="is refused: rows are append-only")
        with refused, transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {table} CASCADE")
    assert counts() == before


def test_the_app_connection_answers_no_to_the_bypass(db):
    """The setting the PostgreSQL trigger reads is unset, and the SQLite function answers 0."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT current_setting('decisionflow.maintenance_flush', true)")
            assert cursor.fetchone()[0] in (None, "", "off")
        else:
            cursor.execute("SELECT decisionflow_maintenance_flush()")
            assert cursor.fetchone()[0] == 0


@pytest.mark.postgres
def test_the_bypass_is_the_setting_and_nothing_else_on_postgres(committed_now):
    """With the setting on (as the suite's flush sets it) this test database may be emptied;
    the same statement without it is refused. Rolled back either way."""
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL decisionflow.maintenance_flush = 'yes'")  # only 'on' counts
        cursor.execute("TRUNCATE effects_effectrecord CASCADE")

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL decisionflow.maintenance_flush = 'on'")
        cursor.execute("TRUNCATE effects_effectrecord CASCADE")
        assert not EffectRecord.objects.exists()
        raise Rollback
    assert EffectRecord.objects.exists()


def test_a_normal_app_process_can_neither_delete_nor_truncate(transactional_db, committed):
    """A separate `manage.py shell` process, connected as the application connects, tries
    every way of emptying the tables; every one is refused and nothing is gone. (The flush
    that ends this transactional test then goes through the suite's bypass.)"""
    script = (
        "from django.db import connection, transaction\n"
        f"for table in {TABLES!r}:\n"
        "    statements = [f'DELETE FROM {table}']\n"
        "    if connection.vendor == 'postgresql':\n"
        "        statements.append(f'TRUNCATE {table} CASCADE')\n"
        "    for sql in statements:\n"
        "        try:\n"
        "            with transaction.atomic(), connection.cursor() as cursor:\n"
        "                cursor.execute(sql)\n"
        "            print('ALLOWED', sql)\n"
        "        except Exception as exc:\n"
        "            print('refused', sql, '|', str(exc).splitlines()[0])\n"
    )
    before = counts()
    proc = subprocess.run(
        manage_argv("shell", "-c", script), env=child_env(), capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("refused", "ALLOWED"))]
    assert len(lines) == len(TABLES) * (2 if connection.vendor == "postgresql" else 1), proc.stdout
    assert all(line.startswith("refused") and "append-only" in line for line in lines), proc.stdout
    assert counts() == before


# Statements that would turn the bypass on. The suite's own flush (tests/conftest.py) is the
# only place allowed to hold them.
_SETTERS = [
    re.compile(r"\bSET\s+(LOCAL\s+|SESSION\s+)?decisionflow\.maintenance_flush\b", re.I),
    re.compile(r"set_config\s*\(\s*['\"]decisionflow\.maintenance_flush", re.I),
    re.compile(r"ALTER\s+(ROLE|DATABASE|SYSTEM)\b.*decisionflow\.maintenance_flush", re.I),
    re.compile(r"PGOPTIONS.*maintenance_flush", re.I),
]
_SKIP_DIRS = {".git", "tests", "node_modules", "__pycache__", "var", "docs"}


def _source_files():
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".venv")]
        for name in files:
            if not name.endswith((".md", ".png", ".sqlite3", ".pyc")):
                yield Path(folder) / name


def test_no_application_source_turns_the_bypass_on():
    """Outside tests/, nothing sets the PostgreSQL setting, and the only registration of the
    SQLite function is the one that answers 0 (core/append_only.py)."""
    setters, registrations = [], []
    for path in _source_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        rel = str(path.relative_to(ROOT))
        setters += [f"{rel}: {m.group(0)}" for rx in _SETTERS for m in rx.finditer(text)]
        registrations += [f"{rel}: {line.strip()}" for line in text.splitlines() if "create_function(" in line]
    assert setters == []
    assert registrations == [
        "core/append_only.py: connection.connection.create_function(SQLITE_MAINTENANCE_FLUSH, 0, _never)"
    ]
    from core.append_only import _never

    assert _never() == 0


def test_every_append_only_table_has_its_triggers(db):
    """A later migration that rebuilds one of these tables on SQLite (Django copies the table
    and drops the old one) would drop its triggers silently: this notices."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")
            expected = {f"{t}_{kind}" for t in TABLES for kind in ("append_only", "no_truncate")}
        else:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
            expected = {f"{t}_{kind}" for t in TABLES for kind in ("no_update", "no_delete")}
        # The tables added after 0004, each with its own migration's triggers.
        later = ["reviews_notificationevent", "audit_seal"]
        kinds = ("append_only", "no_truncate") if connection.vendor == "postgresql" else ("no_update", "no_delete")
        expected |= {f"{t}_{kind}" for t in later for kind in kinds}
        assert expected <= {row[0] for row in cursor.fetchall()}


def test_notification_events_are_append_only_in_the_database(proposal):
    from reviews.models import Notification, NotificationEvent

    notification = Notification.objects.create(
        operation_id=proposal.operation_id, kind="review_begun", case=proposal.case, channels="email"
    )
    NotificationEvent.objects.create(
        notification=notification,
        case=proposal.case,
        operation_id=proposal.operation_id,
        kind="review_begun",
        outcome="sent",
        attempt=1,
    )
    for sql in ("UPDATE reviews_notificationevent SET error = 'x'", "DELETE FROM reviews_notificationevent"):
        with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql)
    assert NotificationEvent.objects.filter(error="").count() == 1


@pytest.mark.postgres
def test_the_migration_goes_backwards_and_forwards_on_postgres(committed_now):
    """Run 0004's own backward and forward steps in a transaction that is rolled back."""

    class Rollback(Exception):
        pass

    def truncate_refused() -> bool:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("TRUNCATE effects_commitattempt")
                raise Rollback
        except Rollback:
            return False
        except DatabaseError:
            return True

    with pytest.raises(Rollback), transaction.atomic():
        with connection.schema_editor(atomic=False) as editor:
            MIGRATION.backward(None, editor)
        assert not truncate_refused()
        with connection.schema_editor(atomic=False) as editor:
            MIGRATION.forward(None, editor)
        assert truncate_refused()
        raise Rollback
    assert truncate_refused()


def test_migrate_backwards_and_forwards_on_sqlite(tmp_path):
    """`migrate effects 0003` drops the DELETE triggers, `migrate` puts them back (SQLite file)."""
    if connection.vendor == "postgresql":
        pytest.skip("the PostgreSQL run has its own backward-and-forward test; this one is a SQLite file")
    env = child_env(DATABASE_URL=f"sqlite:///{tmp_path / 'm.sqlite3'}")

    def triggers(*argv: str) -> set[str]:
        proc = subprocess.run(manage_argv(*argv), env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        with sqlite3.connect(tmp_path / "m.sqlite3") as db:
            return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}

    deletes = {f"{t}_no_delete" for t in TABLES}
    assert deletes <= triggers("migrate", "--noinput", "-v", "0")
    assert not deletes & triggers("migrate", "effects", "0003", "--noinput", "-v", "0")
    assert deletes <= triggers("migrate", "--noinput", "-v", "0")
