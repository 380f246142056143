from core.commandline import BulkCommand
from core.errors import InvalidInput
from core.progress import CommandProgress
from core.text import shown
from reviews.models import Channel
from workflow.sources import Follow, source_version_add, source_version_plan

VERB = {Follow.MOVED: "move", Follow.MARKED: "mark"}


class Command(BulkCommand):
    help = (
        "Add a version to a source document: `python manage.py add_source_version SOURCE_ID VERSION "
        "--text-file F [--apply] [--actor USERNAME] [--json] [--batch-size N]`. F holds the version's text "
        "(UTF-8; - reads stdin). Without --apply it is a dry run: it prints which undecided cases would move "
        "and which would be marked, and writes nothing. With --apply the version is added (the same number "
        "with the same text is the one already there; with other text it is refused) and every undecided "
        "current proposal citing an older version of the source follows: moved to an evidence-change "
        "proposal on the new version when each of its quotations and licensed clauses is still in it "
        "verbatim, else marked evidence changed (its approval is refused until a re-draft or an edit). "
        "Decided cases are untouched. The actor (default $DECISIONFLOW_REVIEWER) needs the intake permission "
        "(the Pipeline group). Safe to run again: a second run does nothing, and a run that was killed is "
        "finished by the next. On a terminal it shows a progress bar; with --json or when not on a terminal, "
        "one summary line. Exit codes: 0 ok; 1 error (nothing written); 6 some cases were busy and were "
        "left as they were: run again."
    )

    def add_arguments(self, parser):
        parser.add_argument("source_id", metavar="SOURCE_ID", help="The source, e.g. HOLD-7.")
        # A positional argument: Django's commands all take --version (theirs).
        parser.add_argument("number", metavar="VERSION", type=int, help="The new version's number, e.g. 5.")
        parser.add_argument("--text-file", required=True, metavar="F", help="The version's text (- reads stdin).")
        parser.add_argument(
            "--actor",
            metavar="USERNAME",
            help="Who adds it (needs the intake permission); default $DECISIONFLOW_REVIEWER.",
        )
        self.add_bulk_arguments(parser)

    def _read(self, name: str) -> str:
        try:
            return self.read_input(name).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"text: {shown(name)} is not UTF-8; nothing was written", field="text") from None

    def handle(self, *args, source_id, number, text_file, apply, actor, as_json, batch_size, **options):
        text = self._read(text_file)
        user = self.user(actor, option="--actor", role="actor")
        interactive = self.interactive(as_json)
        call = {"source_id": source_id, "version": number, "text": text, "actor": user, "channel": Channel.COMMAND}
        if apply and interactive:
            # The bulk commands' one progress bar (core/progress.py): done, rate, time left.
            total = source_version_plan(source_id=source_id, version=number, text=text).total
            with CommandProgress(self.stdout, label="following", total=total, bar=True) as bar:
                result = source_version_add(
                    **call, apply=True, batch=batch_size, progress=lambda r: bar.advance(r.done - bar.done)
                )
        else:
            result = source_version_add(**call, apply=apply, batch=batch_size)
        self._report(result, as_json=as_json, interactive=interactive)
        self.fail_if_left(result.failed)

    def _report(self, result, *, as_json: bool, interactive: bool):
        def row(r):
            why = f": {r.reason}" if r.reason else ""
            return f"would {VERB[r.action]} {shown(r.case_id)} op={r.operation_id[:19]} (cites v{r.from_version}){why}"

        summary, plan = result.summary(), result.plan
        self.report(
            result,
            as_json=as_json,
            interactive=interactive,
            row=row,
            counts=f"source={shown(summary['source_id'])} version={summary['version']} "
            f"version_created={summary['version_created']} to_move={plan.to_move} to_mark={plan.to_mark} "
            f"moved={result.moved} marked={result.marked} failed={len(result.failed)}",
        )
