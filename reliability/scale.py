"""The load test of reliability/load.py at a chosen scale, with what each request costs.

Runs the same hosts, clients and scenarios as ``load.py`` (and the same checks afterwards:
reconcile agrees, no duplicates), and adds what docs/DEPLOY.md's scale section needs:

- from the hosts' own /metrics folder (PROMETHEUS_MULTIPROC_DIR, summed over both hosts):
  requests, SQL statements, new database connections, time in SQL and time per request;
- CPU seconds of every gunicorn process (master and workers, from /proc), of this driver
  (which imports the cases and begins the "stale" ones, as the pipeline would), and of the
  whole machine (/proc/stat), over the measured window.

Usage::

    python reliability/scale.py --create-database decisionflow_scale --seconds 45 --clients 80 --json var/scale-80.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from reliability import load  # noqa: E402


def read_metrics(folder: str) -> dict:
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=folder)
    totals: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name in (
                "django_http_requests_total_by_method_total",
                "django_db_execute_total",
                "django_db_new_connections_total",
                "django_db_query_duration_seconds_sum",
                "django_http_requests_latency_including_middlewares_seconds_sum",
                "decisionflow_decisions_total",
                "decisionflow_commit_seconds_sum",
                "decisionflow_commit_seconds_count",
                "decisionflow_busy_refusals_total",
            ):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--create-database", metavar="NAME", required=True)
    parser.add_argument(
        "--admin-url", default=os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--seconds", type=float, default=45)
    parser.add_argument("--clients", type=int, default=80)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= 400 or not 1 <= args.hosts <= 8 or not 0 < args.seconds <= 300:
        parser.error("--clients 1..400, --hosts 1..8, --seconds 0..300")

    os.environ["SECRET_KEY"] = load.SHARED_SECRET
    database_url = load.create_database(args.admin_url, args.create_database)
    migrated = load.manage(database_url, "migrate", "--noinput")
    if migrated.returncode != 0:
        print(migrated.stderr, file=sys.stderr)
        return 1
    metrics_dir = tempfile.mkdtemp(prefix="decisionflow-scale-metrics-")
    load.django_setup(database_url)
    tokens = load.make_reviewers(4)
    load.import_case("LOAD-WARMUP")

    ports: list[int] = []
    while len(ports) < args.hosts:
        port = load.free_port()
        if port not in ports:
            ports.append(port)
    servers = load.Servers(
        database_url,
        ports,
        args.workers,
        args.threads,
        Path(tempfile.mkdtemp(prefix="decisionflow-scale-logs-")),
        extra_env={"PROMETHEUS_MULTIPROC_DIR": metrics_dir},
    )
    tally = load.Tally()
    summary: dict = {
        "seconds": args.seconds,
        "clients": args.clients,
        "hosts": len(ports),
        "workers_per_host": args.workers,
        "threads_per_worker": args.threads,
        "cpus": os.cpu_count(),
    }
    try:
        servers.wait_ready()
        before = (
            load.servers_cpu(servers),
            load.driver_cpu(),
            load.machine_cpu(),
            read_metrics(metrics_dir),
            load.postgres_cpu(),
        )
        started = time.monotonic()
        deadline = started + args.seconds
        clients = [
            threading.Thread(target=load.client_loop, args=(i, ports, tokens, tally, deadline, args.seed))
            for i in range(args.clients)
        ]
        for t in clients:
            t.start()
        for t in clients:
            t.join(max(1.0, deadline - time.monotonic()) + 300)
        elapsed = time.monotonic() - started
        after = (
            load.servers_cpu(servers),
            load.driver_cpu(),
            load.machine_cpu(),
            read_metrics(metrics_dir),
            load.postgres_cpu(),
        )
    finally:
        servers.stop()
    m0, m1 = before[3], after[3]
    delta = {k: m1.get(k, 0.0) - m0.get(k, 0.0) for k in m1}
    requests = delta.get("django_http_requests_total_by_method_total", 0.0) or 1.0
    statements = delta.get("django_db_execute_total", 0.0) or 1.0
    lat = sorted(tally.latencies) or [0.0]
    summary.update(
        elapsed_seconds=round(elapsed, 1),
        scenarios=dict(tally.scenarios),
        client_requests=tally.requests,
        requests_per_second=round(tally.requests / elapsed, 1),
        latency_p50_ms=round(lat[len(lat) // 2] * 1000),
        latency_p95_ms=round(lat[int(len(lat) * 0.95)] * 1000),
        latency_p99_ms=round(lat[int(len(lat) * 0.99)] * 1000),
        statuses=dict(tally.statuses),
        server_requests=int(delta.get("django_http_requests_total_by_method_total", 0)),
        sql_statements=int(delta.get("django_db_execute_total", 0)),
        statements_per_request=round(statements / requests, 2),
        new_db_connections=int(delta.get("django_db_new_connections_total", 0)),
        sql_ms_per_statement=round(delta.get("django_db_query_duration_seconds_sum", 0) * 1000 / statements, 3),
        server_ms_per_request=round(
            delta.get("django_http_requests_latency_including_middlewares_seconds_sum", 0) * 1000 / requests, 1
        ),
        decisions=int(delta.get("decisionflow_decisions_total", 0)),
        commit_ms_mean=round(
            delta.get("decisionflow_commit_seconds_sum", 0)
            * 1000
            / (delta.get("decisionflow_commit_seconds_count", 0) or 1),
            1,
        ),
        busy_refusals=int(delta.get("decisionflow_busy_refusals_total", 0)),
        server_cpu_seconds=round(after[0] - before[0], 1),
        server_cpu_ms_per_request=round((after[0] - before[0]) * 1000 / requests, 1),
        driver_cpu_seconds=round(after[1] - before[1], 1),
        postgres_cpu_seconds=round(after[4] - before[4], 1),
        postgres_cpu_ms_per_statement=round((after[4] - before[4]) * 1000 / statements, 3),
        machine_busy_cpu_seconds=round(after[2][0] - before[2][0], 1),
        machine_cpu_seconds=round(after[2][1] - before[2][1], 1),
    )
    summary["machine_cpu_busy_percent"] = round(
        100 * summary["machine_busy_cpu_seconds"] / (summary["machine_cpu_seconds"] or 1), 1
    )
    failures = load.settle(database_url, tally, summary)
    summary["failures"] = failures
    summary["ok"] = not failures
    text = json.dumps(summary, indent=2, sort_keys=True)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
