from pathlib import Path

from django.core.management.base import CommandError

from cases.services import case_import, parse_case_file
from decisionflow.core.commandline import ProjectCommand
from decisionflow.core.errors import DecisionflowError
from decisionflow.core.text import one_line, shown


class Command(ProjectCommand):
    help = (
        "Import a case from the pipeline's JSON file: "
        "`python manage.py load_case FILE.json`. Identical content again changes nothing; "
        "a file that changes an existing case, or a malformed one, is refused and nothing is written."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="Path to the case JSON file.")

    def handle(self, *args, file, **options):
        try:
            raw = Path(file).read_bytes()
        except OSError as exc:
            raise CommandError(one_line(f"load_case: cannot read {shown(file)}: {exc.strerror}")) from None
        try:
            result = case_import(data=parse_case_file(raw))
        except DecisionflowError as exc:
            raise CommandError(one_line(f"load_case: {shown(file)}: {exc.message}"), returncode=exc.exit_code) from None
        verb = "imported" if result.created else "unchanged"
        self.stdout.write(f"load_case: case={shown(result.case.case_id)} {verb}")
