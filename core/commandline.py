"""What the workflow commands share: documented exit codes, usage errors, user lookup.

Exit codes (docs/COMMANDS.md): 0 success (a replay or a decline included), 1 usage or other
error, 3 conflicting decision, 4 stale or not the recorded proposal, 5 incompatible workflow
version or a checkpoint that fails its checks, 6 the case is busy (try again), 7 an edit was
saved but its review not begun, 42 the outcome is uncertain (ask reconcile). Each error
class carries its own code (core/errors.py).

Start-up failures, for every command (ours and Django's; manage.py calls
``execute_from_command_line`` below): 78 the installation is not ready (a setting such as
SECRET_KEY is missing or wrong, or the database has unapplied migrations), 75 the database
cannot be reached (try again later), 141 standard output was closed (``| head``). Each is one
line on stderr; ``--traceback`` shows the traceback instead.

Status lines go to stdout; an error is one clear message on stderr (plus, sometimes, a hint
line), with no traceback and no "CommandError:" prefix, because scripts parse both streams.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, OperationalError, connections

from core.errors import CaseBusy, DecisionflowError, InvalidInput, NotFound
from core.observability import events_off_stderr
from core.text import one_line, shown

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BUSY = 6
EXIT_SAVED_NOT_BEGUN = 7
# Start-up failures, from the BSD sysexits.h vocabulary that cron and supervisors know, and
# the shell's own code for a program stopped by a closed pipe (128 + SIGPIPE).
EXIT_TEMPFAIL = 75
EXIT_CONFIG = 78
EXIT_BROKEN_PIPE = 141

REVIEWER_ENV = "DECISIONFLOW_REVIEWER"


class Exit(Exception):
    """Stop with an exact stderr message and exit code (raised by ``WorkflowCommand.fail``)."""

    def __init__(self, code: int, lines: list[str]):
        super().__init__("\n".join(lines))
        self.code = code
        self.lines = lines


def _every_migration_recorded(alias: str) -> bool:
    """True when every migration file of every app is recorded as applied: then nothing is
    unapplied, and the migration graph need not be built. Listing the files and reading
    django_migrations is one query and no imports; loading the graph imports every migration
    module (~30 ms of each command's start, docs/PERFORMANCE.md, 14). False means "look
    closer", never "unapplied": the graph then decides (squashed migrations, say)."""
    import pkgutil
    from importlib import import_module

    from django.apps import apps
    from django.db.migrations.loader import MigrationLoader
    from django.db.migrations.recorder import MigrationRecorder

    on_disk = set()
    for app in apps.get_app_configs():
        module_name, _ = MigrationLoader.migrations_module(app.label)
        try:
            module = import_module(module_name) if module_name else None
        except ImportError:
            continue
        if module is None or not hasattr(module, "__path__"):
            continue
        # The files the loader would read: the same filter as MigrationLoader.load_disk.
        on_disk |= {
            (app.label, name)
            for _, name, is_pkg in pkgutil.iter_modules(module.__path__)
            if not is_pkg and name[0] not in "_~"
        }
    # No table: nothing is recorded, and the graph says what is missing.
    return on_disk <= set(MigrationRecorder(connections[alias]).applied_migrations())


def unapplied_migrations(alias: str = DEFAULT_DB_ALIAS) -> list[str]:
    """The migrations the database still lacks, as ``app.name``, in the order they would run."""
    if _every_migration_recorded(alias):
        return []
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[alias])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, backwards in plan if not backwards]


def not_migrated_message(pending: list[str]) -> str:
    shown = ", ".join(pending[:3]) + (f" and {len(pending) - 3} more" if len(pending) > 3 else "")
    return (
        f"the database is not migrated: {len(pending)} migration(s) not applied ({shown}); "
        "run `manage.py migrate` first"
    )


