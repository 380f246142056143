"""Side by side with two peers, LangGraph and DBOS: begin and resume + approve + commit, one server.

    python -m bench.side_by_side --out results.json [--scale full|smoke] [--n N] [--rounds R]

DATABASE_URL names our side's own, migrated PostgreSQL database (bench.run creates
``decisionflow_bench_side``). Each peer runs in its own virtual environment, as one
subprocess per round, and is never imported here:

- bench/peer/langgraph_hitl.py (LangGraph with its PostgreSQL checkpointer), in
  ``.venv-peer`` (``make .venv-peer/.installed``);
- bench/peer/dbos/dbos_hitl.py (DBOS Transact, a durable workflow in its system database),
  in ``.venv-dbos`` (``make .venv-dbos/.installed``).

Each creates and drops its own database (``PEER_PG_DB``) on the same server, through the
maintenance database (``PEER_PG_URL``). A peer whose venv is missing is reported as not
measured; the other sides are still measured.

Rounds are interleaved, and who goes first rotates each round (``round_order``): LangGraph,
DBOS, ours; then DBOS, ours, LangGraph; then ours, LangGraph, DBOS; ... Each round takes N
fresh cases through begin (all N, one after another), then through resume + approve +
commit (all N). Every side times each call in-process with ``perf_counter`` (no process
start), sequentially; each peer warms up on 5 cases per round (its own default), ours on a
few cases once, before the first round. Per round and side: the median and the p90 (nearest
rank, as the peers compute it) of the N calls; a round's ratio is ours ÷ a peer in the same
round; the report shows the median over rounds. Every side commits durably, each on its own
defaults otherwise: LangGraph runs with ``--durability sync`` (each checkpoint written
before the call returns); DBOS always commits each checkpoint before going on (the run
checks that ``synchronous_commit`` is ``on`` for its engine); ours always does.

- begin: ours ``review_begin(case=case, actor=None)``; LangGraph
  ``graph.invoke({"case_id": t}, cfg)`` until it stops at ``interrupt()``; DBOS
  ``DBOS.start_workflow(review, case_id)`` until the workflow waits durably in ``recv``.
- resume + approve + commit: ours the one decision service (see ``decide``); LangGraph
  ``graph.invoke(Command(resume={"approved": True, ...}), cfg)`` (``review`` re-runs, then
  ``commit`` inserts the effect row, ``ON CONFLICT (operation_id) DO NOTHING``); DBOS
  ``DBOS.send(case_id, approval, "decision")`` until ``handle.get_result()`` returns (the
  same keyed INSERT in its ``commit`` step, the step and the workflow recorded).

Counted for ours, on separate fresh cases after the timed rounds (the counting is not
timed), per begin and per resume (see ``DbWork``): statements, commits, durable commits,
and ``reviews.WorkflowCheckpoint`` rows written.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER_SCRIPT = ROOT / "bench" / "peer" / "langgraph_hitl.py"
PEER_PYTHON = ROOT / ".venv-peer" / "bin" / "python"
DBOS_SCRIPT = ROOT / "bench" / "peer" / "dbos" / "dbos_hitl.py"
DBOS_PYTHON = ROOT / ".venv-dbos" / "bin" / "python"

# Rounds are a multiple of the three sides, so that each goes first equally often.
SCALES = {
    "full": {"n": 300, "rounds": 6, "warmup": 5, "count_n": 10},
    "smoke": {"n": 20, "rounds": 3, "warmup": 2, "count_n": 3},
}

# Goals for our resume (and the same figures for begin, as context).
GOAL_STATEMENTS = 12
GOAL_DURABLE_COMMITS = 2
GOAL_CHECKPOINT_ROWS = 1


@dataclass(frozen=True)
class Peer:
    """One peer program: where it lives, its venv, and what it must report to be trusted."""

    side: str  # its name in round_order
    name: str  # as the report names it
    script: Path
    python: Path
    venv: str
    key: str  # its results: {key}_resume and {key}_begin (ours ÷ it), and {key} itself
    goal: float  # ours ÷ it, for both calls (lower is better for us)
    title_numbers: tuple[int, int]  # the report's numbers for resume and for begin
    tables: str  # where it keeps its checkpoints, for the report

    def command(self, n: int, python: Path | None = None) -> list[str]:
        exe = python or self.python
        return [str(exe), str(self.script), "bench", str(n), "--effect", "keyed", "--runs", "1", "--durability", "sync"]

    def not_durable(self, out: dict) -> str | None:
        """Why a run's figures do not come from durable commits, or None."""
        if self.side == "langgraph":
            return None if out["durability"] == "sync" else f"durability {out['durability']!r}, not sync"
        settings = out.get("settings") or {}
        got = (settings.get("synchronous_commit"), settings.get("dbos_engine_synchronous_commit"))
        return None if got == ("on", "on") else f"synchronous_commit (server, DBOS engine) {got}, not on"


