"""Three hosts behind haproxy, then PgBouncer, then PostgreSQL: the load, with one host SIGKILLed.

The whole picture of docs/DEPLOY.md "Scale", as processes on one machine:

    clients -> haproxy (health check GET /readyz) -> 3 gunicorn hosts -> PgBouncer -> PostgreSQL

- haproxy is Debian's binary (`make haproxy`), run in the foreground as a child process on a
  free loopback port, with a config rendered from deploy/haproxy.cfg (``render``): the
  example's own settings, with loopback addresses, a private stats socket and the log on
  standard output. It never uses the system service.
- PgBouncer (reliability/pooler.py) in transaction mode sits between the hosts and the
  server; this driver, migrate and reconcile connect directly, as cron does.
- The clients run reliability/load.py's scenarios (approve raced twice, decline then
  approve, stale edit), every request through the balancer, which picks the host.

Part-way through the run, once the chosen host is serving at least one request, its whole
process group (gunicorn's master and workers) gets SIGKILL. The run then requires:

- **no answer lost beyond the requests in flight on the killed host**: every answer the
  clients lost (haproxy's own 502/503/504 page, or a dropped connection) is a request
  haproxy's log shows on the killed host, aborted by it (termination state ``S…``), and
  there are at most as many as the host serves at once (its ``maxconn``); a request that
  found the host gone is resent to another (``retry-on conn-failure``, ``option
  redispatch``) and answered;
- the health check takes the host out of rotation, and, restarted, puts it back;
- every lost answer is settled afterwards by ``GET /api/operations/<id>`` through the
  balancer, which must agree with ``reconcile``;
- every client answer agrees with ``manage.py reconcile --all --json``, 0 duplicates, no
  other error answer, and no advisory lock left on the server.

Usage (``make reliability`` runs it for 45 s; about 2-3 minutes in all)::

    python reliability/balancer.py --create-database decisionflow_balancer --seconds 45 --clients 8
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reliability import load, streaming  # noqa: E402
from reliability.pooler import PgBouncer, advisory_locks, debian_binary, spawn, terminate  # noqa: E402

HOST = load.HOST
EXAMPLE = ROOT / "deploy" / "haproxy.cfg"
# haproxy's own error pages: the answer of a request it could not get answered by a host.
BALANCER_STATUSES = (502, 503, 504)
# One line of haproxy's `option httplog`, the fields this run reads.
HTTPLOG = re.compile(
    r" (?P<backend>[\w.-]+)/(?P<server>[\w.<>-]+) -?\d+/-?\d+/-?\d+/-?\d+/\+?-?\d+ (?P<status>-?\d+) "
    r"\S+ \S+ \S+ (?P<term>\S{4}) \d+/\d+/\d+/\d+/(?P<retries>\+?\d+) \d+/\d+ [^\"]*\"(?P<method>\S+) (?P<path>\S+)"
)


def binary() -> str | None:
    """The haproxy executable, or None when it is not installed (`make haproxy`)."""
    return debian_binary("haproxy")


# --- the config ----------------------------------------------------------------------------


def _replace_once(text: str, pattern: str, replacement: str) -> str:
    new, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    if count != 1:
        raise ValueError(
            f"deploy/haproxy.cfg: expected one line matching {pattern!r}, found {count};"
            " reliability/balancer.py renders its config from that file"
        )
    return new


def render(*, port: int, backends: list[int], maxconn: int, stats_socket: Path, example: str | None = None) -> str:
    """deploy/haproxy.cfg with this machine's addresses: haproxy on ``port`` (no TLS), one ``server``
    line per backend port, each serving ``maxconn`` requests at once, the stats socket at
    ``stats_socket``, the log on standard output. Every other setting is the example's."""
    text = EXAMPLE.read_text() if example is None else example
    if not backends:
        raise ValueError("at least one backend port")
    text = _replace_once(text, r"^(\s*)log /dev/log (\S+)$", r"\1log stdout format raw \2")
    text = _replace_once(text, r"^(\s*stats socket )\S+", rf"\g<1>{stats_socket}")
    # Loopback, plain HTTP: the hosts run with SECURE_SSL_REDIRECT=0 (reliability/load.py).
    text = _replace_once(text, r"^(\s*bind ).*$", rf"\g<1>{HOST}:{port}")
    text = _replace_once(text, r"^(\s*default-server .*\bmaxconn )\d+$", rf"\g<1>{maxconn}")
    servers = list(re.finditer(r"^(\s*)server (\S+) (\S+)(.*)\n", text, flags=re.MULTILINE))
    if not servers:
        raise ValueError("deploy/haproxy.cfg: no `server` line to render the backends from")
    indent, rest = servers[0].group(1), servers[0].group(4)
    lines = "".join(f"{indent}server web{i} {HOST}:{p}{rest}\n" for i, p in enumerate(backends, 1))
    return text[: servers[0].start()] + lines + text[servers[-1].end() :]


