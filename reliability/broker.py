"""The broker-backed task backend under kill -9: `make reliability`'s broker step.

Deliveries and notifications run through django-tasks-rq on a private redis-server
(reliability/redis_server.py), worked by two ``manage.py rqworker`` processes, against the
reference helpdesk (helpdesk/) and a webhook stand-in that counts the notifications. For
``--seconds`` the driver approves cases (each approval's transaction writes its delivery;
a "review begun" notification is recorded in a transaction of its own, as ``begin`` does)
while a killer SIGKILLs one worker at a time, at random, and starts another in its place
(as systemd's ``Restart=`` would). The helpdesk answers each send after ``--delay-ms``, so
kills land in the middle of sends too. The driver runs ``notify_sweep`` every two seconds,
as cron would every five minutes; the workers run the delivery sweep themselves.

A task lost with a killed worker stays in RQ's registries and is never run again: the
outbox rows bring it back. Past the lease a delivery left Sending turns Unknown and is
looked up, then resent with the same Idempotency-Key; a notification left Sending turns
Unknown and is sent once more (at-least-once, with its Message-ID).

It must show 0 duplicate replies (the helpdesk's count), every approval delivered with the
reference the helpdesk gives and reconcile agreeing, and 0 lost notifications (every
notification Sent, and received by the webhook). A notification received twice is counted
(a kill after the webhook accepted it and before the row said so), not failed.

Run alone (PostgreSQL, a database of its own, created and dropped first)::

    .venv/bin/python reliability/broker.py --create-database decisionflow_broker --seconds 60 \\
        --json var/reliability/broker.json --log-dir var/reliability/broker-logs

Exit 0 when every check holds; the summary is printed and written to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CODE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CODE))

from helpdesk.testing import running_helpdesk  # noqa: E402
from reliability.load import create_database, django_setup, import_case, manage  # noqa: E402
from reliability.pooler import HOST  # noqa: E402
from reliability.redis_server import RedisServer  # noqa: E402

OPERATION = re.compile(r"\(operation (op-v1-[0-9a-f]+)\)")
RQ_BACKEND = "django_tasks_rq.RQBackend"


class Webhook:
    """A stand-in for a Slack incoming webhook: answers ``ok`` and counts each operation's
    notifications by the text's operation id."""

    def __init__(self):
        self.received: Counter[str] = Counter()
        lock = threading.Lock()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                found = OPERATION.search(json.loads(body).get("text", ""))
                with lock:
                    received[found.group(1) if found else "?"] += 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self.url = f"http://{HOST}:{self._server.server_address[1]}/hook"

    def __enter__(self) -> Webhook:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


