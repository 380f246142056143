#!/usr/bin/env python3
"""Peer benchmark: a DBOS Transact human-in-the-loop approval on PostgreSQL.

The same job as shared/peer/langgraph_hitl.py, written the way DBOS documents a human in the
loop: a durable workflow whose steps are checkpointed in DBOS's system database, which
publishes what it waits for with ``DBOS.set_event`` and waits durably with ``DBOS.recv``;
the reviewer's approval is delivered with ``DBOS.send``.

Workflow (workflow id = case id):
  prepare   @DBOS.step: builds the proposal (case_id, ~2 KiB body) and its sha256 operation id,
            exactly as the LangGraph peer does (canonical JSON of the fields, hex SHA-256)
  set_event "approval_request" = {"kind": "approval_request", **proposal}
  recv      topic "decision" (durable: the timeout is recorded, the message is consumed in
            the same transaction that records the recv's output)
  commit    @DBOS.step: the side effect, an INSERT into peer_effect (same Postgres database)
              naive: fresh uuid4 key per attempt, plain INSERT
              keyed: INSERT ... ON CONFLICT (operation_id) DO NOTHING
            on its own autocommit psycopg connection, as the LangGraph peer's commit node does.

Usage:
  dbos_hitl.py bench [N] [--effect naive|keyed|both] [--runs K] [--warmup W]
  dbos_hitl.py replay [--effect naive|keyed|both]
  dbos_hitl.py count [N]          libpq-traced statements / round trips / commits per begin and resume

Connection: PEER_PG_URL (default postgres://postgres@127.0.0.1:5432/postgres) is the
maintenance database; the script DROPs and CREATEs its own database (PEER_PG_DB, default
pf_dbos_hitl) for every run and drops it at the end unless --keep-db. Both DBOS's system
tables (schema "dbos") and peer_effect live in that one database.

What is timed (perf_counter, in-process, sequential, warm-up excluded):
  begin   DBOS.start_workflow(review, case_id) until the workflow is durably waiting: its
          status row, prepare's recorded output, the set_event and recv's recorded timeout
          are committed and the workflow thread is blocked in recv (an in-process probe around
          SystemDatabase.recv_setup says so; it adds no database work).
  begin_visible  the same start until DBOS.get_event(case_id, "approval_request") returns the
          request to the caller (what a reviewer UI would read); context only.
  resume  DBOS.send(case_id, approval, "decision") until handle.get_result() returns, i.e.
          the message was consumed, the effect committed, the step recorded and the workflow
          marked SUCCESS.
Human-readable lines first; the last line of stdout is one JSON object
(.summary.keyed.begin.median_ms and .summary.keyed.resume_commit.median_ms, as the LangGraph peer).
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
import tempfile
import threading
import time
import uuid
from collections import Counter
from typing import Any

import psycopg
from dbos import DBOS, DBOSConfig, SetWorkflowID
from dbos._sys_db import SystemDatabase
from psycopg.conninfo import conninfo_to_dict, make_conninfo

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/postgres"
APPROVAL = {"approved": True, "reviewer": "alice"}
BODY_BYTES = 2048
RECV_TIMEOUT_S = 3600.0  # a human step: long; recorded durably by recv
DBOS_TABLES = ("workflow_status", "operation_outputs", "notifications", "workflow_events", "workflow_events_history")


def say(msg: str = "") -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- probe


class Probe:
    """Counts step-body runs per case; marks when a workflow is blocked in recv (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, Counter] = {}
        self.waiting: dict[str, threading.Event] = {}
        self.fail_after_insert: set[str] = set()  # next commit raises after INSERT
        self.fail_once_after_insert: set[str] = set()  # raise after INSERT on the first attempt only

    def hit(self, case_id: str, what: str) -> None:
        with self.lock:
            self.counts.setdefault(case_id, Counter())[what] += 1

    def of(self, case_id: str) -> dict:
        with self.lock:
            return dict(self.counts.get(case_id, Counter()))

    def waiter(self, case_id: str) -> threading.Event:
        with self.lock:
            return self.waiting.setdefault(case_id, threading.Event())


