"""The engine's bridge to the caller's thread: the driver against asgiref, side by side.

    DEBUG=1 .venv/bin/python -m bench.driver [--scale full|smoke] [--only sqlite,postgresql]

A workflow run is async (agent-framework) and its steps' ORM work is sync. The same code
runs under each bridge, swapped in at the modules that cross:

- ``driver``: ``engine.driver.run_on_caller`` and ``on_caller`` (the loop runs on the
  caller's thread, and the ORM work between its iterations);
- ``asgiref``: ``async_to_sync`` and ``sync_to_async(thread_sensitive=True)`` (a new thread
  and event loop per run; each ORM call hops back to the caller's thread and waits there);
- ``asyncio.run``: the engine's own API with the ORM called directly on the loop's thread,
  which Django refuses (``SynchronousOnlyOperation``) unless ``DJANGO_ALLOW_ASYNC_UNSAFE``
  turns its async-safety check off for the whole process; and even then Django gives the
  loop's context a connection of its own, outside the caller's transaction and locks. Both
  are checked (``asyncio_run_probe``); it is not timed, as it cannot run a begin.

Timed in one process, the two bridges taking turns op by op, each on cases of its own: a
run with one ORM call, a run with ten (their difference is the cost per crossing),
``review_begin`` on a fresh case, and ``decision_record`` (resume + approve + commit) on a
begun case, in wall time and in this process's CPU time (the latter hardly moves with the
machine's load). A round's figure is its median per op; the report gives the median and
range of the rounds, and of the per-round ratios asgiref ÷ driver. Each
database is its own, migrated first: a temporary SQLite file (in /dev/shm), and on PostgreSQL
(BENCH_POSTGRES_URL, default postgres://postgres@127.0.0.1:5432) ``decisionflow_bench_driver``,
dropped and recreated. Nothing here reads or writes a test database.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.env import PY, ROOT, env_for
from bench.stats import summary

SCALES = {
    "full": {"rounds": 7, "n": 40, "crossings": 200},
    "smoke": {"rounds": 1, "n": 1, "crossings": 2},
}
BRIDGES = ("driver", "asgiref")  # timed; asyncio.run is only probed (asyncio_run_probe)
MEASURES = ("run_1", "run_10", "begin", "resume")
CPU = tuple(f"{m}_cpu" for m in MEASURES)
# Every place a workflow run starts or one of its steps crosses to the ORM: begin's run, the
# answered run (stepped by its host, ``hosted``), and the steps' crossings.
RUN_SITES = ("workflow.begin",)
HOST_SITES = ("workflow.answer",)
CALL_SITES = ("engine.graph", "engine.checkpoints")
UNSAFE = "DJANGO_ALLOW_ASYNC_UNSAFE"


# --- the bridges ---------------------------------------------------------------------------


def _asgiref_run(coroutine_fn, /, *args, **kwargs):
    from asgiref.sync import async_to_sync

    return async_to_sync(coroutine_fn)(*args, **kwargs)


async def _asgiref_call(fn, /, *args, **kwargs):
    from asgiref.sync import sync_to_async

    return await sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)


def _asyncio_run(coroutine_fn, /, *args, **kwargs):
    return asyncio.run(coroutine_fn(*args, **kwargs))


async def _direct_call(fn, /, *args, **kwargs):
    return fn(*args, **kwargs)


class _RanWhole:
    """A bridge's run in ``driver.hosted``'s place: run whole as its block begins, every call
    made by the bridge itself, so its host is handed none."""

    def __init__(self, result):
        self._result = result

    def next_call(self):
        return None

    def finish(self):
        return self._result


def _hosting(run: Callable) -> Callable:
    @contextlib.contextmanager
    def hosted(coroutine_fn, /, *args, **kwargs):
        yield _RanWhole(run(coroutine_fn, *args, **kwargs))

    return hosted


def _bridge(name: str) -> tuple[Callable, Callable, Callable]:
    if name == "driver":
        from engine.driver import hosted, on_caller, run_on_caller

        return run_on_caller, on_caller, hosted
    if name == "asgiref":
        return _asgiref_run, _asgiref_call, _hosting(_asgiref_run)
    return _asyncio_run, _direct_call, _hosting(_asyncio_run)


@contextlib.contextmanager
def bridged(name: str, *, unsafe: bool = True) -> Iterator[tuple[Callable, Callable]]:
    """The product's crossing points use bridge ``name`` inside this block."""
    run, call, host = _bridge(name)
    patched = [(importlib.import_module(m), "run_on_caller", run) for m in RUN_SITES]
    patched += [(importlib.import_module(m), "hosted", host) for m in HOST_SITES]
    patched += [(importlib.import_module(m), "on_caller", call) for m in CALL_SITES]
    saved = [(module, attr, getattr(module, attr)) for module, attr, _ in patched]
    flag = os.environ.get(UNSAFE)
    try:
        for module, attr, value in patched:
            setattr(module, attr, value)
        if name == "asyncio.run" and unsafe:
            os.environ[UNSAFE] = "1"
        yield run, call
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)
        if flag is None:
            os.environ.pop(UNSAFE, None)
        else:
            os.environ[UNSAFE] = flag


