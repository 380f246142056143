"""Resume with the commit's read made ahead (on) against the commit reading for itself (off),
in one process, interleaved rounds (docs/PERFORMANCE.md, "Issue 31's two missed goals,
second pass").

    DATABASE_URL=postgres://…/<own database> DEBUG=0 SECRET_KEY=bench-only ALLOWED_HOSTS=localhost \\
        .venv/bin/python -m bench.ab_read_ahead --n 150 --rounds 8

The database must be migrated. "off" wraps ``workflow.bind.read_beside`` so that it hands
no read ahead, which is exactly the path SQLite takes: the commit step then reads for
itself, one statement more. Each round begins ``n`` fresh cases per side, then times
``decision_record`` on each: wall time (median) and this process's CPU time (mean).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=150, help="resumes per round and side")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "decisionflow.settings")
    import django

    django.setup()
    import workflow.bind as bind
    from bench.data import make_cases
    from bench.side_by_side import authenticated_reviewer, decide
    from workflow.begin import review_begin

    ahead = bind.read_beside

    def without(sql, params, operation_id):
        row, _ = ahead(sql, params, operation_id)
        return row, None

    reviewer = authenticated_reviewer()

    def begun(n: int, prefix: str) -> list[tuple]:
        return [
            (c, review_begin(case=c, actor=None).operation_id) for c in make_cases(n, prefix=prefix, proposals=False)
        ]

    for case, op in begun(10, f"ABW{os.getpid()}"):  # warm-up: caches, prepared statements
        decide(case, op, reviewer)
    wall: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
            cases = begun(args.n, f"AB{side}{r}-{os.getpid()}")
            bind.read_beside = ahead if side == "on" else without
            ms, cs = [], []
            for case, op in cases:
                t, u = time.perf_counter(), time.process_time()
                decide(case, op, reviewer)
                ms.append((time.perf_counter() - t) * 1000)
                cs.append((time.process_time() - u) * 1000)
            wall[side].append(statistics.median(ms))
            cpu[side].append(statistics.mean(cs))
    bind.read_beside = ahead
    for name, got in (("wall", wall), ("CPU", cpu)):
        ratios = [a / b for a, b in zip(got["on"], got["off"], strict=True)]
        print(
            f"{name}: on ÷ off {statistics.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f}); "
            f"on {statistics.median(got['on']):.2f} ms, off {statistics.median(got['off']):.2f} ms"
        )
    print(f"load average after: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