# --- haproxy -------------------------------------------------------------------------------


class HAProxy:
    """Debian's haproxy as a child process, in front of ``backends`` (loopback ports)."""

    def __init__(self, *, backends: list[int], maxconn: int, log_path: Path):
        self.backends, self.maxconn, self.log_path = backends, maxconn, log_path
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.folder: Path | None = None

    @property
    def socket_path(self) -> Path:
        assert self.folder is not None
        return self.folder / "admin.sock"

    def start(self, timeout: float = 30) -> HAProxy:
        executable = binary()
        if executable is None:
            raise RuntimeError("haproxy is not installed: run `make haproxy` (Debian's haproxy package)")
        self.folder = Path(tempfile.mkdtemp(prefix="decisionflow-haproxy-"))
        self.port = load.free_port()
        config = self.folder / "haproxy.cfg"
        config.write_text(
            render(port=self.port, backends=self.backends, maxconn=self.maxconn, stats_socket=self.socket_path)
        )
        checked = subprocess.run([executable, "-c", "-q", "-f", str(config)], capture_output=True, text=True)
        if checked.returncode != 0:
            raise RuntimeError(f"haproxy refused the rendered config: {checked.stdout}{checked.stderr}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            # -db: foreground, no daemon; the log goes to standard output (the rendered config).
            self.proc = spawn([executable, "-db", "-f", str(config)], log)
        try:
            deadline = time.monotonic() + timeout
            while not self.all_up():
                if self.proc.poll() is not None:
                    raise RuntimeError(f"haproxy exited with {self.proc.returncode}: see {self.log_path}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"haproxy's backends were not all UP within {timeout:.0f} s: {self.stats()}")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def stats(self) -> dict[str, dict]:
        """``show stat`` from the runtime socket: one row per server of the backend, by name."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect(str(self.socket_path))
                s.sendall(b"show stat\n")
                raw = b""
                while chunk := s.recv(65536):
                    raw += chunk
        except OSError:
            return {}
        rows = csv.DictReader(raw.decode().lstrip("# ").splitlines())
        return {r["svname"]: r for r in rows if r.get("pxname") == "web" and r["svname"] not in ("BACKEND",)}

    def all_up(self) -> bool:
        rows = self.stats()
        return len(rows) == len(self.backends) and all(r["status"] == "UP" for r in rows.values())

    def wait_status(self, server: str, wanted: str, timeout: float) -> float | None:
        """Seconds until the health check reports ``server`` as ``wanted`` (UP, DOWN), or None."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.stats().get(server, {}).get("status") == wanted:
                return time.monotonic() - started
            time.sleep(0.05)
        return None

    def stop(self) -> None:
        terminate(self.proc)
        self.proc = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def read_log(path: Path) -> list[dict]:
    """Every request haproxy logged: backend, server, status, termination state, retries."""
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        found = HTTPLOG.search(line)
        if found:
            row = found.groupdict()
            row["status"] = int(row["status"])
            row["redispatched"] = row["retries"].startswith("+")
            row["retries"] = int(row["retries"].lstrip("+"))
            rows.append(row)
    return rows


# --- clients -------------------------------------------------------------------------------


class BalancedTally(load.Tally):
    def __init__(self):
        super().__init__()
        self.lost = []  # (method, path) of every answer the balancer could not give


class BalancedClient(load.Client):
    """A client of the balancer: haproxy's own error page (no JSON ``code``) is a lost
    answer, as a dropped connection is; the application's errors carry a code."""

    def request(self, method, path, body=None, what=""):
        status, payload, retry_after = super().request(method, path, body, what=what)
        if status is None or (status in BALANCER_STATUSES and "code" not in payload):
            with self.tally.lock:
                self.tally.lost.append((method, path))
            return None, {}, None
        return status, payload, retry_after


def operations_read_back(port: int, token: str, tally: BalancedTally) -> dict[str, str | None]:
    """The state ``GET /api/operations/<id>`` gives, through the balancer, for each operation
    whose answer was lost: what a client does after a lost answer (docs/API.md)."""
    client = BalancedClient(port, token, tally, timeout=30)
    states = {}
    for op in sorted(tally.uncertain):
        status, body = client.call("GET", f"/api/operations/{op}", what="read back a lost answer")
        states[op] = body.get("state") if status == 200 else f"HTTP {status}"
    return states


def kill_host(servers: load.Servers, index: int) -> None:
    """SIGKILL one host's whole process group: gunicorn's master and its workers at once."""
    _port, proc, _log = servers.procs[index]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


# --- the run -------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--create-database", metavar="NAME", default="decisionflow_balancer")
    parser.add_argument(
        "--admin-url",
        default=os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="The PostgreSQL server to create the database on.",
    )
    parser.add_argument("--seconds", type=float, default=45)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers per host.")
    parser.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker.")
    parser.add_argument("--pool-size", type=int, default=4, help="PgBouncer's default_pool_size.")
    parser.add_argument(
        "--kill-at", type=float, default=0.3, help="When the host is killed, as a fraction of --seconds."
    )
    parser.add_argument("--rounds-per-client", type=int, help="Rounds prepared before the clock starts.")
    streaming.add_replica_option(parser)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", metavar="FILE", help="Also write the summary here.")
    parser.add_argument("--log-dir", default=str(ROOT / "var" / "balancer"), help="gunicorn, haproxy, PgBouncer logs.")
    args = parser.parse_args(argv)
    if not 2 <= args.hosts <= 8 or not 1 <= args.clients <= 64 or not 5 <= args.seconds <= 600:
        parser.error("--hosts 2..8, --clients 1..64, --seconds 5..600")
    if not 0.1 <= args.kill_at <= 0.8:
        parser.error("--kill-at 0.1..0.8")
    if binary() is None:
        print("balancer: haproxy is not installed: `make haproxy` (Debian's package, as root)", file=sys.stderr)
        return 1
    with streaming.server_for(args.admin_url, args.replica) as (admin_url, pair):
        return run(args, admin_url, pair)


def replica_transactions(pair, database: str) -> int | None:
    """Transactions the standby has served in ``database`` (its own statistics), or None."""
    import psycopg

    try:
        with psycopg.connect(pair.replica_url(database), autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", [database]
            ).fetchone()
    except psycopg.Error:
        return None
    return int(row[0]) if row else None


def run(args, admin_url: str, pair) -> int:
    log_dir = Path(args.log_dir)
    rounds_per_client = args.rounds_per_client
    if rounds_per_client is None:
        # A client ran about 1.5 rounds a second on 2 shared cores; one that runs out imports
        # its own cases during the run (load.py counts them).
        rounds_per_client = int(args.seconds * 2) + 10

    os.environ["SECRET_KEY"] = load.SHARED_SECRET
    database_url = load.database_created(admin_url, args.create_database)
    load.django_setup(database_url)
    tokens = load.make_reviewers(4)
    load.import_case("LOAD-WARMUP")
    preparing = time.monotonic()
    plans = load.prepare_rounds(args.clients, rounds_per_client, args.seed)
    prepare_seconds = time.monotonic() - preparing

    ports: list[int] = []
    while len(ports) < args.hosts:
        port = load.free_port()
        if port not in ports:
            ports.append(port)
    maxconn = args.workers * args.threads
    victim = args.hosts - 1  # the last host: web<hosts> in haproxy's config
    victim_name = f"web{victim + 1}"
    database = database_url.rsplit("/", 1)[1]
    # The replica is read directly: PgBouncer forwards every database to one server.
    hosts_env = {"DATABASE_REPLICA_URL": pair.replica_url(database)} if pair else {}
    tally = BalancedTally()
    summary: dict = {
        "seconds": args.seconds,
        "clients": args.clients,
        "hosts": args.hosts,
        "workers_per_host": args.workers,
        "threads_per_worker": args.threads,
        "maxconn_per_host": maxconn,
        "pool_size": args.pool_size,
        "rounds_prepared": rounds_per_client * args.clients,
        "prepare_seconds": round(prepare_seconds, 1),
        "killed_host": victim_name,
        "replica": bool(pair),
    }
    problems: list[str] = []
    bouncer = PgBouncer(
        server_url=database_url,
        mode="transaction",
        default_pool_size=args.pool_size,
        log_path=log_dir / "pgbouncer.log",
    ).start()
    restarted: load.Servers | None = None
    balancer: HAProxy | None = None
    servers: load.Servers | None = None
    try:
        hosts_url = bouncer.url(database)
        servers = load.Servers(hosts_url, ports, args.workers, args.threads, log_dir, extra_env=hosts_env)
        servers.wait_ready()
        balancer = HAProxy(backends=ports, maxconn=maxconn, log_path=log_dir / "haproxy.log").start()
        lb = [balancer.port]
        replica_before = replica_transactions(pair, database) if pair else None
        started = time.monotonic()
        deadline = started + args.seconds
        clients = [
            threading.Thread(
                target=load.client_loop,
                args=(i, lb, tokens, tally, deadline, args.seed, plans[i]),
                kwargs={"client_class": BalancedClient},
            )
            for i in range(args.clients)
        ]
        for t in clients:
            t.start()
        time.sleep(max(0.0, started + args.seconds * args.kill_at - time.monotonic()))
        # Kill it while it serves: wait (bounded) until haproxy counts a request on it.
        busy_wait = time.monotonic()
        in_flight = 0
        while time.monotonic() - busy_wait < 5:
            in_flight = int(balancer.stats().get(victim_name, {}).get("scur") or 0)
            if in_flight:
                break
            time.sleep(0.01)
        kill_host(servers, victim)
        killed_at = time.monotonic() - started
        down_after = balancer.wait_status(victim_name, "DOWN", timeout=15)
        # Back in rotation once restarted and its /readyz answers again (rise 2).
        restarted = load.Servers(
            hosts_url, [ports[victim]], args.workers, args.threads, log_dir / "restarted", extra_env=hosts_env
        )
        restarted.wait_ready()
        restarting = time.monotonic()
        up_after = balancer.wait_status(victim_name, "UP", timeout=30)
        rejoined_at = time.monotonic() - started if up_after is not None else None
        up_after = None if up_after is None else time.monotonic() - restarting
        for t in clients:
            t.join(max(1.0, deadline - time.monotonic()) + 300)
        elapsed = time.monotonic() - started
        stuck = sum(t.is_alive() for t in clients)
        final_stats = balancer.stats()
        replica_after = replica_transactions(pair, database) if pair else None
        read_back = operations_read_back(balancer.port, tokens[0], tally)
    finally:
        for group in (restarted, servers):
            if group is not None:
                group.stop()
        if balancer is not None:
            balancer.stop()
        try:
            left = advisory_locks(database_url, database)
        finally:
            bouncer.stop()
    if left:
        problems.append(f"{left} advisory lock(s) left held on the server after the run")

    logged = read_log(log_dir / "haproxy.log")
    by_server = Counter(r["server"] for r in logged)
    failed = [r for r in logged if r["status"] >= 500 or r["status"] < 0]
    aborted_by_victim = [r for r in failed if r["server"] == victim_name and r["term"].startswith("S")]
    failed_elsewhere = [r for r in failed if r not in aborted_by_victim]
    lost = len(tally.lost)
    # haproxy logs in the order requests end: after the killed host's last aborted request,
    # its lines are the restarted host's.
    last_abort = max((i for i, r in enumerate(logged) if r in aborted_by_victim), default=len(logged))
    served_after_restart = sum(1 for r in logged[last_abort + 1 :] if r["server"] == victim_name)
    lat = sorted(tally.latencies) or [0.0]
    # The lost answers are judged here, against the killed host's aborted requests; settle()
    # would count each dropped connection as a failure of its own.
    dropped_connections, tally.transport_errors = tally.transport_errors, 0
    summary.update(
        elapsed_seconds=round(elapsed, 1),
        killed_at_seconds=round(killed_at, 1),
        in_flight_on_killed_host_when_killed=in_flight,
        down_after_seconds=None if down_after is None else round(down_after, 2),
        rejoined_after_restart_seconds=None if up_after is None else round(up_after, 2),
        rejoined_at_seconds=None if rejoined_at is None else round(rejoined_at, 1),
        scenarios=dict(tally.scenarios),
        requests=tally.requests,
        requests_per_second=round(tally.requests / elapsed, 1) if elapsed else 0,
        latency_p50_ms=round(lat[len(lat) // 2] * 1000),
        latency_p95_ms=round(lat[int(len(lat) * 0.95)] * 1000),
        statuses=dict(tally.statuses),
        expected_409=dict(tally.expected_409),
        requests_by_host=dict(sorted(by_server.items())),
        redispatched=sum(1 for r in logged if r["redispatched"]),
        served_by_killed_host_after_restart=served_after_restart,
        answers_lost=lost,
        of_which_dropped_connections=dropped_connections,
        aborted_by_killed_host=len(aborted_by_victim),
        lost_beyond_in_flight=max(0, lost - len(aborted_by_victim)),
        failed_on_other_hosts=len(failed_elsewhere),
        lost_samples=[f"{m} {p}" for m, p in tally.lost[:10]],
        lost_operations_read_back=len(read_back),
        unexpected_errors=tally.unexpected_count,
        unexpected_samples=tally.unexpected,
        stuck_clients=stuck,
        haproxy_servers={name: row.get("status") for name, row in final_stats.items()},
        # Reads the hosts' router sent to the standby during the run (0 with no router).
        replica_transactions=(
            replica_after - replica_before if replica_before is not None and replica_after is not None else None
        ),
    )
    failures = load.settle(database_url, tally, summary)
    reconciled = {
        r["operation_id"]: r["state"]
        for r in (
            json.loads(line)
            for line in load.manage(database_url, "reconcile", "--all", "--json").stdout.splitlines()
            if line.startswith("{")
        )
        if "summary" not in r
    }
    read_back_disagree = {
        op: (state, reconciled.get(op)) for op, state in read_back.items() if state != reconciled.get(op)
    }
    summary["lost_operations_read_back_disagreeing"] = len(read_back_disagree)
    if read_back_disagree:
        problems.append(f"GET /api/operations disagrees with reconcile for {len(read_back_disagree)} lost answer(s)")
    if lost != len(aborted_by_victim):
        problems.append(
            f"{lost} answer(s) lost, but haproxy logged {len(aborted_by_victim)} request(s) aborted by the killed host"
        )
    if len(aborted_by_victim) > maxconn:
        problems.append(
            f"{len(aborted_by_victim)} request(s) aborted by the killed host, more than its maxconn {maxconn}"
        )
    if failed_elsewhere:
        problems.append(f"{len(failed_elsewhere)} request(s) failed on a host that was not killed, or after the kill")
    if down_after is None:
        problems.append(f"the health check did not take {victim_name} out of rotation within 15 s")
    if up_after is None:
        problems.append(f"{victim_name}, restarted, did not come back into rotation within 30 s")
    if any(row.get("status") != "UP" for row in final_stats.values()):
        problems.append(f"not every host is UP at the end: {summary['haproxy_servers']}")
    if stuck:
        problems.append(f"{stuck} client thread(s) did not finish")
    return load.summary_written(summary, failures + problems, args.json)


if __name__ == "__main__":
    sys.exit(main())
