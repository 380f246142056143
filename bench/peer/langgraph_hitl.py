#!/usr/bin/env python3
"""Peer benchmark: a LangGraph human-in-the-loop approval on the Postgres checkpointer.

Standalone; needs only langgraph, langgraph-checkpoint-postgres and psycopg[binary]
(see README.md next to this file for the pinned versions and how to run it).

Graph:  START -> prepare -> review -> commit -> END
  prepare  builds a proposal for a case (case_id, ~2 KiB body) and a sha256 operation id
  review   interrupt(proposal); resumed with Command(resume={"approved": True, "reviewer": "alice"})
  commit   the side effect: INSERT a row into peer_effect (same Postgres database)
             naive: fresh uuid4 key per attempt, plain INSERT
             keyed: INSERT ... ON CONFLICT (operation_id) DO NOTHING
Checkpointer: PostgresSaver (langgraph-checkpoint-postgres) with .setup(); thread_id = case id.

Usage:
  langgraph_hitl.py bench [N] [--effect naive|keyed|both] [--runs K] [--warmup W] [--durability sync|async|exit]
  langgraph_hitl.py replay [--effect naive|keyed|both]

Connection: PEER_PG_URL (default postgres://postgres@127.0.0.1:5432/postgres) is the
maintenance database; the script DROPs and CREATEs its own database (PEER_PG_DB,
default peer_hitl) for every run, and drops it at the end unless --keep-db.
Human-readable lines first; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from typing import Any, TypedDict

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt
from psycopg.conninfo import make_conninfo

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/postgres"
APPROVAL = {"approved": True, "reviewer": "alice"}
BODY_BYTES = 2048
CHECKPOINT_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


def say(msg: str = "") -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- graph


class CaseState(TypedDict, total=False):
    case_id: str
    proposal: dict
    decision: dict


class Probe:
    """Counts how often each node body runs, per thread (case), thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, Counter] = {}
        # optional hooks (used by the replay scenarios only)
        self.after_review_interrupt = None  # callable(case_id) or None
        self.fail_after_insert: set[str] = set()  # case ids whose next commit raises after INSERT
        self.fail_once_after_insert: set[str] = set()  # raise after INSERT on the first attempt only

    def hit(self, case_id: str, what: str) -> None:
        with self.lock:
            self.counts.setdefault(case_id, Counter())[what] += 1

    def of(self, case_id: str) -> dict:
        with self.lock:
            return dict(self.counts.get(case_id, Counter()))

    def total(self) -> Counter:
        with self.lock:
            out: Counter = Counter()
            for c in self.counts.values():
                out.update(c)
            return out


def make_body(case_id: str) -> str:
    """~2 KiB of deterministic, poorly compressible text (hex of a sha256 chain)."""
    parts, h = [], case_id.encode()
    while sum(len(p) for p in parts) < BODY_BYTES:
        h = hashlib.sha256(h).digest()
        parts.append(h.hex())
    return "".join(parts)[:BODY_BYTES]


def operation_id(fields: dict) -> str:
    canon = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode()).hexdigest()


