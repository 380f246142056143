"""Render the benchmark results as docs/PERFORMANCE.md (no Django needed)."""

from __future__ import annotations

import re

from bench import audit_export
from bench.stats import summary

ORDER = [
    "identity",
    "identity_nonascii",
    "markers_10k",
    "markers_100k",
    "markers_250k",
    "commit_postgresql",
    "orm_postgresql",
    "commit_concurrent",
    "replay_postgresql",
    "resume_postgresql",
    "resume_floor",
    "begin_postgresql",
    "side_resume",
    "side_begin",
    "side_dbos_resume",
    "side_dbos_begin",
    "process_start",
    "reconcile_command",
    "reconcile_service",
    "commit_sqlite",
    "orm_sqlite",
    "replay_sqlite",
    "begin_sqlite",
    "cron_start",
]

# What profiling found, per measure; printed under "Findings". Kept next to the renderer so
# a re-run regenerates the whole document.
FINDINGS = {
    "markers_250k": (
        "Each marker's line and column were found by counting the line breaks from the start of the text "
        "(`core.text.position` per marker), so marking grew with the square of the text: one 250 KB edit of "
        "soft hyphens took 26.9 s to answer, and the case's API answer (65 MB) and review page (72 MB) "
        "listed every marker. Now each kind of marker is found in one pass and placed in one more scan "
        "(`core.text._Lines`), and only the listed ones are built. `markers()` still builds one object per "
        "marker (measured ad hoc: about 3.5 µs each, and the cyclic garbage collector walking them adds up "
        "to as much again at 250 KB), so the ratio to `str.count` stays of the same order from 100 KB to "
        "250 KB rather than growing with the text; `warnings()`, what the pages and the API call, builds "
        "50 per field and took about 40 ms at 250 KB. What a page or answer lists is capped at "
        "`MARKERS_LISTED` (50) per field, with the full count beside it, and a draft body is at most "
        "`DECISIONFLOW_MAX_BODY_CHARS` (20,000) characters (docs/TEXT.md). The eight kinds of marker "
        "are each one compiled `regex` pattern that starts with its rarest class, and every pass starts at the "
        "text's first character beyond ASCII (measured ad hoc, 250 KB, best of 5, before and after: soft "
        "hyphens 450-560 ms and 390-410 ms; mixed prose in ten scripts 44-51 ms and 38-60 ms; ASCII with one "
        "accented letter at the end 20-30 ms and 1.3 ms)."
    ),
    "identity": (
        "Profiled with cProfile/timeit: of ~14 µs per `operation_id` on a 4 KiB draft, SHA-256 itself was "
        "~4 µs; `normalize_newlines` ran two `str.replace` scans over the draft even when it had no CR "
        "(~4.5 µs), and `encode_fields` built an f-string label per field and grew a bytearray (~5 µs). "
        "This benchmark proposed the fix as a prototype (same identities as the protocol vectors); it is "
        "now in decisionflow/identity.py (commit 8ec0de5: no newline scans when there is no CR, the error "
        "label only on error, one `b''.join`), which took the ratio from 0.26× to the figure above. What "
        "stays out of reach: this CPU hashes the 4.3 KB in ~3.6 µs (SHA-NI), and framing six fields in "
        "Python costs ~3 µs even in that form, so 0.8 would need the framing in C. Larger drafts do not "
        "help (measured ad hoc: 0.24 at 64 KiB before the fix, 0.4 after), because the UTF-8 encoding "
        "scales with the text just as the hash does, and a non-ASCII draft (1, context) pays ~3 µs more "
        "per 4 KiB to encode."
    ),
    "commit_postgresql": (
        "The commit is two round trips, each statement a transaction of its own in Django's autocommit "
        "(effects/services.py `effect_commit`, effects/store.py): one read (the case, the proposal, the "
        "standing decision with its reviewer, whether its effect and an open pending review exist); "
        "Python decides the outcome (stale, conflict, replay, new); one statement with every write (a "
        "guard that locks the case row `FOR NO KEY UPDATE` only while its current proposal is the one "
        "read, the decision, the effect, the delivery, the attempt row, the pending review completed), "
        "which sets its own lock timeout and commits as it ends. The baseline takes four (psycopg's "
        "BEGIN, two inserts, COMMIT). Both statements are bound on the server, so psycopg prepares them "
        "on a direct connection (`DATABASE_PREPARE_THRESHOLD`; off behind a pooler). What separates it "
        "from raw is client CPU (about 1 ms per commit: the rows read back as models, the new rows built "
        "as models and their parameters through the fields' own `get_db_prep_save`) and the database work"
        " the guarantees need: the case row lock, the lock timeout and the append-only attempt row (every"
        ' click is history; four indexes, its case and reviewer unchecked references). The "ORM floor" '
        "row (the same two inserts through `objects.create`) reaches {orm_postgresql} of raw, for "
        "comparison."
    ),
    "commit_concurrent": (
        "With 8 processes on 2 cores both sides are CPU-bound (the server's backends and the clients share "
        "the cores); the case row locks do not contend (every worker commits different cases). Fewer round "
        "trips matter most here: each one is a send, a wake-up of the server and a wake-up of the client."
    ),
    "replay_postgresql": (
        "The baseline's replay is two statements that write nothing, so its COMMIT has nothing to flush. "
        "A replay through `effect_commit` is the same two round trips as a first commit and appends a "
        "CommitAttempt row (outcome `replay`) by design. That row is all it writes, so its write "
        "statement turns `synchronous_commit` off for its own transaction (`set_config(…, true)`) and "
        "does not wait for the WAL flush; a fresh decision or effect always does. The trade: a replay's "
        "audit row can be lost if the PostgreSQL server crashes within ~3 × `wal_writer_delay` of the "
        "answer; the decision and effect are never at risk (docs/RELIABILITY.md)."
    ),
    "resume_postgresql": (
        "A resume is the one decision service (`decision_record`): one query reads the pending review with "
        "its checkpoint row, the binding checks run in Python (HMAC, case, operation, nothing in flight), "
        "then one engine run restores the checkpoint from memory and answers it in one call (one "
        "sync-to-async crossing, on the caller's own thread: no thread or event loop is started per call), "
        "and its commit step is `effect_commit` above, with the reviewer the "
        "channel authenticated (no permission queries). The engine's own checkpoints of the answered run "
        "stay in memory: once the commit has happened, recovery reads the effect store. Before issue 12: "
        "29 statements, six durable commits and four checkpoint rows per resume, two engine runs."
    ),
    "resume_floor": (
        "The floor is the least any approval of a begun case must do, by hand in bare psycopg on its own "
        "connection: one durable transaction that takes the case row lock (`FOR NO KEY UPDATE`, the lock the "
        "commit takes, so two decisions on one case are serialised) and writes the decision and its effect (the "
        "rows that make the approval durable and that reconcile reads) in one statement. BEGIN, the lock, the "
        "write, COMMIT: four round trips, psycopg's defaults (it prepares a statement after five runs). Nothing "
        "less keeps the guarantees. What a resume does above it: one statement reads the pending review with its "
        "checkpoint, the binding checks and the engine run in Python, the attempt row and the pending review "
        "completed in the commit statement, and the decision's JSON event line. Same rows checked: "
        "tests/bench/test_resume_floor.py compares the floor's decision and effect with `effect_commit`'s."
    ),
    "begin_postgresql": (
        "Begin = `proposal_create` plus one engine run to the human step, with the one checkpoint row it "
        "writes (the pause; the engine's other checkpoints of the run stay in memory) and the pending "
        "review row. A case's first begin on PostgreSQL takes no lock: one statement reads the case, its "
        "policy and its evidence and draws the first proposal's id; the engine runs; one statement writes"
        " the proposal, the case's pointer (compare-and-swap), the pause and the pending review, and "
        "commits as it ends. Two round trips, both statements prepared by psycopg on a direct connection."
        " The peer's begin does no database work of its own in `prepare`."
    ),
    "process_start": (
        "Profiled with `python -X importtime`: `resume` runs the workflow, so its module imports "
        "`workflow.decide` and through it the engine and agent-framework (~0.1 s of "
        "imports on a quiet machine), even for `--help`. Nothing else does: the admin pages load with the "
        "URLs (SimpleAdminConfig), never in a command, and `api.services` imports no workflow, so `reconcile`, "
        "`prune_checkpoints` and `load_case` start without agent-framework (14 below). Report only; no goal."
    ),
    "cron_start": (
        "An admin discovered at start-up would import the workflow, and through it agent-framework (~0.3 s), "
        "for every command: 1.40× (median of 5, measured when it did). The admin pages load with the URLs "
        "(SimpleAdminConfig; decisionflow/urls.py), so `reconcile`, `prune_checkpoints` and "
        "`load_case` import no agent-framework (tests/workflow/test_retention.py checks it with "
        "`-X importtime`). Every command of ours refuses to run on unapplied migrations; that check built "
        "Django's migration graph, importing every migration module (~30 ms, cProfile). It now compares the "
        "migration files on disk with django_migrations (one query, no imports) and builds the graph only "
        "when a file is not recorded: CPU time 1.28× → 1.21× a bare `check` (15 interleaved pairs, "
        "rusage, loaded machine). What remains is Django populating 14 apps and the one connection the "
        "command needs (the bare `check` opens none)."
    ),
    "reconcile_command": (
        "The service (8, service level) streams Python rows at {reconcile_service} of a raw server-side "
        "cursor (`SET LOCAL cursor_tuple_fraction = 1.0` gets the whole-result plan: hash joins and one "
        "sort). The command no longer goes through those rows: with `--json` the database makes each line "
        "(string concatenation with `to_json` for the strings; the state is `operation_state`'s own truth "
        "table written out as a nested CASE, so the rule stays in Python), psycopg streams them in libpq's "
        "chunked-rows mode (`cursor.stream(..., size=2000)`: each result 2,000 rows made in C, and the plan "
        "still parallel, which a server-side cursor's never is), each chunk is joined and goes to standard "
        "output's binary layer; the states are counted in each chunk's bytes. Read as COPY data instead, "
        "each line cost a Python step in psycopg's copy reader: 1.0 s of client CPU over a million lines "
        'against 0.4 s, and 1.53× → 1.10× in one sitting ("fourth pass"). A profile of the old '
        "command: ~4 µs of Python per operation (row, state, line, counters), twice the query (2.56–2.94× "
        "before). For that query: `SET LOCAL jit = off` (compiling the line's expressions cost more than they "
        "ran: 3.78 s → 3.01 s, best of 4, loaded machine) and `SET LOCAL work_mem = '64MB'` (the sort carries "
        "the finished lines; in memory 1.9 s, spilled 2.1 s). Deliveries (their age decides an alert) and the "
        "rows to repair are read again on their own, and only those. A test holds the lines to `json.dumps` "
        "for every state, a delivery and awkward strings (quotes, backslashes, controls, non-ASCII). The "
        "baseline is the same query raw: its joins (the delivery's too), rows and order, and the seven columns "
        "the lines are made from (tests/bench/test_bench_smoke.py holds its text to the service's); until "
        "2026-12-06 it read four columns without the delivery join. The approvals of an undecided operation "
        "come from one grouped join: as three correlated subqueries per row they kept the plan off parallel "
        'workers (1.94× → 1.45×, docs/PERFORMANCE.md, "third pass"). What remains: the formatting, a sort '
        "of lines wider than the raw rows, more bytes to stream, and Python with Django's start (~0.4 s on "
        "a quiet machine). Memory stays flat: one 2,000-line chunk."
    ),
}


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def wall_time_line(total_s: float, parts: dict[str, float]) -> str:
    """A run's own wall time and each part's, longest first (bench.run prints it last)."""
    each = ", ".join(f"{part} {_minutes(s)}" for part, s in sorted(parts.items(), key=lambda kv: -kv[1]))
    return f"wall time {_minutes(total_s)} in all" + (f"; by part: {each}" if each else "")