class ProjectCommand(BaseCommand):
    """Our commands' base: refuse to start on a database with unapplied migrations.

    Django's own ``check_migrations`` prints a notice and carries on; a command of ours on an
    older schema could run without a constraint or trigger it relies on, so it stops first.
    """

    requires_migrations_checks = True

    def check_migrations(self):
        pending = unapplied_migrations()
        if pending:
            message = not_migrated_message(pending)
            if getattr(self, "_called_from_command_line", False):
                # The same line manage.py prints for a Django command (execute_from_command_line).
                self.stderr.write(f"{type(self).__module__.rsplit('.', 1)[-1]}: {message}")
                sys.exit(EXIT_CONFIG)
            raise CommandError(message, returncode=EXIT_CONFIG)


class WorkflowCommand(ProjectCommand):
    """A thin command: parse, call one service, print status lines, exit with a documented code."""

    # These run once per workflow step (and from cron); the full system checks import every
    # URLconf and admin module and double the start-up time. `manage.py check` (and the
    # deploy) still runs them.
    requires_system_checks = []

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)

        # argparse exits 2 on a usage error; this project documents 1 for usage errors.
        def error(message):
            if parser.called_from_command_line:
                parser.print_usage(sys.stderr)
                parser.exit(EXIT_ERROR, f"{parser.prog}: error: {message}\n")
            raise CommandError(f"Error: {message}", returncode=EXIT_ERROR)

        # Replacing the bound method on this one parser instance is the point: argparse
        # calls self.error() for every usage error, and there is no hook to pass one in.
        parser.error = error  # type: ignore[method-assign]
        return parser

    def fail(self, code: int, *lines: str) -> NoReturn:
        raise Exit(code, list(lines))

    def execute(self, *args, **options):
        try:
            # stderr is for the one error line; the decision events go to their file, if any.
            with events_off_stderr():
                return super().execute(*args, **options)
        except DecisionflowError as exc:
            self._stop(options, exc.exit_code, [exc.message, *self.hints(exc)])
        except Exit as exc:
            self._stop(options, exc.code, exc.lines)

    def _stop(self, options, code, lines):
        # A message may quote a value (a case id, a file name, an operation id as typed):
        # each line stays one line, so no value can forge another.
        lines = [one_line(line) for line in lines]
        for line in lines:
            self.stderr.write(line)
        if code == EXIT_OK:
            return
        # From the command line: exit with the documented code. From call_command: raise
        # a CommandError carrying the same code, so callers and tests can read it.
        if getattr(self, "_called_from_command_line", False):
            sys.exit(code)
        raise CommandError(lines[0] if lines else "failed", returncode=code)

    def hints(self, exc: DecisionflowError) -> list[str]:
        return []

    def user(self, username: str | None, *, option: str, role: str):
        """The named user, or the one named by $DECISIONFLOW_REVIEWER; a usage error otherwise."""
        username = username or os.environ.get(REVIEWER_ENV)
        if not username:
            raise InvalidInput(f"{option} USERNAME is required (or set {REVIEWER_ENV}): a {role} must be named")
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise NotFound(f"no user named {username!r}")
        return user