def build_graph(
    effect_conn: psycopg.Connection, effect_mode: str, probe: Probe, commit_retry: RetryPolicy | None = None
) -> StateGraph:
    assert effect_mode in ("naive", "keyed")

    def prepare(state: CaseState) -> dict:
        cid = state["case_id"]
        probe.hit(cid, "prepare")
        fields = {"case_id": cid, "action": "approve_payout", "amount_cents": 12_345, "body": make_body(cid)}
        proposal = dict(fields, operation_id=operation_id(fields))
        return {"proposal": proposal}

    def review(state: CaseState) -> dict:
        cid = state["case_id"]
        probe.hit(cid, "review_entered")
        decision = interrupt({"kind": "approval_request", **state["proposal"]})
        probe.hit(cid, "review_resumed")
        if probe.after_review_interrupt is not None:
            probe.after_review_interrupt(cid)
        return {"decision": decision}

    def commit(state: CaseState) -> dict:
        cid = state["case_id"]
        probe.hit(cid, "commit")
        p, d = state["proposal"], state["decision"]
        if not d.get("approved"):
            return {}
        if effect_mode == "naive":
            sql = "INSERT INTO peer_effect (effect_id, operation_id, case_id, reviewer) VALUES (%s, %s, %s, %s)"
        else:
            sql = (
                "INSERT INTO peer_effect (effect_id, operation_id, case_id, reviewer) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (operation_id) DO NOTHING"
            )
        cur = effect_conn.execute(sql, (uuid.uuid4(), p["operation_id"], cid, d.get("reviewer")))
        probe.hit(cid, "commit_row_inserted" if cur.rowcount == 1 else "commit_row_skipped")
        if cid in probe.fail_after_insert:
            probe.fail_after_insert.discard(cid)
            raise ConnectionError("simulated lost receipt: INSERT committed, reply lost")
        if cid in probe.fail_once_after_insert and probe.of(cid).get("commit", 0) == 1:
            raise ConnectionError("simulated lost receipt on first attempt: INSERT committed, reply lost")
        return {}

    b = StateGraph(CaseState)
    b.add_node("prepare", prepare)
    b.add_node("review", review)
    if commit_retry is not None:
        b.add_node("commit", commit, retry_policy=commit_retry)
    else:
        b.add_node("commit", commit)
    b.add_edge(START, "prepare")
    b.add_edge("prepare", "review")
    b.add_edge("review", "commit")
    b.add_edge("commit", END)
    return b


# --------------------------------------------------------------------------- database


def admin_url() -> str:
    return os.environ.get("PEER_PG_URL", DEFAULT_URL)


def db_name() -> str:
    return os.environ.get("PEER_PG_DB", "peer_hitl")