PROBE = Probe()
STATE: dict[str, Any] = {"effect_conn": None, "effect_mode": "keyed"}

_orig_recv_setup = SystemDatabase.recv_setup


def _recv_setup_probe(self, workflow_uuid, *args, **kwargs):
    """Measurement hook only: after DBOS's own recv setup (recorded-output check, unconsumed
    message check, durable timeout recorded) returns, say that this workflow now waits."""
    out = _orig_recv_setup(self, workflow_uuid, *args, **kwargs)
    PROBE.waiter(workflow_uuid).set()
    return out


SystemDatabase.recv_setup = _recv_setup_probe


# --------------------------------------------------------------------------- workflow


def make_body(case_id: str) -> str:
    """~2 KiB of deterministic, poorly compressible text (hex of a sha256 chain); as the LangGraph peer."""
    parts, h = [], case_id.encode()
    while sum(len(p) for p in parts) < BODY_BYTES:
        h = hashlib.sha256(h).digest()
        parts.append(h.hex())
    return "".join(parts)[:BODY_BYTES]


def operation_id(fields: dict) -> str:
    """As the LangGraph peer: sha256 of the canonical JSON of the proposal's fields."""
    canon = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode()).hexdigest()


@DBOS.step()
def prepare(case_id: str) -> dict:
    PROBE.hit(case_id, "prepare")
    fields = {"case_id": case_id, "action": "approve_payout", "amount_cents": 12_345, "body": make_body(case_id)}
    return dict(fields, operation_id=operation_id(fields))


def _commit_body(proposal: dict, decision: dict) -> dict:
    cid = proposal["case_id"]
    PROBE.hit(cid, "commit")
    if STATE["effect_mode"] == "naive":
        sql = "INSERT INTO peer_effect (effect_id, operation_id, case_id, reviewer) VALUES (%s, %s, %s, %s)"
    else:
        sql = (
            "INSERT INTO peer_effect (effect_id, operation_id, case_id, reviewer) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (operation_id) DO NOTHING"
        )
    cur = STATE["effect_conn"].execute(sql, (uuid.uuid4(), proposal["operation_id"], cid, decision.get("reviewer")))
    inserted = cur.rowcount == 1
    PROBE.hit(cid, "commit_row_inserted" if inserted else "commit_row_skipped")
    if os.environ.get("DBOS_HITL_CRASH_AFTER_INSERT") == cid:
        os._exit(17)  # the process dies after the INSERT committed, before DBOS records the step
    if cid in PROBE.fail_after_insert:
        PROBE.fail_after_insert.discard(cid)
        raise ConnectionError("simulated lost receipt: INSERT committed, reply lost")
    if cid in PROBE.fail_once_after_insert and PROBE.of(cid).get("commit", 0) == 1:
        raise ConnectionError("simulated lost receipt on first attempt: INSERT committed, reply lost")
    return {"inserted": inserted}


@DBOS.step()
def commit(proposal: dict, decision: dict) -> dict:
    return _commit_body(proposal, decision)


@DBOS.step(retries_allowed=True, max_attempts=3, interval_seconds=0.01, backoff_rate=1.0)
def commit_with_retries(proposal: dict, decision: dict) -> dict:
    return _commit_body(proposal, decision)


@DBOS.workflow()
def review(case_id: str, retrying_commit: bool = False) -> dict:
    proposal = prepare(case_id)
    DBOS.set_event("approval_request", {"kind": "approval_request", **proposal})
    PROBE.hit(case_id, "review_entered")
    decision = DBOS.recv("decision", timeout_seconds=RECV_TIMEOUT_S)
    if decision is None:
        return {"status": "timed_out", "operation_id": proposal["operation_id"]}
    PROBE.hit(case_id, "review_resumed")
    if not decision.get("approved"):
        return {"status": "declined", "operation_id": proposal["operation_id"], "decision": decision}
    res = (commit_with_retries if retrying_commit else commit)(proposal, decision)
    return {"status": "committed", "operation_id": proposal["operation_id"], "decision": decision, **res}


