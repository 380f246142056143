import json

from core.commandline import EXIT_BUSY, EXIT_ERROR, WorkflowCommand
from core.progress import CommandProgress, bar_wanted
from core.text import shown
from engine.messages import short_fingerprint
from workflow.drain import DEFAULT_BATCH_SIZE, DrainItem, drain_candidates, workflow_drain


class Command(WorkflowCommand):
    help = (
        "Run once after deploying a new workflow version (docs/DEPLOY.md): "
        "`python manage.py drain_workflow --from review-v1` shows what it would do, and "
        "`python manage.py drain_workflow --from review-v1 --apply` does it. It re-begins every pending "
        "review recorded by that workflow version (without --from: by any version or graph fingerprint "
        "other than this code's) on the current one: a new pause checkpoint, the same operation, so "
        "what the reviewer saw stays valid. Each case is its own transaction under the per-case lock, in "
        "batches of --batch-size; run it again after an interruption and it finishes the job (a case "
        "already moved is not touched again). Without --apply: one line per pending review it would "
        "move, `drain_workflow: would re-begin case=<id> op=<op> from=<version>/<fingerprint>`. Every run "
        "ends with one summary line (with --json, every line is a JSON object). On a terminal --apply "
        "shows a progress bar (cases done, rate, time left). Exit codes: 0 ok (nothing to drain "
        "included); 1 usage error or a case that could not be re-begun; 6 only busy cases were left "
        "(run it again)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--from",
            dest="from_version",
            metavar="VERSION",
            help="Only pending reviews recorded by this workflow version, e.g. review-v1.",
        )
        parser.add_argument("--apply", action="store_true", help="Re-begin; without it, only report (dry run).")
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"Cases per batch (default {DEFAULT_BATCH_SIZE}).",
        )
        parser.add_argument("--json", dest="as_json", action="store_true", help="One JSON object per line.")

    def handle(self, *args, from_version, apply, batch_size, as_json, **options):
        self.as_json = as_json
        bar = apply and bar_wanted(self.stdout, as_json=as_json)
        total = drain_candidates(from_version=from_version).count() if bar else None
        with CommandProgress(self.stdout, label="drain_workflow", total=total, bar=bar) as progress:
            result = workflow_drain(
                from_version=from_version,
                apply=apply,
                batch_size=batch_size,
                report=lambda item: progress.write(self.line(item)),
                progress=progress.advance,
            )
        target = f"{result.to_version} (graph {short_fingerprint(result.to_fingerprint)})"
        seconds = round(progress.elapsed, 3)
        if as_json:
            summary = {
                "summary": "drain_workflow",
                "applied": result.applied,
                "candidates": result.candidates,
                "rebegun": result.rebegun,
                "unchanged": result.unchanged,
                "refused": len(result.refused),
                "batches": result.batches,
                "to_version": result.to_version,
                "to_fingerprint": result.to_fingerprint,
                "seconds": seconds,
            }
            self.stdout.write(json.dumps(summary))
        elif result.applied:
            self.stdout.write(
                f"drain_workflow: re-begun {result.rebegun} of {result.candidates} pending review(s) on {target} "
                f"in {result.batches} batch(es), {seconds:.2f} s ({progress.rate()}); {result.unchanged} already "
                f"moved, {len(result.refused)} not re-begun"
            )
        else:
            self.stdout.write(
                f"drain_workflow: dry run: {result.candidates} pending review(s) would be re-begun on {target}. "
                "Nothing was changed: add --apply"
            )
        if result.refused:
            self.fail(
                EXIT_BUSY if result.busy_only else EXIT_ERROR,
                f"drain_workflow: {len(result.refused)} pending review(s) could not be re-begun (listed above); "
                "run it again once they are fixed or no longer busy",
            )

    def line(self, item: DrainItem) -> str:
        if self.as_json:
            return json.dumps(item.as_dict(), ensure_ascii=False)
        source = f"{shown(item.from_version)}/{item.from_fingerprint}"
        if item.outcome == "would":
            return (
                f"drain_workflow: would re-begin case={shown(item.case_id)} op={shown(item.operation_id)} from={source}"
            )
        return (
            f"drain_workflow: not re-begun case={shown(item.case_id)} op={shown(item.operation_id)} from={source}: "
            f"{item.detail}"
        )
