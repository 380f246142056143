"""The load test of reliability/load.py at a chosen scale, with what each request costs.

Runs the same hosts, clients and scenarios as ``load.py`` (and the same checks afterwards:
reconcile agrees, no duplicates), and adds what docs/DEPLOY.md's scale section needs:

- from the hosts' own /metrics folder (PROMETHEUS_MULTIPROC_DIR, summed over both hosts):
  requests, SQL statements, new database connections, time in SQL and time per request;
- CPU seconds of every gunicorn process (master and workers, from /proc), of this driver
  (which imports the cases and begins the "stale" ones, as the pipeline would), and of the
  whole machine (/proc/stat), over the measured window.

``--pooler transaction`` puts a private PgBouncer (reliability/pooler.py, ``--pool-size`` server
connections) between the hosts and the server, as in production behind a pooler; this driver
and reconcile connect directly.

Usage::

    python reliability/scale.py --create-database decisionflow_scale --seconds 45 --clients 80 --json var/scale-80.json
    python reliability/scale.py --create-database decisionflow_scale --pooler transaction --clients 80
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from reliability import load, streaming  # noqa: E402
from reliability.pooler import PgBouncer  # noqa: E402


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
                if sample.name == "django_db_execute_total" and sample.labels.get("alias") == "replica":
                    totals["replica_execute_total"] = totals.get("replica_execute_total", 0.0) + sample.value
    return totals


def bouncer_cpu(bouncer: PgBouncer | None) -> float:
    return load._proc_cpu(bouncer.proc.pid) if bouncer is not None and bouncer.proc is not None else 0.0


CASE_VIEW_CASES = 10
CASE_VIEW_ROUNDS = 5


def case_view_cost(servers, port: int, token: str, tally, metrics_dir: str, cases: list[str]) -> dict:
    """What the API's read-only case view costs alone, after the load: the one request of
    the mix a read replica would take (docs/DEPLOY.md, "Scale"). GETs of cases nobody began,
    one after the other, on one host; statements and CPU from the same counters as the load."""
    metrics, cpu = read_metrics(metrics_dir), load.servers_cpu(servers)
    client = load.Client(port, token, tally, timeout=30)
    statuses = [client.call("GET", f"/api/cases/{case}", what="case view")[0] for case in cases * CASE_VIEW_ROUNDS]
    after = read_metrics(metrics_dir)
    requests = after.get("django_http_requests_total_by_method_total", 0) - metrics.get(
        "django_http_requests_total_by_method_total", 0
    )
    statements = after.get("django_db_execute_total", 0) - metrics.get("django_db_execute_total", 0)
    return {
        "requests": int(requests),
        "ok": sum(1 for s in statuses if s == 200),
        "statements_per_request": round(statements / (requests or 1), 2),
        "server_cpu_ms_per_request": round((load.servers_cpu(servers) - cpu) * 1000 / (requests or 1), 1),
    }


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
    parser.add_argument("--pooler", choices=("transaction", "session"), help="Hosts behind a private PgBouncer.")
    parser.add_argument("--pool-size", type=int, default=8, help="With --pooler: PgBouncer's default_pool_size.")
    parser.add_argument(
        "--rounds-per-client",
        type=int,
        help="Rounds whose cases are imported before the clock starts (default: about 700 in all, at least 10"
        " per client), so that the client threads hold no database connection of their own.",
    )
    streaming.add_replica_option(parser)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= 400 or not 1 <= args.hosts <= 8 or not 0 < args.seconds <= 300:
        parser.error("--clients 1..400, --hosts 1..8, --seconds 0..300")
    with streaming.server_for(args.admin_url, args.replica) as (admin_url, pair):
        return measure(args, admin_url, pair)


def measure(args, admin_url: str, pair) -> int:
    """One measured run on the server of ``admin_url``, the hosts reading ``pair``'s standby
    when there is one."""
    os.environ["SECRET_KEY"] = load.SHARED_SECRET
    database_url = load.database_created(admin_url, args.create_database)
    metrics_dir = tempfile.mkdtemp(prefix="decisionflow-scale-metrics-")
    load.django_setup(database_url)
    tokens = load.make_reviewers(4)
    load.import_case("LOAD-WARMUP")
    read_cases = [load.import_case("SCALE-READ") for _ in range(CASE_VIEW_CASES)]
    # Prepared before the clock: a client that imports its own case holds a connection to the
    # server for the rest of the run, and 80 of them fill a shared server's max_connections.
    rounds_per_client = args.rounds_per_client or max(10, 700 // args.clients)
    plans = load.prepare_rounds(args.clients, rounds_per_client, args.seed)

    ports: list[int] = []
    while len(ports) < args.hosts:
        port = load.free_port()
        if port not in ports:
            ports.append(port)
    hosts_url, hosts_env = database_url, {"PROMETHEUS_MULTIPROC_DIR": metrics_dir}
    if pair is not None:
        hosts_env["DATABASE_REPLICA_URL"] = pair.replica_url(database_url.rsplit("/", 1)[1])
    log_dir = Path(tempfile.mkdtemp(prefix="decisionflow-scale-logs-"))
    bouncer = None
    if args.pooler:
        bouncer = PgBouncer(
            server_url=database_url,
            mode=args.pooler,
            default_pool_size=args.pool_size,
            log_path=log_dir / "pgbouncer.log",
        ).start()
        hosts_url = bouncer.url(database_url.rsplit("/", 1)[1])
        if args.pooler == "session":
            hosts_env["DATABASE_CONN_MAX_AGE"] = "0"
    try:
        servers = load.Servers(hosts_url, ports, args.workers, args.threads, log_dir, extra_env=hosts_env)
    except BaseException:
        if bouncer is not None:
            bouncer.stop()
        raise
    tally = load.Tally()
    summary: dict = {
        "seconds": args.seconds,
        "clients": args.clients,
        "hosts": len(ports),
        "workers_per_host": args.workers,
        "threads_per_worker": args.threads,
        "cpus": os.cpu_count(),
        "pooler": {"mode": args.pooler, "default_pool_size": args.pool_size} if bouncer else None,
        "replica": pair is not None,
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
        pooler_cpu_before = bouncer_cpu(bouncer)
        started = time.monotonic()
        deadline = started + args.seconds
        clients = [
            threading.Thread(target=load.client_loop, args=(i, ports, tokens, tally, deadline, args.seed, plans[i]))
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
        pooler_cpu = bouncer_cpu(bouncer) - pooler_cpu_before
        summary["case_view"] = case_view_cost(servers, ports[0], tokens[0], tally, metrics_dir, read_cases)
    finally:
        servers.stop()
        if bouncer is not None:
            bouncer.stop()
    m0, m1 = before[3], after[3]
    delta = {k: m1.get(k, 0.0) - m0.get(k, 0.0) for k in m1}
    requests = delta.get("django_http_requests_total_by_method_total", 0.0) or 1.0
    statements = delta.get("django_db_execute_total", 0.0) or 1.0
    lat = sorted(tally.latencies) or [0.0]
    summary.update(
        elapsed_seconds=round(elapsed, 1),
        rounds_prepared=rounds_per_client * args.clients,
        rounds_imported_during_run=tally.rounds_imported_during_run,
        scenarios=dict(tally.scenarios),
        client_requests=tally.requests,
        requests_per_second=round(tally.requests / elapsed, 1),
        latency_p50_ms=round(lat[len(lat) // 2] * 1000),
        latency_p95_ms=round(lat[int(len(lat) * 0.95)] * 1000),
        latency_p99_ms=round(lat[int(len(lat) * 0.99)] * 1000),
        statuses=dict(tally.statuses),
        server_requests=int(delta.get("django_http_requests_total_by_method_total", 0)),
        sql_statements=int(delta.get("django_db_execute_total", 0)),
        # What the database router sent to the standby (with --replica), of the statements above.
        replica_statements=int(delta.get("replica_execute_total", 0)),
        replica_statement_share=round(delta.get("replica_execute_total", 0) / statements, 3),
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
        pooler_cpu_ms_per_request=round(pooler_cpu * 1000 / requests, 2),
        postgres_cpu_ms_per_statement=round((after[4] - before[4]) * 1000 / statements, 3),
        machine_busy_cpu_seconds=round(after[2][0] - before[2][0], 1),
        machine_cpu_seconds=round(after[2][1] - before[2][1], 1),
    )
    summary["machine_cpu_busy_percent"] = round(
        100 * summary["machine_busy_cpu_seconds"] / (summary["machine_cpu_seconds"] or 1), 1
    )
    status = load.summary_written(summary, load.settle(database_url, tally, summary), args.json)
    shutil.rmtree(metrics_dir, ignore_errors=True)
    if status == 0:
        shutil.rmtree(log_dir, ignore_errors=True)  # kept when a check failed, to read
    else:
        print(f"scale: the hosts' logs are in {log_dir}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