LANGGRAPH = Peer(
    side="langgraph",
    name="LangGraph",
    script=PEER_SCRIPT,
    python=PEER_PYTHON,
    venv=".venv-peer",
    key="side",
    goal=1.0,
    title_numbers=(11, 12),
    tables="its three tables: checkpoints, checkpoint_blobs, checkpoint_writes",
)
DBOS = Peer(
    side="dbos",
    name="DBOS",
    script=DBOS_SCRIPT,
    python=DBOS_PYTHON,
    venv=".venv-dbos",
    key="side_dbos",
    goal=0.5,
    title_numbers=(18, 19),
    tables="its five tables: workflow_status, operation_outputs, notifications, workflow_events, "
    "workflow_events_history",
)
PEERS = (LANGGRAPH, DBOS)
SIDES = ("langgraph", "dbos", "ours")


def round_order(i: int, sides: tuple[str, ...] = SIDES) -> tuple[str, ...]:
    """Who runs in round ``i`` (from 0), first to last: the first of each round rotates."""
    k = i % len(sides)
    return sides[k:] + sides[:k]


# --- the decision service ---------------------------------------------------------------


# The one decision service (resume + approve + commit), as the report names it.
DECISION_SERVICE = "decision_record"


def decide(case, operation_id: str, reviewer):
    """Resume + approve + commit through the one decision service, as a channel calls it;
    refuses anything but a fresh commit of an operation that was already begun."""
    from core.outcomes import DecisionOutcome
    from workflow.decide import decision_record

    done = decision_record(case=case, operation_id=operation_id, approved=True, reviewer=reviewer, channel="bench")
    if done.outcome != DecisionOutcome.COMMITTED or done.begun:
        raise AssertionError(f"the decision on {case.case_id} was not a fresh commit of a begun review: {done}")
    return done


def authenticated_reviewer():
    """The bench reviewer (Reviewers group), authenticated as a channel does it: loaded once,
    ``has_perm`` asked once before anything is timed, so its permission cache is warm."""
    from bench.data import bench_reviewer

    reviewer = bench_reviewer()
    if not reviewer.has_perm("reviews.review_proposal"):
        raise AssertionError("the bench reviewer lacks reviews.review_proposal")
    return reviewer


# --- percentiles (as the peer computes them) --------------------------------------------