def asyncio_run_probe() -> dict:
    """What becomes of the engine's own API with the ORM called on the loop's thread: Django
    refuses it, and with its check off the ORM work runs on another connection than the
    caller's (Django keeps a connection per async context), outside the caller's transaction
    and blocked by the caller's own locks. So it is checked, not timed."""
    from django.core.exceptions import SynchronousOnlyOperation
    from django.db import connection

    def loops_connection():
        connection.ensure_connection()
        try:
            return id(connection.connection)
        finally:
            connection.close()  # the loop context's own connection; the caller's stays open

    async def ask():
        return await _direct_call(loops_connection)

    async def one_query():
        return await _direct_call(connection.ensure_connection)

    connection.ensure_connection()
    callers = id(connection.connection)
    with bridged("asyncio.run", unsafe=False) as (run, _):
        try:
            run(one_query)
            refused = "accepted"
        except SynchronousOnlyOperation as exc:
            refused = f"SynchronousOnlyOperation: {exc}"
    with bridged("asyncio.run") as (run, _):
        loops = run(ask)
    return {"check_on": refused, "check_off_uses_callers_connection": loops == callers}


# --- the measures ----------------------------------------------------------------------------


def _interleaved(op: Callable[[Callable, Callable, int], object], n: int) -> dict[str, tuple[float, float]]:
    """``op(run, call, slot)`` ``n`` times under each bridge, the bridges taking turns op by op
    (so both meet the same machine load); each bridge's median ms per op, of wall time and of
    this process's CPU time (all its threads). ``slot`` numbers the op among all of them
    (``len(BRIDGES) * n``), for ops that each need a case of their own."""
    wall: dict[str, list[float]] = {b: [] for b in BRIDGES}
    cpu: dict[str, list[float]] = {b: [] for b in BRIDGES}
    gc.collect()
    for i in range(n):
        for bridge in BRIDGES if i % 2 == 0 else BRIDGES[::-1]:
            with bridged(bridge) as (run, call):
                t, c = time.perf_counter(), time.process_time()
                op(run, call, len(BRIDGES) * i + BRIDGES.index(bridge))
                wall[bridge].append(time.perf_counter() - t)
                cpu[bridge].append(time.process_time() - c)
    return {b: (statistics.median(wall[b]) * 1000, statistics.median(cpu[b]) * 1000) for b in BRIDGES}


def bench_bridges(*, rounds: int, n: int, crossings: int, log=print) -> dict:
    """Every measure, ``rounds`` rounds; in each, the bridges take turns op by op."""
    from django.db import connection

    from bench.data import bench_reviewer, make_cases, run_token
    from bench.measures import _begin_result_op
    from cases.models import Case
    from workflow.begin import review_begin
    from workflow.decide import decision_record

    vendor = connection.vendor
    load_before = os.getloadavg()[0]
    reviewer = bench_reviewer()
    token = run_token()
    values: dict[str, dict[str, list[float]]] = {b: {m: [] for m in MEASURES + CPU} for b in BRIDGES}

    async def orm_calls(call, k):
        for _ in range(k):
            await call(Case.objects.exists)

    def one_round(label: str, n: int, crossings: int) -> dict[str, dict[str, tuple[float, float]]]:
        fresh = make_cases(len(BRIDGES) * n, prefix=f"{token}-{label}b", proposals=False)
        begun = [
            (c, _begin_result_op(review_begin(case=c), c))
            for c in make_cases(len(BRIDGES) * n, prefix=f"{token}-{label}r", proposals=False)
        ]

        def begin(run, call, slot):
            review_begin(case=fresh[slot])

        def resume(run, call, slot):
            case, op = begun[slot]
            decision_record(case=case, operation_id=op, approved=True, reviewer=reviewer, channel="bench")

        return {
            "run_1": _interleaved(lambda run, call, slot: run(orm_calls, call, 1), crossings),
            "run_10": _interleaved(lambda run, call, slot: run(orm_calls, call, 10), crossings),
            "begin": _interleaved(begin, n),
            "resume": _interleaved(resume, n),
        }

    one_round("w", min(n, 5), min(crossings, 10))  # warm-up: imports, loops, the resume workflow, caches
    for r in range(rounds):
        for measure, by_bridge in one_round(str(r), n, crossings).items():
            for bridge, (wall, cpu) in by_bridge.items():
                values[bridge][measure].append(wall)
                values[bridge][f"{measure}_cpu"].append(cpu)
        log(f"driver bench ({vendor}): round {r + 1}/{rounds} done")
    per_crossing = {
        b: [(ten - one) / 9 for one, ten in zip(values[b]["run_1"], values[b]["run_10"], strict=True)] for b in BRIDGES
    }
    for b in BRIDGES:
        values[b]["crossing"] = per_crossing[b]
    measures = (*MEASURES, *CPU, "crossing")
    # Ratios within a round, where both bridges met the same machine load.
    ratios = {m: [a / d for a, d in zip(values["asgiref"][m], values["driver"][m], strict=True)] for m in measures}
    return {
        "kind": "driver",
        "vendor": vendor,
        "rounds": rounds,
        "n": n,
        "crossings": crossings,
        "load": [load_before, os.getloadavg()[0]],
        "asyncio_run": asyncio_run_probe(),
        "values": {b: {m: summary(values[b][m]) for m in measures} for b in BRIDGES},
        "ratios": {m: summary(ratios[m]) for m in measures},
    }


