"""The two-host load with a real streaming replica on, and the standby stopped mid-run.

Starts a private streaming pair (reliability/streaming.py: a primary made with ``initdb`` on a
free port and its standby made with ``pg_basebackup -R``; never the shared server), then runs
reliability/load.py against the pair's primary with ``DATABASE_REPLICA_URL`` naming the
standby, so that the hosts' read-only case view (``GET /api/cases/{id}``, which every
scenario reads first) goes to the replica while it is near. Once the clients are deciding,
it stops the standby (fast shutdown) at the middle of the timed window: from then on the hosts
must read the primary, say so, and answer nothing 5xx.

It requires, from the load's own checks (every decision answer against ``reconcile``) and
from the standby's counters:

- 0 errors: no 5xx, no unexpected answer, nothing lost in transport;
- 0 stale answers on the primary-only paths: every decision's answer agrees with what
  ``reconcile`` reads from the effect store (the load's ``disagreements``);
- 0 duplicates (effects, decisions, a second ``replay: false``);
- the replica served reads before it stopped (transactions in the load's database on the
  standby), and its lag was measured with the router's own query (core/replicas.py
  ``LAG_SQL``) while it ran.

Usage (``make reliability`` runs it for 30 s; alone it takes about 2-3 minutes)::

    .venv/bin/python -m reliability.replica --seconds 30 --clients 6 --json var/reliability/replica.json

Exit status 0 when every check holds; the summary is printed and, with --json, written.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.replicas import LAG_SQL  # noqa: E402  (the SQL only: no Django set-up needed)
from reliability.load import summary_written  # noqa: E402
from reliability.streaming import Pair, streaming_pair  # noqa: E402

DATABASE = "decisionflow_replica"


def _scalar(url: str, sql: str, params=()):
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
        row = conn.execute(sql, params).fetchone()
    return row[0] if row else None


def _decisions(pair: Pair) -> int:
    try:
        return int(_scalar(pair.primary_url(DATABASE), "SELECT count(*) FROM reviews_reviewdecision") or 0)
    except Exception:  # noqa: BLE001 - not migrated yet: no decision yet
        return 0


def _standby_reads(pair: Pair) -> dict:
    import psycopg

    with psycopg.connect(pair.replica_url("postgres"), autocommit=True, connect_timeout=3) as conn:
        row = conn.execute(
            "SELECT xact_commit, tup_returned FROM pg_stat_database WHERE datname = %s", [DATABASE]
        ).fetchone()
    return {"transactions": int(row[0]), "rows_returned": int(row[1])} if row else {}


class Watcher(threading.Thread):
    """Samples the standby's lag with the router's query; stops the standby mid-run."""

    def __init__(self, pair: Pair, seconds: float, done: threading.Event):
        super().__init__(daemon=True)
        self.pair, self.seconds, self.done = pair, seconds, done
        self.lags: list[float] = []
        self.clients_started_after: float | None = None
        self.stopped_after: float | None = None
        self.standby_reads: dict = {}
        self.problems: list[str] = []

    def run(self) -> None:
        started = time.monotonic()
        # The clients' first decisions mark the start of the timed window.
        while not self.done.is_set() and _decisions(self.pair) == 0:
            self._sample()
            time.sleep(0.5)
        if self.done.is_set():
            self.problems.append("the load ended before any decision was made")
            return
        self.clients_started_after = time.monotonic() - started
        middle = time.monotonic() + self.seconds / 2
        while not self.done.is_set() and time.monotonic() < middle:
            self._sample()
            time.sleep(0.5)
        try:
            self.standby_reads = _standby_reads(self.pair)
        except Exception as exc:  # noqa: BLE001 - reported as a failed check
            self.problems.append(f"could not read the standby's counters: {exc}")
        self.pair.stop_standby()
        self.stopped_after = time.monotonic() - started

    def _sample(self) -> None:
        try:
            lag = _scalar(self.pair.replica_url("postgres"), LAG_SQL)
        except Exception:  # noqa: BLE001 - a sample missed while the standby starts
            return
        if lag is not None:
            self.lags.append(float(lag))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--json", metavar="FILE", help="Also write the summary here.")
    parser.add_argument("--log-dir", default=str(ROOT / "var" / "replica"), help="The load's and gunicorn's logs.")
    args = parser.parse_args(argv)
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    summary: dict = {"seconds": args.seconds, "clients": args.clients}
    failures: list[str] = []
    # The pair's own folder is under the system's temporary folder, which the postgres user can
    # reach; this one (root's, 0700) keeps only the load's summary.
    with tempfile.TemporaryDirectory(prefix="decisionflow-replica-") as folder, streaming_pair() as pair:
        summary["pair_ready_seconds"] = round(time.monotonic() - started, 1)
        load_json = Path(folder) / "load.json"
        env = dict(os.environ, DEBUG="1", DATABASE_REPLICA_URL=pair.replica_url(DATABASE))
        done = threading.Event()
        watcher = Watcher(pair, args.seconds, done)
        watcher.start()
        with open(log_dir / "load.log", "w") as log:
            load = subprocess.run(
                [
                    sys.executable,
                    "reliability/load.py",
                    "--create-database",
                    DATABASE,
                    "--admin-url",
                    pair.primary_url("postgres"),
                    "--seconds",
                    str(args.seconds),
                    "--clients",
                    str(args.clients),
                    # Enough prepared rounds for ~1.5 per client per second (the load's
                    # default prepares 4, whose import dominated this step's time).
                    "--rounds-per-client",
                    str(math.ceil(args.seconds * 2) + 5),
                    "--json",
                    str(load_json),
                    "--log-dir",
                    str(log_dir / "hosts"),
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        done.set()
        watcher.join(30)
        loaded = json.loads(load_json.read_text()) if load_json.exists() else {}
    summary.update(
        load_exit=load.returncode,
        requests=loaded.get("requests", 0),
        requests_per_second=loaded.get("requests_per_second", 0),
        statuses=loaded.get("statuses", {}),
        expected_409=loaded.get("expected_409", {}),
        server_errors=loaded.get("server_errors"),
        unexpected_errors=loaded.get("unexpected_errors"),
        transport_errors=loaded.get("transport_errors"),
        errors=sum(int(loaded.get(k) or 0) for k in ("server_errors", "unexpected_errors", "transport_errors")),
        stale_answers=loaded.get("disagreements"),
        duplicates=loaded.get("duplicates"),
        operations_told_committed=loaded.get("operations_told_committed"),
        effects=loaded.get("effects"),
        load_failures=loaded.get("failures", ["the load wrote no summary"]),
        standby_stopped_after_seconds=round(watcher.stopped_after, 1) if watcher.stopped_after else None,
        standby_reads_before_stop=watcher.standby_reads,
        lag_samples=len(watcher.lags),
        lag_p50_seconds=round(statistics.median(watcher.lags), 3) if watcher.lags else None,
        lag_max_seconds=round(max(watcher.lags), 3) if watcher.lags else None,
        total_seconds=round(time.monotonic() - started, 1),
    )
    failures += watcher.problems
    if load.returncode != 0 or summary["load_failures"]:
        failures.append(f"the load failed (exit {load.returncode}): {'; '.join(summary['load_failures'])}")
    for key in ("errors", "stale_answers", "duplicates"):
        if summary[key] != 0:
            failures.append(f"{key}: {summary[key]} (must be 0)")
    if watcher.stopped_after is None:
        failures.append("the standby was never stopped mid-run")
    if not summary["standby_reads_before_stop"].get("transactions"):
        failures.append("the replica served no reads before it stopped")
    return summary_written(summary, failures, args.json)


if __name__ == "__main__":
    sys.exit(main())