def pct(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile on an ascending list (the peer's own definition)."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, math.ceil(round(q * len(sorted_vals), 9)) - 1))
    return sorted_vals[k]


def phase_stats(samples_ms: list[float]) -> dict:
    s = sorted(samples_ms)
    return {"n": len(s), "median_ms": statistics.median(s), "p90_ms": pct(s, 0.90)}


# --- the peer -----------------------------------------------------------------------------


class PeerFailed(RuntimeError):
    pass


def peer_missing_reason(python: Path | None = None, peer: Peer = LANGGRAPH) -> str | None:
    """Why the peer cannot run here, or None."""
    python = python or peer.python
    if not peer.script.is_file():
        return f"the peer script {peer.script.relative_to(ROOT)} is missing"
    if not (python.is_file() and os.access(python, os.X_OK)):
        return (
            f"the {peer.name} peer's virtual environment is missing ({python} not found): "
            f"`make bench` builds it (`make {peer.venv}/.installed`); the peer was skipped"
        )
    return None


def parse_peer_output(stdout: str) -> dict:
    """The figures we use from a peer's last stdout line (one JSON object), keyed mode; both
    peers print the same keys.

    ``checkpoint_rows_per_case`` is what the peer counts in its own tables per case after
    begin and resume, both (LangGraph's checkpoint tables, DBOS's system tables).
    """
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise PeerFailed("the peer printed nothing")
    try:
        doc = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise PeerFailed(f"the peer's last line is not JSON: {lines[-1][:200]!r}") from exc
    try:
        keyed = doc["summary"]["keyed"]
        runs = doc["per_run"]["keyed"]
        out = {
            "n": doc["n"],
            "begin": {"median_ms": keyed["begin"]["median_ms"], "p90_ms": keyed["begin"]["p90_ms"]},
            "resume": {
                "median_ms": keyed["resume_commit"]["median_ms"],
                "p90_ms": keyed["resume_commit"]["p90_ms"],
            },
            "checkpoint_rows_per_case": keyed.get("checkpoint_rows_per_case"),
            "checkpoint_row_bytes_per_case": keyed.get("checkpoint_row_bytes_per_case"),
            "effect_rows": keyed.get("effect_rows"),
            "durability": runs[0].get("durability"),
            "settings": doc.get("settings", {}),
            "versions": doc.get("versions", {}),
        }
    except (KeyError, IndexError, TypeError) as exc:
        raise PeerFailed(f"the peer's JSON lacks {exc}: {lines[-1][:200]!r}") from exc
    if out["effect_rows"] is not None and out["effect_rows"] != out["n"]:
        raise PeerFailed(f"the peer wrote {out['effect_rows']} effect rows for {out['n']} cases")
    return out


def peer_command(n: int, python: Path | None = None, peer: Peer = LANGGRAPH) -> list[str]:
    return peer.command(n, python)


def run_peer_round(
    n: int, *, python: Path, admin_url: str, db: str, timeout: float = 900, peer: Peer = LANGGRAPH
) -> dict:
    """One peer round in its own process and venv, against its own database."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE", "DATABASE_URL", "SECRET_KEY")
    }
    env.update(PEER_PG_URL=admin_url, PEER_PG_DB=db)
    proc = subprocess.run(
        peer.command(n, python), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise PeerFailed(f"the {peer.name} peer exited {proc.returncode}: {proc.stderr.strip()[-1500:]}")
    out = parse_peer_output(proc.stdout)
    why = peer.not_durable(out)
    if why:
        raise PeerFailed(f"the {peer.name} peer ran with {why}")
    return out


# --- counting statements and commits --------------------------------------------------------

_WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE|MERGE)\b", re.IGNORECASE)
_CTE_WRITE = re.compile(r"^\s*WITH\b.*\b(INSERT|UPDATE|DELETE)\b", re.IGNORECASE | re.DOTALL)
_ROW_LOCK = re.compile(r"\bFOR\s+(NO\s+KEY\s+UPDATE|UPDATE|SHARE|KEY\s+SHARE)\b", re.IGNORECASE)


def writes(sql: str) -> bool:
    """A statement that gives its transaction an ID on PostgreSQL when it touches a row:
    INSERT/UPDATE/DELETE/MERGE (also inside WITH) and row locks (SELECT ... FOR UPDATE)."""
    return bool(_WRITE.match(sql) or _CTE_WRITE.match(sql) or _ROW_LOCK.search(sql))


class DbWork:
    """What one call sends to the database through Django's connection.

    - ``statements``: every statement Django executes (``connection.execute_wrapper`` sees
      each one: queries, writes, SAVEPOINT/RELEASE, advisory locks); a batch
      (``executemany``) counts once. BEGIN is implicit in psycopg (sent with the first
      statement of a transaction) and COMMIT is not a cursor statement, so neither is here.
    - ``commits``: transactions that ended in a commit: every explicit COMMIT
      (``connection.commit()``, which ``transaction.atomic`` calls on its way out), plus
      every statement run in autocommit mode (outside ``atomic``, each is its own
      transaction, committed by the server).
    - ``durable_commits``: the commits that wait for a WAL flush to disk, i.e. of a
      transaction that was given an ID because it wrote (or locked) a row; a read-only
      commit does not flush. For an explicit transaction on PostgreSQL the server is asked
      just before the COMMIT (``pg_current_xact_id_if_assigned()``, sent on the raw
      connection, so not counted as a statement); an autocommit statement counts when it
      writes (``writes(sql)``) and touched a row (rowcount ≠ 0: an UPDATE that matched
      nothing or an INSERT ... ON CONFLICT DO NOTHING that conflicted gets no ID).
    """

    def __init__(self, connection):
        self.connection = connection
        self.statements = 0
        self.commits = 0
        self.durable_commits = 0
        self.rollbacks = 0
        self.autocommit_statements = 0
        self.sql: list[str] = []
        self._txn_writes = False

    def as_dict(self) -> dict:
        return {
            "statements": self.statements,
            "commits": self.commits,
            "durable_commits": self.durable_commits,
            "autocommit_statements": self.autocommit_statements,
            "rollbacks": self.rollbacks,
        }

    def __call__(self, execute, sql, params, many, context):
        conn = self.connection
        autocommit = conn.get_autocommit() and not conn.in_atomic_block
        result = execute(sql, params, many, context)
        self.statements += 1
        self.sql.append(" ".join(str(sql).split())[:160])
        wrote = writes(str(sql))
        if wrote:
            rowcount = getattr(context.get("cursor"), "rowcount", -1)
            wrote = rowcount is None or rowcount != 0
        if autocommit:
            self.autocommit_statements += 1
            self.commits += 1
            self.durable_commits += int(wrote)
        else:
            self._txn_writes = self._txn_writes or wrote
        return result

    def _assigned_xid(self) -> bool:
        conn = self.connection
        if conn.vendor == "postgresql" and conn.connection is not None:
            row = conn.connection.execute("SELECT pg_current_xact_id_if_assigned() IS NOT NULL").fetchone()
            return bool(row[0])
        return self._txn_writes

    def on_commit(self) -> None:
        self.commits += 1
        self.durable_commits += int(self._assigned_xid())
        self._txn_writes = False

    def on_rollback(self) -> None:
        self.rollbacks += 1
        self._txn_writes = False


@contextmanager
def count_db_work(connection=None):
    """Count what runs on ``connection`` (default: Django's) inside the block; see DbWork."""
    if connection is None:
        from django.db import connection

    work = DbWork(connection)
    commit, rollback = connection._commit, connection._rollback

    def counted_commit():
        work.on_commit()
        return commit()

    def counted_rollback():
        work.on_rollback()
        return rollback()

    connection._commit, connection._rollback = counted_commit, counted_rollback
    try:
        with connection.execute_wrapper(work):
            yield work
    finally:
        del connection._commit, connection._rollback


def checkpoint_rows() -> int:
    from reviews.models import WorkflowCheckpoint

    return WorkflowCheckpoint.objects.count()


def count_one(fn) -> tuple[dict, object]:
    """Run ``fn()`` once, counting its database work and the checkpoint rows it wrote."""
    before = checkpoint_rows()
    with count_db_work() as work:
        value = fn()
    counted = work.as_dict()
    counted["checkpoint_rows"] = checkpoint_rows() - before
    counted["sql"] = work.sql
    return counted, value


def count_ours(*, n: int, reviewer, prefix: str) -> dict:
    """Statements, commits, durable commits and checkpoint rows per begin and per resume,
    over ``n`` fresh cases (call after a warm-up: one-time lookups are not counted)."""
    from bench.data import make_cases
    from workflow.begin import review_begin

    per = {"begin": [], "resume": []}
    for case in make_cases(n, prefix=prefix, proposals=False):
        counted, begun = count_one(lambda case=case: review_begin(case=case, actor=None))
        per["begin"].append(counted)
        counted, _ = count_one(lambda case=case, op=begun.operation_id: decide(case, op, reviewer))
        per["resume"].append(counted)
    out = {}
    for phase, rows in per.items():
        out[phase] = {
            key: {"median": statistics.median(r[key] for r in rows), "max": max(r[key] for r in rows)}
            for key in ("statements", "commits", "durable_commits", "autocommit_statements", "checkpoint_rows")
        }
        out[phase]["n"] = len(rows)
        out[phase]["sql"] = rows[-1]["sql"]  # one call's statements, for whoever reads the JSON
    return out


# --- our rounds ---------------------------------------------------------------------------


def our_round(cases, reviewer) -> dict:
    """Begin every case, then resume + approve + commit every case; per-call ms."""
    from workflow.begin import review_begin

    begin_ms, resume_ms, ops = [], [], []
    for case in cases:
        t = time.perf_counter()
        begun = review_begin(case=case, actor=None)
        begin_ms.append((time.perf_counter() - t) * 1000)
        ops.append(begun.operation_id)
    for case, op in zip(cases, ops, strict=True):
        t = time.perf_counter()
        decide(case, op, reviewer)
        resume_ms.append((time.perf_counter() - t) * 1000)
    return {"begin": phase_stats(begin_ms), "resume": phase_stats(resume_ms)}


def _server_url() -> str:
    """The maintenance database on the server Django is using (for the peer)."""
    from urllib.parse import quote

    from django.db import connection

    s = connection.settings_dict
    auth = quote(s.get("USER") or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    host = s.get("HOST") or "127.0.0.1"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}{'@' if auth else ''}{host}{port}/postgres"


def _timing_result(key: str, title: str, subject: str, baseline: str, n: int) -> dict:
    from bench.measures import result

    return result(
        key,
        title,
        subject=subject,
        baseline=baseline,
        kind="cost",
        unit="ms",
        goal=("≤", 1.0),
        n=n,
        vendor="postgresql",
        subject_p90=[],
        baseline_p90=[],
        ours_only={"median_ms": [], "p90_ms": []},
    )


def _peer_results(peer: Peer, service: str, n: int, db: str) -> tuple[dict, dict, dict]:
    """The two timing results (ours ÷ this peer) and the peer's own record, still empty."""
    if peer is LANGGRAPH:
        resume_peer = "LangGraph peer: `graph.invoke(Command(resume=...))`, durability sync, keyed effect INSERT"
        begin_peer = "LangGraph peer: `graph.invoke({case_id})` to `interrupt()`, durability sync"
    else:
        resume_peer = (
            "DBOS peer, on its defaults: `DBOS.send(...)` until `handle.get_result()`, keyed effect INSERT in a step"
        )
        begin_peer = "DBOS peer, on its defaults: `DBOS.start_workflow(review)` until it waits durably in `recv`"
    n_resume, n_begin = peer.title_numbers
    resume = _timing_result(
        f"{peer.key}_resume",
        f"{n_resume}. resume + approve + commit vs {peer.name}, side by side, PostgreSQL",
        f"ours: `{service}(approved=True)` in-process (checkpoint, re-emitted request, decision + effect)",
        resume_peer,
        n,
    )
    begin = _timing_result(
        f"{peer.key}_begin",
        f"{n_begin}. begin vs {peer.name}, side by side, PostgreSQL",
        "ours: `review_begin(case, actor=None)` (proposal, run to the human step, pending review)",
        begin_peer,
        n,
    )
    for r in (resume, begin):
        r["goal"] = ("≤", peer.goal)
    script = peer.script.relative_to(ROOT)
    info: dict = {
        "key": peer.key if peer is DBOS else "side_peer",
        "kind": "peer",
        "peer": peer.name,
        "command": f"PEER_PG_DB={db} {peer.venv}/bin/python {script} bench {n} --effect keyed --runs 1 --durability sync",
        "rounds": [],
        "checkpoint_rows_per_case": [],
        "checkpoint_row_bytes_per_case": [],
        "versions": {},
        "settings": {},
        "service": service,
    }
    return resume, begin, info


def _analyze_ours() -> None:
    """Fresh planner statistics for our database before each round, as autovacuum keeps them
    on a production server; this machine's PostgreSQL runs without it (its CI settings). Each
    peer starts every round on a database of its own made afresh, where ours keeps every
    earlier round's rows (1,800 decisions by the last): without statistics, the plans our
    long-lived connection prepared while the tables were nearly empty stayed cached as they
    grew, and our resume went from 3.0 to 7.2 ms over one run's six rounds (2026-12-06)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def bench_side_by_side(
    *,
    n: int,
    rounds: int,
    warmup: int,
    count_n: int,
    peer_python: Path = PEER_PYTHON,
    dbos_python: Path = DBOS_PYTHON,
    peer_url: str | None = None,
    peer_db: str | None = None,
    dbos_db: str | None = None,
    log=print,
) -> list[dict]:
    from django.db import connection

    from bench.data import make_cases, run_token
    from workflow.begin import review_begin

    if connection.vendor != "postgresql":
        raise RuntimeError("the side-by-side benchmark runs on PostgreSQL only (the peers' checkpoints are)")
    peer_url = peer_url or _server_url()
    dbs = {
        "langgraph": peer_db or f"{connection.settings_dict['NAME']}_peer",
        "dbos": dbos_db or f"{connection.settings_dict['NAME']}_dbos",
    }
    pythons = {"langgraph": peer_python, "dbos": dbos_python}
    service = DECISION_SERVICE
    reviewer = authenticated_reviewer()
    token = run_token()

    sides = {}
    for peer in PEERS:
        resume, begin, info = _peer_results(peer, service, n, dbs[peer.side])
        missing = peer_missing_reason(pythons[peer.side], peer)
        if missing:
            log(f"side by side: {missing}")
        sides[peer.side] = {"peer": peer, "resume": resume, "begin": begin, "info": info, "missing": missing}
    orders: list[list[str]] = []
    sides["langgraph"]["resume"]["orders"] = orders  # who went first, for the report

    # Our warm-up (imports, statement caches, the reviewer), once, before the first round.
    for c in make_cases(warmup, prefix=f"{token}-sw", proposals=False):
        decide(c, review_begin(case=c, actor=None).operation_id, reviewer)
    case_sets = [make_cases(n, prefix=f"{token}-s{i}", proposals=False) for i in range(rounds)]

    errors: dict[str, str] = {}
    for i in range(rounds):
        _analyze_ours()
        order = round_order(i)
        orders.append(list(order))
        got: dict[str, dict] = {}
        for side in order:
            t = time.perf_counter()
            if side == "ours":
                got["ours"] = our_round(case_sets[i], reviewer)
                name = "ours"
            else:
                s = sides[side]
                name = s["peer"].name
                if s["missing"] or side in errors:
                    continue
                try:
                    got[side] = run_peer_round(
                        n, python=pythons[side], admin_url=peer_url, db=dbs[side], peer=s["peer"]
                    )
                except Exception as exc:
                    errors[side] = f"round {i + 1}: {exc}"
                    log(f"side by side: the {name} peer FAILED in {errors[side]}")
                    continue
            log(
                f"side by side round {i + 1}/{rounds}: {name} begin {got[side]['begin']['median_ms']:.2f} ms, "
                f"resume {got[side]['resume']['median_ms']:.2f} ms ({time.perf_counter() - t:.1f} s)"
            )
        ours = got["ours"]
        for s in sides.values():
            peer_round = got.get(s["peer"].side)
            for res, phase in ((s["resume"], "resume"), (s["begin"], "begin")):
                res["ours_only"]["median_ms"].append(ours[phase]["median_ms"])
                res["ours_only"]["p90_ms"].append(ours[phase]["p90_ms"])
                if peer_round is not None:
                    res["subject_values"].append(ours[phase]["median_ms"])
                    res["baseline_values"].append(peer_round[phase]["median_ms"])
                    res["ratios"].append(ours[phase]["median_ms"] / peer_round[phase]["median_ms"])
                    res["subject_p90"].append(ours[phase]["p90_ms"])
                    res["baseline_p90"].append(peer_round[phase]["p90_ms"])
            if peer_round is not None:
                info = s["info"]
                info["rounds"].append({"round": i + 1, "begin": peer_round["begin"], "resume": peer_round["resume"]})
                info["checkpoint_rows_per_case"].append(peer_round["checkpoint_rows_per_case"])
                info["checkpoint_row_bytes_per_case"].append(peer_round["checkpoint_row_bytes_per_case"])
                info["versions"] = peer_round["versions"]
                info["settings"] = peer_round["settings"]

    out: list[dict] = []
    for side, s in sides.items():
        out += [s["resume"], s["begin"]]
        info_key = s["info"]["key"]
        if s["missing"]:
            out.append({"key": info_key, "kind": "missing", "bench": "side_by_side", "error": s["missing"]})
        elif side in errors:
            out.append({"key": info_key, "kind": "error", "bench": "side_by_side", "error": errors[side]})
        else:
            out.append(s["info"])

    def rows_per_case(side: str):
        values = sides[side]["info"]["checkpoint_rows_per_case"]
        return statistics.median(values) if values else None

    counts = count_ours(n=count_n, reviewer=reviewer, prefix=f"{token}-sc")
    out.append(
        {
            "key": "side_counts",
            "kind": "counts",
            "vendor": "postgresql",
            "service": service,
            "n": count_n,
            **counts,
            "goals": {
                "statements": GOAL_STATEMENTS,
                "durable_commits": GOAL_DURABLE_COMMITS,
                "checkpoint_rows": GOAL_CHECKPOINT_ROWS,
            },
            "peer_checkpoint_rows_per_case": rows_per_case("langgraph"),
            "dbos_checkpoint_rows_per_case": rows_per_case("dbos"),
        }
    )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument("--n", type=int, help="cases per round (default: 300 full, 20 smoke)")
    parser.add_argument("--rounds", type=int, help="rounds per side (default: 6 full, 3 smoke)")
    parser.add_argument("--peer-python", default=str(PEER_PYTHON), help="the LangGraph peer's Python")
    parser.add_argument("--dbos-python", default=str(DBOS_PYTHON), help="the DBOS peer's Python")
    parser.add_argument("--peer-url", help="the server's maintenance database (default: Django's server)")
    parser.add_argument("--peer-db", help="the LangGraph peer's own database (default: <ours>_peer)")
    parser.add_argument("--dbos-db", help="the DBOS peer's own database (default: <ours>_dbos)")
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL"):
        parser.error("DATABASE_URL must name the benchmark database")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "decisionflow.settings")
    import django

    django.setup()
    scale = dict(SCALES[args.scale])
    scale["n"] = args.n or scale["n"]
    scale["rounds"] = args.rounds or scale["rounds"]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from core.observability import events_off_stderr

    try:
        with events_off_stderr():  # the decision events go to DECISIONFLOW_EVENT_LOG_FILE (bench/run.py)
            results = bench_side_by_side(
                **scale,
                peer_python=Path(args.peer_python),
                dbos_python=Path(args.dbos_python),
                peer_url=args.peer_url,
                peer_db=args.peer_db,
                dbos_db=args.dbos_db,
                log=log,
            )
    except Exception:
        log(f"side by side: FAILED\n{traceback.format_exc(limit=8)}")
        results = [
            {"key": "side_resume", "kind": "error", "bench": "side_by_side", "error": traceback.format_exc(limit=8)}
        ]
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
