"""One benchmark process against one database: ``python -m bench.inproc --out results.json``.

DATABASE_URL must name the benchmark's own, migrated database (bench.run creates it). The
process-level measures (interpreter start, the reconcile command) are in bench.run; the
rest runs here so that interpreter start-up is excluded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

# Sizes: "full" for `make bench`; "smoke" proves the code still runs (tests/bench).
SCALES = {
    "full": {
        "runs": 5,
        "identity_runs": 9,
        "identity_number": 3000,
        "marker_sizes": (10_000, 100_000, 250_000),
        # Long enough for steady state: on these VMs a loop right after an idle moment runs up
        # to twice as fast for its first ~50 ms (docs/PERFORMANCE.md, "Short runs"), which
        # a 300-operation raw loop fits in and ours does not.
        "commit_n": 1000,
        "concurrent_per_worker": 200,
        "workers": 8,
        "workflow_n": 20,
        # Resumes per round against the raw floor (and as many floor operations): the whole
        # measure, set-up included, took 22 s on these 2 cores at a load average of 5.
        "floor_n": 100,
        "storage_n": 50,
        "admin_requests": 15,
        "retention_n": 50,
        "retention_pending": 5,
    },
    "smoke": {
        "runs": 1,
        "identity_runs": 1,
        "identity_number": 50,
        "marker_sizes": (1_000, 2_000),
        "commit_n": 2,
        "concurrent_per_worker": 1,
        "workers": 2,
        "workflow_n": 1,
        "floor_n": 2,
        "storage_n": 1,
        "admin_requests": 1,
        "retention_n": 2,
        "retention_pending": 1,
    },
}


def run_suite(*, scale: dict, only: set[str] | None = None, log=print) -> list[dict]:
    """Run every in-process measure that applies to the configured database."""
    from django.db import connection

    from bench import admin_pages, measures

    vendor = connection.vendor
    pg = vendor == "postgresql"
    runs = scale["runs"]
    plan = []
    if pg:
        plan.append(
            ("identity", lambda: measures.bench_identity(runs=scale["identity_runs"], number=scale["identity_number"]))
        )
        # Pure CPU: measured once, beside identity.
        plan.append(("markers", lambda: measures.bench_markers(runs=runs, sizes=scale["marker_sizes"])))
    plan.append(("commit", lambda: list(measures.bench_commit(runs=runs, n=scale["commit_n"], vendor=vendor))))
    if pg:
        plan.append(
            (
                "concurrent",
                lambda: [
                    measures.bench_commit_concurrent(
                        runs=runs, n_per_worker=scale["concurrent_per_worker"], workers=scale["workers"]
                    )
                ],
            )
        )
    plan.append(("begin", lambda: [measures.bench_begin(runs=runs, n=scale["workflow_n"], vendor=vendor)]))
    if pg:
        plan.append(("resume", lambda: [measures.bench_resume(runs=runs, n=scale["workflow_n"], vendor=vendor)]))
        plan.append(("resume_floor", lambda: [measures.bench_resume_floor(runs=runs, n=scale["floor_n"])]))
        plan.append(("storage", lambda: [measures.bench_storage(n=scale["storage_n"], vendor=vendor)]))
    if pg and only and "pages" in only:
        # Only on request: bench.run runs it on its 10,000- and 1,000,000-case databases
        # (it replaced "admin", the same pages over one 100,000-case database).
        plan.append(("pages", lambda: [admin_pages.bench_pages(requests=scale["admin_requests"])]))
    if only and "retention" in only:
        # Only on request: bench.run gives it a database of its own (it ages and prunes rows).
        from bench.retention import bench_retention

        plan.append(
            (
                "retention",
                lambda: [bench_retention(n=scale["retention_n"], pending=scale["retention_pending"], vendor=vendor)],
            )
        )
    if pg and only and "reconcile_service" in only:
        # Only on request: bench.run points it at the million-operation database.
        plan.append(("reconcile_service", lambda: [measures.bench_reconcile_service(runs=min(runs, 3))]))
    out = []
    for name, fn in plan:
        if only and name not in only:
            continue
        t = time.perf_counter()
        log(f"bench {name} ({vendor}) ...")
        try:
            for res in fn():
                res.setdefault("vendor", vendor)
                out.append(res)
        except Exception:
            out.append(
                {
                    "key": f"{name}_{vendor}",
                    "kind": "error",
                    "bench": name,
                    "vendor": vendor,
                    "error": traceback.format_exc(limit=8),
                }
            )
            log(f"bench {name} ({vendor}): FAILED\n{traceback.format_exc(limit=8)}")
        log(f"bench {name} ({vendor}) done in {time.perf_counter() - t:.1f} s")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument(
        "--only", default="", help="comma-separated subset: identity,markers,commit,concurrent,begin,..."
    )
    parser.add_argument("--requests", type=int, help="pages: timed requests per page (default: the scale's)")
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL"):
        parser.error("DATABASE_URL must name the benchmark database")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "decisionflow.settings")
    import django

    django.setup()
    scale = dict(SCALES[args.scale])
    if args.requests:
        scale["admin_requests"] = args.requests
    from core.observability import events_off_stderr

    with events_off_stderr():  # the decision events go to DECISIONFLOW_EVENT_LOG_FILE (bench/run.py)
        results = run_suite(
            scale=scale,
            only=set(filter(None, args.only.split(","))) or None,
            log=lambda m: print(m, file=sys.stderr, flush=True),
        )
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