class Workers:
    """Two ``manage.py rqworker`` processes; ``kill_one`` SIGKILLs one and starts another."""

    def __init__(self, env: dict, log_dir: Path, count: int = 2):
        self.env, self.log_dir, self.started = env, log_dir, 0
        self.procs = [self._start() for _ in range(count)]

    def _start(self) -> subprocess.Popen:
        self.started += 1
        log = open(self.log_dir / f"rqworker-{self.started}.log", "w")  # noqa: SIM115 (kept open by the child)
        argv = [sys.executable, "manage.py", "rqworker", "--worker-ttl", "10"]
        return subprocess.Popen(argv, cwd=CODE, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def sending(self) -> list[int]:
        """The workers holding a delivery in the middle of its try (its lease names the process)."""
        from effects.models import Delivery, DeliveryState

        owners = Delivery.objects.filter(state=DeliveryState.SENDING).values_list("lease_owner", flat=True)
        pids = {owner.rsplit(":", 1)[-1] for owner in owners}
        return [i for i, proc in enumerate(self.procs) if str(proc.pid) in pids]

    def kill_one(self, rng: random.Random) -> bool:
        """SIGKILL a worker in the middle of a send when there is one, else one at random, and
        start another; True when it was mid-send."""
        busy = self.sending()
        i = rng.choice(busy) if busy else rng.randrange(len(self.procs))
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()
        self.procs[i] = self._start()
        return bool(busy)

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def approve_one(reviewer) -> str:
    from django.db import transaction

    from cases.models import Case
    from effects.services import effect_commit
    from reviews.models import NotificationKind
    from reviews.notifications import notify
    from reviews.services import proposal_create

    case = Case.objects.get(case_id=import_case("broker"))
    proposal = proposal_create(case=case)
    with transaction.atomic():
        notify(case=case, operation_id=proposal.operation_id, kind=NotificationKind.REVIEW_BEGUN)
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    return proposal.operation_id


def settled(operation_ids: list[str]) -> bool:
    from effects.models import Delivery, DeliveryState
    from reviews.models import Notification, NotificationState

    deliveries = Delivery.objects.filter(operation_id__in=operation_ids).exclude(state=DeliveryState.DELIVERED)
    notifications = Notification.objects.exclude(state=NotificationState.SENT)
    return not deliveries.exists() and not notifications.exists()


def verdict(operation_ids: list[str], helpdesk, hook: Webhook, database_url: str) -> dict:
    from effects.models import Delivery, DeliveryState, DeliveryTry
    from reviews.models import Notification, NotificationState

    delivered = dict(
        Delivery.objects.filter(operation_id__in=operation_ids, state=DeliveryState.DELIVERED).values_list(
            "operation_id", "reference"
        )
    )
    theirs = {op: helpdesk.lookup(op).json.get("reference") for op in operation_ids}
    done = manage(database_url, "reconcile", "--all", "--json")
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    said = {r["operation_id"]: r.get("delivery_reference") for r in rows if "operation_id" in r}
    stats = helpdesk.stats()
    sent = set(Notification.objects.filter(state=NotificationState.SENT).values_list("operation_id", flat=True))
    return {
        "approvals": len(operation_ids),
        "delivered": len(delivered),
        "helpdesk_replies": stats["replies"],
        "duplicate_replies": stats["duplicate_replies"],
        "helpdesk_agrees": sum(delivered.get(op) == theirs[op] is not None for op in operation_ids),
        "reconcile_agrees": sum(said.get(op) == theirs[op] is not None for op in operation_ids),
        "reconcile_exit": done.returncode,
        "delivery_tries": DeliveryTry.objects.filter(operation_id__in=operation_ids).count(),
        "deliveries_tried_more_than_once": Delivery.objects.filter(operation_id__in=operation_ids, tries__gt=1).count(),
        "notifications": Notification.objects.count(),
        "notifications_sent": len(sent),
        "notifications_lost": sum(1 for op in operation_ids if op not in sent or not hook.received[op]),
        "notifications_received_twice": sum(1 for n in hook.received.values() if n > 1),
    }


ROWS = (
    ("approvals made while workers were killed", "approvals"),
    ("worker kills (SIGKILL) / of them in the middle of a send", ("kills", "kills_mid_send")),
    ("rqworker processes started in all", "workers_started"),
    ("deliveries Delivered", "delivered"),
    ("replies on the helpdesk / duplicate replies", ("helpdesk_replies", "duplicate_replies")),
    ("the helpdesk's reference agrees / reconcile agrees", ("helpdesk_agrees", "reconcile_agrees")),
    ("delivery tries / deliveries tried more than once", ("delivery_tries", "deliveries_tried_more_than_once")),
    ("notifications Sent / lost", ("notifications_sent", "notifications_lost")),
    ("notifications received twice (at-least-once, same Message-ID)", "notifications_received_twice"),
    ("seconds in all (load seconds)", ("seconds", "load_seconds")),
)


def report_lines(summary: dict | None) -> list[str]:
    """The section of docs/RELIABILITY.md (reliability/run.py writes it)."""
    lines = [
        "",
        "## The RQ task backend under kill -9",
        "",
        "Deliveries and notifications through django-tasks-rq on a private redis-server, two "
        "`manage.py rqworker` processes, one SIGKILLed every few seconds (preferably the one holding a "
        "delivery in the middle of its send) and replaced at once, against the reference helpdesk "
        "(answering each send after 300 ms) and a webhook stand-in. A task lost with its worker is never "
        "run again by RQ: the outbox rows bring it back (the delivery sweep in each worker, `notify_sweep` "
        "every 5 s in the driver as cron's stand-in; the workers sweep every 5 s). Must show: 0 duplicate replies, every approval "
        "delivered with the helpdesk's own reference and reconcile agreeing, 0 lost notifications. "
        'Script: `reliability/broker.py` (docs/QUEUE.md, "Workers on RQ").',
        "",
    ]
    if not summary:
        return [*lines, "Not run (no PostgreSQL, or no redis-server: `make redis`).", ""]
    lines += ["| figure | value |", "|---|---|"]
    for label, keys in ROWS:
        value = " / ".join(str(summary.get(k)) for k in keys) if isinstance(keys, tuple) else summary.get(keys)
        lines.append(f"| {label} | {value} |")
    verdict = "; ".join(summary.get("failures") or []) or "every check held"
    return [*lines, "", f"Verdict: {verdict}.", ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--create-database", required=True, help="dropped and created first (letters, digits, _)")
    parser.add_argument(
        "--admin-url", default=os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="how long approvals are made and workers killed")
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds between two kills (on average)")
    parser.add_argument("--delay-ms", type=int, default=300, help="the helpdesk's delay before each answer")
    parser.add_argument("--settle-seconds", type=float, default=240.0, help="the most the end may take to settle")
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--log-dir", type=Path, default=CODE / "var" / "reliability" / "broker-logs")
    args = parser.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    started = time.monotonic()

    database_url = create_database(args.admin_url, args.create_database)
    with (
        RedisServer(log_path=args.log_dir / "redis.log") as redis,
        tempfile.TemporaryDirectory(prefix="broker-helpdesk-") as helpdesk_dir,
        running_helpdesk(Path(helpdesk_dir), faults=True, token="t") as helpdesk,
        Webhook() as hook,
    ):
        helpdesk.set_faults(delay_ms=args.delay_ms)
        settings = {
            "DECISIONFLOW_TASKS_BACKEND": RQ_BACKEND,
            "DECISIONFLOW_TASKS_REDIS_URL": redis.url,
            "DECISIONFLOW_DELIVERY_URL": helpdesk.url,
            "DECISIONFLOW_DELIVERY_TOKEN": "t",
            "DECISIONFLOW_DELIVERY_READ_TIMEOUT": "3",
            "DECISIONFLOW_DELIVERY_LEASE": "4s",
            # Each sweep enqueues again every row due for longer than its interval, whether or
            # not its task still waits in Redis: at 1 s a backlog of a few seconds filled the
            # queue with copies (harmless, the claim lets one through, but they crowd out the
            # real work). 5 s is still well inside the run.
            "DECISIONFLOW_DELIVERY_SWEEP_INTERVAL": "5",
            "DECISIONFLOW_DELIVERY_BACKOFF": "0.5",
            "DECISIONFLOW_NOTIFY_WEBHOOK_URL": hook.url,
            "DECISIONFLOW_NOTIFY_LEASE": "4s",
            "DATABASE_URL": database_url,
            "DEBUG": "1",
        }
        os.environ.update(settings)
        migrated = manage(database_url, "migrate", "--noinput")  # django-rq's tables too, with its backend
        if migrated.returncode != 0:
            print(migrated.stderr[-2000:], file=sys.stderr)
            return 1
        django_setup(database_url)
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group, Permission

        from reviews.groups import ensure_review_groups
        from reviews.notifications import notify_sweep

        reviewers, _leads = ensure_review_groups(Group, Permission)
        reviewer = get_user_model().objects.create_user("broker-reviewer")
        reviewer.groups.add(reviewers)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DECISIONFLOW_CRASH")}
        workers = Workers(env, args.log_dir)
        operation_ids: list[str] = []
        kills = Counter()
        stop = threading.Event()

        def killer() -> None:
            # When a kill is due, wait (up to the interval again) for a worker in the middle of
            # a send: a worker takes seconds to start, and killing it then proves little.
            from django.db import connections

            while not stop.wait(rng.uniform(0.5, 1.5) * args.kill_every):
                until = time.monotonic() + args.kill_every
                while not workers.sending() and time.monotonic() < until and not stop.is_set():
                    time.sleep(0.02)
                kills["mid_send" if workers.kill_one(rng) else "idle"] += 1
            connections.close_all()

        operation_ids: list[str] = []
        thread = threading.Thread(target=killer, name="killer")
        thread.start()
        try:
            until, next_sweep = time.monotonic() + args.seconds, 0.0
            while time.monotonic() < until:
                operation_ids.append(approve_one(reviewer))
                if time.monotonic() >= next_sweep:
                    notify_sweep()
                    next_sweep = time.monotonic() + 5
            stop.set()
            thread.join()
            settle_until = time.monotonic() + args.settle_seconds
            while not settled(operation_ids) and time.monotonic() < settle_until:
                notify_sweep()
                time.sleep(5)
        finally:
            stop.set()
            thread.join()
            workers.stop()
        summary = {
            **verdict(operation_ids, helpdesk, hook, database_url),
            "kills": sum(kills.values()),
            "kills_mid_send": kills["mid_send"],
            "workers_started": workers.started,
            "seconds": round(time.monotonic() - started, 1),
            "load_seconds": args.seconds,
        }
    failures = []
    n = summary["approvals"]
    if summary["duplicate_replies"] or summary["helpdesk_replies"] != n:
        failures.append("the helpdesk does not hold exactly one reply per approval")
    if not summary["delivered"] == summary["helpdesk_agrees"] == summary["reconcile_agrees"] == n:
        failures.append("not every approval is delivered with the helpdesk's reference, as reconcile says")
    if summary["notifications_lost"] or summary["notifications_sent"] != n:
        failures.append("a notification was lost")
    if summary["kills"] == 0:
        failures.append("no worker was killed: the run proves nothing")
    summary["failures"] = failures
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
