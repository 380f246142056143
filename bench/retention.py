"""Storage per case before and after checkpoint pruning (`prune_checkpoints`, reviews/retention.py).

In-process, on the benchmark's own database: ``n`` fresh cases are begun and approved
(finished), ``pending`` more are begun and left waiting. Their rows are then moved back past
the retention window (as if all this happened 40 days ago), the prune runs (``apply``), and
the storage of those cases is measured again. Only this measure's own rows are aged, so
other measures' checkpoints in the same database are never pruned.
"""

from __future__ import annotations

import time
from datetime import timedelta

from bench.data import bench_reviewer, make_cases, run_token
from bench.measures import _begin_result_op, _table_stats

WINDOW = timedelta(days=30)


def _checkpoint_stats(table: str) -> tuple[int, int, int | None]:
    stats = _table_stats()[table]
    return stats["rows"], stats["data"], stats["disk"]


def bench_retention(*, n: int, pending: int, vendor: str) -> dict:
    from django.db import connection
    from django.utils import timezone

    from reviews.models import PendingReview, WorkflowCheckpoint
    from reviews.retention import checkpoints_prune
    from workflow.begin import review_begin
    from workflow.decide import decision_record

    reviewer = bench_reviewer()
    token = run_token()
    before = _table_stats()
    cases = make_cases(n + pending, prefix=f"{token}-rt", proposals=False)
    begun = [(c, _begin_result_op(review_begin(case=c), c)) for c in cases]
    for c, op in begun[:n]:
        decision_record(case=c, operation_id=op, approved=True, reviewer=reviewer, channel="bench")
    built = _table_stats()
    mine = PendingReview.objects.filter(case__in=cases)
    pauses = list(mine.values_list("checkpoint_id", flat=True))
    then = timezone.now() - timedelta(days=40)
    WorkflowCheckpoint.objects.filter(checkpoint_id__in=pauses).update(created_at=then)
    mine.update(updated_at=then)
    t = time.perf_counter()
    pruned = checkpoints_prune(older_than=WINDOW, apply=True)
    prune_s = time.perf_counter() - t
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            # Plain VACUUM: the space is kept for reuse by new rows, not returned to the OS.
            cur.execute(f"VACUUM {WorkflowCheckpoint._meta.db_table}")
    after = _table_stats()
    kept = WorkflowCheckpoint.objects.filter(checkpoint_id__in=pauses).count()
    finished_pauses = mine.exclude(status=PendingReview.Status.PENDING).values_list("checkpoint_id", flat=True)
    finished_left = WorkflowCheckpoint.objects.filter(checkpoint_id__in=list(finished_pauses)).count()
    if kept != pending or finished_left:
        raise AssertionError(f"{kept} checkpoints of this run's cases are left; expected the {pending} pending pauses")
    total = n + pending

    def per_case(stats: dict) -> dict:
        out = {}
        for table in stats:
            out[table] = {
                k: (None if stats[table][k] is None else (stats[table][k] - before[table][k]) / total)
                for k in ("rows", "data", "disk")
            }
        return out

    def totals(per: dict) -> dict:
        disk = [v["disk"] for v in per.values()]
        return {
            "rows": sum(v["rows"] for v in per.values()),
            "data": sum(v["data"] for v in per.values()),
            "disk": None if None in disk else sum(disk),
        }

    ck = WorkflowCheckpoint._meta.db_table
    per_before, per_after = per_case(built), per_case(after)
    return {
        "key": f"retention_{vendor}",
        "kind": "retention",
        "vendor": vendor,
        "finished": n,
        "pending": pending,
        "deleted": pruned.rows,
        "finished_checkpoints_left": finished_left,
        "batches": pruned.batches,
        "prune_s": prune_s,
        "checkpoint_table": ck,
        "checkpoint_before": per_before[ck],
        "checkpoint_after": per_after[ck],
        "before": totals(per_before),
        "after": totals(per_after),
    }
