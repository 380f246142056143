"""Two hosts, one PostgreSQL: concurrent load through the JSON API, then reconcile.

Starts two gunicorn instances (the pinned gunicorn, gthread workers) on two loopback ports,
both on one PostgreSQL database, and runs bounded client threads against them for a fixed
time. Each client thread loops over three scenarios on fresh cases (imported directly in the
database, as the pipeline's import would). The cases are imported, and the stale ones begun,
before the clock starts: that is the pipeline's work, not the API's, and done during the run
it shared this process's GIL and the machine's cores with the requests being timed. A client
that runs out of prepared cases imports its own (counted as rounds_imported_during_run).

- approve: GET the case, then the same approval sent to BOTH hosts at once, then once more:
  exactly one answer may say ``replay: false``;
- decline: decline on one host, then approve on the other: 409 ``conflicting_decision``;
- stale: GET the case, edit it (a new operation, its review begun: ``review_begun``),
  approve the old operation on the other host (409 ``stale_proposal`` naming the new one),
  then approve the new one.

Every decision answer's ``outcome`` must match its receipt (committed, declined, replay).
A 409 ``case_busy`` (another action held the case past its timeout) is the documented
"try again": the client waits ``Retry-After`` and sends the same request again, a bounded
number of times, and the busy answers are counted with the expected 409s.

Only the 409s listed above are expected; any other non-2xx answer is an error. Afterwards
the servers are stopped and ``manage.py reconcile --all --json`` must show every operation
settled and agreeing with what the clients were told: each operation told Committed is
Committed with one effect, each told Declined is Declined, nothing is NoLocalEffectRecorded,
and no case has two decisions or two effects.

The summary also says where the CPU went during the timed window (both hosts' processes,
this driver, every postgres process, the whole machine) and the hosts' and PostgreSQL's CPU
per request: on a shared machine those move less than requests per second do.

``--code DIR`` serves, migrates and imports another checkout's code with this harness, so
that one harness measures two commits (docs/PERFORMANCE.md, "load").

``--pooler transaction|session`` puts a private PgBouncer (reliability/pooler.py, Debian's
binary, ``--pool-size`` server connections, 4 by default) between the two hosts and the
server; this driver, migrate and reconcile still connect directly, as the pipeline and cron
may. In session mode the hosts close their connection after each request
(``DATABASE_CONN_MAX_AGE=0``), so that the few server connections are shared between
requests (each reset with DISCARD ALL) instead of being held by idle threads. The run then
also requires, with the hosts still up:

- ``/readyz`` answers 200 on both hosts;
- a held case: while another connection holds the case row (``FOR UPDATE``), an approval of a
  begun case and one of a case not yet begun each answer 409 ``case_busy`` with Retry-After;
  once released, the same approvals commit, and sent once more they are replays (200);

and, once the hosts have stopped and before the pooler does, no advisory lock held on the
server in the load's database (a lock a pooled session left behind would stay held by an
idle server connection). Every answer 5xx fails the run: no fault is injected.

Usage (``make reliability`` runs the first form for 60 s)::

    python reliability/load.py --create-database decisionflow_load --seconds 60 --clients 8
    python reliability/load.py --database-url postgres://...  # an existing, migrated database

Exit status 0 when every check holds; the summary is printed and, with --json, written.
Every address is 127.0.0.1; every loop is bounded in time and in count. Both hosts and this
script share one SECRET_KEY: checkpoint digests are HMACs keyed from it, so a pause begun
on one host (or here) must verify on the other.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import random
import resource
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# This harness's own helpers come from this checkout, also when --code serves another one.
sys.path.insert(0, str(ROOT))

from reliability.pooler import PgBouncer, advisory_locks  # noqa: E402

# The checkout whose code is under test: served by the hosts, run by manage.py, imported by
# this driver. This one by default; --code names another (the same harness then measures an
# older commit, as the before/after figures in docs/PERFORMANCE.md do).
CODE = ROOT
HOST = "127.0.0.1"
MAX_ROUNDS_PER_CLIENT = 100_000  # a bound on count, beside the bound on time
EXPECTED_409 = {"conflicting_decision", "stale_proposal", "case_busy"}
BUSY = "case_busy"
MAX_BUSY_RETRIES = 5  # a busy case is "try again": bounded, after Retry-After
# What a first decision's ``outcome`` must be, from its status (a replay says "replay").
# These and the states below are the API's and reconcile's wire values, written out: the
# harness checks that contract, and the code it imports comes from the checkout under test
# (--code), older ones without core/outcomes.py included.
OUTCOMES = {"Committed": "committed", "Declined": "declined"}
# One secret for every process this script starts (and for this script, when it begins a
# review itself): checkpoint digests are HMACs keyed from SECRET_KEY.
SHARED_SECRET = secrets.token_urlsafe(50)


# --- setup ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def create_database(admin_url: str, name: str) -> str:
    """Drop and create ``name`` on the server of ``admin_url``; return its DATABASE_URL."""
    import psycopg
    from psycopg import sql

    if not name.replace("_", "").isalnum():
        raise SystemExit(f"load: database name {name!r} must be letters, digits and _")
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base = admin_url.rsplit("/", 1)[0]
    return f"{base}/{name}"


def database_created(admin_url: str, name: str) -> str:
    """Drop, create and migrate ``name`` on the server of ``admin_url``; its DATABASE_URL.
    A failed migrate ends the harness with migrate's own error output."""
    database_url = create_database(admin_url, name)
    migrated = manage(database_url, "migrate", "--noinput")
    if migrated.returncode != 0:
        raise SystemExit(f"migrate failed on {name}:\n{migrated.stderr}")
    return database_url


