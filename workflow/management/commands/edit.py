import re
import sys
from pathlib import Path

from cases.selectors import case_by_id
from core.commandline import EXIT_SAVED_NOT_BEGUN, WorkflowCommand
from core.errors import InvalidInput
from core.text import shown
from reviews.models import Channel
from workflow.edit import EditResult, review_edit

_SOURCE = re.compile(r"^(?P<source>[^=\s]+)=(?P<version>\d+)$")


def report(command: WorkflowCommand, act: str, edited: EditResult, case_id: str) -> None:
    """The lines of a revision (an edit, a re-draft), and exit 7 when it is saved but its
    review was not begun."""
    revision, begun = edited.revision, edited.begun
    # Every value is shown quoted unless it is a plain token: no value can forge a line.
    op = shown(revision.proposal.operation_id)
    if not revision.changed:
        command.stdout.write(f"{act}: op={op} unchanged")
        return
    command.stdout.write(f"{act}: op={op} origin={shown(revision.proposal.origin)}")
    if edited.begin_error is not None:
        # Saved and current; only its review is not begun. Say so, and how to finish.
        command.fail(
            EXIT_SAVED_NOT_BEGUN,
            f"{act}: saved, but the review of the new proposal was not begun: {edited.begin_error.message}",
            f"{act}: run `manage.py begin {shown(case_id)}` (or decide on it: the first decision begins it)",
        )
    if begun is not None:  # None: not asked to begin it
        command.stdout.write(
            f"begin: status={shown(begun.status)} op={shown(begun.operation_id)} checkpoints={begun.checkpoints}"
        )


class Command(WorkflowCommand):
    help = (
        "Edit the current proposal of a case and begin the workflow for the new one: "
        "`python manage.py edit CASE_ID --expected-operation-id OP (--body-file FILE | --source SOURCE=VERSION ...) "
        "[--editor USERNAME]`. --body-file and --source may be combined; FILE may be - for stdin. The editor "
        "defaults to $DECISIONFLOW_REVIEWER and needs the review permission. Prints "
        "`edit: op=<new operation id> origin=human_edit|evidence_change`, then the `begin:` line of the new "
        "pause. An edit that changes nothing prints `edit: op=<op> unchanged`. Exit codes: 0 ok; 1 error; "
        "4 stale (OP is not the current proposal) or already decided, and nothing is written; 6 the case "
        "is busy (another action holds it), nothing is written, try again; 7 the edit is saved and current "
        "but its review was not begun (run `begin`)."
    )

    def add_arguments(self, parser):
        parser.add_argument("case_id", metavar="CASE_ID", help="The case's external ID, e.g. T-1042.")
        parser.add_argument(
            "--expected-operation-id",
            required=True,
            metavar="OP",
            help="The operation identity the editor started from; anything else is refused as stale.",
        )
        parser.add_argument("--body-file", metavar="FILE", help="The new body, UTF-8 text (- reads stdin).")
        parser.add_argument(
            "--source",
            action="append",
            default=[],
            metavar="SOURCE=VERSION",
            help="Move a selected source to another version, e.g. HOLD-7=4 (repeatable).",
        )
        parser.add_argument(
            "--editor",
            metavar="USERNAME",
            help="Who edits (needs the review permission); default $DECISIONFLOW_REVIEWER.",
        )

    def handle(self, *args, case_id, expected_operation_id, body_file, source, editor, **options):
        if body_file is None and not source:
            self.fail(1, "edit: one of --body-file FILE or --source SOURCE=VERSION is required")
        source_versions = {}
        for item in source:
            match = _SOURCE.match(item)
            if match is None:
                self.fail(1, f"edit: --source {shown(item)} is not SOURCE=VERSION (e.g. HOLD-7=4)")
            if match["source"] in source_versions:
                self.fail(1, f"edit: --source names {shown(match['source'])} twice")
            source_versions[match["source"]] = int(match["version"])
        body = None if body_file is None else self._read(body_file)
        case = case_by_id(case_id)
        user = self.user(editor, option="--editor", role="editor")
        edited = review_edit(
            case=case,
            expected_operation_id=expected_operation_id,
            body=body,
            source_versions=source_versions or None,
            editor=user,
            channel=Channel.COMMAND,
        )
        report(self, "edit", edited, case_id)

    def _read(self, body_file: str) -> str:
        try:
            raw = sys.stdin.buffer.read() if body_file == "-" else Path(body_file).read_bytes()
        except OSError as exc:
            raise InvalidInput(f"edit: cannot read {shown(body_file)}: {exc.strerror}") from None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"edit: {shown(body_file)} is not UTF-8 text (byte {exc.start})") from None
