from cases.services import parse_policy_file
from core.commandline import BulkCommand
from core.progress import CommandProgress
from core.text import shown
from reviews.models import Channel
from workflow.publishing import policy_publish, publish_plan


class Command(BulkCommand):
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
        parser.add_argument(
            "--publisher",
            metavar="USERNAME",
            help="Who publishes (needs the permission); default $DECISIONFLOW_REVIEWER.",
        )
        self.add_bulk_arguments(parser)

    def _read(self, name: str) -> dict:
        return parse_policy_file(self.read_input(name))

    def handle(self, *args, file, apply, publisher, as_json, batch_size, **options):
        data = self._read(file)
        user = self.user(publisher, option="--publisher", role="publisher")
        interactive = self.interactive(as_json)
        if apply and interactive:
            result = self._with_bar(data, user, batch_size)
        else:
            result = policy_publish(data=data, publisher=user, channel=Channel.COMMAND, apply=apply, batch=batch_size)
        self._report(result, as_json=as_json, interactive=interactive)
        self.fail_if_left(result.failed)

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
        def row(r):
            what = f"op={r.operation_id[:19]}" if r.operation_id else "no proposal yet"
            return f"would supersede {shown(r.case_id)} {what} (policy {shown(r.from_label)})"

        plan = result.plan
        self.report(
            result,
            as_json=as_json,
            interactive=interactive,
            row=row,
            counts=f"policy={shown(plan.name)} label={shown(plan.label)} policy_id={plan.policy_id[:19]} "
            f"to_supersede={plan.to_supersede} to_move={plan.to_move} superseded={result.superseded} "
            f"moved={result.moved} failed={len(result.failed)}",
        )