def manage(database_url: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, DATABASE_URL=database_url, DEBUG="1")
    env.pop("DECISIONFLOW_FAULT_INJECTION", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=CODE, env=env, capture_output=True, text=True, timeout=timeout
    )


def django_setup(database_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DEBUG", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "decisionflow.settings")
    sys.path.insert(0, str(CODE))
    import django

    django.setup()


def case_data(case_id: str) -> dict:
    data = json.loads((CODE / "cases" / "demo" / "t1042.json").read_text())
    data["case_id"] = case_id
    return data


def import_case(prefix: str) -> str:
    from cases.services import case_import

    case_id = f"{prefix}-{uuid.uuid4().hex[:12]}"
    case_import(data=case_data(case_id))
    return case_id


def make_reviewers(count: int) -> list[str]:
    """Reviewers with the review permission and one API token each (created in the DB)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission

    from api.services import token_create
    from reviews.groups import ensure_review_groups

    reviewers, _leads = ensure_review_groups(Group, Permission)
    tokens = []
    run = uuid.uuid4().hex[:6]
    for i in range(count):
        user = get_user_model().objects.create_user(f"load-{run}-{i}", is_staff=True)
        user.set_unusable_password()
        user.save()
        user.groups.add(reviewers)
        tokens.append(token_create(user=user, name="load test")[1])
    return tokens


# --- servers -------------------------------------------------------------------------------


class Servers:
    def __init__(
        self,
        database_url: str,
        ports: list[int],
        workers: int,
        threads: int,
        log_dir: Path,
        extra_env: dict | None = None,
        secret_key: str | None = None,
    ):
        """Start one gunicorn per port. Every host gets ``secret_key`` (default: the one
        secret of this process), never a secret of its own: a checkpoint one host signed must
        verify on every other host that shares the database."""
        self.procs = []
        env = dict(
            os.environ,
            DATABASE_URL=database_url,
            DEBUG="0",
            SECRET_KEY=secret_key or SHARED_SECRET,
            ALLOWED_HOSTS=HOST,
            SECURE_SSL_REDIRECT="0",
            LOG_LEVEL="WARNING",
        )
        env.pop("DECISIONFLOW_FAULT_INJECTION", None)
        env.pop("DECISIONFLOW_CRASH_AT", None)
        env.update(extra_env or {})  # the crash tests start a host with a crash point armed
        log_dir.mkdir(parents=True, exist_ok=True)
        for port in ports:
            log = open(log_dir / f"gunicorn-{port}.log", "w")  # noqa: SIM115 - closed in stop()
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "decisionflow.wsgi:application",
                    "--bind",
                    f"{HOST}:{port}",
                    "--workers",
                    str(workers),
                    "--threads",
                    str(threads),
                    "--worker-class",
                    "gthread",
                    "--timeout",
                    "120",
                    "--graceful-timeout",
                    "10",
                ],
                cwd=CODE,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.procs.append((port, proc, log))

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        for port, proc, _log in self.procs:
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"load: gunicorn on port {port} exited with {proc.returncode}")
                try:
                    conn = http.client.HTTPConnection(HOST, port, timeout=5)
                    conn.request("GET", "/api/cases/READY-CHECK")
                    status = conn.getresponse().status
                    conn.close()
                    if status in (401, 404):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"load: gunicorn on port {port} did not answer within {timeout:.0f} s")
                time.sleep(0.2)

    def stop(self) -> None:
        for _port, proc, _log in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _port, proc, log in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            log.close()


# --- CPU accounting (Linux /proc) ------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def _tree(pid: int) -> list[int]:
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            pids += [int(c) for c in (task / "children").read_text().split()]
    return pids


def servers_cpu(servers) -> float:
    return sum(_proc_cpu(p) for _port, proc, _log in servers.procs for p in _tree(proc.pid))


def postgres_cpu() -> float:
    """CPU seconds of every live ``postgres`` process on this machine (the server is local).

    An upper bound for this run: other databases on the same server count too, and backends
    that exited during the window (one per request without persistent connections) do not,
    so the figure is read with server_requests and new_db_connections beside it.
    """
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if "(postgres)" in text:
            fields = text.rsplit(")", 1)[1].split()
            # utime + stime, plus the reaped children's (cutime + cstime): the postmaster
            # collects the CPU of every backend that exited, so short-lived ones count too.
            total += sum(int(f) for f in fields[11:15]) / TICK
    return total


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the machine so far."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]
    return (sum(parts) - idle) / TICK, sum(parts) / TICK


def driver_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- clients -------------------------------------------------------------------------------


class Tally:
    """Everything the clients saw, merged under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = 0
        self.statuses = Counter()  # "200", "409 stale_proposal", ...
        self.expected_409 = Counter()
        self.unexpected = []  # (what, status, body) samples
        self.unexpected_count = 0
        self.transport_errors = 0
        self.told = {}  # operation_id -> "Committed" | "Declined"
        self.first_answers = Counter()  # operation_id -> answers with replay false
        self.scenarios = Counter()
        self.uncertain = set()  # operations whose answer was lost in transport
        self.latencies = []
        self.rounds_imported_during_run = 0  # rounds whose case a client imported itself

    def answer(self, what, status, body, seconds):
        with self.lock:
            self.requests += 1
            self.latencies.append(seconds)
            code = body.get("code") if isinstance(body, dict) else None
            self.statuses[f"{status} {code}" if code else str(status)] += 1

    def unexpected_answer(self, what, status, body):
        with self.lock:
            self.unexpected_count += 1
            if len(self.unexpected) < 20:
                self.unexpected.append({"what": what, "status": status, "body": str(body)[:300]})


class Client:
    def __init__(self, port: int, token: str, tally: Tally, timeout: float = 120):
        self.port, self.token, self.tally, self.timeout = port, token, tally, timeout

    def decide(self, case_id: str, operation_id: str, approved: bool, what: str) -> tuple[int | None, dict]:
        """POST a decision; on 409 ``case_busy`` wait Retry-After and send it again (bounded)."""
        path = f"/api/cases/{case_id}/decision"
        body = {"operation_id": operation_id, "approved": approved}
        status, payload, retry_after = self.request("POST", path, body, what=what)
        for _ in range(MAX_BUSY_RETRIES):
            if status != 409 or payload.get("code") != BUSY:
                break
            with self.tally.lock:
                self.tally.expected_409[BUSY] += 1
            time.sleep(min(float(retry_after or 1), 5.0))
            status, payload, retry_after = self.request("POST", path, body, what=f"{what} (again after busy)")
        return status, payload

    def call(self, method: str, path: str, body=None, what="") -> tuple[int | None, dict]:
        status, payload, _retry_after = self.request(method, path, body, what=what)
        return status, payload

    def request(self, method: str, path: str, body=None, what="") -> tuple[int | None, dict, str | None]:
        """One request; (status, JSON body, Retry-After), or (None, {}, None) when the answer is lost."""
        headers = {"Authorization": f"Bearer {self.token}", "Host": HOST}
        data = None if body is None else json.dumps(body)
        if data is not None:
            headers["Content-Type"] = "application/json"
        started = time.monotonic()
        # A new connection per request: an idle kept-alive connection that the server has
        # closed would turn a POST into a lost answer for no reason under test.
        conn = http.client.HTTPConnection(HOST, self.port, timeout=self.timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
            status = response.status
            retry_after = response.getheader("Retry-After")
        except (OSError, http.client.HTTPException):
            # The answer is lost; reconcile tells what happened to the operation.
            with self.tally.lock:
                self.tally.transport_errors += 1
            return None, {}, None
        finally:
            conn.close()
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = {"raw": raw[:200].decode("utf-8", "replace")}
        self.tally.answer(what, status, payload, time.monotonic() - started)
        return status, payload, retry_after


def expect(tally, what, status, body, wanted_status, wanted_code=None) -> bool:
    ok = status == wanted_status and (wanted_code is None or body.get("code") == wanted_code)
    if ok and status == 409:
        with tally.lock:
            tally.expected_409[wanted_code] += 1
    elif not ok and status is not None:
        tally.unexpected_answer(what, status, body)
    return ok


def decided(tally, op, body, outcome):
    wanted = "replay" if body.get("replay") else OUTCOMES.get(body.get("status"))
    if body.get("outcome") != wanted:
        tally.unexpected_answer("decision outcome does not match its receipt", 200, body)
    with tally.lock:
        tally.told[op] = outcome
        if body.get("replay") is False:
            tally.first_answers[op] += 1


def scenario_approve(here, there, tally, case_id):
    status, case = here.call("GET", f"/api/cases/{case_id}", what="get case")
    if not expect(tally, "get case", status, case, 200):
        return
    op = case["operation_id"]
    answers = [None, None]

    def send(i, client):
        answers[i] = client.decide(case_id, op, True, what="approve (racing duplicate)")

    racers = [threading.Thread(target=send, args=(i, c)) for i, c in enumerate((here, there))]
    for t in racers:
        t.start()
    for t in racers:
        t.join(180)
    answers.append(here.decide(case_id, op, True, what="approve (duplicate)"))
    for answer in answers:
        if answer is None or answer[0] is None:
            with tally.lock:
                tally.uncertain.add(op)
            continue
        status, body = answer
        if expect(tally, "approve", status, body, 200) and body.get("status") == "Committed":
            decided(tally, op, body, "Committed")
        elif status == 200:
            tally.unexpected_answer("approve", status, body)


def scenario_decline(here, there, tally, case_id):
    status, case = here.call("GET", f"/api/cases/{case_id}", what="get case")
    if not expect(tally, "get case", status, case, 200):
        return
    op = case["operation_id"]
    status, body = here.decide(case_id, op, False, what="decline")
    if status is None:
        with tally.lock:
            tally.uncertain.add(op)
        return
    if expect(tally, "decline", status, body, 200) and body.get("status") == "Declined":
        decided(tally, op, body, "Declined")
    status, body = there.decide(case_id, op, True, what="approve after decline")
    expect(tally, "approve after decline", status, body, 409, "conflicting_decision")


def scenario_stale(here, there, tally, case_id, rng):
    status, case = here.call("GET", f"/api/cases/{case_id}", what="get case")
    if not expect(tally, "get case", status, case, 200):
        return
    old = case["operation_id"]
    edit = {"expected_operation_id": old, "body": f"Hello,\n\nEdited under load ({rng.random():.6f}).\n\nSupport"}
    status, body = here.call("POST", f"/api/cases/{case_id}/edits", edit, what="edit")
    if not expect(tally, "edit", status, body, 201):
        return
    new = body["proposal"]["operation_id"]
    if body.get("review_begun") is not True:
        # Saved, but its review was not begun: nothing under load should cause that.
        tally.unexpected_answer("edit saved without beginning its review", status, body)
    status, body = there.decide(case_id, old, True, what="stale approval")
    if expect(tally, "stale approval", status, body, 409, "stale_proposal") and body.get("current_operation_id") != new:
        tally.unexpected_answer("stale approval names the wrong current operation", status, body)
    status, body = there.call("POST", f"/api/cases/{case_id}/edits", edit, what="stale edit")
    expect(tally, "stale edit", status, body, 409, "stale_proposal")
    status, body = there.decide(case_id, new, True, what="approve after edit")
    if status is None:
        with tally.lock:
            tally.uncertain.add(new)
    elif expect(tally, "approve after edit", status, body, 200) and body.get("status") == "Committed":
        decided(tally, new, body, "Committed")


KINDS = ("approve", "decline", "stale")
KIND_WEIGHTS = (45, 25, 30)


def round_case(kind: str) -> str:
    """A fresh case for one round, as the pipeline hands it over: imported directly in the
    database and, for the stale scenario, begun (as `manage.py begin` would). Approve and
    decline cases are begun by their first decision through the API."""
    case_id = import_case(f"LOAD-{kind[:2].upper()}")
    if kind == "stale":
        from cases.models import Case
        from workflow.begin import review_begin

        review_begin(case=Case.objects.get(case_id=case_id))
    return case_id


def prepare_rounds(clients: int, rounds_per_client: int, seed: int) -> list[list[tuple[str, str]]]:
    """Every client's rounds, (scenario, case), with their cases imported before the clock starts.

    The import is the pipeline's work, not an API request: done here, it no longer shares
    this process's GIL and the machine's two cores with the measured requests. A client that
    runs out of prepared rounds imports the next case itself (counted in the summary).
    """
    plans = []
    for index in range(clients):
        rng = random.Random(f"{seed}:{index}:scenarios")
        kinds = rng.choices(KINDS, weights=KIND_WEIGHTS, k=rounds_per_client)
        plans.append([(kind, round_case(kind)) for kind in kinds])
    return plans


def client_loop(index, ports, tokens, tally, deadline, seed, plan=None, client_class=None):
    """One client thread's rounds until ``deadline``. ``client_class`` (default ``Client``)
    is how a request is sent and its answer read: behind a load balancer, its own error page
    is a lost answer, not the application's (reliability/balancer.py)."""
    from django.db import connections

    make = client_class or Client
    rng = random.Random(seed + index)
    here = make(ports[index % len(ports)], tokens[index % len(tokens)], tally)
    there = make(ports[(index + 1) % len(ports)], tokens[(index + 1) % len(tokens)], tally)
    prepared = iter(plan or ())
    try:
        for _ in range(MAX_ROUNDS_PER_CLIENT):
            if time.monotonic() >= deadline:
                break
            kind, case_id = next(prepared, (None, None))
            if case_id is None:
                kind = rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
                case_id = round_case(kind)
                with tally.lock:
                    tally.rounds_imported_during_run += 1
            with tally.lock:
                tally.scenarios[kind] += 1
            if kind == "approve":
                scenario_approve(here, there, tally, case_id)
            elif kind == "decline":
                scenario_decline(here, there, tally, case_id)
            else:
                scenario_stale(here, there, tally, case_id, rng)
    except Exception as exc:  # noqa: BLE001 - a crashed client is reported, not hidden
        tally.unexpected_answer(f"client {index} crashed", None, f"{type(exc).__name__}: {exc}")
    finally:
        connections.close_all()


# --- behind a pooler -------------------------------------------------------------------


def held_case_probe(client: Client, database_url: str, case_id: str, what: str) -> list[str]:
    """Hold ``case_id``'s row from a direct connection: the approval must answer 409
    ``case_busy`` with Retry-After; once released it commits, and once more it is a replay.
    Returns what went wrong (nothing when the documented answers came)."""
    import psycopg
    from psycopg import sql

    from cases.models import Case

    problems = []
    status, case = client.call("GET", f"/api/cases/{case_id}", what=f"{what}: get case")
    if status != 200:
        return [f"{what}: GET the case answered {status} {case}"]
    op = case["operation_id"]
    body = {"operation_id": op, "approved": True}
    path = f"/api/cases/{case_id}/decision"
    lock = sql.SQL("SELECT 1 FROM {} WHERE case_id = %s FOR UPDATE").format(sql.Identifier(Case._meta.db_table))
    with psycopg.connect(database_url, connect_timeout=5) as holder:
        holder.execute(lock, [case_id])
        status, payload, retry_after = client.request("POST", path, body, what=f"{what}: approve a held case")
        holder.rollback()
    if status == 409 and payload.get("code") == BUSY:
        with client.tally.lock:
            client.tally.expected_409[BUSY] += 1
    if status != 409 or payload.get("code") != BUSY or not retry_after:
        problems.append(f"{what}: a held case answered {status} {str(payload)[:160]} (Retry-After {retry_after!r})")
    for expected, again in (("committed", "approve once released"), ("replay", "the same approval again")):
        status, payload, _ = client.request("POST", path, body, what=f"{what}: {again}")
        if status is None:
            with client.tally.lock:
                client.tally.uncertain.add(op)
        elif status == 200 and payload.get("status") == "Committed":
            decided(client.tally, op, payload, "Committed")
        if status != 200 or payload.get("outcome") != expected:
            problems.append(f"{what}: {again} answered {status} {str(payload)[:160]}, not {expected}")
    return problems


def pooler_probes(ports: list[int], tokens: list[str], tally: Tally, database_url: str) -> tuple[dict, list[str]]:
    """/readyz on both hosts, then a held case on each decision path, at once (each waits
    out the decision lock timeout)."""
    figures: dict = {"readyz": {}}
    problems: list[str] = []
    for port in ports:
        conn = http.client.HTTPConnection(HOST, port, timeout=30)
        try:
            conn.request("GET", "/readyz", headers={"Host": HOST})
            response = conn.getresponse()
            figures["readyz"][str(port)] = response.status
            if response.status != 200:
                problems.append(f"/readyz on port {port} answered {response.status}: {response.read()[:300]!r}")
        finally:
            conn.close()
    # A begun case (its approval waits for the row in the commit) and one nobody began (it
    # waits in begin, which writes the case row).
    cases = {"begun case": round_case("stale"), "case not begun": round_case("approve")}
    found: dict[str, list[str]] = {}

    def probe(i: int, what: str, case_id: str) -> None:
        # Each answer is due within the decision lock timeout (3 s by default): a request
        # still waiting after this long is reported, not waited for.
        client = Client(ports[i % len(ports)], tokens[i % len(tokens)], tally, timeout=20)
        try:
            found[what] = held_case_probe(client, database_url, case_id, what)
        except Exception as exc:
            found[what] = [f"{what}: the probe crashed: {type(exc).__name__}: {exc}"]

    threads = [threading.Thread(target=probe, args=(i, w, c)) for i, (w, c) in enumerate(cases.items())]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    for what in cases:
        problems += found.get(what, [f"{what}: the probe did not finish"])
    figures["held_case_probes"] = len(cases)
    figures["held_case_probes_passed"] = sum(1 for w in cases if found.get(w) == [])
    return figures, problems


# --- checks --------------------------------------------------------------------------------


def summary_written(summary: dict, failures: list[str], json_path: str | None) -> int:
    """Print the summary (and write it to ``json_path``); the exit status: 0 when nothing failed."""
    summary["failures"] = failures
    summary["ok"] = not failures
    text = json.dumps(summary, indent=2, sort_keys=True)
    print(text)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(text + "\n")
    return 0 if not failures else 1


def settle(database_url: str, tally: Tally, summary: dict) -> list[str]:
    """Reconcile, compare with what the clients were told; returns the failed checks."""
    from django.db.models import Count

    from effects.models import EffectRecord
    from reviews.models import ReviewDecision

    proc = manage(database_url, "reconcile", "--all", "--json")
    # The last line of --all is the run's summary object, not an operation.
    rows = [
        r for r in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")) if "summary" not in r
    ]
    by_op = {r["operation_id"]: r for r in rows}
    states = Counter(r["state"] for r in rows)
    failures = []
    if proc.returncode != 0:
        failures.append(f"reconcile --all exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    disagreements = []
    for op, outcome in tally.told.items():
        row = by_op.get(op)
        want_effects = 1 if outcome == "Committed" else 0
        if row is None or row["state"] != outcome or row["effects"] != want_effects:
            disagreements.append({"operation_id": op, "told": outcome, "reconcile": row})
    untold = [r for r in rows if r["operation_id"] not in tally.told]
    unsettled = [r for r in untold if r["state"] not in ("Pending",) and r["operation_id"] not in tally.uncertain]
    effects = EffectRecord.objects.count()
    dup_effects = EffectRecord.objects.values("case_id").annotate(n=Count("id")).filter(n__gt=1).count()
    dup_decisions = ReviewDecision.objects.values("proposal__case_id").annotate(n=Count("id")).filter(n__gt=1).count()
    double_first = sum(1 for n in tally.first_answers.values() if n > 1)
    told_committed = sum(1 for v in tally.told.values() if v == "Committed")
    summary.update(
        reconcile_exit=proc.returncode,
        reconcile_operations=len(rows),
        reconcile_states=dict(states),
        operations_told_committed=told_committed,
        operations_told_declined=sum(1 for v in tally.told.values() if v == "Declined"),
        effects=effects,
        duplicate_effects=dup_effects,
        duplicate_decisions=dup_decisions,
        duplicates=dup_effects + dup_decisions + double_first,
        answered_replay_false_twice=double_first,
        disagreements=len(disagreements),
        disagreement_samples=disagreements[:5],
        pending_never_decided=sum(1 for r in untold if r["state"] == "Pending"),
        unsettled=len(unsettled),
    )
    if states.get("NoLocalEffectRecorded"):
        failures.append(f"{states['NoLocalEffectRecorded']} operation(s) NoLocalEffectRecorded")
    if disagreements:
        failures.append(f"{len(disagreements)} operation(s) disagree with what clients were told")
    if unsettled:
        failures.append(f"{len(unsettled)} decided operation(s) no client was told about")
    if effects != states.get("Committed", 0):
        failures.append(f"{effects} effect(s) but {states.get('Committed', 0)} Committed operation(s)")
    if summary["duplicates"]:
        failures.append(f"{summary['duplicates']} duplicate(s)")
    if tally.unexpected_count:
        failures.append(f"{tally.unexpected_count} unexpected answer(s)")
    if tally.transport_errors:
        failures.append(f"{tally.transport_errors} request(s) lost in transport")
    if tally.requests == 0:
        failures.append("no requests were made")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--database-url", help="An existing, migrated PostgreSQL database.")
    target.add_argument("--create-database", metavar="NAME", help="Drop, create and migrate this database first.")
    parser.add_argument(
        "--admin-url",
        default=os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="With --create-database: a URL of the server to create it on.",
    )
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=8, help="Client threads, split across the two hosts.")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers per host.")
    parser.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker.")
    parser.add_argument(
        "--rounds-per-client",
        type=int,
        help="Rounds whose cases are imported before the clock starts (default: 4 per second of the run, + 5).",
    )
    parser.add_argument(
        "--code",
        metavar="DIR",
        default=str(ROOT),
        help="The checkout to run: its hosts, its manage.py and its models (default: this one).",
    )
    parser.add_argument(
        "--pooler",
        choices=("transaction", "session"),
        help="Put a private PgBouncer in this pool mode between the hosts and the server (reliability/pooler.py).",
    )
    parser.add_argument(
        "--pool-size", type=int, default=4, help="With --pooler: PgBouncer's default_pool_size (server connections)."
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", metavar="FILE", help="Also write the summary here.")
    parser.add_argument("--log-dir", default=str(ROOT / "var" / "load"), help="gunicorn logs.")
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= 64 or not 0 < args.seconds <= 900:
        parser.error("--clients must be 1..64 and --seconds 0..900")
    rounds_per_client = args.rounds_per_client
    if rounds_per_client is None:
        # A client that runs out imports in this process during the run, on the cores the
        # hosts use: at ~75 requests per second (docs/PERFORMANCE.md, "third pass") a client
        # needed ~2 rounds per second, the old default.
        rounds_per_client = math.ceil(args.seconds * 4) + 5
    if not 0 <= rounds_per_client <= 10_000:
        parser.error("--rounds-per-client must be 0..10000")
    global CODE
    CODE = Path(args.code).resolve()
    if not (CODE / "manage.py").is_file():
        parser.error(f"--code {args.code}: no manage.py there")

    # This script begins reviews itself (the stale scenario), so it signs checkpoints with the
    # same secret as the hosts; children started below (migrate, reconcile) inherit it.
    os.environ["SECRET_KEY"] = SHARED_SECRET
    database_url = args.database_url
    if args.create_database:
        database_url = create_database(args.admin_url, args.create_database)
        migrated = manage(database_url, "migrate", "--noinput")
        if migrated.returncode != 0:
            print(migrated.stderr, file=sys.stderr)
            return 1
    if not database_url.startswith(("postgres://", "postgresql://")):
        parser.error("the load test runs on PostgreSQL (two hosts share one database)")
    django_setup(database_url)
    tokens = make_reviewers(4)
    import_case("LOAD-WARMUP")  # creates the shared sources before the clients race for them
    preparing = time.monotonic()
    plans = prepare_rounds(args.clients, rounds_per_client, args.seed)
    prepare_seconds = time.monotonic() - preparing

    ports = [free_port(), free_port()]
    while ports[0] == ports[1]:
        ports[1] = free_port()
    bouncer = None
    hosts_url, hosts_env = database_url, {}
    if args.pooler:
        bouncer = PgBouncer(
            server_url=database_url,
            mode=args.pooler,
            default_pool_size=args.pool_size,
            log_path=Path(args.log_dir) / f"pgbouncer-{args.pooler}.log",
        ).start()
        hosts_url = bouncer.url(database_url.rsplit("/", 1)[1])
        if args.pooler == "session":
            hosts_env["DATABASE_CONN_MAX_AGE"] = "0"
    try:
        servers = Servers(hosts_url, ports, args.workers, args.threads, Path(args.log_dir), extra_env=hosts_env)
    except BaseException:
        if bouncer is not None:
            bouncer.stop()
        raise
    tally = Tally()
    summary = {
        "seconds": args.seconds,
        "clients": args.clients,
        "hosts": [f"{HOST}:{p}" for p in ports],
        "workers_per_host": args.workers,
        "threads_per_worker": args.threads,
        "code": str(CODE),
        "rounds_prepared": rounds_per_client * args.clients,
        "prepare_seconds": round(prepare_seconds, 1),
        "pooler": {"mode": args.pooler, "default_pool_size": args.pool_size} if bouncer else None,
    }
    pooler_problems: list[str] = []
    try:
        servers.wait_ready()
        cpu_before = (servers_cpu(servers), driver_cpu(), postgres_cpu(), machine_cpu())
        started = time.monotonic()
        deadline = started + args.seconds
        clients = [
            threading.Thread(target=client_loop, args=(i, ports, tokens, tally, deadline, args.seed, plans[i]))
            for i in range(args.clients)
        ]
        for t in clients:
            t.start()
        for t in clients:
            t.join(max(1.0, deadline - time.monotonic()) + 300)
        elapsed = time.monotonic() - started
        stuck = sum(t.is_alive() for t in clients)
        cpu_after = (servers_cpu(servers), driver_cpu(), postgres_cpu(), machine_cpu())
        if bouncer is not None:
            probed, pooler_problems = pooler_probes(ports, tokens, tally, database_url)
            summary["pooler"].update(probed)
    finally:
        try:
            servers.stop()
            if bouncer is not None:
                # Read while the pooler still holds its server connections: a lock a pooled
                # session left behind is held by one of them.
                left = advisory_locks(database_url, database_url.rsplit("/", 1)[1])
                summary["pooler"]["advisory_locks_left"] = left
                if left:
                    pooler_problems.append(f"{left} advisory lock(s) left held on the server after the run")
        finally:
            if bouncer is not None:
                bouncer.stop()
    lat = sorted(tally.latencies) or [0.0]
    summary.update(
        elapsed_seconds=round(elapsed, 1),
        scenarios=dict(tally.scenarios),
        rounds_imported_during_run=tally.rounds_imported_during_run,
        requests=tally.requests,
        requests_per_second=round(tally.requests / elapsed, 1) if elapsed else 0,
        latency_p50_ms=round(lat[len(lat) // 2] * 1000),
        latency_p95_ms=round(lat[int(len(lat) * 0.95)] * 1000),
        statuses=dict(tally.statuses),
        errors=sum(n for s, n in tally.statuses.items() if not s.startswith("2")),
        server_errors=sum(n for s, n in tally.statuses.items() if s.startswith("5")),
        outcome_uncertain=sum(n for s, n in tally.statuses.items() if s.endswith(" outcome_uncertain")),
        expected_409=dict(tally.expected_409),
        unexpected_errors=tally.unexpected_count,
        unexpected_samples=tally.unexpected,
        transport_errors=tally.transport_errors,
        stuck_clients=stuck,
        # Where the machine's CPU went during the timed window (context for the figures
        # above: the hosts, this driver's clients, every postgres process, the whole machine
        # including whatever else ran on it).
        cpu_seconds={
            "hosts": round(cpu_after[0] - cpu_before[0], 1),
            "clients": round(cpu_after[1] - cpu_before[1], 1),
            "postgres": round(cpu_after[2] - cpu_before[2], 1),
            "machine_busy": round(cpu_after[3][0] - cpu_before[3][0], 1),
            "machine_total": round(cpu_after[3][1] - cpu_before[3][1], 1),
        },
        host_cpu_ms_per_request=round((cpu_after[0] - cpu_before[0]) * 1000 / max(tally.requests, 1), 1),
        postgres_cpu_ms_per_request=round((cpu_after[2] - cpu_before[2]) * 1000 / max(tally.requests, 1), 1),
    )
    failures = settle(database_url, tally, summary)
    if stuck:
        failures.append(f"{stuck} client thread(s) did not finish")
    if summary["server_errors"]:
        failures.append(
            f"{summary['server_errors']} answer(s) 5xx with no fault injected"
            f" ({summary['outcome_uncertain']} of them outcome_uncertain)"
        )
    return summary_written(summary, failures + pooler_problems, args.json)


if __name__ == "__main__":
    sys.exit(main())