# --- the report ------------------------------------------------------------------------------

LABELS = {
    "run_1": "a run with 1 ORM call",
    "run_10": "a run with 10 ORM calls",
    "crossing": "each further ORM call",
    "begin": "`review_begin`",
    "resume": "`decision_record` (resume + approve + commit)",
    "run_1_cpu": "a run with 1 ORM call, CPU",
    "begin_cpu": "`review_begin`, CPU",
    "resume_cpu": "`decision_record`, CPU",
}


def _ms(s: dict) -> str:
    return f"{s['median']:.3f} ({s['min']:.3f}–{s['max']:.3f})"


def _ratio(s: dict) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def render(results: list[dict]) -> str:
    """One markdown table per database: ms per op (median and range over the rounds), and the
    ratio to the driver (median and range of the per-round ratios)."""
    out = []
    for r in results:
        db = "PostgreSQL" if r["vendor"] == "postgresql" else "SQLite"
        out.append(
            f"**{db}**: {r['rounds']} rounds of {r['n']} ops ({r['crossings']} for the bare runs) per bridge, "
            f"load average {r['load'][0]:.1f} → {r['load'][1]:.1f}; ms per op (wall time; CPU: this process's, "
            "all its threads), median (range) of the rounds' medians"
        )
        out.append("")
        out.append("| measure | driver | asgiref | asgiref ÷ driver |")
        out.append("|---|---|---|---|")
        v, q = r["values"], r["ratios"]
        for m in LABELS:
            out.append(f"| {LABELS[m]} | {_ms(v['driver'][m])} | {_ms(v['asgiref'][m])} | {_ratio(q[m])} |")
        probe = r["asyncio_run"]
        out.append("")
        out.append(f"`asyncio.run`, ORM called on the loop's thread: {probe['check_on'].splitlines()[0]}")
        same = "the caller's" if probe["check_off_uses_callers_connection"] else "another than the caller's"
        out.append(f"With `{UNSAFE}` set, its ORM work runs on {same} connection.")
        out.append("")
    return "\n".join(out)


# --- the two databases -----------------------------------------------------------------------


def _inproc(database_url: str, scale: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    try:
        cmd = [PY, "-m", "bench.driver", "--inproc", "--scale", scale, "--out", out]
        subprocess.run(cmd, cwd=ROOT, env=env_for(database_url), check=True)
        return json.loads(Path(out).read_text())
    finally:
        Path(out).unlink(missing_ok=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument("--only", default="sqlite,postgresql", help="comma-separated: sqlite,postgresql")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--inproc", action="store_true", help=argparse.SUPPRESS)  # one database, in this process
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    scale = SCALES[args.scale]
    if args.inproc:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "decisionflow.settings")
        import django

        django.setup()
        from core.observability import events_off_stderr

        with events_off_stderr():
            result = bench_bridges(**scale, log=lambda m: print(m, file=sys.stderr, flush=True))
        Path(args.out).write_text(json.dumps(result, indent=1))
        return 0

    from bench.run import migrate, pg_recreate, pg_url

    results = []
    vendors = set(filter(None, args.only.split(",")))
    if "sqlite" in vendors:
        # In memory where the machine has it: the disk's fsync noise would hide what is measured.
        with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
            url = f"sqlite:///{tmp}/driver.sqlite3"
            migrate(url)
            results.append(_inproc(url, args.scale))
    if "postgresql" in vendors:
        base = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432")
        pg_recreate(base, "decisionflow_bench_driver")
        url = pg_url(base, "decisionflow_bench_driver")
        migrate(url)
        results.append(_inproc(url, args.scale))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