def recreate_database() -> str:
    name = db_name()
    with psycopg.connect(admin_url(), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    return make_conninfo(admin_url(), dbname=name)


def drop_database() -> None:
    with psycopg.connect(admin_url(), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{db_name()}" WITH (FORCE)')


def create_effect_table(conn: psycopg.Connection, effect_mode: str) -> None:
    unique = ", UNIQUE (operation_id)" if effect_mode == "keyed" else ""
    conn.execute("DROP TABLE IF EXISTS peer_effect")
    conn.execute(
        "CREATE TABLE peer_effect ("
        " effect_id uuid PRIMARY KEY,"
        " operation_id text NOT NULL,"
        " case_id text NOT NULL,"
        " reviewer text,"
        " created_at timestamptz NOT NULL DEFAULT clock_timestamp()"
        f"{unique})"
    )


def effect_rows(conn: psycopg.Connection, case_id: str | None = None) -> int:
    if case_id is None:
        return conn.execute("SELECT count(*) FROM peer_effect").fetchone()[0]
    return conn.execute("SELECT count(*) FROM peer_effect WHERE case_id = %s", (case_id,)).fetchone()[0]


def checkpoint_footprint(conn: psycopg.Connection, thread_prefix: str, n_cases: int) -> dict:
    """Rows and bytes in the checkpoint tables for threads with this prefix, per case."""
    out: dict[str, Any] = {"per_table": {}}
    tot_rows = tot_bytes = tot_rel = 0
    for t in CHECKPOINT_TABLES:
        rows, row_bytes = conn.execute(
            f"SELECT count(*), coalesce(sum(pg_column_size(x.*)), 0) FROM {t} x WHERE thread_id LIKE %s",
            (thread_prefix + "%",),
        ).fetchone()
        rel = conn.execute("SELECT pg_total_relation_size(%s)", (t,)).fetchone()[0]
        out["per_table"][t] = {
            "rows_per_case": rows / n_cases,
            "row_bytes_per_case": row_bytes / n_cases,
            "table_bytes_total": rel,
        }
        tot_rows += rows
        tot_bytes += row_bytes
        tot_rel += rel
    out["rows_per_case"] = tot_rows / n_cases
    out["row_bytes_per_case"] = tot_bytes / n_cases  # sum of pg_column_size(row) = stored tuple data
    threads = conn.execute("SELECT count(DISTINCT thread_id) FROM checkpoints").fetchone()[0]
    out["threads_in_tables"] = threads  # timed cases + warm-up cases
    # pg_total_relation_size (heap + toast + indexes, page-granular) / all threads in the tables
    out["table_bytes_per_case"] = tot_rel / max(threads, 1)
    out["effect_table_bytes_total"] = conn.execute("SELECT pg_total_relation_size('peer_effect')").fetchone()[0]
    return out


def versions(conn: psycopg.Connection | None = None) -> dict:
    v = {"python": platform.python_version()}
    for pkg in (
        "langgraph",
        "langgraph-checkpoint",
        "langgraph-checkpoint-postgres",
        "psycopg",
        "psycopg-binary",
        "psycopg-pool",
    ):
        try:
            v[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            v[pkg] = None
    if conn is not None:
        v["postgres_server"] = conn.execute("SHOW server_version").fetchone()[0]
    return v


# --------------------------------------------------------------------------- bench


def pct(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile on an ascending list."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, math.ceil(round(q * len(sorted_vals), 9)) - 1))
    return sorted_vals[k]


def summarize(samples_s: list[float], wall_s: float) -> dict:
    s = sorted(samples_s)
    ms = [x * 1000.0 for x in s]
    return {
        "n": len(s),
        "median_ms": statistics.median(ms),
        "p90_ms": pct(ms, 0.90),
        "p99_ms": pct(ms, 0.99),
        "mean_ms": statistics.fmean(ms),
        "max_ms": ms[-1],
        "wall_s": wall_s,
        "throughput_per_s": len(s) / wall_s if wall_s > 0 else float("nan"),
    }


def invoke_kwargs(durability: str | None) -> dict:
    return {"durability": durability} if durability else {}


def bench_once(n: int, effect_mode: str, warmup: int, durability: str | None) -> dict:
    url = recreate_database()
    probe = Probe()
    kw = invoke_kwargs(durability)
    with psycopg.connect(url, autocommit=True) as econn, PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        create_effect_table(econn, effect_mode)
        graph = build_graph(econn, effect_mode, probe).compile(checkpointer=saver)
        ver = versions(econn)

        # warm-up (own thread-id prefix; excluded from timings and per-case footprint)
        for i in range(warmup):
            cfg = {"configurable": {"thread_id": f"warm-{effect_mode}-{i:05d}"}}
            graph.invoke({"case_id": cfg["configurable"]["thread_id"]}, cfg, **kw)
            graph.invoke(Command(resume=APPROVAL), cfg, **kw)

        prefix = f"bench-{effect_mode}-"
        cases = [f"{prefix}{i:05d}" for i in range(n)]
        begin_s: list[float] = []
        t0 = time.perf_counter()
        for cid in cases:
            cfg = {"configurable": {"thread_id": cid}}
            a = time.perf_counter()
            out = graph.invoke({"case_id": cid}, cfg, **kw)
            begin_s.append(time.perf_counter() - a)
            intr = out.get("__interrupt__")
            if not intr or intr[0].value.get("case_id") != cid:
                raise SystemExit(f"begin for {cid} did not stop at the review interrupt: {out!r:.200}")
        begin_wall = time.perf_counter() - t0

        resume_s: list[float] = []
        t0 = time.perf_counter()
        for cid in cases:
            cfg = {"configurable": {"thread_id": cid}}
            a = time.perf_counter()
            out = graph.invoke(Command(resume=APPROVAL), cfg, **kw)
            resume_s.append(time.perf_counter() - a)
            if out.get("decision") != APPROVAL or "__interrupt__" in out:
                raise SystemExit(f"resume for {cid} did not complete: {out!r:.200}")
        resume_wall = time.perf_counter() - t0

        rows = econn.execute(
            "SELECT count(*), count(DISTINCT operation_id) FROM peer_effect WHERE case_id LIKE %s", (prefix + "%",)
        ).fetchone()
        counts = Counter()
        for cid in cases:
            counts.update(probe.of(cid))
        foot = checkpoint_footprint(econn, prefix, n)

    return {
        "effect_mode": effect_mode,
        "n": n,
        "durability": durability or "default(async)",
        "begin": summarize(begin_s, begin_wall),
        "resume_commit": summarize(resume_s, resume_wall),
        "effect_rows": rows[0],
        "effect_distinct_operation_ids": rows[1],
        "node_runs_per_case": {k: v / n for k, v in sorted(counts.items())},
        "checkpoint": foot,
        "versions": ver,
    }


def median_of_runs(runs: list[dict]) -> dict:
    def med(path: list[str]) -> float:
        vals = []
        for r in runs:
            x: Any = r
            for p in path:
                x = x[p]
            vals.append(x)
        return statistics.median(vals)

    out: dict[str, Any] = {"runs": len(runs)}
    for phase in ("begin", "resume_commit"):
        out[phase] = {k: med([phase, k]) for k in ("median_ms", "p90_ms", "p99_ms", "mean_ms", "throughput_per_s")}
    out["checkpoint_rows_per_case"] = med(["checkpoint", "rows_per_case"])
    out["checkpoint_row_bytes_per_case"] = med(["checkpoint", "row_bytes_per_case"])
    out["checkpoint_table_bytes_per_case"] = med(["checkpoint", "table_bytes_per_case"])
    out["effect_rows"] = med(["effect_rows"])
    return out


def cmd_bench(args: argparse.Namespace) -> dict:
    modes = ["naive", "keyed"] if args.effect == "both" else [args.effect]
    by_mode: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        for r in range(args.runs):
            for m in modes if r % 2 == 0 else modes[::-1]:  # alternate order between runs
                res = bench_once(args.n, m, args.warmup, args.durability)
                by_mode[m].append(res)
                b, c, f = res["begin"], res["resume_commit"], res["checkpoint"]
                say(f"[run {r + 1}/{args.runs}] effect={m} N={args.n} durability={res['durability']}")
                say(
                    f"  begin          median {b['median_ms']:.3f} ms  p90 {b['p90_ms']:.3f} ms  "
                    f"throughput {b['throughput_per_s']:.1f}/s"
                )
                say(
                    f"  resume+commit  median {c['median_ms']:.3f} ms  p90 {c['p90_ms']:.3f} ms  "
                    f"throughput {c['throughput_per_s']:.1f}/s"
                )
                say(
                    f"  checkpoint     {f['rows_per_case']:.2f} rows/case, "
                    f"{f['row_bytes_per_case']:.0f} row bytes/case, "
                    f"{f['table_bytes_per_case']:.0f} table bytes/case  "
                    + ", ".join(
                        f"{t}={v['rows_per_case']:.2f}r/{v['row_bytes_per_case']:.0f}B"
                        for t, v in f["per_table"].items()
                    )
                )
                say(
                    f"  effect rows    {res['effect_rows']} (distinct operation ids "
                    f"{res['effect_distinct_operation_ids']}); node runs/case {res['node_runs_per_case']}"
                )
    finally:
        if not args.keep_db:
            drop_database()
    summary = {m: median_of_runs(v) for m, v in by_mode.items()}
    for m, s in summary.items():
        say(
            f"[median of {s['runs']} run(s)] effect={m}: begin median {s['begin']['median_ms']:.3f} ms "
            f"p90 {s['begin']['p90_ms']:.3f} ms {s['begin']['throughput_per_s']:.1f}/s | "
            f"resume+commit median {s['resume_commit']['median_ms']:.3f} ms "
            f"p90 {s['resume_commit']['p90_ms']:.3f} ms {s['resume_commit']['throughput_per_s']:.1f}/s | "
            f"ckpt {s['checkpoint_rows_per_case']:.2f} rows, {s['checkpoint_row_bytes_per_case']:.0f} B/case"
        )
    first = next(iter(by_mode.values()))[0]
    return {
        "tool": "peer/langgraph_hitl",
        "command": "bench",
        "n": args.n,
        "runs": args.runs,
        "warmup": args.warmup,
        "versions": first["versions"],
        "summary": summary,
        "per_run": by_mode,
    }


# --------------------------------------------------------------------------- replay


def replay_mode(effect_mode: str) -> dict:
    url = recreate_database()
    probe = Probe()
    scen: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as econn, PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        create_effect_table(econn, effect_mode)
        builder = build_graph(econn, effect_mode, probe)
        graph = builder.compile(checkpointer=saver)

        def cfg_of(cid: str) -> dict:
            return {"configurable": {"thread_id": cid}}

        def step(cid: str, call: str, fn) -> dict:
            """Run one API call; record its outcome, which node bodies ran, effect rows after."""
            before = Counter(probe.of(cid))
            try:
                out = fn()
                if isinstance(out, dict) and "__interrupt__" in out:
                    outcome = "stopped at interrupt"
                elif isinstance(out, dict) and out.get("decision"):
                    outcome = "returned final state"
                else:
                    outcome = f"returned {out!r:.80}"
            except Exception as e:  # noqa: BLE001 - we record what the library did
                outcome = f"raised {type(e).__name__}: {e}"
            ran = Counter(probe.of(cid))
            ran.subtract(before)
            return {
                "call": call,
                "outcome": outcome,
                "node_runs": {k: v for k, v in ran.items() if v},
                "effect_rows_after": effect_rows(econn, cid),
            }

        def begin(cid: str) -> tuple[dict, dict, str]:
            st0 = step(cid, "invoke({'case_id': t}, thread_cfg)", lambda: graph.invoke({"case_id": cid}, cfg_of(cid)))
            st = graph.get_state(cfg_of(cid))
            assert st.next == ("review",), st.next
            iid = st.tasks[0].interrupts[0].id
            return st0, st.config, iid  # st.config carries the interrupt checkpoint_id

        def resume(cid: str, cfg: dict, label: str, value: Any = APPROVAL, g=None) -> dict:
            g = g or graph
            return step(cid, label, lambda: g.invoke(Command(resume=value), cfg))

        def record(name: str, cid: str, steps: list[dict], **extra: Any) -> None:
            scen[name] = {
                "case_id": cid,
                "steps": steps,
                **extra,
                "node_runs_total": probe.of(cid),
                "effect_rows": effect_rows(econn, cid),
            }

        # 0. one ordinary approval: does review re-run from its start on resume?
        cid = f"replay-{effect_mode}-plain"
        s0, _, _ = begin(cid)
        record("plain_single_resume", cid, [s0, resume(cid, cfg_of(cid), "invoke(Command(resume=v), thread_cfg)")])

        # 1. resume the same interrupt twice on the thread's latest checkpoint
        cid = f"replay-{effect_mode}-latest-twice"
        s0, _, _ = begin(cid)
        record(
            "resume_twice_latest",
            cid,
            [
                s0,
                resume(cid, cfg_of(cid), "invoke(Command(resume=v), thread_cfg)"),
                resume(cid, cfg_of(cid), "invoke(Command(resume=v), thread_cfg) again"),
            ],
        )

        # 2. resume again from the interrupt checkpoint, addressed by checkpoint_id
        cid = f"replay-{effect_mode}-checkpoint-id"
        s0, icfg, iid = begin(cid)
        record(
            "resume_from_interrupt_checkpoint_id",
            cid,
            [
                s0,
                resume(cid, cfg_of(cid), "invoke(Command(resume=v), thread_cfg)"),
                resume(cid, icfg, "invoke(Command(resume=v), {thread_id, checkpoint_id=<interrupt ckpt>})"),
                resume(
                    cid,
                    icfg,
                    "invoke(Command(resume={interrupt_id: v}), {thread_id, checkpoint_id=<interrupt ckpt>})",
                    value={iid: APPROVAL},
                ),
            ],
            interrupt_checkpoint_id=icfg["configurable"]["checkpoint_id"],
        )

        # 3. fork: update_state on the interrupt checkpoint, then resume the fork
        cid = f"replay-{effect_mode}-fork"
        s0, icfg, _ = begin(cid)
        s1 = resume(cid, cfg_of(cid), "invoke(Command(resume=v), thread_cfg)")
        fork_cfg = graph.update_state(icfg, None)
        fork_state = graph.get_state(fork_cfg)
        record(
            "fork_update_state_then_resume",
            cid,
            [
                s0,
                s1,
                resume(cid, fork_cfg, "fork = update_state(interrupt_cfg, None); invoke(Command(resume=v), fork)"),
            ],
            fork_next=list(fork_state.next),
            fork_pending_interrupts=sum(len(t.interrupts) for t in fork_state.tasks),
        )

        # 4. two clients resume the same pending interrupt at the same time, each with its
        #    own connection + PostgresSaver. A barrier right after interrupt() returns in
        #    review makes both runs overlap (both must have loaded the pending interrupt).
        cid = f"replay-{effect_mode}-concurrent"
        s0, _, _ = begin(cid)
        barrier = threading.Barrier(2, timeout=10)
        overlap = {"broken": False}

        def hook(case_id: str) -> None:
            if case_id == cid:
                try:
                    barrier.wait()
                except threading.BrokenBarrierError:
                    overlap["broken"] = True

        outcomes: list[str] = ["", ""]
        start = threading.Barrier(2, timeout=10)

        def worker(i: int) -> None:
            try:
                with PostgresSaver.from_conn_string(url) as s2:
                    g2 = builder.compile(checkpointer=s2)
                    start.wait()
                    out = g2.invoke(Command(resume=APPROVAL), cfg_of(cid))
                    outcomes[i] = "returned final state" if out.get("decision") else repr(out)[:80]
            except Exception as e:  # noqa: BLE001
                outcomes[i] = f"raised {type(e).__name__}: {e}"

        before = Counter(probe.of(cid))
        probe.after_review_interrupt = hook
        try:
            ts = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        finally:
            probe.after_review_interrupt = None
        ran = Counter(probe.of(cid))
        ran.subtract(before)
        record(
            "concurrent_double_resume",
            cid,
            [
                s0,
                {
                    "call": "2 threads, each its own PostgresSaver: invoke(Command(resume=v), thread_cfg)",
                    "outcome": outcomes,
                    "node_runs": {k: v for k, v in ran.items() if v},
                    "effect_rows_after": effect_rows(econn, cid),
                },
            ],
            both_runs_overlapped=not overlap["broken"],
            final_next=list(graph.get_state(cfg_of(cid)).next),
        )

        # 5. lost receipt: commit INSERTs, then raises; the caller resumes again
        cid = f"replay-{effect_mode}-lost-receipt"
        s0, _, _ = begin(cid)
        probe.fail_after_insert.add(cid)
        s1 = resume(cid, cfg_of(cid), "invoke(Command(resume=v), thread_cfg) [commit raises after INSERT]")
        st = graph.get_state(cfg_of(cid))
        record(
            "lost_receipt_then_resume_again",
            cid,
            [
                s0,
                s1,
                resume(cid, cfg_of(cid), "invoke(Command(resume=v), thread_cfg) again"),
            ],
            state_next_after_failure=list(st.next),
            task_errors_after_failure=[t.error for t in st.tasks if t.error],
        )

        # 6. same failure, but commit has a RetryPolicy: LangGraph retries inside one invoke
        cid = f"replay-{effect_mode}-retry-policy"
        rgraph = build_graph(
            econn, effect_mode, probe, commit_retry=RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)
        ).compile(checkpointer=saver)
        s0 = step(cid, "invoke({'case_id': t}, thread_cfg)", lambda: rgraph.invoke({"case_id": cid}, cfg_of(cid)))
        probe.fail_once_after_insert.add(cid)
        record(
            "retry_policy_on_commit",
            cid,
            [
                s0,
                resume(
                    cid,
                    cfg_of(cid),
                    "add_node('commit', ..., retry_policy=RetryPolicy(max_attempts=3)); "
                    "invoke(Command(resume=v), thread_cfg) [1st attempt raises ConnectionError after INSERT]",
                    g=rgraph,
                ),
            ],
        )
    return scen


def cmd_replay(args: argparse.Namespace) -> dict:
    modes = ["naive", "keyed"] if args.effect == "both" else [args.effect]
    out: dict[str, Any] = {}
    ver = None
    try:
        for m in modes:
            out[m] = replay_mode(m)
            if ver is None:
                with psycopg.connect(admin_url()) as c:
                    ver = versions(c)
    finally:
        if not args.keep_db:
            drop_database()
    names = list(next(iter(out.values())).keys())
    for m in modes:
        say(f"== effect={m}")
        for name in names:
            sc = out[m][name]
            say(f"  {name}: effect rows {sc['effect_rows']}")
            for st in sc["steps"]:
                say(
                    f"    {st['call']}\n      -> {st['outcome']}; node runs {st['node_runs']}; "
                    f"effect rows after {st['effect_rows_after']}"
                )
    say("effect rows for one approved case (1 = no duplicate):")
    say(f"  {'scenario':38s} " + " ".join(f"{m:>6s}" for m in modes))
    for name in names:
        say(f"  {name:38s} " + " ".join(f"{out[m][name]['effect_rows']:>6d}" for m in modes))
    plain = out[modes[0]]["plain_single_resume"]["steps"]
    at_begin = plain[0]["node_runs"].get("review_entered", 0)
    on_resume = plain[1]["node_runs"].get("review_entered", 0)
    say(
        f"review node body entered {at_begin}x at begin and {on_resume}x on resume "
        f"(re-executes from its start on resume: {on_resume >= 1})"
    )
    return {
        "tool": "peer/langgraph_hitl",
        "command": "replay",
        "versions": ver,
        "review_entered": {"begin": at_begin, "resume": on_resume},
        "review_reexecutes_on_resume": on_resume >= 1,
        "effect_rows": {m: {n: out[m][n]["effect_rows"] for n in names} for m in modes},
        "scenarios": out,
    }


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="time begin (to interrupt) and resume+commit over N cases")
    b.add_argument("n", nargs="?", type=int, default=300)
    b.add_argument("--effect", choices=["naive", "keyed", "both"], default="both")
    b.add_argument("--runs", type=int, default=1, help="repeat (fresh database each); report medians")
    b.add_argument("--warmup", type=int, default=5, help="warm-up cases before timing (excluded)")
    b.add_argument(
        "--durability",
        choices=["sync", "async", "exit"],
        default=None,
        help="LangGraph durability (default: library default, 'async')",
    )
    b.add_argument("--keep-db", action="store_true")
    r = sub.add_parser("replay", help="duplicate-effect scenarios for one case per scenario")
    r.add_argument("--effect", choices=["naive", "keyed", "both"], default="both")
    r.add_argument("--keep-db", action="store_true")
    args = ap.parse_args(argv)
    result = cmd_bench(args) if args.cmd == "bench" else cmd_replay(args)
    print(json.dumps(result, default=str, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
