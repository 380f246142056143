import json
import sys
from pathlib import Path

from cases.services import parse_policy_file
from core.commandline import EXIT_BUSY, EXIT_ERROR, WorkflowCommand
from core.errors import CaseBusy, InvalidInput
from core.progress import CommandProgress
from core.text import shown
from reviews.models import Channel
from workflow.publishing import policy_publish, publish_plan


class Command(WorkflowCommand):
    help = (
        "Publish a new version of a policy: `python manage.py publish_policy FILE [--apply] [--publisher USERNAME] "
        '[--json]`. FILE is JSON {"name", "label", "parameters"} (- reads stdin). Without --apply it is a '
        "dry run: it prints what it would supersede and writes nothing. With --apply every undecided current "
        "proposal under another version of the policy is superseded by a `policy_change` proposal whose review "
        "is begun; decided proposals are untouched. The publisher (default $DECISIONFLOW_REVIEWER) needs the "
        "publish policy permission. Safe to run again: the same file twice does nothing the second time, and a "
        "run that was killed is finished by the next. On a terminal it shows a progress bar; with --json or "
        "when not on a terminal (cron), one summary line. Exit codes: 0 ok; 1 error (nothing written); 6 some "
        "cases were busy and were left as they were: run again."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", metavar="FILE", help="The policy version, JSON (- reads stdin).")
        parser.add_argument("--apply", action="store_true", help="Act; without it, a dry run.")
        parser.add_argument(
            "--publisher",
            metavar="USERNAME",
            help="Who publishes (needs the permission); default $DECISIONFLOW_REVIEWER.",
        )
        parser.add_argument(
            "--json", dest="as_json", action="store_true", help="One JSON summary line, no progress bar."
        )
        parser.add_argument("--batch-size", type=int, default=None, metavar="N", help="Cases read per batch.")

    def _read(self, name: str) -> dict:
        try:
            raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        except OSError as exc:
            raise InvalidInput(f"publish_policy: cannot read {shown(name)}: {exc.strerror}") from None
        return parse_policy_file(raw)

    def _interactive(self, as_json: bool) -> bool:
        stream = getattr(self.stdout, "_out", self.stdout)
        return not as_json and bool(getattr(stream, "isatty", lambda: False)())

    def handle(self, *args, file, apply, publisher, as_json, batch_size, **options):
        data = self._read(file)
        user = self.user(publisher, option="--publisher", role="publisher")
        interactive = self._interactive(as_json)
        if apply and interactive:
            result = self._with_bar(data, user, batch_size)
        else:
            result = policy_publish(data=data, publisher=user, channel=Channel.COMMAND, apply=apply, batch=batch_size)
        self._report(result, as_json=as_json, interactive=interactive)
        if result.failed:
            busy = all(isinstance(exc, CaseBusy) for _, exc in result.failed)
            self.fail(
                EXIT_BUSY if busy else EXIT_ERROR,
                f"publish_policy: {len(result.failed)} case(s) were left as they were "
                f"({shown(result.failed[0][0])}: {result.failed[0][1].message}); run again to finish",
            )

    def _with_bar(self, data, user, batch_size):
        # The bulk commands' one progress bar (core/progress.py): done, rate, time left.
        total = publish_plan(data=data).total
        with CommandProgress(self.stdout, label="publishing", total=total, bar=True) as bar:

            def advance(done, of):
                bar.advance(done - bar.done)

            return policy_publish(
                data=data, publisher=user, channel=Channel.COMMAND, apply=True, progress=advance, batch=batch_size
            )

    def _report(self, result, *, as_json: bool, interactive: bool):
        summary = result.summary()
        if as_json:
            self.stdout.write(json.dumps(summary, sort_keys=True))
            return
        plan = result.plan
        if interactive and not result.applied:
            for row in plan.sample:
                what = f"op={row.operation_id[:19]}" if row.operation_id else "no proposal yet"
                self.stdout.write(f"  would supersede {shown(row.case_id)} {what} (policy {shown(row.from_label)})")
            if plan.total > len(plan.sample):
                self.stdout.write(f"  ... and {plan.total - len(plan.sample)} more")
        mode = "applied" if result.applied else "dry run (add --apply to act)"
        self.stdout.write(
            f"publish_policy: {mode} policy={shown(plan.name)} label={shown(plan.label)} "
            f"policy_id={plan.policy_id[:19]} to_supersede={plan.to_supersede} to_move={plan.to_move} "
            f"superseded={result.superseded} moved={result.moved} failed={len(result.failed)}"
        )
