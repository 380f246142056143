"""What the workflow commands share: documented exit codes, usage errors, user lookup.

Exit codes (docs/COMMANDS.md): 0 success (a replay or a decline included), 1 usage or other
error, 3 conflicting decision, 4 stale or not the recorded proposal, 5 incompatible workflow
version or a checkpoint that fails its checks, 6 the case is busy (try again), 7 an edit was
saved but its review not begun, 42 the outcome is uncertain (ask reconcile). Each error
class carries its own code (decisionflow/core/errors.py).

Status lines go to stdout; an error is one clear message on stderr (plus, sometimes, a hint
line), with no traceback and no "CommandError:" prefix, because scripts parse both streams.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from decisionflow.core.errors import DecisionflowError, InvalidInput, NotFound
from decisionflow.core.observability import events_off_stderr

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFLICT = 3
EXIT_STALE = 4
EXIT_INCOMPATIBLE = 5
EXIT_BUSY = 6
EXIT_SAVED_NOT_BEGUN = 7
EXIT_NO_RECEIPT = 42

REVIEWER_ENV = "DECISIONFLOW_REVIEWER"


class Exit(Exception):
    """Stop with an exact stderr message and exit code (raised by ``WorkflowCommand.fail``)."""

    def __init__(self, code: int, lines: list[str]):
        super().__init__("\n".join(lines))
        self.code = code
        self.lines = lines


class WorkflowCommand(BaseCommand):
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