# The budget of a whole `make bench` run on 2 cores.
BUDGET_S = 30 * 60


def wall_time_goal_row(info: dict) -> str:
    """The goal row of a whole run's wall time (a partial run, ``--only``, does not replace it)."""
    took = info.get("duration_s", 0)
    parts = info.get("part_s") or {}
    each = ", ".join(f"{part} {_minutes(s)}" for part, s in sorted(parts.items(), key=lambda kv: -kv[1]))
    return (
        f"| `{info.get('command')}` wall time, every part (2 cores) | **{_minutes(took)}** ({each or 'no part ran'}) | "
        f"≤ {BUDGET_S // 60} min | {'**met**' if took <= BUDGET_S else '**missed**'} |"
    )


def _fmt(value, unit: str) -> str:
    if value is None:
        return "—"
    if unit in ("ops/s", "rows/s"):
        return f"{value:,.0f} {unit}"
    if unit == "µs/op":
        return f"{value:.1f} {unit}"
    if unit in ("ms/op", "ms"):
        return f"{value:.1f} {unit}"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:.3g} {unit}"


def _ratio_text(r: dict, s: dict) -> str:
    word = "of the baseline's speed" if r["kind"] == "speed" else "the baseline's cost"
    return f"**{s['median']:.2f}×** {word}"


def _met(r: dict, median: float) -> str:
    goal = r.get("goal")
    if not goal:
        return "report only"
    op, value = goal
    ok = median >= value if op == "≥" else median <= value
    return "**yes**" if ok else "**no**"


def _goal(r: dict) -> str:
    goal = r.get("goal")
    if not goal:
        return "report only"
    op, value = goal
    return f"{op} {value:g}×"