class BulkCommand(WorkflowCommand):
    """A command that acts on many cases in batches (publish_policy, add_source_version): a
    dry run unless ``--apply``, one JSON line with ``--json``, a progress bar on a terminal,
    and exit 6 (or 1) when some cases were left as they were, for a run again to finish."""

    def add_bulk_arguments(self, parser) -> None:
        parser.add_argument("--apply", action="store_true", help="Act; without it, a dry run.")
        parser.add_argument(
            "--json", dest="as_json", action="store_true", help="One JSON summary line, no progress bar."
        )
        parser.add_argument("--batch-size", type=int, default=None, metavar="N", help="Cases read per batch.")

    def read_input(self, name: str) -> bytes:
        """The bytes of file ``name`` (``-``: stdin); ``InvalidInput`` when it cannot be read."""
        try:
            return sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        except OSError as exc:
            raise InvalidInput(f"{self._name()}: cannot read {shown(name)}: {exc.strerror}") from None

    def interactive(self, as_json: bool) -> bool:
        """A person at a terminal: a bar and the plan's lines; else one summary line."""
        stream = getattr(self.stdout, "_out", self.stdout)
        return not as_json and bool(getattr(stream, "isatty", lambda: False)())

    def fail_if_left(self, failed: list[tuple[str, DecisionflowError]]) -> None:
        """Exit 6 when every case left was busy (run again), 1 otherwise; nothing when none."""
        if not failed:
            return
        busy = all(isinstance(exc, CaseBusy) for _, exc in failed)
        self.fail(
            EXIT_BUSY if busy else EXIT_ERROR,
            f"{self._name()}: {len(failed)} case(s) were left as they were "
            f"({shown(failed[0][0])}: {failed[0][1].message}); run again to finish",
        )

    def report(self, result, *, as_json: bool, interactive: bool, row: Callable[[Any], str], counts: str) -> None:
        """The run's report: one JSON line (``result.summary()``) with ``--json``; else, for
        a dry run on a terminal, a line per sampled case of the plan (``row``), then one
        summary line (``counts``)."""
        if as_json:
            self.stdout.write(json.dumps(result.summary(), sort_keys=True))
            return
        plan = result.plan
        if interactive and not result.applied:
            for sampled in plan.sample:
                self.stdout.write(f"  {row(sampled)}")
            if plan.total > len(plan.sample):
                self.stdout.write(f"  ... and {plan.total - len(plan.sample)} more")
        mode = "applied" if result.applied else "dry run (add --apply to act)"
        self.stdout.write(f"{self._name()}: {mode} {counts}")

    def _name(self) -> str:
        return type(self).__module__.rsplit(".", 1)[-1]


# --- manage.py ---------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _raised_while_connecting(exc: BaseException) -> bool:
    """Did this error come from opening the connection (not from a query on an open one)?"""
    return any(
        frame.f_code.co_name in ("connect", "get_new_connection")
        and "django" in frame.f_code.co_filename
        and "backends" in frame.f_code.co_filename
        for frame, _ in traceback.walk_tb(exc.__traceback__)
    )


def startup_failure(exc: BaseException) -> tuple[int, str] | None:
    """The exit code and the one line for a failure an operator fixes outside the code, or
    None for anything else (a bug keeps its traceback)."""
    if isinstance(exc, ImproperlyConfigured):
        return EXIT_CONFIG, f"configuration error: {_first_line(exc)}"
    if isinstance(exc, BrokenPipeError):
        return EXIT_BROKEN_PIPE, "stopped: standard output was closed before the command finished (broken pipe)"
    if not isinstance(exc, DatabaseError):
        return None
    if _raised_while_connecting(exc):
        return EXIT_TEMPFAIL, f"cannot connect to the database: {_first_line(exc)}"
    # A missing table or column is what an unmigrated database looks like from inside a
    # query: ask the database which migrations it lacks before blaming anything else.
    try:
        pending = unapplied_migrations()
    except Exception:  # noqa: BLE001 - a diagnosis that fails must not replace the error it explains
        pending = []
    finally:
        connections.close_all()
    if pending:
        return EXIT_CONFIG, not_migrated_message(pending)
    if isinstance(exc, OperationalError | InterfaceError):
        return EXIT_TEMPFAIL, f"database error: {_first_line(exc)}"
    return None


def execute_from_command_line(argv: list[str]) -> int:
    """Django's ``execute_from_command_line``, with one line on stderr for every start-up
    failure (no secret, no database, unapplied migrations, a closed pipe) and a documented
    exit code; ``--traceback`` anywhere in the arguments shows the traceback instead."""
    from django.core.management import execute_from_command_line as django_execute

    finished = False
    try:
        django_execute(argv)
        finished = True
        # A pipe closed by the reader shows up here at the latest, not at interpreter exit.
        sys.stdout.flush()
    except Exception as exc:
        failure = startup_failure(exc)
        if failure is None or "--traceback" in argv[1:]:
            raise
        code, message = failure
        if isinstance(exc, BrokenPipeError) and finished:
            # Only the buffered output was lost: the work itself was done.
            message = "standard output was closed before all output was written (broken pipe); the command finished"
        if isinstance(exc, BrokenPipeError):
            # Whatever is still buffered goes nowhere, so the exit flush cannot fail again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        command = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else "manage.py"
        sys.stderr.write(f"{command}: {message}\n")
        return code
    return EXIT_OK
