"""Every start-up failure of every command is one line on stderr and a documented exit code
(docs/COMMANDS.md), ours and Django's alike; `--traceback` shows the traceback instead."""

from __future__ import annotations

import subprocess
from urllib.parse import quote

import pytest
from django.db import connection

from core.commandline import EXIT_BROKEN_PIPE, EXIT_CONFIG, EXIT_TEMPFAIL
from tests.conftest import ROOT, database_url
from tests.workflow.conftest import child_env, manage_argv


def run(*argv: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        manage_argv(*argv), env=child_env(**env), capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def one_line(proc: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """The process exited ``code`` with exactly one line on stderr, holding ``words``."""
    lines = proc.stderr.splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0]
    return lines[0]


def traceback_shown(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode not in (0, EXIT_CONFIG, EXIT_TEMPFAIL), proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr


NO_SECRET = {"SECRET_KEY": "", "DEBUG": "0"}


@pytest.mark.parametrize("argv", [["reconcile", "--all"], ["migrate", "--noinput"]])
def test_no_secret_key_is_one_line(argv):
    line = one_line(run(*argv, **NO_SECRET), EXIT_CONFIG, "configuration error: SECRET_KEY is not set")
    assert line.startswith(f"{argv[0]}: ")


def test_no_secret_key_with_traceback_shows_it():
    traceback_shown(run("reconcile", "--all", "--traceback", **NO_SECRET))


UNREACHABLE = [
    # Nothing listens on port 1; a SQLite file in a folder that does not exist cannot be opened.
    "postgres://postgres@127.0.0.1:1/decisionflow",
    "sqlite:////nonexistent-decisionflow-folder/db.sqlite3",
]


@pytest.mark.parametrize(
    "url, argv",
    [
        (UNREACHABLE[0], ["begin", "T-1042"]),
        (UNREACHABLE[1], ["reconcile", "--all"]),
        (UNREACHABLE[0], ["migrate", "--noinput"]),
    ],
)
def test_database_unreachable_is_one_line(url, argv):
    one_line(run(*argv, DATABASE_URL=url), EXIT_TEMPFAIL, f"{argv[0]}: cannot connect to the database: ")


def test_database_unreachable_with_traceback_shows_it():
    traceback_shown(run("reconcile", "--all", "--traceback", DATABASE_URL=UNREACHABLE[0]))


@pytest.fixture
def unmigrated_url(db, tmp_path) -> str:
    """A database this suite can reach that has no tables at all."""
    if connection.vendor == "postgresql":
        # The test database, seen through a schema that does not exist: no table is found.
        return database_url() + "?options=" + quote("-c search_path=decisionflow_no_such_schema")
    return f"sqlite:///{tmp_path / 'empty.sqlite3'}"


@pytest.mark.parametrize(
    "argv",
    [
        ["reconcile", "--all"],  # ours: refused before the first query
        ["load_demo"],
        ["createsuperuser", "--noinput", "--username", "x", "--email", "x@example.com"],  # Django's: diagnosed
    ],
)
def test_unapplied_migrations_is_one_line(unmigrated_url, argv):
    one_line(
        run(*argv, DATABASE_URL=unmigrated_url),
        EXIT_CONFIG,
        f"{argv[0]}: the database is not migrated: ",
        "run `manage.py migrate` first",
    )


def test_unapplied_migrations_with_traceback_shows_it(unmigrated_url):
    traceback_shown(run("createsuperuser", "--noinput", "--username", "x", "--traceback", DATABASE_URL=unmigrated_url))


def closed_pipe(*argv: str, unbuffered: bool) -> subprocess.CompletedProcess:
    """Run with stdout a pipe whose reader is already gone (as after `| head -1`)."""
    env = child_env(PYTHONUNBUFFERED="1" if unbuffered else "")
    proc = subprocess.Popen(manage_argv(*argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.wait(60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)


# Unbuffered, the first line printed meets the closed pipe and the command stops there;
# buffered (the default for a pipe), the output is only written, and lost, once it finished.
STOPPED = "stopped: standard output was closed before the command finished (broken pipe)"
FINISHED = "standard output was closed before all output was written (broken pipe); the command finished"


@pytest.mark.parametrize("unbuffered, says", [(True, STOPPED), (False, FINISHED)])
def test_closed_pipe_is_one_line_for_django_commands(unbuffered, says):
    one_line(closed_pipe("help", unbuffered=unbuffered), EXIT_BROKEN_PIPE, f"help: {says}")


@pytest.mark.parametrize("unbuffered, says", [(True, STOPPED), (False, FINISHED)])
def test_closed_pipe_is_one_line_for_ours(transactional_db, unbuffered, says):
    from cases.models import Case

    one_line(closed_pipe("load_demo", unbuffered=unbuffered), EXIT_BROKEN_PIPE, f"load_demo: {says}")
    # Stopped inside its one transaction, load_demo loaded nothing; finished, it loaded all.
    assert Case.objects.exists() is (not unbuffered)


def test_closed_pipe_with_traceback_shows_it(transactional_db):
    proc = closed_pipe("load_demo", "--traceback", unbuffered=True)
    assert proc.returncode != 0
    assert "BrokenPipeError" in proc.stderr


def test_unapplied_migrations_through_call_command_is_a_command_error(db, monkeypatch):
    """In-process callers (call_command) get a CommandError carrying the same exit code."""
    from django.core.management import CommandError, call_command

    from core import commandline

    assert commandline.unapplied_migrations() == []  # the test database is migrated
    monkeypatch.setattr(commandline, "unapplied_migrations", lambda: ["effects.0004_append_only_truncate_and_delete"])
    with pytest.raises(CommandError, match="the database is not migrated: 1 migration") as refused:
        call_command("reconcile", "--all")
    assert refused.value.returncode == EXIT_CONFIG


def test_a_migration_file_not_recorded_is_found_without_the_graph_only_when_all_are(db):
    """The start-up check reads the migration files and django_migrations; one file not
    recorded sends it to the migration graph, which names what is missing."""
    from django.db.migrations.recorder import MigrationRecorder

    from core import commandline

    assert commandline._every_migration_recorded("default")
    # The app's latest migration: one that others depend on would leave them applied above it.
    recorded = MigrationRecorder.Migration.objects.filter(app="reviews")
    latest = recorded.order_by("-name").values_list("name", flat=True).first()
    recorded.filter(name=latest).delete()
    assert not commandline._every_migration_recorded("default")
    assert commandline.unapplied_migrations() == [f"reviews.{latest}"]