def _spread(s: dict) -> str:
    return f"{s['min']:.2f}–{s['max']:.2f} (±{s['spread'] * 50:.0f}%)" if s["spread"] is not None else "—"


# --- the goals, one row each ---------------------------------------------------------------


def _not_measured(by_key: dict, *keys: str) -> str:
    for key in keys:
        r = by_key.get(key)
        if r and r.get("kind") in ("error", "missing"):
            first = (r.get("error", "").strip().splitlines() or [""])[-1]
            return f"not measured: {first[:160]}"
    return "not measured in this run"


def _failed(by_key: dict, *keys: str) -> str:
    """The met? cell of a goal whose measure did not give a figure: missed when the measure
    ran and failed (never a quiet dash), a dash when this run left it out."""
    failed = any((by_key.get(key) or {}).get("kind") in ("error", "missing") for key in keys)
    return "**missed** (not measured)" if failed else "—"


def _ratio_goal_row(by_key: dict, label: str, goal: tuple[str, float], key: str, *also: str) -> str:
    op, value = goal
    r = by_key.get(key)
    if not r or r.get("kind") not in ("speed", "cost") or not r.get("ratios"):
        return f"| {label} | {_not_measured(by_key, key, *also)} | {op} {value:g}× | {_failed(by_key, key, *also)} |"
    s = summary(r["ratios"])
    sv, bv = summary(r["subject_values"]), summary(r["baseline_values"])
    ok = s["median"] >= value if op == "≥" else s["median"] <= value
    return (
        f"| {label} | **{s['median']:.2f}×**, median of {s['n']} runs ({s['min']:.2f}–{s['max']:.2f}; "
        f"{_fmt(sv['median'], r['unit'])} vs {_fmt(bv['median'], r['unit'])}) | {op} {value:g}× | "
        f"{'**met**' if ok else '**missed**'} |"
    )


def _count_goal_rows(by_key: dict) -> list[str]:
    c = by_key.get("side_counts")
    if not c or c.get("kind") != "counts":
        why = _not_measured(by_key, "side_counts", "side_resume")
        met = _failed(by_key, "side_counts", "side_resume")
        return [
            f"| statements per resume, with durable commits | {why} | ≤ 12 statements, ≤ 2 durable commits | {met} |",
            f"| checkpoint rows written per resume | {why} | ≤ 1 | {met} |",
        ]
    g, r = c["goals"], c["resume"]
    st, dc, ck = r["statements"]["max"], r["durable_commits"]["max"], r["checkpoint_rows"]["max"]
    ok = st <= g["statements"] and dc <= g["durable_commits"]
    return [
        f"| statements per resume, with durable commits (`{c['service']}`) | **{st} statements, {dc} durable "
        f"commit{'' if dc == 1 else 's'}** "
        f"(most over {c['n']} resumes) | ≤ {g['statements']} statements, ≤ {g['durable_commits']} durable commits | "
        f"{'**met**' if ok else '**missed**'} |",
        f"| checkpoint rows written per resume | **{ck}** (most over {c['n']} resumes) | ≤ {g['checkpoint_rows']} | "
        f"{'**met**' if ck <= g['checkpoint_rows'] else '**missed**'} |",
    ]


def goals_table(by_key: dict) -> list[str]:
    """The goals of the resume-path work, one row each: measured value, goal, met or missed."""
    return [
        "## Goals",
        "",
        "| goal | measured | target | met? |",
        "|---|---|---|---|",
        _ratio_goal_row(
            by_key,
            "resume + approve + commit, ours ÷ LangGraph (median ms per call)",
            ("≤", 1.0),
            "side_resume",
            "side_peer",
        ),
        _ratio_goal_row(by_key, "begin, ours ÷ LangGraph (median ms per call)", ("≤", 1.0), "side_begin", "side_peer"),
        _ratio_goal_row(
            by_key,
            "resume + approve + commit, ours ÷ DBOS (median ms per call; DBOS on its defaults, ours on ours)",
            ("≤", 0.5),
            "side_dbos_resume",
            "side_dbos",
        ),
        _ratio_goal_row(
            by_key,
            "begin, ours ÷ DBOS (median ms per call; DBOS on its defaults, ours on ours)",
            ("≤", 0.5),
            "side_dbos_begin",
            "side_dbos",
        ),
        _ratio_goal_row(by_key, "commit, 1 connection, ÷ raw psycopg (approvals/s)", ("≥", 0.5), "commit_postgresql"),
        _ratio_goal_row(by_key, "commit, 8 connections, ÷ raw psycopg (approvals/s)", ("≥", 0.5), "commit_concurrent"),
        _ratio_goal_row(by_key, "replay ÷ raw conflicting inserts (replays/s)", ("≥", 0.5), "replay_postgresql"),
        _ratio_goal_row(
            by_key,
            "resume ÷ the raw floor (psycopg: BEGIN; the lock; one write statement; COMMIT; ms per resume)",
            ("≤", 2.5),
            "resume_floor",
            "resume_floor_postgresql",  # the key bench.inproc gives the measure's error
        ),
        *_count_goal_rows(by_key),
        _intake_goal_row(by_key.get("intake")),
        _ratio_goal_row(by_key, "audit export of 1M attempts ÷ raw COPY (rows/s)", ("≥", 0.5), "audit_export"),
        "",
    ]


def _intake_goal_row(r: dict | None) -> str:
    label = "| intake through the API, 8 clients, ÷ the services in-process (new cases/s, review begun)"
    if not r or r.get("kind") != "intake":
        failed = r is not None and r.get("kind") in ("error", "missing")
        return f"{label} | not measured in this run | ≥ 0.5× | {'**missed** (not measured)' if failed else '—'} |"
    lo, hi = r["ratio_range"]["8"]
    met = "**met**" if r["ratio"]["8"] >= r["goal"] else "**missed**"
    return (
        f"{label} | **{r['ratio']['8']:.2f}×**, median of {r['rounds']} rounds ({lo:.2f}–{hi:.2f}; "
        f"{r['median']['api_8']:.1f}/s vs {r['median']['inprocess']:.1f}/s) | ≥ {r['goal']}× | {met} |"
    )


# --- 11, 12, 18 and 19: side by side with LangGraph and DBOS ----------------------------------

# The peers as the side-by-side results name them: (name, timing key prefix, own record's key).
SIDE_PEERS = (("LangGraph", "side", "side_peer"), ("DBOS", "side_dbos", "side_dbos"))


def _ms(values: list[float]) -> str:
    return f"{summary(values)['median']:.2f} ms" if values else "—"


def _side_text(by_key: dict, info: dict) -> str | None:
    lines = side_by_side_section(by_key, info)
    if not lines:
        return None
    begin, end = section_markers("side")
    return "\n".join([begin, *lines, end])


