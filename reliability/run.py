"""`make reliability`: run the whole battery, then write docs/RELIABILITY.md from what it measured.

Steps (each a subprocess; a failing step is reported, and the rest still run):

1. tests/reliability on SQLite, 10 iterations per crash point;
2. tests/reliability on PostgreSQL, 20 iterations per crash point (skipped, and reported as
   skipped, when no server answers at TEST_POSTGRES_URL); the delivery battery
   (tests/reliability/test_delivery.py) runs in both, with the reference helpdesk;
3. reliability/load.py: two gunicorn hosts on one PostgreSQL database (decisionflow_load,
   created and migrated), 8 client threads for 60 s;
4. the same load through a private PgBouncer (reliability/pooler.py, 4 server
   connections), once in transaction mode and once in session mode, each on its own
   database (decisionflow_pooler_transaction, decisionflow_pooler_session), 30 s each;
5. reliability/replica.py: the same load (6 clients, 30 s) against a private streaming pair
   (reliability/streaming.py: its own primary from initdb, its standby from pg_basebackup)
   with DATABASE_REPLICA_URL on, the standby stopped mid-run;
6. reliability/balancer.py: three gunicorn hosts behind Debian's haproxy (health check on
   /readyz), then PgBouncer, then PostgreSQL (decisionflow_balancer), 8 client threads for
   45 s, one host SIGKILLed part-way and restarted; with PostgreSQL's server binaries, on a
   private primary and its streaming standby (reliability/streaming.py), the standby the
   hosts' DATABASE_REPLICA_URL;
7. reliability/broker.py: deliveries and notifications through the RQ task backend on a
   private redis-server, two rqworker processes SIGKILLed in turn, on its own database
   (decisionflow_broker), 45 s of approvals then the settling;
8. this file writes docs/RELIABILITY.md from the figures the tests recorded
   (figures.jsonl), the JUnit reports and the load summaries.

Exit status 0 only if every step passed. Figures and logs stay in var/reliability/.
``reliability/run.py --only replica|balancer|broker`` runs step 5, 6 or 7 alone and rewrites
only its section of docs/RELIABILITY.md.
Environment: RELIABILITY_SQLITE_ITERATIONS (10), RELIABILITY_POSTGRES_ITERATIONS (20),
RELIABILITY_LOAD_SECONDS (60), RELIABILITY_LOAD_CLIENTS (8), RELIABILITY_POOLER_SECONDS (30),
RELIABILITY_REPLICA_SECONDS (30), RELIABILITY_BALANCER_SECONDS (45), RELIABILITY_BROKER_SECONDS (45),
TEST_POSTGRES_URL.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reliability import balancer, broker, pooler, redis_server, streaming  # noqa: E402

OUT = ROOT / "var" / "reliability"
DOC = ROOT / "docs" / "RELIABILITY.md"
PG = os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
SQLITE_ITERATIONS = int(os.environ.get("RELIABILITY_SQLITE_ITERATIONS", "10"))
POSTGRES_ITERATIONS = int(os.environ.get("RELIABILITY_POSTGRES_ITERATIONS", "20"))
LOAD_SECONDS = os.environ.get("RELIABILITY_LOAD_SECONDS", "60")
LOAD_CLIENTS = os.environ.get("RELIABILITY_LOAD_CLIENTS", "8")
POOLER_SECONDS = os.environ.get("RELIABILITY_POOLER_SECONDS", "30")
POOLER_MODES = ("transaction", "session")
REPLICA_SECONDS = os.environ.get("RELIABILITY_REPLICA_SECONDS", "30")
BALANCER_SECONDS = os.environ.get("RELIABILITY_BALANCER_SECONDS", "45")
BROKER_SECONDS = os.environ.get("RELIABILITY_BROKER_SECONDS", "45")

POINTS = {
    "begin-after-proposal": (
        "`begin`",
        "after the proposal is made, before the pause and the pending review (SQLite: written inside begin's one transaction; PostgreSQL's first begin: built, written later with the pause in one statement that commits as it ends)",
        "engine/graph.py `_review_request`",
        "no operation: nothing written, or the transaction rolled back (no proposal, no checkpoint, no pending review)",
    ),
    "begin-during-checkpoint-save": (
        "`begin`",
        "a first begin: the pause checkpoint built, just before the write that stores it (PostgreSQL: one statement with the proposal and the pending review, which commits as it ends; SQLite: inside begin's one transaction); the general way: inserted inside begin's one transaction, not committed",
        "engine/checkpoints.py `DatabaseCheckpointStorage.write` / workflow/begin.py `_begin_first`",
        "no operation: nothing written, or the transaction rolled back (no proposal, no checkpoint, no pending review)",
    ),
    "commit-before-decision": (
        "`resume`",
        "before the decision insert: after the read and the stale check, before the verdict and the writes",
        "effects/services.py `effect_commit`",
        "Pending",
    ),
    "commit-after-decision": (
        "`resume`",
        "the verdict made and the rows to write built, before the write (on PostgreSQL the write is one "
        "statement that commits as it ends, so no point lies between its rows and its commit; on SQLite "
        "inside the commit's transaction)",
        "effects/services.py `effect_commit`",
        "Pending (nothing written, or the transaction rolled back)",
    ),
    "commit-after-transaction": (
        "`resume`",
        "after the commit transaction, before the receipt",
        "effects/services.py `effect_commit`",
        "Committed with 1 effect (Declined for a decline)",
    ),
    "repair-midway": (
        "`reconcile --repair`",
        "after the first of 4 repairs",
        "effects/services.py `effects_repair`",
        "1 Committed, 3 NoLocalEffectRecorded (exit 1)",
    ),
}

SECURITY = {
    "test_admin_routes_change_nothing_without_the_review_permission": "5 identities (anonymous, support lead, staff without groups, inactive reviewer, a reviewer's browser "
    "sending a CSRF-less cross-site POST) x 7 admin routes (decide, edit, begin, both bulk actions, the add "
    "pages of decisions and effects): 403 or the login page, nothing written",
    "test_api_routes_change_nothing_without_the_review_permission": "6 credentials (none, support lead, staff, inactive user, revoked token, forged token) x 4 API writes: "
    "401/403 JSON, nothing written",
    "test_api_session_post_without_csrf_changes_nothing": "a logged-in reviewer's session POSTing to the API without the CSRF token: 403, nothing written",
    "test_commands_and_services_refuse_a_user_without_the_permission": "`resume` and `edit` naming a lead or a staff user (on a begun case, and `resume` on a case nobody "
    "began, which it would begin for a reviewer), `effect_commit` and `decision_record` called directly: refused, "
    "nothing begun",
    "test_html_in_a_draft_or_quotation_is_escaped_on_every_page": "`<script>`, `<img onerror>` and `<b onmouseover>` in the draft, subject, source title and quotation: "
    "never raw on 9 admin pages for a reviewer and a lead, shown escaped on the pages that show them; the "
    "API answers JSON with nosniff (the browser suite, tests/browser, checks the same in Chromium)",
    "test_check_deploy_is_clean_with_production_settings": "`manage.py check --deploy --fail-level WARNING` with DEBUG=0, a SECRET_KEY and ALLOWED_HOSTS: no "
    "issues; secure session and CSRF cookies, SSL redirect, HSTS one year, nosniff, X-Frame-Options DENY",
    "test_a_checkpoint_row_holding_a_pickle_is_refused_never_unpickled": "a checkpoint row carrying agent-framework's `__pickled__` encoding of an object whose unpickling "
    "writes a file, with a matching digest: load and `resume` refuse it (exit 5) and the file never "
    "appears; the control (plain `pickle.loads`) does write it",
    "test_a_checkpoint_forged_without_the_secret_is_refused": "a pause rewritten to approve another case's operation by someone who can write the checkpoint table "
    "but does not hold SECRET_KEY (digest a bare SHA-256, or an HMAC under a guessed secret): `resume` refuses "
    "it (exit 5) before anything runs, nothing written",
}

# What a crash of the database server may lose (effects/services.py `_decided`, effects/store.py).
DURABILITY = (
    "What is flushed to disk before an answer: every commit that writes a decision, an effect or a "
    "pending review's completion waits for its WAL flush (PostgreSQL's `synchronous_commit`, on by "
    "default). A replay or a conflict writes nothing but its own attempt row (the audit of that click), "
    "so its write statement turns `synchronous_commit` off for its own transaction: its answer does not wait for the "
    "flush. The trade: if the PostgreSQL server itself crashes (not our process: the server, or the "
    "machine) within about three times `wal_writer_delay` (200 ms by default) of such an answer, that "
    "attempt row can be lost. The decision and the effect it reported were committed and flushed by the "
    "earlier commit, and are never at risk; nor is any database left inconsistent (PostgreSQL recovers to"
    " a consistent point). Tested by tests/effects/test_commit_postgres.py (the write statement "
    "sets `synchronous_commit` off for its own transaction only for a plain replay or conflict, never for "
    "a fresh decision or a replay that completes a pending review; the session's own stays `on`). docs/PERFORMANCE.md has what it buys. An attempt "
    "row's case and reviewer are references the database does not check (effects migration 0009): "
    "recording an attempt takes no lock on them, so a refusal's row never waits behind the case lock it "
    "reports, and keeps its case. Django's `on_delete=PROTECT` still refuses to delete a case or a user "
    "that has attempts; only a raw SQL delete could leave an attempt naming one that is gone. Decisions "
    "and effects keep their checked foreign keys."
)


def run(step: str, argv: list[str], env: dict, log: Path) -> dict:
    print(f"== {step} ==", flush=True)
    started = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
    print(f"   exit {proc.returncode} in {seconds:.0f} s: {tail[0][:200]}", flush=True)
    return {"step": step, "exit": proc.returncode, "seconds": round(seconds, 1), "log": str(log.relative_to(ROOT))}


def postgres_answers() -> bool:
    try:
        import psycopg

        psycopg.connect(PG, connect_timeout=3).close()
        return True
    except Exception:  # noqa: BLE001 - any failure means "no server"
        return False


def pytest_step(database: str, iterations: int) -> dict:
    out = OUT / database
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(DEBUG="1", DECISIONFLOW_RELIABILITY_ITERATIONS=str(iterations), DECISIONFLOW_RELIABILITY_OUT=str(out))
    if database == "postgresql":
        env["DATABASE_URL"] = PG
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "tests/reliability",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={out / 'junit.xml'}",
    ]
    return run(
        f"tests/reliability on {database}, {iterations} iterations per crash point", argv, env, out / "pytest.log"
    )


def load_step() -> dict:
    env = dict(os.environ, DEBUG="1")
    argv = [
        sys.executable,
        "reliability/load.py",
        "--create-database",
        "decisionflow_load",
        "--admin-url",
        PG,
        "--seconds",
        LOAD_SECONDS,
        "--clients",
        LOAD_CLIENTS,
        "--json",
        str(OUT / "load.json"),
        "--log-dir",
        str(OUT / "load-logs"),
    ]
    return run(f"load: two gunicorn hosts, one PostgreSQL, {LOAD_SECONDS} s", argv, env, OUT / "load.log")


def not_installed(step: str, why: str) -> dict:
    """A step whose Debian package is missing: skipped, or failed in CI (DECISIONFLOW_REQUIRE_POSTGRES=1)."""
    required = os.environ.get("DECISIONFLOW_REQUIRE_POSTGRES") == "1"
    note = f"{'FAILED' if required else 'SKIPPED'}: {why}"
    return {"step": step, "exit": 1 if required else 0, "seconds": 0, "log": "-", "note": note}


def pooler_step(mode: str) -> dict:
    step = f"load through PgBouncer, {mode} mode, {POOLER_SECONDS} s"
    if pooler.binary() is None:
        return not_installed(step, "pgbouncer is not installed (`make pgbouncer`, as root)")
    env = dict(os.environ, DEBUG="1")
    argv = [
        sys.executable,
        "reliability/load.py",
        "--create-database",
        f"decisionflow_pooler_{mode}",
        "--admin-url",
        PG,
        "--pooler",
        mode,
        "--seconds",
        POOLER_SECONDS,
        "--clients",
        LOAD_CLIENTS,
        "--json",
        str(OUT / f"pooler-{mode}.json"),
        "--log-dir",
        str(OUT / f"pooler-{mode}-logs"),
    ]
    return run(step, argv, env, OUT / f"pooler-{mode}.log")


def replica_step() -> dict:
    step = f"load with a streaming replica, the standby stopped mid-run, {REPLICA_SECONDS} s"
    if streaming.bin_dir() is None:
        return not_installed(step, "PostgreSQL's server binaries are missing (`make postgresql-server`, as root)")
    argv = [
        sys.executable,
        "-m",
        "reliability.replica",
        "--seconds",
        REPLICA_SECONDS,
        "--json",
        str(OUT / "replica.json"),
        "--log-dir",
        str(OUT / "replica-logs"),
    ]
    return run(step, argv, dict(os.environ, DEBUG="1"), OUT / "replica.log")


def balancer_step() -> dict:
    step = f"three hosts behind haproxy, then PgBouncer, one host killed, {BALANCER_SECONDS} s"
    missing = [name for name, found in (("haproxy", balancer.binary()), ("pgbouncer", pooler.binary())) if not found]
    if missing:
        return not_installed(step, f"{' and '.join(missing)} not installed (`make haproxy pgbouncer`, as root)")
    env = dict(os.environ, DEBUG="1")
    argv = [sys.executable, "reliability/balancer.py", "--create-database", "decisionflow_balancer"]
    argv += ["--admin-url", PG, "--seconds", BALANCER_SECONDS, "--clients", LOAD_CLIENTS]
    argv += ["--json", str(OUT / "balancer.json"), "--log-dir", str(OUT / "balancer-logs")]
    if streaming.bin_dir() is not None:
        argv.append("--replica")
        step += ", on a private primary and its streaming replica"
    return run(step, argv, env, OUT / "balancer.log")


def broker_step() -> dict:
    step = f"RQ task backend, two workers killed in turn, {BROKER_SECONDS} s"
    if redis_server.binary() is None:
        return not_installed(step, "redis-server is not installed (`make redis`, as root)")
    argv = [sys.executable, "reliability/broker.py", "--create-database", "decisionflow_broker", "--admin-url", PG]
    argv += ["--seconds", BROKER_SECONDS, "--json", str(OUT / "broker.json"), "--log-dir", str(OUT / "broker-logs")]
    return run(step, argv, dict(os.environ, DEBUG="1"), OUT / "broker.log")


# --- the report ----------------------------------------------------------------------------


def figures(database: str) -> list[dict]:
    path = OUT / database / "figures.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def junit(database: str) -> list[dict]:
    path = OUT / database / "junit.xml"
    if not path.exists():
        return []
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "FAILED"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        cases.append(
            {
                "name": case.get("name"),
                "file": case.get("classname", "").rsplit(".", 1)[-1],
                "seconds": float(case.get("time") or 0),
                "outcome": outcome,
            }
        )
    return cases


def git(*args) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "?"


def md_table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def pooler_report() -> list[str]:
    """The load through PgBouncer, one column per pool mode."""
    lines = [
        "",
        "## Load behind PgBouncer: transaction and session mode",
        "",
        "The load above, through Debian's PgBouncer (reliability/pooler.py: a private child process on "
        "a free loopback port, with a small `default_pool_size`, so that the hosts' threads share its server "
        "connections), once per pool mode, each on a fresh database. Only the two hosts connect through "
        "the pooler; the driver, migrate and reconcile connect directly. In session mode the hosts close "
        "their connection after each request (`DATABASE_CONN_MAX_AGE=0`), so that the 4 server "
        "connections are shared between requests, each reset with `DISCARD ALL`. No fault is injected, "
        "so any 5xx answer fails the run (an `outcome_uncertain` there is a false one). With the "
        "hosts still up: `/readyz` on both; then a **held case**, twice at once: a direct connection "
        "holds the case row (`FOR UPDATE`) while an approval is sent, for a begun case (it waits in the "
        "commit) and for a case nobody began (it waits in begin); each must answer 409 `case_busy` with "
        "`Retry-After`, then, once released, commit, then answer a replay. After the hosts stop, and "
        "before the pooler does, `pg_locks` on the server must show no advisory lock in the database "
        "(a lock a pooled session left behind stays held by an idle server connection). Statement mode "
        "is not run: it refuses every transaction of several statements, which `/readyz` and start-up "
        "report (tests/reliability/test_pooler.py). Script: `reliability/load.py --pooler MODE`.",
        "",
    ]
    summaries = {}
    for mode in POOLER_MODES:
        path = OUT / f"pooler-{mode}.json"
        if path.exists():
            summaries[mode] = json.loads(path.read_text())
    if not summaries:
        return lines + ["Not run (no PostgreSQL or no pgbouncer, or the step failed before writing its summary)."]

    def row(label, fn):
        return [label, *(fn(summaries[m], summaries[m].get("pooler") or {}) for m in summaries)]

    def statuses(s, p):
        return ", ".join(f"{k}: {v}" for k, v in sorted(s["statuses"].items()))

    lines += md_table(
        ["figure", *(f"{m} mode" for m in summaries)],
        [
            row("seconds, clients", lambda s, p: f"{s['seconds']:.0f} s, {s['clients']}"),
            row(
                "host threads / server connections",
                lambda s, p: (
                    f"{len(s['hosts']) * s['workers_per_host'] * s['threads_per_worker']} / "
                    f"{p.get('default_pool_size', '?')}"
                ),
            ),
            row(
                "rounds (approve / decline / stale)",
                lambda s, p: " / ".join(str(s["scenarios"].get(k, 0)) for k in ("approve", "decline", "stale")),
            ),
            row("requests (per second)", lambda s, p: f"{s['requests']} ({s['requests_per_second']})"),
            row("latency p50 / p95", lambda s, p: f"{s['latency_p50_ms']} ms / {s['latency_p95_ms']} ms"),
            row("answers by status", statuses),
            row(
                "**5xx answers** (of which `outcome_uncertain`)",
                lambda s, p: f"**{s.get('server_errors', '?')}** ({s.get('outcome_uncertain', '?')})",
            ),
            row("unexpected answers", lambda s, p: s["unexpected_errors"]),
            row("effects", lambda s, p: s["effects"]),
            row("**duplicates**", lambda s, p: f"**{s['duplicates']}**"),
            row("operations where reconcile disagrees with the clients", lambda s, p: f"**{s['disagreements']}**"),
            row("`/readyz` on both hosts", lambda s, p: ", ".join(str(v) for v in (p.get("readyz") or {}).values())),
            row(
                "held case: `case_busy`, then commit, then replay",
                lambda s, p: f"{p.get('held_case_probes_passed', '?')} of {p.get('held_case_probes', '?')}",
            ),
            row("**advisory locks left held**", lambda s, p: f"**{p.get('advisory_locks_left', '?')}**"),
            row("result", lambda s, p: "passed" if s["ok"] else "FAILED: " + "; ".join(s["failures"])),
        ],
    )
    for db in ("postgresql",):
        quick = [f for f in figures(db) if f["family"] == "pooler"]
        for f in quick:
            lines += [
                "",
                f"The quick version in `make test` (tests/reliability/test_pooler.py, {f['mode']} mode, "
                f"{f['seconds']} s, on the test database) also ran here: {f['requests']} requests, "
                f"{f['server_errors']} 5xx, {f['effects']} effects, {f['duplicates']} duplicates, "
                f"{f['advisory_locks_left']} advisory locks left.",
            ]
    return lines


def step_summary(name: str) -> dict | None:
    """The JSON summary a step wrote to var/reliability/NAME.json, or None when it wrote none."""
    path = OUT / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def replica_report() -> list[str]:
    """The load with a real streaming replica, and the standby stopped mid-run."""
    lines = [
        "",
        "## Load with a read replica, the standby stopped mid-run",
        "",
        "The two-host load against a streaming pair of its own (reliability/streaming.py: a primary made "
        "with `initdb` on a free port, `wal_level replica`, and its standby made with `pg_basebackup -R`, "
        "both run as the `postgres` user and removed afterwards; the shared server is never copied), with "
        "`DATABASE_REPLICA_URL` naming the standby: every scenario's first read, `GET /api/cases/{id}`, "
        "reads the replica while it is within `DECISIONFLOW_REPLICA_MAX_LAG` (5 s). Once the clients "
        "decide, the standby is stopped (fast shutdown) at the middle of the timed window; from then on "
        "the hosts read the primary. Decisions, `GET /api/operations/...` and reconcile read the primary "
        "throughout. Stale answers: decision answers that disagree with what reconcile reads from the "
        "effect store. The lag is sampled every half second with the router's own query "
        "(core/replicas.py `LAG_SQL`). Script: `python -m reliability.replica`.",
        "",
    ]
    s = step_summary("replica")
    if s is None:
        return lines + ["Not run (see Steps)."]
    reads = s.get("standby_reads_before_stop") or {}
    lines += md_table(
        ["measure", "value"],
        [
            ["clients, timed seconds", f"{s['clients']}, {s['seconds']:.0f}"],
            ["requests (per second)", f"{s['requests']} ({s['requests_per_second']})"],
            ["answers by status", ", ".join(f"{k}: {v}" for k, v in sorted(s["statuses"].items()))],
            ["errors (5xx, unexpected, lost in transport)", s["errors"]],
            ["stale answers on the primary-only paths", s["stale_answers"]],
            ["duplicates", s["duplicates"]],
            ["operations told Committed / effects", f"{s['operations_told_committed']} / {s['effects']}"],
            [
                "reads served by the standby before it stopped",
                f"{reads.get('transactions', 0)} transactions, {reads.get('rows_returned', 0)} rows",
            ],
            ["standby stopped after (s from the load's start)", s["standby_stopped_after_seconds"]],
            [
                "lag while it ran: median / max (s, samples)",
                f"{s['lag_p50_seconds']} / {s['lag_max_seconds']} ({s['lag_samples']})",
            ],
            ["pair ready in / whole step (s)", f"{s['pair_ready_seconds']} / {s['total_seconds']}"],
            ["verdict", "ok" if s["ok"] else "FAILED: " + "; ".join(s["failures"])],
        ],
    )
    return lines


def balancer_report() -> list[str]:
    """Three hosts behind haproxy and PgBouncer, one of them killed."""
    lines = [
        "",
        "## Behind a load balancer: three hosts, haproxy, PgBouncer, one host killed",
        "",
        'The whole picture of docs/DEPLOY.md "Scale": the clients send every request to Debian\'s haproxy, '
        "which picks one of three gunicorn hosts (`balance leastconn`, each host at most `maxconn` = its "
        "workers x threads requests at once) and takes a host out of rotation when `GET /readyz` fails twice "
        "(checked every second). The hosts connect through a private PgBouncer in transaction mode; the "
        "driver and `reconcile` connect directly. With PostgreSQL's server binaries installed the database "
        "is on a private primary made by `initdb` with a standby made by `pg_basebackup -R` "
        "(reliability/streaming.py), and the hosts get the standby as `DATABASE_REPLICA_URL` (directly: "
        "PgBouncer forwards to one server). haproxy's config is rendered from deploy/haproxy.cfg, the "
        "documented example, with loopback ports. The scenarios are the load's (above). Part-way through, "
        "once haproxy counts a request on it, the third host's gunicorn (master and workers) gets SIGKILL; "
        "once the health check has marked it DOWN it is started again and must come back UP. Required: every "
        "answer the clients lost is a request haproxy logged as aborted by the killed host, no more than it "
        "serves at once (no answer lost beyond the requests in flight on it); a request that found it gone is "
        "resent to another host (`retry-on conn-failure`, `option redispatch`); every lost decision is read "
        "back with `GET /api/operations/<id>` through the balancer and agrees with `reconcile`; every other "
        "answer agrees with `reconcile --all`; 0 duplicates; no other error; no advisory lock left. "
        "Script: `reliability/balancer.py`.",
        "",
    ]
    s = step_summary("balancer")
    if s is None:
        return lines + ["Not run (no PostgreSQL, haproxy or pgbouncer, or the step failed before writing its summary)."]
    lines += md_table(
        ["figure", "value"],
        [
            [
                "seconds, clients, hosts (workers x threads, maxconn)",
                f"{s['seconds']:.0f} s, {s['clients']}, {s['hosts']} ({s['workers_per_host']} x "
                f"{s['threads_per_worker']}, {s['maxconn_per_host']}); PgBouncer pool {s['pool_size']}",
            ],
            [
                "rounds (approve / decline / stale)",
                " / ".join(str(s["scenarios"].get(k, 0)) for k in ("approve", "decline", "stale")),
            ],
            ["requests (per second)", f"{s['requests']} ({s['requests_per_second']})"],
            ["latency p50 / p95", f"{s['latency_p50_ms']} ms / {s['latency_p95_ms']} ms"],
            [
                "database; transactions the standby served during the run",
                "private primary and standby; " + str(s["replica_transactions"])
                if s.get("replica")
                else "the shared server, no replica; -",
            ],
            ["requests by host (haproxy's log)", ", ".join(f"{k}: {v}" for k, v in s["requests_by_host"].items())],
            ["answers by status", ", ".join(f"{k}: {v}" for k, v in sorted(s["statuses"].items()))],
            [
                f"{s['killed_host']} killed at / requests haproxy counted on it just before",
                f"{s['killed_at_seconds']} s / {s['in_flight_on_killed_host_when_killed']}",
            ],
            [
                "taken out of rotation after / back after its restart",
                f"{s['down_after_seconds']} s / {s['rejoined_after_restart_seconds']} s "
                f"({s['served_by_killed_host_after_restart']} requests served after)",
            ],
            ["requests resent to another host by haproxy", s["redispatched"]],
            [
                "answers lost (of which dropped connections) / aborted by the killed host",
                f"{s['answers_lost']} ({s['of_which_dropped_connections']}) / {s['aborted_by_killed_host']}",
            ],
            ["**answers lost beyond the requests in flight on the killed host**", f"**{s['lost_beyond_in_flight']}**"],
            ["requests failed on the other hosts", f"**{s['failed_on_other_hosts']}**"],
            [
                "lost decisions read back / disagreeing with reconcile",
                f"{s['lost_operations_read_back']} / **{s['lost_operations_read_back_disagreeing']}**",
            ],
            ["unexpected answers", s["unexpected_errors"]],
            [
                "operations told Committed / Declined; effects",
                f"{s['operations_told_committed']} / {s['operations_told_declined']}; {s['effects']}",
            ],
            ["**duplicates**", f"**{s['duplicates']}**"],
            ["operations where reconcile disagrees with the clients", f"**{s['disagreements']}**"],
            ["result", "passed" if s["ok"] else "FAILED: " + "; ".join(s["failures"])],
        ],
    )
    return lines


def report(steps: list[dict], started: dt.datetime, total_seconds: float) -> str:
    dbs = [d for d in ("sqlite", "postgresql") if (OUT / d).exists()]
    lines = [
        "# Reliability",
        "",
        "Generated by `make reliability` (reliability/run.py). Do not edit by hand: rerun it.",
        "",
        f"- Run: {started:%Y-%m-%d %H:%M} UTC, {total_seconds / 60:.1f} minutes in all; commit `{git('rev-parse', '--short', 'HEAD')}`.",
        f"- Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()} {platform.machine()}.",
        "",
        "The promise: nothing is duplicated, nothing approved is lost, and no one approves without permission. "
        "Each family below tries to break it and counts.",
        "",
        DURABILITY,
        "",
        "## Steps",
        "",
    ]
    lines += md_table(
        ["step", "result", "seconds", "log"],
        [
            [
                s["step"],
                s.get("note") or ("passed" if s["exit"] == 0 else f"FAILED (exit {s['exit']})"),
                s["seconds"],
                f"`{s['log']}`",
            ]
            for s in steps
        ],
    )

    # crashes
    lines += [
        "",
        "## Crashes: SIGKILL at every step",
        "",
        "For each crash point and each iteration, on a fresh case: run the real command in a new process "
        "with `DECISIONFLOW_FAULT_INJECTION=1 DECISIONFLOW_CRASH_AT=<point>` and require that it died of "
        "SIGKILL (exit -9); run `reconcile` and require that it reports exactly what the decision and "
        "effect tables hold, and the state the point implies; retry the same command; then require one "
        "decision, at most one effect, and an effect for every approval. Every other `resume` iteration "
        "declines at the points a decline passes through. `begin` writes its proposal, pause "
        "checkpoint and pending review together (one transaction; a first begin on PostgreSQL, one statement "
        "that commits as it ends): killed before they commit, it leaves nothing, reconcile reports no "
        "operation for the case, and `begin` then works. The rows marked *(resume begins the case)* run `resume` on a case "
        "nobody began: it begins the review (committed on its own) and dies in the commit step; the retry "
        "finds the pause. `reconcile --repair` is killed after the first "
        "of 4 approved operations that have no effect (built directly in the tables), then rerun. "
        "The rows marked *(HTTP, host killed)* do the same over the API with two gunicorn hosts on one "
        "database: host A has the crash point armed, so its worker is SIGKILLed mid-request and the "
        "client gets no answer at all; the client asks host B (`GET /api/operations/OP`), reconcile must "
        "agree, and the client retries the approval on host B. "
        "The rows marked *(first of two approvals)* and *(second of two approvals)* run under a policy that "
        "needs two approvers (`approvals_required` 2): the first reviewer's `resume` (its approval row) is "
        "killed at the point, reconciled (`Pending` or `AwaitingApproval`) and retried, then the second "
        "reviewer's (its approval row, the decision and the effect), reconciled (`AwaitingApproval` or "
        "`Committed`) and retried; each approval must be there once, and the effect once.",
        "",
        "Test: `tests/reliability/test_crashes.py`.",
        "",
    ]
    lines += md_table(
        ["point", "command", "killed", "where", "reconcile must say"], [[f"`{p}`", *v] for p, v in POINTS.items()]
    )
    for db in dbs:
        rows = [f for f in figures(db) if f["family"] == "crash"]
        if not rows:
            continue
        lines += ["", f"### {db}", ""]
        total = defaultdict(int)
        table = []
        for f in sorted(rows, key=lambda f: list(POINTS).index(f["point"]) if f["point"] in POINTS else 99):
            extra = f" ({f['operations_repaired']} operations repaired)" if "operations_repaired" in f else ""
            table.append(
                [
                    f"`{f['point']}`",
                    f"{f['iterations']}{extra}",
                    f["crashes"],
                    f["reconcile_truthful"],
                    f"{f['approvals']}/{f['declines']}",
                    f["duplicates"],
                    f["lost_approvals"],
                    f["seconds"],
                ]
            )
            for k in ("iterations", "crashes", "reconcile_truthful", "duplicates", "lost_approvals"):
                total[k] += f[k]
        table.append(
            [
                "**total**",
                total["iterations"],
                total["crashes"],
                total["reconcile_truthful"],
                "",
                f"**{total['duplicates']}**",
                f"**{total['lost_approvals']}**",
                "",
            ]
        )
        lines += md_table(
            [
                "point",
                "iterations",
                "crashes (exit -9)",
                "reconcile truthful",
                "approvals/declines",
                "duplicates",
                "lost approvals",
                "seconds",
            ],
            table,
        )

    # load
    lines += ["", "## Load: two hosts, one PostgreSQL", ""]
    load_path = OUT / "load.json"
    if load_path.exists():
        s = json.loads(load_path.read_text())
        lines += [
            f"Two gunicorn instances ({s['workers_per_host']} gthread workers x {s['threads_per_worker']} threads "
            f"each) on {', '.join(s['hosts'])}, sharing the PostgreSQL database `decisionflow_load` (dropped, "
            f"created and migrated first). {s['clients']} client threads, split across both hosts, ran for "
            f"{s['seconds']:.0f} s (bounded in time and in count). Both hosts and the driver share one "
            "SECRET_KEY (checkpoint digests are HMACs keyed from it). Each round takes a fresh case, imported "
            "(and for the stale scenario begun) by the driver before the clock starts, as the pipeline would hand "
            "it over; the clients then only send the API requests, which are what is timed "
            f"({s.get('rounds_imported_during_run', 0)} round(s) ran out of prepared cases and imported "
            "their own during the run). Then:",
            "",
            "- **approve**: GET the case, send the same approval to both hosts at once (the first decision "
            "begins the review), then once more: exactly one answer may say `replay: false`;",
            "- **decline**: decline on one host, then approve on the other: 409 `conflicting_decision`;",
            "- **stale**: the case is begun, edited through the API (a new operation, `review_begun: true`), the "
            "old operation is approved on the other host (409 `stale_proposal` naming the new one), the same edit "
            "is sent again (409 `stale_proposal`), then the new operation is approved.",
            "",
            'Every decision\'s `outcome` must match its receipt. A 409 `case_busy` is the documented "try again": '
            "the client waits `Retry-After` and resends (at most 5 times); busy answers count as expected 409s.",
            "",
            "Then the servers stop and `manage.py reconcile --all --json` is compared with what the clients "
            "were told. Script: `reliability/load.py`.",
            "",
        ]
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(s["statuses"].items()))
        lines += md_table(
            ["figure", "value"],
            [
                [
                    "rounds (approve / decline / stale)",
                    " / ".join(str(s["scenarios"].get(k, 0)) for k in ("approve", "decline", "stale")),
                ],
                ["requests", s["requests"]],
                ["requests per second", s["requests_per_second"]],
                ["latency p50 / p95", f"{s['latency_p50_ms']} ms / {s['latency_p95_ms']} ms"],
                ["answers by status", statuses],
                ["errors (non-2xx)", s["errors"]],
                ["of which the expected 409s", ", ".join(f"{k}: {v}" for k, v in sorted(s["expected_409"].items()))],
                ["unexpected errors", s["unexpected_errors"]],
                ["requests lost in transport", s["transport_errors"]],
                [
                    "operations told Committed / Declined",
                    f"{s['operations_told_committed']} / {s['operations_told_declined']}",
                ],
                ["effects", s["effects"]],
                [
                    "duplicates (second effect or decision per case, or two `replay: false` answers)",
                    f"**{s['duplicates']}**",
                ],
                [
                    "reconcile --all: operations and states",
                    f"{s['reconcile_operations']}: "
                    + ", ".join(f"{k} {v}" for k, v in sorted(s["reconcile_states"].items())),
                ],
                ["operations where reconcile disagrees with the clients", f"**{s['disagreements']}**"],
                ["result", "passed" if s["ok"] else "FAILED: " + "; ".join(s["failures"])],
            ],
        )
    else:
        lines += ["Not run (no PostgreSQL answered, or the step failed before writing its summary)."]
    for db in dbs:
        quick = [f for f in figures(db) if f["family"] == "load"]
        for f in quick:
            lines += [
                "",
                f"The quick version in `make test` (tests/reliability/test_load.py, {f['seconds']} s, on "
                f"the test database) also ran here: {f['requests']} requests, {f['errors']} errors (all "
                f"expected 409s), {f['effects']} effects, {f['duplicates']} duplicates.",
            ]

    lines += pooler_report()
    lines += replica_report()
    lines += balancer_report()
    summary = OUT / "broker.json"
    lines += broker.report_lines(json.loads(summary.read_text()) if summary.exists() else None)

    # bad input
    lines += [
        "",
        "## Bad input",
        "",
        "One table per entry point. Every row feeds one malformed, hostile or stale input and requires a "
        "clear error (a non-zero exit code with a message; an admin error message or form error; a JSON "
        "4xx with a code) and that nothing was written: proposal, decision, effect and pending-review "
        "rows and every case's current-proposal pointer are compared before and after each row. "
        "Test: `tests/reliability/test_bad_input.py`.",
        "",
    ]
    for db in dbs:
        rows = [f for f in figures(db) if f["family"] == "bad-input"]
        if not rows:
            continue
        lines += [f"### {db}", ""]
        lines += md_table(
            ["entry point", "inputs", "refused clearly", "wrote something"],
            [[f["entry"], f["inputs"], f["refused_clearly"], f["wrote_something"]] for f in rows]
            + [
                [
                    "**total**",
                    sum(f["inputs"] for f in rows),
                    sum(f["refused_clearly"] for f in rows),
                    f"**{sum(f['wrote_something'] for f in rows)}**",
                ]
            ],
        )
        lines += [""]
    if dbs:
        rows = [f for f in figures(dbs[0]) if f["family"] == "bad-input"]
        lines += ["<details><summary>Every input</summary>", ""]
        for f in rows:
            lines += [f"**{f['entry']}**: " + "; ".join(f.get("names", [])), ""]
        lines += ["</details>"]

    # supersession (issue 26)
    lines += [
        "",
        "## Supersession under races",
        "",
        "Rounds of 16 approvals of the old proposals and 4 imports of case files under the old version, all "
        "started at once with the publish of a new version (half the approvals wait until the publish has "
        "prepared four cases again). What a publish promises (docs/COMMANDS.md, publish_policy): once its "
        "switch has committed, no approval under an older version commits and no case comes in under one. "
        "*After publish* counts the approvals decided once the publish had stamped itself (the goal is 0); "
        "*left under old* the undecided cases not under the new version once it returned (0). "
        "Test: `tests/reliability/test_supersession.py`.",
        "",
    ]
    for db in dbs:
        rows = [f for f in figures(db) if f["family"] == "supersession"]
        if not rows:
            continue
        keys = ["committed_before", "stale", "busy", "after_publish", "imported_before", "imports_refused"]
        keys.append("left_under_old")
        lines += [f"### {db}", ""]
        lines += md_table(
            [
                "round",
                "approvals",
                "committed before",
                "stale",
                "busy",
                "**after publish**",
                "imports",
                "imported before",
            ]
            + ["imports refused", "**left under old**"],
            [
                [f["round"], f["approvals"], f["committed_before"], f["stale"], f["busy"], f"**{f['after_publish']}**"]
                + [f["imports"], f["imported_before"], f["imports_refused"], f"**{f['left_under_old']}**"]
                for f in rows
            ]
            + [
                ["**total**", sum(f["approvals"] for f in rows)]
                + [sum(f[k] for f in rows) for k in keys[:3]]
                + [f"**{sum(f['after_publish'] for f in rows)}**", sum(f["imports"] for f in rows)]
                + [sum(f[k] for f in rows) for k in keys[4:6]]
                + [f"**{sum(f['left_under_old'] for f in rows)}**"]
            ],
        )
        lines += [""]

    # delivery to the helpdesk (issue 15)
    lines += [
        "",
        "## Delivery to the helpdesk",
        "",
        "The sending side against the reference helpdesk (helpdesk/, its own process): the task worker "
        "(`manage.py db_worker`) SIGKILLed at each delivery crash point (before the send; after the helpdesk "
        "answered, before the answer was read; after the answer, before the local state was written), then "
        "another worker past the lease; the helpdesk process stopped for 30 s while approvals are made and a "
        "worker keeps trying; every answer dropped after the helpdesk committed with a lookup that lags "
        "(settled only by a resend with the same key); two worker processes draining 1,000 queued "
        "deliveries. Each run requires 0 duplicate replies on the helpdesk, 0 approvals without a delivery, "
        "every delivery Delivered with the reference the helpdesk's own lookup gives, and `reconcile --json` "
        "saying the same (exit 0). Test: `tests/reliability/test_delivery.py`.",
        "",
    ]
    for db in dbs:
        rows = [f for f in figures(db) if f["family"] == "delivery"]
        if not rows:
            continue
        lines += [f"### {db}", ""]
        lines += md_table(
            [
                "scenario",
                "deliveries",
                "worker kills",
                "duplicate replies",
                "approvals without delivery",
                "delivered, helpdesk agrees",
                "reconcile agrees",
                "seconds",
            ],
            [
                [
                    f["scenario"] + (f" ({f['per_second']}/s, {f['workers']} workers)" if "per_second" in f else ""),
                    f["iterations"],
                    f["crashes"],
                    f"**{f['duplicate_replies']}**",
                    f"**{f['approvals_without_delivery']}**",
                    f["helpdesk_agrees"],
                    f["reconcile_agrees"],
                    f["seconds"],
                ]
                for f in rows
            ],
        )
        lines += [""]

    # security
    lines += ["", "## Security", "", "Test: `tests/reliability/test_security.py`.", ""]
    sec_rows = []
    for name, what in SECURITY.items():
        outcomes = []
        for db in dbs:
            hit = [c for c in junit(db) if c["name"] == name]
            outcomes.append(hit[0]["outcome"] if hit else "not run")
        sec_rows.append([f"`{name}`", what, *outcomes])
    lines += md_table(["test", "what it tried", *dbs], sec_rows)

    # every test
    lines += ["", "## Every test of the battery", ""]
    for db in dbs:
        cases = junit(db)
        if not cases:
            continue
        passed = sum(c["outcome"] == "passed" for c in cases)
        failed = sum(c["outcome"] == "FAILED" for c in cases)
        skipped = sum(c["outcome"] == "skipped" for c in cases)
        lines += [f"**{db}**: {passed} passed, {failed} failed, {skipped} skipped.", ""]
        lines += md_table(
            ["test", "result", "seconds"],
            [[f"{c['file']}::{c['name']}", c["outcome"], f"{c['seconds']:.1f}"] for c in cases],
        )
        lines += [""]

    lines += [
        "## What the battery found while it was built",
        "",
        "- The admin edit form accepted a body sent as invalid UTF-8 (`%FF`, or an encoded lone surrogate "
        "`%ED%A0%80`): Django decodes form data with U+FFFD replacement instead of failing, so a proposal "
        "with text nobody wrote was created. The form now refuses a body with replacement characters the "
        "proposal did not already have (reviews/forms.py), and the battery keeps both rows.",
        "- `check --deploy` warned about `SECURE_HSTS_PRELOAD`. Preloading an internal host name on the "
        "browsers' public list is not appropriate by default, so it stays an explicit setting and the "
        "warning is silenced only while it is off (decisionflow/settings.py).",
        "- A killed `reconcile --repair` holds the reconcile lock until PostgreSQL notices the dropped "
        'connection (milliseconds); a run started in that window exits 1 with "locked by another process", '
        "as designed. The harness retries, as cron's next run would.",
        "- Once checkpoint digests became HMACs keyed from SECRET_KEY, the two-host harness (which gave each "
        "gunicorn host a random secret of its own) saw a pause begun on host A refused on host B as "
        '"corrupt or was modified" (409 `workflow_incompatible`). Every process sharing a database must share '
        "the secret (or list the old one in SECRET_KEY_FALLBACKS while rotating); the harness now gives every "
        "host, and the load driver, one secret.",
        "",
        "## How to rerun",
        "",
        "```sh",
        "make reliability                      # everything above; rewrites this file (about 10-20 minutes)",
        "make test                             # the quick version: 1 iteration per crash point, a 4 s load run,",
        "                                      # and 4 s through PgBouncer per pool mode",
        "DECISIONFLOW_RELIABILITY_ITERATIONS=5 .venv/bin/pytest tests/reliability/test_crashes.py   # SQLite",
        "DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres DECISIONFLOW_RELIABILITY_ITERATIONS=20 \\",
        "    .venv/bin/pytest tests/reliability/test_crashes.py -k two_approvals   # two-person approval alone",
        "DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres DECISIONFLOW_RELIABILITY_ITERATIONS=20 \\",
        "    .venv/bin/pytest tests/reliability -q                                                # PostgreSQL",
        ".venv/bin/python reliability/load.py --create-database decisionflow_load --seconds 60 --clients 8",
        ".venv/bin/python reliability/load.py --create-database decisionflow_pooler_transaction --pooler transaction \\",
        "    --seconds 30 --clients 8",
        ".venv/bin/python -m reliability.replica --seconds 30   # its own streaming pair; the standby stopped mid-run",
        ".venv/bin/python reliability/run.py --only balancer   # the balancer step; rewrites its section here",
        ".venv/bin/python reliability/run.py --only broker     # the RQ step; likewise (--only replica too)",
        ".venv/bin/python reliability/broker.py --create-database decisionflow_broker --seconds 45   # the RQ backend",
        "```",
        "",
        "Knobs: `RELIABILITY_SQLITE_ITERATIONS` (10), `RELIABILITY_POSTGRES_ITERATIONS` (20), "
        "`RELIABILITY_LOAD_SECONDS` (60), `RELIABILITY_LOAD_CLIENTS` (8), `RELIABILITY_POOLER_SECONDS` (30), "
        "`RELIABILITY_REPLICA_SECONDS` (30), `RELIABILITY_BALANCER_SECONDS` (45), "
        "`RELIABILITY_BROKER_SECONDS` (45), "
        "`TEST_POSTGRES_URL`. Raw figures, "
        "JUnit reports and logs: `var/reliability/`.",
        "",
    ]
    return "\n".join(lines)


def splice(section: list[str], before: str = "## Bad input") -> None:
    """Put ``section`` (its first non-blank line is its heading) into docs/RELIABILITY.md in
    place of the section of that heading, or ahead of ``before``; the rest of the file is
    left as the last full run wrote it."""
    lines = "\n".join(section).strip("\n").splitlines()
    heading = lines[0]
    text = DOC.read_text()
    new = "\n".join(lines) + "\n\n"
    if heading + "\n" in text:
        start = text.index(heading + "\n")
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + new + (text[end + 1 :] if end != -1 else "")
    else:
        at = text.index(before + "\n")
        text = text[:at] + new + text[at:]
    DOC.write_text(text)


# The steps that can run alone, each rewriting only its own section of docs/RELIABILITY.md.
ALONE = {
    "replica": (replica_step, replica_report),
    "balancer": (balancer_step, balancer_report),
    "broker": (lambda: broker_step(), lambda: broker.report_lines(step_summary("broker"))),
}


def only(name: str) -> int:
    """`reliability/run.py --only NAME`: that step alone, and its section of docs/RELIABILITY.md
    rewritten (the other sections keep the last full run's figures)."""
    step_of, report_of = ALONE[name]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").unlink(missing_ok=True)
    step = step_of()
    if (OUT / f"{name}.json").exists():
        when = dt.datetime.now(dt.UTC)
        note = (
            f"This section's figures are from the step run alone (`reliability/run.py --only {name}`) on "
            f"{when:%Y-%m-%d %H:%M} UTC, commit `{git('rev-parse', '--short', 'HEAD')}`, load average "
            f"{os.getloadavg()[0]:.0f}; the rest of this file is from the last full run."
        )
        splice([*report_of(), "", note])
        print(f"wrote its section of {DOC.relative_to(ROOT)}")
    return 1 if step["exit"] != 0 else 0


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--only" and sys.argv[2] in ALONE:
        return only(sys.argv[2])
    if sys.argv[1:]:
        print(f"usage: reliability/run.py [--only {'|'.join(ALONE)}]", file=sys.stderr)
        return 2
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True, exist_ok=True)
    steps = [pytest_step("sqlite", SQLITE_ITERATIONS)]
    if postgres_answers():
        steps.append(pytest_step("postgresql", POSTGRES_ITERATIONS))
        steps.append(load_step())
        steps += [pooler_step(mode) for mode in POOLER_MODES]
        steps.append(replica_step())
        steps.append(balancer_step())
        steps.append(broker_step())
    elif os.environ.get("DECISIONFLOW_REQUIRE_POSTGRES") == "1":
        steps.append(
            {
                "step": "PostgreSQL",
                "exit": 1,
                "seconds": 0,
                "log": "-",
                "note": f"FAILED: no PostgreSQL answers at {PG}",
            }
        )
    else:
        steps.append(
            {
                "step": "PostgreSQL runs and load",
                "exit": 0,
                "seconds": 0,
                "log": "-",
                "note": f"SKIPPED: no PostgreSQL answers at {PG}",
            }
        )
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(report(steps, started, time.monotonic() - t0))
    failed = [s for s in steps if s["exit"] != 0]
    print(f"wrote {DOC.relative_to(ROOT)}; {len(steps) - len(failed)} of {len(steps)} step(s) passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
