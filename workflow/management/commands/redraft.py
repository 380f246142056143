import json
import sys
from pathlib import Path

from cases.selectors import case_by_id
from core import identity
from core.commandline import WorkflowCommand
from core.errors import InvalidInput
from core.text import shown
from reviews.models import Channel
from workflow.management.commands.edit import report
from workflow.redraft import case_redraft

FIELDS = ("draft", "selected_evidence", "findings", "operation_id")


class Command(WorkflowCommand):
    help = (
        "Re-draft a case for the pipeline: its new draft, selected evidence or findings supersede the current "
        "proposal, and the review of the new one is begun: `python manage.py redraft CASE_ID "
        "--expected-operation-id OP --file FILE [--user USERNAME] [--no-begin]`. FILE (- for stdin) is a JSON "
        'object with any of "draft", "selected_evidence", "findings" (as in a case file) and "operation_id" (the '
        "identity you computed for the new proposal), the same body as POST /api/cases/{id}/drafts. The user "
        "defaults to $DECISIONFLOW_REVIEWER and needs the intake permission (the Pipeline group). Prints "
        "`redraft: op=<new operation id> origin=pipeline_redraft`, then the `begin:` line of the new pause; "
        "`redraft: op=<op> unchanged` when the current proposal is already what FILE asks for. Exit codes: 0 ok; "
        "1 error (bad input, an operation_id not ours, no permission), nothing written; 4 stale (OP is not the "
        "current proposal) or already decided, nothing written; 6 the case is busy, try again; 7 saved and "
        "current but its review was not begun (run `begin`)."
    )

    def add_arguments(self, parser):
        parser.add_argument("case_id", metavar="CASE_ID", help="The case's external ID, e.g. T-1042.")
        parser.add_argument(
            "--expected-operation-id",
            required=True,
            metavar="OP",
            help="The proposal the re-draft replaces; anything but the current one is refused as stale.",
        )
        parser.add_argument("--file", required=True, metavar="FILE", help="The re-draft, JSON (- reads stdin).")
        parser.add_argument("--user", metavar="USERNAME", help="The pipeline user; default $DECISIONFLOW_REVIEWER.")
        parser.add_argument("--no-begin", action="store_true", help="Save the re-draft without beginning its review.")

    def handle(self, *args, case_id, expected_operation_id, file, user, no_begin, **options):
        data = self._read(file)
        case = case_by_id(case_id)
        actor = self.user(user, option="--user", role="pipeline user")
        redrafted = case_redraft(
            case=case,
            expected_operation_id=expected_operation_id,
            draft=data.get("draft"),
            selected_evidence=data.get("selected_evidence"),
            findings=data.get("findings"),
            operation_id=data.get("operation_id"),
            begin=not no_begin,
            actor=actor,
            channel=Channel.COMMAND,
        )
        report(self, "redraft", redrafted, case_id)

    def _read(self, file: str) -> dict:
        try:
            raw = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
        except OSError as exc:
            raise InvalidInput(f"redraft: cannot read {shown(file)}: {exc.strerror}") from None
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise InvalidInput(f"redraft: {shown(file)} is not JSON in UTF-8 ({type(exc).__name__})") from None
        if not isinstance(data, dict):
            raise InvalidInput(f"redraft: {shown(file)} must hold a JSON object")
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise InvalidInput(f"redraft: {shown(unknown[0])} is not a field of a re-draft ({', '.join(FIELDS)})")
        op = data.get("operation_id")
        if op is not None and not (isinstance(op, str) and identity.is_operation_id(op)):
            raise InvalidInput("redraft: operation_id must be op-v1- and 64 lowercase hex digits", field="operation_id")
        if data.get("draft") is not None and not isinstance(data["draft"], str):
            raise InvalidInput("redraft: draft must be a string", field="draft")
        return data
