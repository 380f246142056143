from django.utils import timezone

from cases.idempotency import keys_prune
from core.commandline import WorkflowCommand
from core.progress import CommandProgress, bar_wanted
from reviews.retention import DEFAULT_BATCH_SIZE, checkpoints_prune, parse_window, prunable_checkpoints


class Command(WorkflowCommand):
    help = (
        "Delete the workflow checkpoints that recovery no longer needs: taken before the retention "
        "window, and not the pause of a review that is still pending or was decided or superseded "
        "within the window. A pending review's pause checkpoint is always kept. Without --apply it is "
        "a dry run: it prints what would go and writes nothing. With --apply it deletes in batches "
        "of --batch-size rows, each its own short transaction, under the prune_checkpoints cron lock; "
        "run it again after an interruption and it finishes the job. Run from cron, e.g. nightly: "
        "`17 3 * * * cd /srv/decisionflow && .venv/bin/python manage.py prune_checkpoints "
        "--older-than 30d --apply >> var/log/prune_checkpoints.log 2>&1`. "
        "Exit codes: 0 ok (nothing to prune included); 1 usage error, or another prune_checkpoints run "
        "holds the lock. On a terminal, --apply shows a progress bar (checkpoints deleted, rate, time "
        "left) above the batch lines; elsewhere the output is the batch lines and the summary line only. "
        "It also deletes the pipeline's Idempotency-Keys claimed more than DECISIONFLOW_IDEMPOTENCY_KEEP "
        "ago (24h by default; docs/INTAKE.md), whatever --older-than says."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="WINDOW",
            help="The retention window: 30d, 12h, 1.5d or 90m (a bare number is days).",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"Rows deleted per transaction (default {DEFAULT_BATCH_SIZE}).",
        )
        parser.add_argument("--apply", action="store_true", help="Delete; without it, only report (dry run).")

    def handle(self, *args, older_than, batch_size, apply, **options):
        window = parse_window(older_than)
        now = timezone.now()
        bar = apply and bar_wanted(self.stdout)
        # The bar's total, counted at the same cutoff the prune uses (a terminal only).
        total = prunable_checkpoints(now - window).count() if bar else None
        with CommandProgress(self.stdout, label="prune_checkpoints", total=total, bar=bar, unit="checkpoints") as shown:

            def progress(batch: int, deleted: int) -> None:
                shown.write(f"prune_checkpoints: batch {batch} deleted {deleted}")
                shown.advance(deleted)

            result = checkpoints_prune(
                older_than=window, batch_size=batch_size, apply=apply, now=now, progress=progress
            )
        cutoff = result.cutoff.isoformat(timespec="seconds")
        kept = f"{result.kept_for_pending} kept as the pause of a pending review"
        # The pipeline's keys have their own period; said in the same one summary line.
        keys, key_cutoff = keys_prune(apply=apply, now=now)
        claimed = f"{keys} idempotency key(s) claimed before {key_cutoff.isoformat(timespec='seconds')}"
        if result.applied:
            self.stdout.write(
                f"prune_checkpoints: deleted {result.rows} checkpoint(s) taken before {cutoff} "
                f"in {result.batches} batch(es); {kept}; deleted {claimed}"
            )
        else:
            self.stdout.write(
                f"prune_checkpoints: dry run: {result.rows} checkpoint(s) taken before {cutoff} would be deleted "
                f"({result.payload_chars} payload characters); {kept}; {claimed} would be deleted. "
                "Nothing was deleted: add --apply"
            )