def side_by_side_section(by_key: dict, info: dict | None = None) -> list[str]:
    resume, begin = by_key.get("side_resume"), by_key.get("side_begin")
    counts = by_key.get("side_counts")
    if not resume or resume.get("kind") != "cost":
        return []
    service = (counts or {}).get("service") or "the decision service"
    lines = [
        "## 11–12, 18–19. Side by side with LangGraph and with DBOS (PostgreSQL)",
        "",
        "Two peers do the same job as we do, each the way its own documentation shows, each in its own virtual "
        "environment as one process per round, on its own database on the same server:",
        "",
        "- **LangGraph** (bench/peer/langgraph_hitl.py, `.venv-peer` from requirements/peer.txt): `prepare` → "
        "`review` with `interrupt()` → `commit`, on LangGraph's PostgreSQL checkpointer, with `--durability sync` "
        "so that it commits durably before a call returns. Begin is `graph.invoke({case_id})` until it stops at "
        "`interrupt()`; resume is `graph.invoke(Command(resume=...))`.",
        "- **DBOS Transact** (bench/peer/dbos/dbos_hitl.py, `.venv-dbos` from requirements/dbos.txt): one durable "
        "workflow per case, `prepare` step → `set_event` → `recv` (a durable wait) → `commit` step, in DBOS's "
        "system database. Begin is `DBOS.start_workflow(review, case_id)` until the workflow waits durably in "
        "`recv`; resume is `DBOS.send(case_id, approval)` until `handle.get_result()` returns. **DBOS runs on its "
        "defaults** (its own connection pool; it commits every checkpoint before going on, and the run checks "
        "that `synchronous_commit` is `on` for its engine), **and we run on ours**.",
        "",
        "Both commit the effect as we do: an `INSERT ... ON CONFLICT (operation_id) DO NOTHING`. "
        "Rounds are interleaved, and who goes first rotates each round (LangGraph, DBOS, ours; then DBOS, "
        f"ours, LangGraph; then ours, LangGraph, DBOS), {resume['n']} fresh cases per round and side: begin for "
        "every case, then resume + approve + commit for every case, each call timed in-process with "
        "`perf_counter`, one after another (no process start on any side). Ours: `review_begin(case=case, "
        f'actor=None)`, then `{service}(case=..., operation_id=..., approved=True, reviewer=..., channel="bench")` '
        "with a reviewer of the Reviewers group whose permission was checked once before (as the admin and the "
        "API do). A round's figure is the median (and the p90, nearest rank) of its calls; a ratio is ours ÷ a "
        "peer's in the same round; the table shows the median over rounds and the range of the rounds' ratios. "
        "Lower is better for us. The machine is shared: read the ratios, not the times.",
        "",
    ]
    took = (info or {}).get("part_s", {}).get("side")
    if info and info.get("command"):
        lines += [
            f"Run: `{info['command']}`, {info.get('date')}"
            + (f"; this part took {_minutes(took)} of wall time." if took else "."),
            "",
        ]
    for name, _prefix, info_key in SIDE_PEERS:
        info = by_key.get(info_key)
        if info and info.get("kind") in ("missing", "error"):
            lines += [f"**The {name} peer was not measured in this run**: {info['error'].strip()[-300:]}", ""]
    lines += [
        "| call | ours: median | ours: p90 | peer | peer: median | peer: p90 | ours ÷ peer (median; rounds min–max) | goal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, phase in (("resume + approve + commit", "resume"), ("begin", "begin")):
        for name, prefix, _info_key in SIDE_PEERS:
            r = by_key.get(f"{prefix}_{phase}")
            if not r or r.get("kind") != "cost":
                continue
            if r["ratios"]:
                s = summary(r["ratios"])
                ratio = f"**{s['median']:.2f}×** ({s['min']:.2f}–{s['max']:.2f})"
            else:
                ratio = "—"
            goal = r.get("goal") or ("≤", 1.0)
            lines.append(
                f"| {label} | {_ms(r['ours_only']['median_ms'])} | {_ms(r['ours_only']['p90_ms'])} | {name} | "
                f"{_ms(r['baseline_values'])} | {_ms(r['baseline_p90'])} | {ratio} | {goal[0]} {goal[1]:g}× |"
            )
    lines.append("")
    orders = resume.get("orders") or []
    if orders:
        peers = {name: by_key.get(info_key) for name, _p, info_key in SIDE_PEERS}
        by_round = {
            name: {pr.get("round", i + 1): pr for i, pr in enumerate(info["rounds"])}
            for name, info in peers.items()
            if info and info.get("kind") == "peer"
        }
        names = {"ours": "ours", "langgraph": "LangGraph", "dbos": "DBOS"}

        def cell(name: str, i: int, phase: str) -> str:
            pr = by_round.get(name, {}).get(i + 1)
            return f"{pr[phase]['median_ms']:.2f} / {pr[phase]['p90_ms']:.2f}" if pr else "—"

        ours_m, ours_p = resume["ours_only"]["median_ms"], resume["ours_only"]["p90_ms"]
        begin_m = begin["ours_only"]["median_ms"] if begin else []
        begin_p = begin["ours_only"]["p90_ms"] if begin else []
        lines += [
            "Per round, median / p90 in ms:",
            "",
            "| round | order | ours begin | LangGraph begin | DBOS begin | ours resume | LangGraph resume | DBOS resume |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for i, order in enumerate(orders):
            ob = f"{begin_m[i]:.2f} / {begin_p[i]:.2f}" if i < len(begin_m) else "—"
            orr = f"{ours_m[i]:.2f} / {ours_p[i]:.2f}" if i < len(ours_m) else "—"
            lines.append(
                f"| {i + 1} | {', '.join(names.get(s, s) for s in order)} | {ob} | {cell('LangGraph', i, 'begin')} | "
                f"{cell('DBOS', i, 'begin')} | {orr} | {cell('LangGraph', i, 'resume')} | {cell('DBOS', i, 'resume')} |"
            )
        lines.append("")
    for name, _prefix, info_key in SIDE_PEERS:
        info = by_key.get(info_key)
        if not info or info.get("kind") != "peer" or not info["rounds"]:
            continue
        v = info.get("versions", {})
        if name == "LangGraph":
            what = (
                f"LangGraph {v.get('langgraph')}, langgraph-checkpoint-postgres "
                f"{v.get('langgraph-checkpoint-postgres')}, psycopg {v.get('psycopg')}, Python {v.get('python')}"
            )
        else:
            st = info.get("settings", {})
            what = (
                f"DBOS {v.get('dbos')}, SQLAlchemy {v.get('sqlalchemy')}, psycopg {v.get('psycopg')}, Python "
                f"{v.get('python')}; `synchronous_commit` {st.get('synchronous_commit')} (server), "
                f"{st.get('dbos_engine_synchronous_commit')} (DBOS's engine)"
            )
        lines.append(f"- {name}: {what}; `{info['command']}` per round (5 warm-up cases each, not timed).")
    lines.append("")
    if counts and counts.get("kind") == "counts":
        g = counts["goals"]

        def count_cell(phase: str, key: str) -> str:
            m = counts[phase][key]
            return f"{m['median']:g}" if m["median"] == m["max"] else f"{m['median']:g} (most {m['max']:g})"

        lines += [
            f"What one call sends and writes (ours, counted over {counts['n']} fresh cases after the timed rounds, "
            "not timed):",
            "",
            "| per call | statements | commits | durable commits | of them autocommit statements | checkpoint rows written |",
            "|---|---|---|---|---|---|",
        ]
        for label, phase in ((f"resume (`{service}`)", "resume"), ("begin (`review_begin`), context", "begin")):
            lines.append(
                f"| {label} | {count_cell(phase, 'statements')} | {count_cell(phase, 'commits')} | "
                f"{count_cell(phase, 'durable_commits')} | {count_cell(phase, 'autocommit_statements')} | "
                f"{count_cell(phase, 'checkpoint_rows')} |"
            )
        lines.append(
            f"| goal for a resume | ≤ {g['statements']} | | ≤ {g['durable_commits']} | | ≤ {g['checkpoint_rows']} |"
        )
        per_case = counts["begin"]["checkpoint_rows"]["median"] + counts["resume"]["checkpoint_rows"]["median"]
        theirs = []
        for name, key, tables in (
            (
                "LangGraph",
                "peer_checkpoint_rows_per_case",
                "its three tables: checkpoints, checkpoint_blobs, checkpoint_writes",
            ),
            (
                "DBOS",
                "dbos_checkpoint_rows_per_case",
                "its five tables: workflow_status, operation_outputs, notifications, workflow_events, "
                "workflow_events_history",
            ),
        ):
            rows = counts.get(key)
            theirs.append(f"{name} {rows:g} ({tables})" if rows is not None else f"{name} not measured in this run")
        lines += [
            "",
            f"Checkpoint rows per case, begin and resume together: ours {per_case:g}, {'; '.join(theirs)}.",
            "",
            "How these are counted: *statements* are every statement Django sends on the connection, as "
            "`connection.execute_wrapper` sees them (queries, writes, SAVEPOINT/RELEASE, the advisory lock and "
            "unlock; psycopg's implicit BEGIN and the COMMIT are not statements there). *Commits* are the "
            "transactions that ended in a commit: each `connection.commit()` (what `transaction.atomic` calls on "
            "its way out), counted by wrapping the connection's commit, plus each statement run in autocommit "
            "mode, which is its own transaction. *Durable commits* are those that wait for a WAL flush because "
            "the transaction wrote or locked a row: for an explicit transaction the server says so just before "
            "the COMMIT (`pg_current_xact_id_if_assigned()`, sent outside the count); an autocommit statement "
            "counts when it is an INSERT/UPDATE/DELETE (or a row lock) that touched a row. *Checkpoint rows* are "
            "`reviews.WorkflowCheckpoint` rows before and after the call.",
            "",
        ]
    return lines


def _bytes(value) -> str:
    return "—" if value is None else f"{value:,.0f}"


def retention_section(results: list[dict]) -> list[str]:
    """Storage per case before and after `prune_checkpoints` (bench/retention.py)."""
    rows = [r for r in results if r.get("kind") == "retention"]
    if not rows:
        return []
    lines = [
        "## 13. Checkpoint retention: storage per case before and after pruning",
        "",
        "Fresh cases begun and approved (finished) plus a few left pending, all moved 40 days back, then "
        "`checkpoints_prune(older_than=30 days, apply=True)` (what `manage.py prune_checkpoints --older-than "
        "30d --apply` runs). Per case, over every table the case touches; row bytes are `pg_column_size` "
        "(PostgreSQL) or the columns' length (SQLite); disk is `pg_total_relation_size` growth after a "
        "plain VACUUM (space kept for reuse, not returned to the OS).",
        "",
        "| database | cases (finished + pending) | checkpoint rows per case | checkpoint row bytes per case | "
        "all rows per case | all row bytes per case | disk bytes per case | deleted | prune time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cb, ca, b, a = r["checkpoint_before"], r["checkpoint_after"], r["before"], r["after"]
        lines.append(
            f"| {r['vendor']} | {r['finished']} + {r['pending']} | {cb['rows']:.2f} → **{ca['rows']:.2f}** | "
            f"{_bytes(cb['data'])} → **{_bytes(ca['data'])}** | {b['rows']:.2f} → {a['rows']:.2f} | "
            f"{_bytes(b['data'])} → {_bytes(a['data'])} | {_bytes(b['disk'])} → {_bytes(a['disk'])} | "
            f"{r['deleted']} in {r['batches']} batch(es) | {r['prune_s'] * 1000:.0f} ms |"
        )
    lines += [
        "",
        "Checkpoint rows left for the finished cases: "
        + ", ".join(f"{r['vendor']} **{r['finished_checkpoints_left']}**" for r in rows)
        + ". What is left of the checkpoints are the pending reviews' pauses (always kept). Decisions, effects "
        "and commit attempts are append-only and untouched.",
        "",
    ]
    return lines


def _summary_row(r: dict) -> str:
    """One measure's row of the summary table."""
    s = summary(r["ratios"])
    sv, bv = summary(r["subject_values"]), summary(r["baseline_values"])
    return (
        f"| {r['title']} | {r['subject']} | {r['baseline']} | {_ratio_text(r, s)} | {_spread(s)} | "
        f"{_goal(r)} | {_met(r, s['median'])} | {_fmt(sv['median'], r['unit'])} | {_fmt(bv['median'], r['unit'])} |"
    )


def _retention_text(results: list[dict]) -> str | None:
    lines = retention_section(results)
    if not lines:
        return None
    begin, end = section_markers("retention")
    return "\n".join([begin, *lines]).rstrip("\n") + "\n" + end


def delivery_section(results: list[dict]) -> str | None:
    """15. One delivery worker against the reference helpdesk's raw accept rate (bench/delivery.py)."""
    rows = [r for r in results if r.get("kind") == "delivery"]
    if not rows:
        return None
    begin, end = section_markers("delivery")
    lines = [
        begin,
        "## 15. Delivery to the helpdesk: one worker against the helpdesk's raw accept rate",
        "",
        "Measured in the same run against the same reference helpdesk process (helpdesk/): **raw** is one "
        "client posting new replies back to back over one keep-alive connection; **one worker** is "
        "`manage.py db_worker --batch` draining as many approvals' queued deliveries (each a claim, a POST, "
        "a try row and the settling update, plus the task queue's own rows), timed from the first try to "
        "the last settlement, so the process start is not counted. Report only; no goal. "
        "Re-run alone: `python -m bench.delivery [--database-url URL] [--n 300]`.",
        "",
        "| database | deliveries | one worker | raw accept | worker ÷ raw | delivered | duplicate replies |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['database']} | {r['n']:,} | {r['worker_per_s']:.1f}/s | {r['raw_per_s']:.1f}/s | "
            f"**{r['ratio']:.3f}×** | {r['delivered']:,} | {r['duplicate_replies']} |"
        )
    return "\n".join([*lines, end])


def intake_section(results: list[dict]) -> str | None:
    """The pipeline's intake through gunicorn against the services in-process (bench/intake.py)."""
    rows = [r for r in results if r.get("kind") == "intake"]
    if not rows:
        return None
    begin, end = section_markers("intake")
    lines = [
        begin,
        "## 17. Intake: new cases per second through the API, against the services in-process",
        "",
        "Measured in the same run on the same PostgreSQL database: **in-process** is "
        "`workflow.intake.case_intake` (the import, the identity check, the review begun) for fresh case "
        "files one after another in one process; **API** is `POST /api/cases` through gunicorn with the "
        "shipped config (deploy/gunicorn.conf.py, its default workers and threads, DEBUG=0), fresh case "
        "files posted by 1 or 8 client threads over keep-alive connections, each with its own "
        "Idempotency-Key and the operation identity the reference client computes. Rounds alternate; a "
        "ratio is the API's rate ÷ the in-process rate of the same round, the median over rounds. "
        "Goal: ≥ 0.5× at 8 clients. Re-run alone: `python -m bench.intake --database-url URL [--n 200] "
        "[--rounds 3]`.",
        "",
        "| cases per round | rounds | in-process | API, 1 client | ÷ in-process | API, 8 clients | ÷ in-process | goal (8 clients) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo1, hi1 = r["ratio_range"]["1"]
        lo8, hi8 = r["ratio_range"]["8"]
        met = "**met**" if r["ratio"]["8"] >= r["goal"] else "**missed**"
        lines.append(
            f"| {r['n']:,} | {r['rounds']} | {r['median']['inprocess']:.1f}/s | {r['median']['api_1']:.1f}/s | "
            f"**{r['ratio']['1']:.2f}×** ({lo1:.2f}–{hi1:.2f}) | {r['median']['api_8']:.1f}/s | "
            f"**{r['ratio']['8']:.2f}×** ({lo8:.2f}–{hi8:.2f}) | ≥ {r['goal']}× {met} |"
        )
    return "\n".join([*lines, end])


def render(info: dict, results: list[dict]) -> str:
    by_key = {r["key"]: r for r in results}
    lines = [
        "# Performance: what each guarantee costs",
        "",
        "<!-- Generated by `make bench` (bench/run.py). Do not edit by hand: re-run it. -->",
        "",
        "Every figure is a ratio against a raw baseline measured **in the same run, on the same machine, "
        "against the same database**, with subject and baseline interleaved run by run (alternating which "
        "goes first) so that a noisy neighbour slows both. Each ratio is the median of several runs, with "
        "the range of the runs. Absolute times are shown for context only: these machines are shared and "
        "noisy, and nothing here is asserted by a test (tests/bench/test_bench_smoke.py only runs each "
        "benchmark once at a tiny size to prove it still works).",
        "",
        f"- Command: `{info.get('command')}` (took {info.get('duration_s', 0) / 60:.1f} min; scale `{info.get('scale')}`)",
        f"- Wall time: {wall_time_line(info.get('duration_s', 0), info.get('part_s') or {})} "
        "(the budget: 30 min on 2 cores)",
        f"- Date: {info.get('date')}",
        f"- Machine: {info.get('cpu')}, {info.get('cores')} cores, {info.get('memory')}; {info.get('os')}",
        f"- Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in info.get('load_before', []))}; "
        f"after: {', '.join(f'{x:.2f}' for x in info.get('load_after', []))}",
        f"- Python {info.get('python')}, Django {info.get('django')}, psycopg {info.get('psycopg')}, "
        f"PostgreSQL {info.get('postgresql')} on loopback "
        f"({', '.join(f'{k}={v}' for k, v in info.get('pg_settings', {}).items())}), SQLite {info.get('sqlite')}",
        "",
        *goals_table({r["key"]: r for r in results})[:-1],
        *([wall_time_goal_row(info)] if info.get("part_s") is not None else []),
        "",
        "## Summary",
        "",
        "| # and measure | what runs | baseline | ratio (median) | runs: min–max | goal | met? | measure (median) | baseline (median) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in ORDER + [r["key"] for r in results if r["key"] not in ORDER]:
        r = by_key.get(key)
        if not r or r.get("kind") not in ("speed", "cost"):
            continue
        if not r["ratios"]:
            continue
        lines.append(_summary_row(r))
    rec = by_key.get("reconcile_command")
    if rec and rec.get("rss_kib"):
        rss = summary([k / 1024 for k in rec["rss_kib"]])
        lines.append(
            f"| 8 (memory). reconcile peak RSS | `reconcile --all --json` over {rec['operations']:,} operations | "
            f"— | **{rss['median']:.0f} MB** | {rss['min']:.0f}–{rss['max']:.0f} MB | ≤ 150 MB | "
            f"{'**yes**' if rss['max'] <= 150 else '**no**'} | | |"
        )
    cron = by_key.get("cron_start")
    if cron and cron.get("cpu_ratios"):
        cpu = summary(cron["cpu_ratios"])
        lines.append(
            "| 14 (CPU). cron start, CPU time (user + system) | the same pairs as 14 | the same | "
            f"**{cpu['median']:.2f}×** | {cpu['min']:.2f}–{cpu['max']:.2f} | context: the goal is on wall time | | | |"
        )
    row = pages_summary_row(by_key.get("pages"))
    if row:
        lines.append(row)
    lines.append("")
    problems = [r for r in results if r.get("kind") in ("error", "missing")]
    if problems:
        lines += ["### Not measured in this run", ""]
        for r in problems:
            first = r.get("error", "").strip().splitlines()[-1:] or [""]
            lines.append(f"- `{r['key']}`: {first[0][:300]}")
        lines.append("")

    rec = by_key.get("reconcile_command")
    if rec and rec.get("kind") == "cost" and rec["ratios"]:
        rss = summary([k / 1024 for k in rec["rss_kib"]])
        aj = summary(rec["anti_join_s"])
        lines += [
            "## 8. Reconcile over a million operations",
            "",
            f"- Data: {rec['operations']:,} operations bulk-loaded with `INSERT ... SELECT FROM generate_series` "
            f"({', '.join(f'{v:,} {k}' for k, v in rec['expected'].items())}).",
            f"- `reconcile --all --json > /dev/null`: median {summary(rec['subject_values'])['median']:.2f} s; "
            f"**peak RSS {rss['median']:.0f} MB** (max {rss['max']:.0f} MB; goal ≤ 150 MB: "
            f"{'**yes**' if rss['max'] <= 150 else '**no**'}), measured with `os.wait4` on the command's own process.",
            f"- Baseline, the same join streamed raw with COPY: median {summary(rec['baseline_values'])['median']:.2f} s.",
            f"- For context, the narrow anti-join that finds only the approved-without-effect operations "
            f"(`NOT EXISTS`, {rec['expected']['NoLocalEffectRecorded']:,} rows): median {aj['median']:.2f} s. "
            "The command must report every operation's state, so the baseline it is held to is the same "
            "full listing, raw; the anti-join alone answers a smaller question.",
            "- The command exits 1 here, as documented, because 1% of operations are NoLocalEffectRecorded.",
            "",
        ]

    side = _side_text(by_key, info)
    if side:
        lines += [side, ""]

    st = by_key.get("storage_postgresql")
    if st and st.get("kind") == "storage":
        lines += [
            "## Storage per case (PostgreSQL)",
            "",
            f"Measured over {st['n']} fresh cases taken through `review_begin` and then an approving "
            "`decision_record` (the case import's own rows included: case, passages, findings).",
            "",
            f"- Checkpoints per paused case: {st['checkpoint_rows_per_paused_case']:.1f} rows, "
            f"**{st['checkpoint_payload_bytes_per_paused_case']:,.0f} bytes** of JSON payload "
            f"({st['checkpoint_row_bytes_per_paused_case']:,.0f} bytes as stored rows, TOAST compression included).",
            f"- Per finished case: **{st['rows_per_finished_case']:.1f} rows**, "
            f"**{st['data_bytes_per_finished_case']:,.0f} bytes** of row data "
            f"(`pg_column_size`), {st['disk_bytes_per_finished_case']:,.0f} bytes on disk with indexes "
            "(`pg_total_relation_size` growth; page-granular, so approximate).",
            "",
            "| table | rows per case | row bytes per case | disk bytes per case |",
            "|---|---|---|---|",
        ]
        for table, v in st["per_table"].items():
            disk = f"{v['disk']:,.0f}" if v["disk"] is not None else "—"
            lines.append(f"| `{table}` | {v['rows']:.2f} | {v['data']:,.0f} | {disk} |")
        lines.append("")

    retention = _retention_text(results)
    if retention:
        lines += [retention, ""]

    text = pages_section(by_key.get("pages"), info)
    if text:
        lines += [text, ""]

    text = delivery_section(results)
    if text:
        lines += [text, ""]

    text = intake_section(results)
    if text:
        lines += [text, ""]

    text = audit_export.section(results, info)
    if text:
        lines += [text, ""]

    lines += ["## Findings and what remains", ""]
    lines += findings(by_key)
    lines += [
        "",
        "## How to read and re-run",
        "",
        "- `make bench` runs `python -m bench.run`, and ends by printing its own wall time and each part's (the "
        "same line heads this document, under Command). Its budget is 30 minutes on 2 cores. The "
        "million-row databases (reconcile's, the admin pages' at 10,000 and 1,000,000 cases, the audit export's) "
        "are kept from "
        "an earlier run while intact (`--fresh` reloads them); a first run loads them, which is most of the "
        "difference between a first run and the next.",
        "- It uses its own databases: `decisionflow_bench`, `decisionflow_bench_side` (with the LangGraph "
        "peer's own `decisionflow_bench_peer` and the DBOS peer's own `decisionflow_bench_dbos`, each created and "
        "dropped by its peer) and "
        "`decisionflow_bench_reconcile` on the "
        "PostgreSQL server at `BENCH_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432`), and a "
        "temporary SQLite file, and for the admin's pages `decisionflow_bench_pages_10k` and "
        "`decisionflow_bench_pages_1m` (loaded once, ~2 minutes, and kept while intact; reloaded when a "
        "migration is added). "
        "`--skip postgres,side,sqlite,process,reconcile,pages` leaves parts out; `--only pages` runs one part and "
        "replaces only its section of this document (`--pages-rounds`, `--pages-requests` size it); "
        "`--side-n` and `--side-rounds` size the side-by-side run; `--json FILE` keeps the raw numbers.",
        '- The side-by-side run (`make bench BENCH_ARGS="--only side"` runs it alone and replaces only its '
        "section, its goal rows and its summary rows) needs each peer's virtual environment, which `make bench` "
        "builds: `.venv-peer` for LangGraph (`make .venv-peer/.installed`: requirements/peer.txt, with hashes) "
        "and `.venv-dbos` for DBOS (`make .venv-dbos/.installed`: requirements/dbos.txt, with hashes). Without "
        "one, that peer is reported as not measured and the rest still runs.",
        "- Every decision a benchmark makes logs its JSON event line, as in production (the cost is in the "
        "figures), into `var/bench/events.jsonl` (this run's only) rather than onto the terminal.",
        "- Speed ratios are the measure's rate divided by the baseline's; cost ratios are the measure's "
        'time divided by the baseline\'s. "runs: min–max" is the range of the per-run ratios.',
        "",
    ]
    return "\n".join(lines)


# --- 9. the admin's pages at two sizes ---------------------------------------------------


def findings(by_key: dict) -> list[str]:
    """One bullet per measured result that has a finding, in the report's order."""
    lines = []
    ratios = {k: f"{summary(v['ratios'])['median']:.2f}×" for k, v in by_key.items() if v.get("ratios")}
    for key in ORDER:
        r = by_key.get(key)
        if key in FINDINGS and r and r.get("ratios"):
            s = summary(r["ratios"])
            text = FINDINGS[key]
            for name in ("orm_postgresql", "reconcile_service"):
                text = text.replace("{" + name + "}", ratios.get(name, "(not measured)"))
            lines.append(f"- **{r['title']}** ({_met(r, s['median']).strip('*')}, {s['median']:.2f}×). {text}")
    return lines


def section_markers(name: str) -> tuple[str, str]:
    """A section a partial run (``--only``) can replace in place; see bench.run._write_sections."""
    return f"<!-- section: {name} -->", f"<!-- /section: {name} -->"


def _size(n: int) -> str:
    return f"{n:,}"


def pages_summary_row(pg: dict | None) -> str | None:
    if not pg or pg.get("kind") != "pages_scale":
        return None
    small, big = pg["sizes"][0], pg["sizes"][-1]
    measured = [p for p in pg["pages"] if "ratio" in p]
    failed = len(pg["pages"]) - len(measured)  # a page that could not be measured fails the goal
    if not measured:
        return (
            f"| 9. admin pages, {_size(big)} ÷ {_size(small)} cases | the {len(pg['pages'])} pages of section 9 | "
            f"the same page at {_size(small)} cases | **not measured**: every page failed (section 9) | | "
            f"≤ {pg['max_ratio']}×, same queries | **no** | | |"
        )
    worst = max(measured, key=lambda p: p["ratio"])
    met = not failed and all(p["met"] for p in measured)
    unmeasured = f"; **{failed} not measured** (section 9)" if failed else ""
    return (
        f"| 9. admin pages, {_size(big)} ÷ {_size(small)} cases | the {len(pg['pages'])} pages of section 9 (p50 each) | "
        f"the same page at {_size(small)} cases | **{worst['ratio']:.2f}×** at most ({worst['label']}){unmeasured} | "
        f"{min(p['ratio'] for p in measured):.2f}–{worst['ratio']:.2f}× over the pages | ≤ {pg['max_ratio']}×, same queries | "
        f"{'**yes**' if met else '**no**'} | | |"
    )


def pages_section(pg: dict | None, info: dict) -> str | None:
    """Section 9: each page's p50 at both sizes, its query counts, and the goal."""
    begin, end = section_markers("pages")
    if not pg:
        return None
    if pg.get("kind") != "pages_scale":
        error = (pg.get("error") or "").strip().splitlines()[-1:] or [""]
        return "\n".join([begin, "## 9. Admin pages at two sizes", "", f"Not measured: {error[0][:300]}", end])
    small, big = pg["sizes"][0], pg["sizes"][-1]
    lines = [
        begin,
        f"## 9. Admin pages at {_size(small)} and {_size(big)} cases",
        "",
        f"The same pages over two databases of the same shape (`bench.bigdata.load_operations`: "
        f"{_size(small)} and {_size(big)} cases, each with its current proposal, 40 % of them decided, "
        "29 % with their effect record), through Django's test client logged in as a superuser, DEBUG off. "
        f"{pg['rounds']} rounds alternate between the two databases (one process per round and size); in "
        f"each, every page is requested once to count its queries and then {pg['requests']} times, timed; "
        "the p50 pools the timed requests of all rounds. Goal: each page at "
        f"{_size(big)} cases takes at most {pg['max_ratio']}× its time at {_size(small)}, with the same "
        "number of queries; every page has this goal, and a page that fails to render fails it. "
        f"Run: `{info.get('command')}`, {info.get('date')}.",
        "",
        f"| page | queries at {_size(small)} | at {_size(big)} | p50 at {_size(small)} | p50 at {_size(big)} | "
        f"{_size(big)} ÷ {_size(small)} | met? |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in pg["pages"]:
        a, b = p["by_size"][str(small)], p["by_size"][str(big)]
        urls = f"`{a['url']}`" if a["url"] == b["url"] else f"`{a['url']}` / `{b['url']}`"
        if "error" in a or "error" in b:
            lines.append(f"| {p['label']} ({urls}) | — | — | {a.get('error', '')} | {b.get('error', '')} | | **no** |")
            continue
        q = lambda v: "/".join(str(x) for x in v["queries"])  # noqa: E731 - one use, in a table cell
        ms = lambda v: f"{v['ms']['median']:.1f} ms"  # noqa: E731
        met = "**yes**" if p["met"] else "**no**"
        lines.append(f"| {p['label']} ({urls}) | {q(a)} | {q(b)} | {ms(a)} | {ms(b)} | {p['ratio']:.2f}× | {met} |")
    lines += [
        "",
        "Why it holds (issue 14; workplace/listing.py): the list is read in the order of an "
        "index that matches it (`case_list_order`: `created_at DESC, case_id, id`); a page first finds its 100 "
        "case ids on that index alone, and only those 100 cases get their statuses computed (the status "
        "subqueries of every skipped row made deep pages slow, and their estimated cost made PostgreSQL "
        "JIT-compile the query); there is no COUNT over the whole table (the unfiltered list shows the "
        "planner's estimate, a filtered or searched one counts at most a few pages ahead); and the search "
        "by part of a case ID (or subject) uses trigram indexes (`pg_trgm`); the reviewer filter's choices "
        "are found with one index probe per reviewer, not by reading every decision. The proposal list pages "
        "the same way on its own order's index (`proposal_list_order`, reviews migration 0012). A deep page still walks the "
        "index up to its offset, so page 1,000 costs more than page 100 (the last page at "
        f"{_size(small)} cases is page {max(1, pg['cases'][str(small)] // 100)}); the "
        "broad search matches more than 100 cases at both sizes, so both pages are full, and it counts ten pages "
        "ahead, never every match. The commit-attempt list pages newest first on the primary key (an index on "
        "the attempt time would cost every attempt's insert) with the same paginator, and its channel filter "
        "lists the vocabulary instead of reading every attempt's channel (before: 28.7×, 59 ms → 1.7 s). The "
        "deliveries list and the review queue page the same way (`pending_review_queue`, a partial index of the "
        "pending reviews only). The history of a case reads its rows by the case, one query per table, so 1,000 "
        "events cost the same at both sizes. The publish preview counts each kind of case up to 1,000 (past that "
        'the page says "more than"; `publish_policy` without `--apply` counts them all) and reads its sample '
        "with two scans that stop after 50 rows (before: 70×, 43 ms → 3.0 s). The extra rows of these pages are "
        "`bench.bigdata.load_page_extras`: an attempt per operation, a delivery per effect, a tenth of the "
        "cases pending.",
        end,
    ]
    return "\n".join(lines)


def render_sections(info: dict, results: list[dict]) -> dict[str, str]:
    """The sections a partial run (``--only pages``) replaces in the existing document."""
    by_key = {r["key"]: r for r in results}
    out = {}
    text = pages_section(by_key.get("pages"), info)
    if text:
        out["pages"] = text
    side = _side_text(by_key, info)
    if side:
        out["side"] = side
    row = pages_summary_row(by_key.get("pages"))
    if row:
        out["row:9"] = row
    retention = _retention_text(results)
    if retention:
        out["retention"] = retention
    delivery = delivery_section(results)
    if delivery:
        out["delivery"] = delivery
    intake = intake_section(results)
    if intake:
        out["intake"] = intake
    audit = audit_export.section(results, info)
    if audit:
        out["audit_export"] = audit
    # A measure's row of the summary table (e.g. "14." for cron_start, "2 (context)." for the
    # ORM floor), replaced where it stands.
    for r in results:
        number = re.match(r"(\d+(?: \(context\))?)\.", r.get("title", ""))
        if r.get("kind") in ("speed", "cost") and r.get("ratios") and number:
            out[f"row:{number.group(1)}"] = _summary_row(r)
    # The goal rows and the findings of the measures this run made (by their leading text).
    measured = {k for k, r in by_key.items() if r.get("ratios")}
    for line in goals_table(by_key)[4:]:
        label = line.split(" | ", 1)[0]
        if line.startswith("| ") and "not measured" not in line and "measured" not in label:
            out[f"line:{label} | "] = line
    for line in findings(by_key):
        title = line.split("** (", 1)[0]
        if any(by_key[k].get("title") and title == f"- **{by_key[k]['title']}" for k in measured):
            out[f"line:{title}** ("] = line
    return out