# --------------------------------------------------------------------------- database


def admin_url() -> str:
    return os.environ.get("PEER_PG_URL", DEFAULT_URL)


def db_name() -> str:
    return os.environ.get("PEER_PG_DB", "pf_dbos_hitl")


def recreate_database() -> str:
    name = db_name()
    with psycopg.connect(admin_url(), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    return make_conninfo(admin_url(), dbname=name)


def drop_database() -> None:
    with psycopg.connect(admin_url(), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{db_name()}" WITH (FORCE)')


def sqlalchemy_url(conninfo: str) -> str:
    d = conninfo_to_dict(conninfo)
    auth = d.get("user", "postgres") + (f":{d['password']}" if d.get("password") else "")
    return f"postgresql://{auth}@{d.get('host', '127.0.0.1')}:{d.get('port', 5432)}/{d['dbname']}"


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


def launch(url: str, effect_mode: str, trace_dir: str | None = None, fresh: bool = True) -> psycopg.Connection:
    """DBOS on `url` (system tables in schema dbos), plus the effect connection. Returns it."""
    econn = psycopg.connect(url, autocommit=True)
    if fresh:
        create_effect_table(econn, effect_mode)
    STATE["effect_conn"], STATE["effect_mode"] = econn, effect_mode
    config: DBOSConfig = {"name": "dbos-hitl-peer", "system_database_url": sqlalchemy_url(url), "log_level": "WARNING"}
    DBOS(config=config)
    if trace_dir is not None:
        _trace_engine(trace_dir)
        _trace_conn(econn, trace_dir, "effect")
    DBOS.launch()
    return econn


def shutdown(econn: psycopg.Connection | None) -> None:
    DBOS.destroy()
    if econn is not None:
        econn.close()
    STATE["effect_conn"] = None


def server_settings(conn: psycopg.Connection) -> dict:
    return {k: conn.execute(f"SHOW {k}").fetchone()[0] for k in ("synchronous_commit", "fsync", "server_version")}


def dbos_footprint(conn: psycopg.Connection, prefix: str, n: int) -> dict:
    """Rows and bytes DBOS keeps per case in its system tables (workflow id = case id)."""
    out: dict[str, Any] = {"per_table": {}}
    tot_rows = tot_bytes = 0
    for t in DBOS_TABLES:
        col = "destination_uuid" if t == "notifications" else "workflow_uuid"
        rows, row_bytes = conn.execute(
            f"SELECT count(*), coalesce(sum(pg_column_size(x.*)), 0) FROM dbos.{t} x WHERE {col} LIKE %s",
            (prefix + "%",),
        ).fetchone()
        out["per_table"][t] = {"rows_per_case": rows / n, "row_bytes_per_case": row_bytes / n}
        tot_rows += rows
        tot_bytes += row_bytes
    out["rows_per_case"] = tot_rows / n
    out["row_bytes_per_case"] = tot_bytes / n
    return out


def versions(conn: psycopg.Connection | None = None) -> dict:
    v = {"python": platform.python_version()}
    for pkg in ("dbos", "sqlalchemy", "psycopg", "psycopg-binary"):
        try:
            v[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            v[pkg] = None
    if conn is not None:
        v["postgres_server"] = conn.execute("SHOW server_version").fetchone()[0]
    return v


# --------------------------------------------------------------------------- begin / resume


def begin(cid: str, retrying_commit: bool = False, timeout: float = 30.0):
    """Start the workflow; return (handle) once it is durably waiting in recv."""
    ev = PROBE.waiter(cid)
    with SetWorkflowID(cid):
        handle = DBOS.start_workflow(review, cid, retrying_commit)
    if not ev.wait(timeout):
        raise SystemExit(f"begin for {cid}: the workflow did not reach recv within {timeout} s")
    return handle


def resume(cid: str, handle, value: Any = APPROVAL) -> dict:
    DBOS.send(cid, value, "decision")
    return handle.get_result()


# --------------------------------------------------------------------------- bench


def pct(sorted_vals: list[float], q: float) -> float:
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


def bench_once(n: int, effect_mode: str, warmup: int) -> dict:
    url = recreate_database()
    econn = launch(url, effect_mode)
    try:
        ver = versions(econn)
        settings = server_settings(econn)
        import sqlalchemy as sa
        from dbos._dbos import _get_dbos_instance

        with _get_dbos_instance()._sys_db.engine.connect() as c:  # the system database's own sessions
            settings["dbos_engine_synchronous_commit"] = c.execute(sa.text("SHOW synchronous_commit")).scalar()
        for i in range(warmup):
            cid = f"warm-{effect_mode}-{i:05d}"
            resume(cid, begin(cid))

        prefix = f"bench-{effect_mode}-"
        cases = [f"{prefix}{i:05d}" for i in range(n)]
        handles, begin_s, visible_s = {}, [], []
        t0 = time.perf_counter()
        for cid in cases:
            a = time.perf_counter()
            handles[cid] = begin(cid)
            begin_s.append(time.perf_counter() - a)
        begin_wall = time.perf_counter() - t0
        # context: the request as a reviewer UI reads it (get_event), on fresh cases, not in begin
        vis_cases = [f"vis-{effect_mode}-{i:05d}" for i in range(min(n, 50))]
        vis_handles = {}
        for cid in vis_cases:
            a = time.perf_counter()
            with SetWorkflowID(cid):
                vis_handles[cid] = DBOS.start_workflow(review, cid, False)
            req = DBOS.get_event(cid, "approval_request", timeout_seconds=30)
            visible_s.append(time.perf_counter() - a)
            if not req or req.get("case_id") != cid:
                raise SystemExit(f"get_event for {cid} returned {req!r:.200}")
            PROBE.waiter(cid).wait(30)

        resume_s = []
        t0 = time.perf_counter()
        for cid in cases:
            a = time.perf_counter()
            out = resume(cid, handles[cid])
            resume_s.append(time.perf_counter() - a)
            if out.get("status") != "committed" or out.get("decision") != APPROVAL:
                raise SystemExit(f"resume for {cid} did not complete: {out!r:.200}")
        resume_wall = time.perf_counter() - t0
        for cid in vis_cases:
            resume(cid, vis_handles[cid])

        rows = econn.execute(
            "SELECT count(*), count(DISTINCT operation_id) FROM peer_effect WHERE case_id LIKE %s", (prefix + "%",)
        ).fetchone()
        counts: Counter = Counter()
        for cid in cases:
            counts.update(PROBE.of(cid))
        foot = dbos_footprint(econn, prefix, n)
    finally:
        shutdown(econn)
    return {
        "effect_mode": effect_mode,
        "n": n,
        "durability": f"synchronous_commit={settings['synchronous_commit']}",
        "settings": settings,
        "begin": summarize(begin_s, begin_wall),
        "begin_visible": summarize(visible_s, sum(visible_s)),
        "resume_commit": summarize(resume_s, resume_wall),
        "effect_rows": rows[0],
        "effect_distinct_operation_ids": rows[1],
        "effect_duplicates": rows[0] - rows[1],
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
    for phase in ("begin", "begin_visible", "resume_commit"):
        out[phase] = {k: med([phase, k]) for k in ("median_ms", "p90_ms", "p99_ms", "mean_ms", "throughput_per_s")}
    out["checkpoint_rows_per_case"] = med(["checkpoint", "rows_per_case"])
    out["checkpoint_row_bytes_per_case"] = med(["checkpoint", "row_bytes_per_case"])
    out["effect_rows"] = med(["effect_rows"])
    out["effect_duplicates"] = max(r["effect_duplicates"] for r in runs)
    return out


def cmd_bench(args: argparse.Namespace) -> dict:
    modes = ["naive", "keyed"] if args.effect == "both" else [args.effect]
    by_mode: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        for r in range(args.runs):
            for m in modes if r % 2 == 0 else modes[::-1]:
                res = bench_once(args.n, m, args.warmup)
                by_mode[m].append(res)
                b, v, c, f = res["begin"], res["begin_visible"], res["resume_commit"], res["checkpoint"]
                say(
                    f"[run {r + 1}/{args.runs}] effect={m} N={args.n} {res['durability']} "
                    f"(DBOS engine: {res['settings']['dbos_engine_synchronous_commit']})"
                )
                say(
                    f"  begin          median {b['median_ms']:.3f} ms  p90 {b['p90_ms']:.3f} ms  "
                    f"throughput {b['throughput_per_s']:.1f}/s"
                )
                say(f"  begin+get_event median {v['median_ms']:.3f} ms  p90 {v['p90_ms']:.3f} ms (context, 50 cases)")
                say(
                    f"  resume+commit  median {c['median_ms']:.3f} ms  p90 {c['p90_ms']:.3f} ms  "
                    f"throughput {c['throughput_per_s']:.1f}/s"
                )
                say(
                    f"  dbos rows      {f['rows_per_case']:.2f} rows/case, {f['row_bytes_per_case']:.0f} B/case  "
                    + ", ".join(f"{t}={x['rows_per_case']:.2f}r" for t, x in f["per_table"].items())
                )
                say(
                    f"  effect rows    {res['effect_rows']} (distinct operation ids "
                    f"{res['effect_distinct_operation_ids']}); step runs/case {res['node_runs_per_case']}"
                )
    finally:
        if not args.keep_db:
            drop_database()
    summary = {m: median_of_runs(v) for m, v in by_mode.items()}
    for m, s in summary.items():
        say(
            f"[median of {s['runs']} run(s)] effect={m}: begin median {s['begin']['median_ms']:.3f} ms "
            f"p90 {s['begin']['p90_ms']:.3f} ms | resume+commit median {s['resume_commit']['median_ms']:.3f} ms "
            f"p90 {s['resume_commit']['p90_ms']:.3f} ms | {s['checkpoint_rows_per_case']:.2f} rows/case"
        )
    first = next(iter(by_mode.values()))[0]
    return {
        "tool": "peer/dbos_hitl",
        "command": "bench",
        "n": args.n,
        "runs": args.runs,
        "warmup": args.warmup,
        "versions": first["versions"],
        "settings": first["settings"],
        "summary": summary,
        "per_run": by_mode,
    }


# --------------------------------------------------------------------------- replay


def replay_mode(effect_mode: str) -> dict:
    url = recreate_database()
    econn = launch(url, effect_mode)
    scen: dict[str, Any] = {}
    try:

        def step(cid: str, call: str, fn) -> dict:
            before = Counter(PROBE.of(cid))
            try:
                out = fn()
                outcome = (
                    f"returned {out!r:.100}" if not isinstance(out, dict) else f"returned status={out.get('status')}"
                )
            except Exception as e:  # noqa: BLE001 - record what the library did
                outcome = f"raised {type(e).__name__}: {str(e)[:120]}"
            ran = Counter(PROBE.of(cid))
            ran.subtract(before)
            return {
                "call": call,
                "outcome": outcome,
                "step_runs": {k: v for k, v in ran.items() if v},
                "effect_rows_after": effect_rows(econn, cid),
            }

        def record(name: str, cid: str, steps: list[dict], **extra: Any) -> None:
            st = DBOS.get_workflow_status(cid)
            scen[name] = {
                "case_id": cid,
                "steps": steps,
                **extra,
                "step_runs_total": PROBE.of(cid),
                "workflow_status": getattr(st, "status", None),
                "effect_rows": effect_rows(econn, cid),
            }

        handles: dict[str, Any] = {}

        def b(cid: str, retrying: bool = False) -> dict:
            def go():
                handles[cid] = begin(cid, retrying)
                return "waiting in recv"

            return step(cid, "start_workflow(review, cid) until recv waits", go)

        # 0. one ordinary approval
        cid = f"replay-{effect_mode}-plain"
        s0 = b(cid)
        record(
            "plain_single_resume",
            cid,
            [s0, step(cid, "send(approval); get_result()", lambda: resume(cid, handles[cid]))],
        )

        # 1. begin twice with the same workflow id: one workflow
        cid = f"replay-{effect_mode}-begin-twice"
        s0 = b(cid)

        def again():
            with SetWorkflowID(cid):
                h2 = DBOS.start_workflow(review, cid, False)
            return f"handle for {h2.get_workflow_id()}"

        s1 = step(cid, "start_workflow(review, cid) again (same id)", again)
        record(
            "begin_twice_same_id",
            cid,
            [s0, s1, step(cid, "send(approval); get_result()", lambda: resume(cid, handles[cid]))],
        )

        # 2. approve twice: the second send after the workflow finished
        cid = f"replay-{effect_mode}-approve-twice"
        s0 = b(cid)
        s1 = step(cid, "send(approval); get_result()", lambda: resume(cid, handles[cid]))
        s2 = step(cid, "send(approval) again; get_result()", lambda: resume(cid, handles[cid]))
        unconsumed = econn.execute(
            "SELECT count(*) FROM dbos.notifications WHERE destination_uuid = %s AND NOT consumed", (cid,)
        ).fetchone()[0]
        record("approve_twice", cid, [s0, s1, s2], unconsumed_messages=unconsumed)

        # 3. two approvals sent at once, from two threads, before the workflow consumes one
        cid = f"replay-{effect_mode}-concurrent"
        s0 = b(cid)
        bar = threading.Barrier(2, timeout=10)
        errs: list[str] = []

        def sender() -> None:
            try:
                bar.wait()
                DBOS.send(cid, APPROVAL, "decision")
            except Exception as e:  # noqa: BLE001
                errs.append(f"{type(e).__name__}: {e}")

        def both():
            ts = [threading.Thread(target=sender) for _ in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            return handles[cid].get_result()

        record(
            "concurrent_double_send",
            cid,
            [s0, step(cid, "2 threads: send(approval); get_result()", both)],
            send_errors=errs,
        )

        # 4. lost receipt: commit INSERTs then raises; the workflow fails; resume_workflow re-runs commit
        cid = f"replay-{effect_mode}-lost-receipt"
        s0 = b(cid)
        PROBE.fail_after_insert.add(cid)
        s1 = step(cid, "send(approval); get_result() [commit raises after INSERT]", lambda: resume(cid, handles[cid]))
        st = DBOS.get_workflow_status(cid)
        s2 = step(cid, "DBOS.resume_workflow(cid).get_result()", lambda: DBOS.resume_workflow(cid).get_result())
        record("lost_receipt_then_resume_workflow", cid, [s0, s1, s2], status_after_failure=getattr(st, "status", None))

        # 5. the same failure with a step retry policy (retries_allowed, max_attempts=3)
        cid = f"replay-{effect_mode}-retry-policy"
        s0 = b(cid, retrying=True)
        PROBE.fail_once_after_insert.add(cid)
        record(
            "retry_policy_on_commit",
            cid,
            [
                s0,
                step(
                    cid,
                    "@DBOS.step(retries_allowed=True, max_attempts=3); send; get_result() [1st attempt raises after INSERT]",
                    lambda: resume(cid, handles[cid]),
                ),
            ],
        )

        # 6. lost receipt on the caller's side: the approval was delivered, the caller sends it again
        #    with the same idempotency key before the workflow finished (at-most-once delivery of the send)
        cid = f"replay-{effect_mode}-send-idempotency-key"
        s0 = b(cid)

        def twice_keyed():
            DBOS.send(cid, APPROVAL, "decision", idempotency_key="approval-1")
            DBOS.send(cid, APPROVAL, "decision", idempotency_key="approval-1")
            return handles[cid].get_result()

        s1 = step(cid, "send(approval, idempotency_key=k) x2; get_result()", twice_keyed)
        msgs = econn.execute("SELECT count(*) FROM dbos.notifications WHERE destination_uuid = %s", (cid,)).fetchone()[
            0
        ]
        record("send_twice_same_idempotency_key", cid, [s0, s1], messages_stored=msgs)
    finally:
        shutdown(econn)

    # 7. the process dies after the effect INSERT committed, before DBOS recorded the commit step;
    #    a new process launches DBOS, which recovers the PENDING workflow and re-runs the step
    import subprocess

    cid = f"replay-{effect_mode}-crash"
    child = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "_crash_child", effect_mode, cid],
        env=dict(os.environ, DBOS_HITL_CRASH_AFTER_INSERT=cid),
        capture_output=True,
        text=True,
        timeout=120,
    )
    econn = launch(url, effect_mode, fresh=False)
    try:
        rows_after_crash = effect_rows(econn, cid)
        t0 = time.perf_counter()
        try:
            out = DBOS.retrieve_workflow(cid).get_result()
            outcome = f"recovered: status={out.get('status')} inserted={out.get('inserted')}"
        except Exception as e:  # noqa: BLE001
            outcome = f"raised {type(e).__name__}: {str(e)[:120]}"
        st = DBOS.get_workflow_status(cid)
        scen["crash_after_insert_then_recovery"] = {
            "case_id": cid,
            "child_exit": child.returncode,
            "effect_rows_after_crash": rows_after_crash,
            "recovery": outcome,
            "recovery_s": round(time.perf_counter() - t0, 3),
            "workflow_status": getattr(st, "status", None),
            "effect_rows": effect_rows(econn, cid),
            "steps": [
                {
                    "call": "child: begin, send(approval); commit step os._exit()s after INSERT",
                    "outcome": f"exit {child.returncode}",
                    "step_runs": {},
                    "effect_rows_after": rows_after_crash,
                },
                {
                    "call": "new process: DBOS.launch() (recovers PENDING workflows); retrieve_workflow().get_result()",
                    "outcome": outcome,
                    "step_runs": {},
                    "effect_rows_after": effect_rows(econn, cid),
                },
            ],
        }
    finally:
        shutdown(econn)
    return scen


def cmd_crash_child(args: argparse.Namespace) -> dict:
    url = make_conninfo(admin_url(), dbname=db_name())
    econn = launch(url, args.effect_mode, fresh=False)
    h = begin(args.case_id)
    resume(args.case_id, h)  # never returns: the commit step exits the process after its INSERT
    shutdown(econn)
    return {"unexpected": "the child was not killed"}


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
            say(f"  {name}: effect rows {sc['effect_rows']} (workflow {sc['workflow_status']})")
            for st in sc["steps"]:
                say(
                    f"    {st['call']}\n      -> {st['outcome']}; step runs {st['step_runs']}; "
                    f"effect rows after {st['effect_rows_after']}"
                )
    say("effect rows for one approved case (1 = no duplicate):")
    say(f"  {'scenario':38s} " + " ".join(f"{m:>6s}" for m in modes))
    for name in names:
        say(f"  {name:38s} " + " ".join(f"{out[m][name]['effect_rows']:>6d}" for m in modes))
    return {
        "tool": "peer/dbos_hitl",
        "command": "replay",
        "versions": ver,
        "effect_rows": {m: {n: out[m][n]["effect_rows"] for n in names} for m in modes},
        "scenarios": out,
    }


# --------------------------------------------------------------------------- count (libpq trace)

TRACER = None


def _trace_conn(conn: psycopg.Connection, trace_dir: str, label: str) -> None:
    TRACER.attach(conn, label)


def _trace_engine(trace_dir: str) -> None:
    """Trace every connection DBOS's system-database engine opens (pool, listener, notifier)."""
    import sqlalchemy as sa
    from sqlalchemy import event

    @event.listens_for(sa.engine.Engine, "connect")  # every engine: DBOS creates its own at launch
    def _on_connect(dbapi_conn, _record):  # noqa: ANN001
        if isinstance(dbapi_conn, psycopg.Connection):
            _trace_conn(dbapi_conn, trace_dir, "sysdb")


def cmd_count(args: argparse.Namespace) -> dict:
    global TRACER
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pgtrace import Tracer

    trace_dir = tempfile.mkdtemp(prefix="dbos-trace-")
    TRACER = Tracer(trace_dir)
    url = recreate_database()
    econn = launch(url, "keyed", trace_dir=trace_dir)
    res: dict[str, Any] = {}
    try:
        for i in range(3):
            cid = f"warm-count-{i}"
            resume(cid, begin(cid))
        time.sleep(0.2)
        n = args.n
        cases = [f"count-{i:04d}" for i in range(n)]
        xact0 = _xact(econn)
        mark = TRACER.mark()
        handles = {cid: begin(cid) for cid in cases}
        time.sleep(0.1)  # let the coalesced notifier flush what begin queued (counted with begin)
        per_begin = TRACER.tally(mark)
        xact1 = _xact(econn)
        mark = TRACER.mark()
        for cid in cases:
            resume(cid, handles[cid])
        time.sleep(0.1)
        per_resume = TRACER.tally(mark)
        xact2 = _xact(econn)
        res = {
            "n": n,
            "begin": {k: v / n for k, v in per_begin.items()},
            "resume": {k: v / n for k, v in per_resume.items()},
            "server_xact_commit_per_begin_incl_background": (xact1 - xact0) / n,
            "server_xact_commit_per_resume_incl_background": (xact2 - xact1) / n,
            "trace_dir": trace_dir,
            "connections_traced": len(TRACER.files),
        }
    finally:
        shutdown(econn)
        if not args.keep_db:
            drop_database()
    say(f"per begin : {res['begin']}")
    say(f"per resume: {res['resume']}")
    return {"tool": "peer/dbos_hitl", "command": "count", **res}


def _xact(conn: psycopg.Connection) -> int:
    """pg_stat_database.xact_commit of this database (flushed; includes this query's own transactions)."""
    time.sleep(1.1)  # pending backend stats are flushed at most once a second when idle
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="time begin (to the durable wait) and resume+commit over N cases")
    b.add_argument("n", nargs="?", type=int, default=300)
    b.add_argument("--effect", choices=["naive", "keyed", "both"], default="both")
    b.add_argument("--runs", type=int, default=1, help="repeat (fresh database each); report medians")
    b.add_argument("--warmup", type=int, default=5, help="warm-up cases before timing (excluded)")
    b.add_argument(
        "--durability",
        choices=["sync"],
        default="sync",
        help="accepted for CLI parity with the LangGraph peer; DBOS always commits each "
        "checkpoint before going on (synchronous_commit as the server's, 'on')",
    )
    b.add_argument("--keep-db", action="store_true")
    r = sub.add_parser("replay", help="duplicate-effect scenarios for one case per scenario")
    r.add_argument("--effect", choices=["naive", "keyed", "both"], default="both")
    r.add_argument("--keep-db", action="store_true")
    c = sub.add_parser("count", help="statements, round trips, commits per begin and per resume (libpq trace)")
    c.add_argument("n", nargs="?", type=int, default=20)
    c.add_argument("--keep-db", action="store_true")
    x = sub.add_parser("_crash_child", help=argparse.SUPPRESS)
    x.add_argument("effect_mode")
    x.add_argument("case_id")
    args = ap.parse_args(argv)
    result = {"bench": cmd_bench, "replay": cmd_replay, "count": cmd_count, "_crash_child": cmd_crash_child}[args.cmd](
        args
    )
    print(json.dumps(result, default=str, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
