from pathlib import Path

from django.core.management.base import CommandError

from cases.services import case_import, parse_case_file
from core.commandline import ProjectCommand
from core.errors import DecisionflowError
from core.progress import CommandProgress, bar_wanted
from core.text import one_line, shown


class Command(ProjectCommand):
    help = (
        "Import a case from the pipeline's JSON file: "
        "`python manage.py load_case FILE.json [FILE.json ...]`. Identical content again changes nothing; "
        "a file that changes an existing case, or a malformed one, is refused and nothing is written for it. "
        "Given several files, each is imported on its own (a refused file does not stop the others; the "
        "command then exits with the first refusal's code), with a progress bar on a terminal (files done, "
        "rate, time left) and, elsewhere, one summary line at the end: "
        "`load_case: summary: <n> file(s) in <s> s (<rate>): <i> imported, <u> unchanged, <r> refused`."
    )

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="+", metavar="file", help="Path(s) to case JSON files.")

    def handle(self, *args, files, **options):
        if len(files) == 1:
            # One file: exactly the one line (or the one error) it always printed.
            self.stdout.write(self.load(files[0]))
            return
        counts = {"imported": 0, "unchanged": 0, "refused": 0}
        first_error: CommandError | None = None
        bar = bar_wanted(self.stdout)
        with CommandProgress(self.stdout, label="load_case", total=len(files), bar=bar, unit="files") as progress:
            for file in files:
                try:
                    line = self.load(file)
                except CommandError as exc:
                    counts["refused"] += 1
                    first_error = first_error or exc
                    self.stderr.write(str(exc))
                else:
                    counts[line.rsplit(" ", 1)[-1]] += 1
                    progress.write(line)
                progress.advance()
        self.stdout.write(
            f"load_case: summary: {len(files)} file(s) in {progress.elapsed:.2f} s ({progress.rate()}): "
            + ", ".join(f"{n} {what}" for what, n in counts.items())
        )
        if first_error is not None:
            raise CommandError(
                f"load_case: {counts['refused']} of {len(files)} file(s) refused; the others were imported or unchanged",
                returncode=first_error.returncode,
            )

    def load(self, file: str) -> str:
        """Import one file; its status line, or CommandError (nothing written for this file)."""
        try:
            raw = Path(file).read_bytes()
        except OSError as exc:
            raise CommandError(one_line(f"load_case: cannot read {shown(file)}: {exc.strerror}")) from None
        try:
            result = case_import(data=parse_case_file(raw))
        except DecisionflowError as exc:
            raise CommandError(one_line(f"load_case: {shown(file)}: {exc.message}"), returncode=exc.exit_code) from None
        verb = "imported" if result.created else "unchanged"
        return f"load_case: case={shown(result.case.case_id)} {verb}"
