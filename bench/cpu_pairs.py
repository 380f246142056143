"""CPU per commit and per replay, ours against the raw loop: ``python -m bench.cpu_pairs``.

For a loaded, shared machine, where wall-clock ratios are noise: each side's client CPU
(``time.process_time``) plus its server backend's CPU (``/proc/<pid>/schedstat``, so the
database must run on this host), per operation, in one process against the database that
DATABASE_URL names (migrated; DEBUG=0 as bench.run sets it). Runs alternate which side goes
first. Ratio = raw CPU ÷ our CPU, as the speed goals read.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _server_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as fh:
        return int(fh.read().split()[0]) / 1e9


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=300, help="operations per run and side")
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "decisionflow.settings")
    import django

    django.setup()
    from django.db import connection

    from bench.data import bench_reviewer, make_cases, raw_connect, run_token
    from bench.measures import _commit_loop, _ops, _raw_rows, raw_commit_loop

    n, reviewer, token = args.n, bench_reviewer(), run_token()
    raw = raw_connect()
    with raw.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        raw_pid = cursor.fetchone()[0]
    raw.commit()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        our_pid = cursor.fetchone()[0]
    _commit_loop(_ops(make_cases(5, prefix=f"{token}-w", proposals=True)), reviewer, expect_replay=False)
    found: dict[str, list[dict]] = {"fresh": [], "replay": []}
    for i in range(args.runs):
        ops = _ops(make_cases(n, prefix=f"{token}-s{i}", proposals=True))
        rows = _raw_rows(make_cases(n, prefix=f"{token}-b{i}", proposals=True), reviewer.pk)
        for kind in ("fresh", "replay"):
            again = kind == "replay"
            sides = [
                ("raw", lambda rows=rows, again=again: raw_commit_loop(raw, "postgresql", rows, replay=again), raw_pid),
                ("ours", lambda ops=ops, again=again: _commit_loop(ops, reviewer, expect_replay=again), our_pid),
            ]
            if i % 2:
                sides.reverse()
            run = {}
            for side, loop, pid in sides:
                wall, client, server = time.perf_counter(), time.process_time(), _server_cpu(pid)
                loop()
                run[side] = (
                    (time.perf_counter() - wall) / n * 1e3,
                    (time.process_time() - client) / n * 1e3,
                    (_server_cpu(pid) - server) / n * 1e3,
                )
            found[kind].append(run)
    raw.close()
    for kind, runs in found.items():
        ratios = [(r["raw"][1] + r["raw"][2]) / (r["ours"][1] + r["ours"][2]) for r in runs]
        walls = [r["raw"][0] / r["ours"][0] for r in runs]

        def med(side: str, j: int, runs=runs) -> float:
            return statistics.median(r[side][j] for r in runs)

        print(
            f"{kind}: CPU ratio {statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)}); "
            f"wall ratio {statistics.median(walls):.2f}x; ms per operation, ours client {med('ours', 1):.3f} "
            f"server {med('ours', 2):.3f} wall {med('ours', 0):.3f}, raw client {med('raw', 1):.3f} "
            f"server {med('raw', 2):.3f} wall {med('raw', 0):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
