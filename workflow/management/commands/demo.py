"""`manage.py demo`: the lost-receipt story (docs/COMMANDS.md), one process per step.

Each step is a separate ``manage.py`` child process on a scratch SQLite file, so nothing
survives in memory between steps: only the database does. The first control experiment
resumes a real pause through the real workflow with one change, the commit step's key: a
fresh random ID per attempt (a small table this command creates in the scratch database)
instead of the operation identity. The retry after the lost receipt then writes a second
record.

The remote chapter (docs/DELIVERY.md) starts the reference helpdesk (``python -m helpdesk``,
its own process and SQLite file in the scratch folder) with its fault switches on. An
approval queues its delivery; a task worker sends it; the helpdesk stores the reply and
drops the answer, so the delivery is Unknown; ``reconcile --repair`` looks it up and finds it
Delivered, with one reply on the helpdesk. Its control runs the same worker code with one
change, the Idempotency-Key: a fresh random one per try. The helpdesk then holds two replies.
"""

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from unittest import mock

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from cases.selectors import case_by_id
from core import identity
from core.commandline import WorkflowCommand
from core.outcomes import ReceiptStatus
from effects import delivery
from effects.models import Delivery
from effects.services import CommitResult

FIRST_CASE = "T-1042"
SECOND_CASE = "T-1077"
CONTROL_CASE = "T-1103"
# The remote chapter: a case delivered to the helpdesk, and a copy of it for its control.
REMOTE_CASE = "T-1150"
REMOTE_CONTROL_CASE = "T-1151"
# How long the demo waits for the reference helpdesk to listen before it gives up.
HELPDESK_START_S = 15.0

# Settings the story's child processes never take from the demo's own environment.
_NOT_INHERITED = ("DECISIONFLOW_", "PROMETHEUS_", "LOG_", "HELPDESK_")

NAIVE_TABLE = "demo_naive_effect"
_OP = re.compile(r"op-v1-[0-9a-f]{64}")


def _port(text: str) -> int:
    """--helpdesk-port: 0 (a free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: give 0 (a free port) to 65535")
    return port


def _short_ops(text: str) -> str:
    return _OP.sub(lambda m: identity.short(m.group(0)), text)


def _naive_commit(*, operation_id: str, approved, reviewer, channel: str, **decline) -> CommitResult:
    """The control's commit: the effect keyed by a fresh random ID per attempt, not the operation."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {NAIVE_TABLE} (effect_key, operation_id, recorded_at) VALUES (%s, %s, %s)",
            [uuid.uuid4().hex, operation_id, timezone.now().isoformat()],
        )
    # A random key cannot tell a retry from a first attempt: never a replay.
    return CommitResult(ReceiptStatus.COMMITTED, False, _naive_count(operation_id), operation_id)


def _naive_count(operation_id: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM {NAIVE_TABLE} WHERE operation_id = %s", [operation_id])
        return cursor.fetchone()[0]


def _naive_send(*, operation_id: str, body: bytes) -> delivery.Answer:
    """The remote control's send: the same request with a fresh random key per try (and the
    body naming it, as the helpdesk requires), instead of the operation identity."""
    fresh = "op-v1-" + secrets.token_hex(32)
    data = json.loads(body)
    data["operation_id"] = fresh
    return delivery._exchange(
        "POST", delivery._url("/replies"), fresh, lookup=False, body=json.dumps(data, sort_keys=True).encode()
    )


def delivery_line(operation_id: str) -> str:
    """One line about a delivery, as the demo prints it (docs/DELIVERY.md)."""
    row = Delivery.objects.filter(operation_id=operation_id).select_related("case").first()
    if row is None:
        return f"delivery: op={operation_id} none"
    last = row.try_rows.order_by("-started_at", "-id").first()
    line = f"delivery: case={row.case.case_id} op={operation_id} state={row.get_state_display()} tries={row.tries}"
    if row.reference:
        line += f" reference={row.reference}"
    if last is not None:
        said = f"HTTP {last.http_status}" if last.http_status else (last.error.split(":")[0] or "no answer")
        line += f" last={last.kind}:{last.outcome} ({said})"
    return line


class Command(WorkflowCommand):
    # The story migrates its own scratch database; this process never uses the configured one.
    requires_migrations_checks = False

    help = (
        "Replay the lost-receipt story (docs/COMMANDS.md) on a scratch SQLite database: `python manage.py demo`. "
        "Every step is a separate manage.py process: begin, approve with a lost receipt (exit 42), "
        "reconcile, approve again (a replay), approve again, a decline on a second case, an approval of that "
        "case (ConflictingDecision), a decline after the approval, and finally the control experiment with "
        "the effect keyed by a fresh random ID per attempt (EffectCount 2). Then the remote chapter "
        "(docs/DELIVERY.md): the reference helpdesk, started as its own process on a free port (or on "
        "--helpdesk-port), stores an "
        "approved reply and drops the answer; the delivery is Unknown; `reconcile --repair` looks it up and "
        "finds it Delivered, one reply on the helpdesk; and its control, a fresh Idempotency-Key per try, "
        "leaves two. Each line is printed as its step ends. Exits 0 only if every step behaved as expected. "
        "Touches no other database."
    )

    def add_arguments(self, parser):
        parser.add_argument("--keep", action="store_true", help="Keep the scratch database and print its path.")
        parser.add_argument(
            "--helpdesk-port",
            type=_port,
            default=0,
            metavar="PORT",
            help="The port the reference helpdesk listens on, on 127.0.0.1 (default 0: a free port it picks).",
        )
        # Internal: one step of the control experiment, run by the demo in a child process.
        parser.add_argument("--naive-step", choices=["approve", "count"], help=argparse.SUPPRESS)
        parser.add_argument("--case", help=argparse.SUPPRESS)
        parser.add_argument("--operation-id", help=argparse.SUPPRESS)
        parser.add_argument("--fault", help=argparse.SUPPRESS)
        # Internal: a step of the remote chapter (show a delivery; the naive control's try).
        parser.add_argument("--delivery-step", choices=["show", "naive"], help=argparse.SUPPRESS)

    def handle(self, *args, keep, helpdesk_port, naive_step, delivery_step, **options):
        if naive_step:
            return self.naive_step(naive_step, options["case"], options["operation_id"], options["fault"])
        if delivery_step:
            return self.delivery_step(delivery_step, options["operation_id"])
        return self.story(keep=keep, helpdesk_port=helpdesk_port)

    def delivery_step(self, step, operation_id):
        if connection.vendor != "sqlite" or not str(connection.settings_dict["NAME"]).endswith("demo.sqlite3"):
            self.fail(1, "demo: the delivery steps run only on the demo's scratch database")
        if step == "naive":
            # The very same worker code (claim, look up after Unknown, send, settle), with one
            # change made here and not in production code: a fresh key per try.
            with mock.patch.object(delivery, "helpdesk_send", _naive_send):
                delivery.delivery_attempt(operation_id=operation_id, worker="demo-naive", due_only=False)
        self.stdout.write(delivery_line(operation_id))

    # --- the child side of the control -------------------------------------------------

    def naive_step(self, step, case_id, operation_id, fault):
        if connection.vendor != "sqlite" or not str(connection.settings_dict["NAME"]).endswith("demo.sqlite3"):
            self.fail(1, "demo: the naive-key control runs only on the demo's scratch database")
        with connection.cursor() as cursor:
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {NAIVE_TABLE} (effect_key TEXT PRIMARY KEY, "
                "operation_id TEXT NOT NULL, recorded_at TEXT NOT NULL)"
            )
        if step == "count":
            self.stdout.write(f"reconcile: case={case_id} op={operation_id} effects={_naive_count(operation_id)}")
            return
        # Imported here, by the one step that runs the workflow: the demo's other child
        # processes (the delivery steps) and its parent start without the engine (~0.15 s of
        # CPU each, and the demo starts some thirty processes).
        from engine import graph as engine
        from workflow.decide import decision_record

        # The very same decision path, with one change made here and not in production code:
        # the commit step's effect writer, swapped for this demo process only.
        with mock.patch.object(engine, "effect_commit", _naive_commit):
            self.stdout.write("approve: resumed status=PendingRequests requestBound=True")
            decided = decision_record(
                case=case_by_id(case_id),
                operation_id=operation_id,
                approved=True,
                reviewer=None,
                channel="demo-naive",
                fault=fault,
            )
        self.stdout.write("result=" + json.dumps(decided.commit.receipt(), separators=(",", ":")))

    # --- the parent: the story ----------------------------------------------------------

    def say(self, line: str) -> None:
        """One line of the story, shown as soon as it is known, even when stdout is a pipe or a
        file (where Python would hold it back until the end)."""
        self.stdout.write(line)
        self.stdout.flush()

    def story(self, *, keep: bool, helpdesk_port: int):
        started = time.monotonic()
        self.processes = 0
        self.helpdesk_port = helpdesk_port
        scratch = Path(tempfile.mkdtemp(prefix="decisionflow-demo-"))
        self.db_path = scratch / "demo.sqlite3"
        # The children get this project's defaults, not the settings of the shell it runs in:
        # on a configured host those would send the story's notifications to the real
        # webhook, write its decision events to the real log, and count it in the host's
        # /metrics (a metrics folder also costs each child the Prometheus imports).
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
        self.env.update(
            DATABASE_URL=f"sqlite:///{self.db_path}",
            DEBUG="1",
            SECRET_KEY=settings.SECRET_KEY,
            DECISIONFLOW_FAULT_INJECTION="1",
            DECISIONFLOW_REVIEWER="reviewer",
            PYTHONUNBUFFERED="1",
        )
        self.failures = 0
        self.scratch = scratch
        self.helpdesk: subprocess.Popen | None = None
        self.say(f"demo: scratch database {self.db_path} (each line below is a separate process)")
        try:
            self.run_story()
            if not self.failures:
                self.remote_chapter()
        finally:
            self.helpdesk_stop()
            if keep:
                self.say(f"demo: kept {self.db_path}")
            else:
                shutil.rmtree(scratch, ignore_errors=True)
        self.say(f"demo: {self.processes} processes in {time.monotonic() - started:.1f} s")
        if self.failures:
            self.fail(1, f"demo: {self.failures} step(s) did not behave as expected")
        self.say("demo: every step behaved as expected")

    def manage(self, *argv: str):
        self.processes += 1
        return subprocess.run(
            [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def step(self, label, argv, *, rc, expect=(), note="", show=None):
        """Run one child process and check its exit code and the lines it must print."""
        proc = self.manage(*argv)
        out = proc.stdout.strip().splitlines()
        missing = [line for line in expect if line not in out and line not in proc.stderr]
        ok = proc.returncode == rc and not missing
        lines = out if show is None else [line for line in out if line.startswith(show)]
        if rc != 0 and proc.stderr.strip():
            lines = lines + [f"{proc.stderr.strip().splitlines()[0]} (exit {proc.returncode})"]
        for index, line in enumerate(lines):
            text = _short_ops(f"{label}: {line}" if label and line.startswith("result=") else line)
            self.say(f"{text:<55} <- {note}" if note and index == len(lines) - 1 else text)
        if not ok:
            self.failures += 1
            self.say(f"  UNEXPECTED: exit {proc.returncode} (expected {rc}); missing {missing}")
            for line in (proc.stdout + proc.stderr).strip().splitlines()[-10:]:
                self.say(f"  | {line}")
        return proc

    def op_of(self, proc) -> str:
        match = _OP.search(proc.stdout)
        return match.group(0) if match else "op-v1-" + "0" * 64

    def run_story(self):
        self.say("demo: migrating the scratch database and loading the demo cases (two processes)")
        # --skip-checks: the system checks import every admin module, and through them the
        # engine, for nothing the story needs (~0.45 s of CPU per process; `manage.py check`
        # runs them).
        for argv in (
            ["migrate", "--noinput", "-v", "0", "--skip-checks"],
            ["load_demo", "--no-begin", "--skip-checks"],
        ):
            proc = self.manage(*argv)
            if proc.returncode != 0:
                self.failures += 1
                self.say(f"  UNEXPECTED: {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
                return

        begin = self.step("", ["begin", FIRST_CASE], rc=0)
        op = self.op_of(begin)
        if not re.search(r"^begin: status=PendingRequests op=\S+ checkpoints=\d+$", begin.stdout, re.M):
            self.failures += 1
            self.say("  UNEXPECTED: begin did not pause at PendingRequests")
        approve = ["resume", FIRST_CASE, "--operation-id", op, "--approve"]
        self.step(
            "",
            [*approve, "--fault", "lose-receipt"],
            rc=42,
            expect=[
                "approve: resumed status=PendingRequests requestBound=True",
                "outcome uncertain: the commit step failed after it may have written (LostReceipt)",
            ],
            note="the effect exists, the receipt was lost",
        )
        self.step(
            "",
            ["reconcile", FIRST_CASE],
            rc=0,
            expect=[f"reconcile: case={FIRST_CASE} op={op} state=Committed effects=1"],
        )
        replay = 'result={"Status":"Committed","Replay":true,"EffectCount":1}'
        self.step(
            "",
            approve,
            rc=0,
            expect=["approve: resumed status=PendingRequests requestBound=True", replay],
            note="a replay, not a second effect",
        )
        self.step("", approve, rc=0, expect=[replay], show="result=", note="and again")

        second = self.manage("begin", SECOND_CASE)
        op2 = self.op_of(second)
        if second.returncode != 0:
            self.failures += 1
            self.say(f"  UNEXPECTED: begin {SECOND_CASE} exited {second.returncode}")
        self.step(
            "decline (another case)",
            ["resume", SECOND_CASE, "--operation-id", op2, "--decline"],
            rc=0,
            expect=['result={"Status":"Declined","Replay":false,"EffectCount":0}'],
            show="result=",
        )
        self.step(
            "approve (that case)",
            ["resume", SECOND_CASE, "--operation-id", op2, "--approve"],
            rc=3,
            expect=['result={"Status":"ConflictingDecision","Replay":false,"EffectCount":0}'],
            show="result=",
        )
        self.step(
            "decline (after the approval)",
            ["resume", FIRST_CASE, "--operation-id", op, "--decline"],
            rc=3,
            expect=['result={"Status":"ConflictingDecision","Replay":false,"EffectCount":1}'],
            show="result=",
        )
        self.step(
            "",
            ["reconcile", FIRST_CASE, SECOND_CASE],
            rc=0,
            expect=[
                f"reconcile: case={FIRST_CASE} op={op} state=Committed effects=1",
                f"reconcile: case={SECOND_CASE} op={op2} state=Declined effects=0",
            ],
        )

        # The control: the same sequence, the same workflow, a fresh random key per attempt.
        self.say("control: the same steps, the effect keyed by a fresh random ID per attempt")
        control = self.step("", ["begin", CONTROL_CASE], rc=0)
        op3 = self.op_of(control)
        naive = ["demo", "--naive-step", "approve", "--case", CONTROL_CASE, "--operation-id", op3]
        self.step(
            "",
            [*naive, "--fault", "lose-receipt"],
            rc=42,
            expect=["outcome uncertain: the commit step failed after it may have written (LostReceipt)"],
            show="result=",
            note="naive key (control): the receipt is lost",
        )
        self.step(
            "naive key (control)",
            naive,
            rc=0,
            expect=['result={"Status":"Committed","Replay":false,"EffectCount":2}'],
            show="result=",
            note="two records for one operation",
        )

    # --- the remote chapter: the reply delivered to the helpdesk ------------------------

    def helpdesk_start(self) -> bool:
        """Start the reference helpdesk on a free port, with its own file in the scratch
        folder; wait at most HELPDESK_START_S for /healthz. False (and said why) if it fails."""
        self.helpdesk_token = secrets.token_hex(16)
        port_file = self.scratch / "helpdesk.port"
        where = f"port {self.helpdesk_port}" if self.helpdesk_port else "a free port"
        self.say(f"demo: starting the reference helpdesk on 127.0.0.1, {where}")
        log = (self.scratch / "helpdesk.log").open("ab")
        self.helpdesk = subprocess.Popen(
            [sys.executable, "-m", "helpdesk", "--port", str(self.helpdesk_port), "--port-file", str(port_file)]
            + ["--db", str(self.scratch / "helpdesk.sqlite3"), "--faults"],
            cwd=settings.BASE_DIR,
            env={**self.env, "HELPDESK_TOKEN": self.helpdesk_token},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + HELPDESK_START_S
        while time.monotonic() < deadline and self.helpdesk.poll() is None:
            if port_file.exists() and port_file.read_text().strip():
                self.helpdesk_url = f"http://127.0.0.1:{int(port_file.read_text())}"
                try:
                    if self.helpdesk_call("GET", "/healthz", auth=False).get("status") == "ok":
                        return True
                except OSError:
                    pass
            time.sleep(0.05)
        self.failures += 1
        why = f"exited {self.helpdesk.returncode}" if self.helpdesk.poll() is not None else "did not answer"
        tail = (self.scratch / "helpdesk.log").read_text(errors="replace").strip().splitlines()[-5:]
        self.say(f"  UNEXPECTED: the reference helpdesk {why} within {HELPDESK_START_S:.0f} s")
        for line in tail:
            self.say(f"  | {line}")
        return False

    def helpdesk_stop(self) -> None:
        if self.helpdesk is None or self.helpdesk.poll() is not None:
            return
        self.helpdesk.terminate()
        try:
            self.helpdesk.wait(5)
        except subprocess.TimeoutExpired:
            self.helpdesk.kill()
            self.helpdesk.wait()

    def helpdesk_call(self, method: str, path: str, body: dict | None = None, *, auth: bool = True) -> dict:
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.helpdesk_token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.helpdesk_url + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def helpdesk_replies(self, case_id: str, *, expect: int, note: str) -> None:
        """Say how many replies the helpdesk holds for the case, read from its own table."""
        stats = self.helpdesk_call("GET", "/_stats")
        count = stats.get("replies_by_case", {}).get(case_id, 0)
        text = f"helpdesk: case={case_id} replies={count}"
        self.say(f"{text:<55} <- {note}")
        if count != expect:
            self.failures += 1
            self.say(f"  UNEXPECTED: the helpdesk holds {count} replies for {case_id} (expected {expect})")

    def delivery_shown(self, operation_id: str, pattern: str, *, note: str = "") -> None:
        """Print the delivery's line (a child process reads it) and check it against pattern."""
        proc = self.manage("demo", "--delivery-step", "show", "--operation-id", operation_id)
        line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-300:]
        text = _short_ops(line)
        self.say(f"{text:<55} <- {note}" if note else text)
        if proc.returncode != 0 or not re.fullmatch(pattern, line):
            self.failures += 1
            self.say(f"  UNEXPECTED: exit {proc.returncode}; the line does not match {pattern!r}")

    def quiet_step(self, said: str, argv, *, note: str) -> None:
        """A child process whose own output is not the point (a worker): one line about it."""
        proc = self.manage(*argv)
        self.say(f"{said:<55} <- {note}")
        if proc.returncode != 0:
            self.failures += 1
            self.say(f"  UNEXPECTED: exit {proc.returncode}")
            for line in (proc.stdout + proc.stderr).strip().splitlines()[-10:]:
                self.say(f"  | {line}")

    def remote_chapter(self) -> None:
        self.say("remote: the approved reply is also delivered to the customer's helpdesk (docs/DELIVERY.md)")
        if not self.helpdesk_start():
            return
        self.env.update(
            DECISIONFLOW_DELIVERY_URL=self.helpdesk_url,
            DECISIONFLOW_DELIVERY_TOKEN=self.helpdesk_token,
            # The worker's own retry is ten minutes out, so that what settles the Unknown
            # delivery below is reconcile, not the worker's next try.
            DECISIONFLOW_DELIVERY_BACKOFF="600",
            DECISIONFLOW_DELIVERY_READ_TIMEOUT="5",
        )
        self.say(f"helpdesk: {self.helpdesk_url} (python -m helpdesk: its own process and SQLite file)")
        begin = self.step("", ["begin", REMOTE_CASE], rc=0)
        op = self.op_of(begin)
        self.helpdesk_call("POST", "/_faults", {"reset": True, "drop_after_commit": 1})
        self.say(f"{'helpdesk: fault drop_after_commit=1':<55} <- the next reply is stored, then the answer is dropped")
        committed = 'result={"Status":"Committed","Replay":false,"EffectCount":1}'
        self.step(
            "approve",
            ["resume", REMOTE_CASE, "--operation-id", op, "--approve"],
            rc=0,
            expect=[committed],
            show="result=",
            note="the commit also writes the delivery",
        )
        self.delivery_shown(op, rf"delivery: case={REMOTE_CASE} op={op} state=Queued tries=0", note="queued")
        worker = ["db_worker", "--batch", "--no-startup-delay", "--no-reload", "--skip-checks"]
        self.quiet_step("worker: manage.py db_worker --batch", worker, note="a task worker sends it")
        self.delivery_shown(
            op,
            rf"delivery: case={REMOTE_CASE} op={op} state=Unknown tries=1 last=send:unknown \(.+\)",
            note="no answer: it may have arrived",
        )
        self.helpdesk_replies(REMOTE_CASE, expect=1, note="it did; decisionflow cannot know that yet")
        committed_line = f"reconcile: case={REMOTE_CASE} op={op} state=Committed effects=1"
        self.step(
            "",
            ["reconcile", REMOTE_CASE],
            rc=0,
            expect=[f"{committed_line} delivery=Unknown"],
            note="reconcile reads it: Unknown",
        )
        self.repair(
            op,
            rf"repaired: case={REMOTE_CASE} op={op} state=Committed effects=1 delivery=Delivered reference=HD-\d+",
            note="--repair looks it up by its key: found",
        )
        self.delivery_shown(
            op,
            rf"delivery: case={REMOTE_CASE} op={op} state=Delivered tries=2 reference=\S+ last=lookup:delivered "
            r"\(HTTP 200\)",
            note="settled by evidence, not a guess",
        )
        self.helpdesk_replies(REMOTE_CASE, expect=1, note="one reply on the ticket")
        self.repair(
            op,
            rf"reconcile: case={REMOTE_CASE} op={op} state=Committed effects=1 delivery=Delivered reference=HD-\d+",
            note="again: nothing left to settle",
        )
        self.helpdesk_replies(REMOTE_CASE, expect=1, note="still one")

        # The control: the same worker code, a fresh random key per try.
        self.say("control: the same delivery, a fresh random Idempotency-Key per try")
        copy = self.scratch / "t1151.json"
        data = json.loads((Path(settings.BASE_DIR) / "cases" / "demo" / "t1150.json").read_text())
        copy.write_text(json.dumps({**data, "case_id": REMOTE_CONTROL_CASE}))
        loaded = self.manage("load_case", str(copy), "--skip-checks")
        if loaded.returncode != 0:
            self.failures += 1
            self.say(f"  UNEXPECTED: load_case exited {loaded.returncode}: {loaded.stderr.strip()[-300:]}")
            return
        control = self.step("", ["begin", REMOTE_CONTROL_CASE], rc=0)
        op4 = self.op_of(control)
        self.step(
            "approve",
            ["resume", REMOTE_CONTROL_CASE, "--operation-id", op4, "--approve"],
            rc=0,
            expect=[committed],
            show="result=",
        )
        self.helpdesk_call("POST", "/_faults", {"reset": True, "drop_after_commit": 1})
        naive = ["demo", "--delivery-step", "naive", "--operation-id", op4]
        first = self.manage(*naive)
        self.check_line(
            first,
            rf"delivery: case={REMOTE_CONTROL_CASE} op={op4} state=Unknown tries=1 last=send:unknown \(.+\)",
            note="naive key: the answer is dropped",
        )
        second = self.manage(*naive)
        self.check_line(
            second,
            rf"delivery: case={REMOTE_CONTROL_CASE} op={op4} state=Delivered tries=2 reference=\S+ "
            r"last=send:delivered \(HTTP 201\)",
            note="naive key: the retry is a new reply",
        )
        self.helpdesk_replies(REMOTE_CONTROL_CASE, expect=2, note="two replies for one approval")

    def check_line(self, proc, pattern: str, *, note: str) -> None:
        line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-300:]
        text = _short_ops(line)
        self.say(f"{text:<55} <- {note}")
        if proc.returncode != 0 or not re.fullmatch(pattern, line):
            self.failures += 1
            self.say(f"  UNEXPECTED: exit {proc.returncode}; the line does not match {pattern!r}")

    def repair(self, operation_id: str, pattern: str, *, note: str) -> None:
        """``reconcile --repair CASE``: it looks an Unknown delivery up by its key, and resends
        with the same key where the lookup cannot settle it. Its last line must match."""
        proc = self.manage("reconcile", "--repair", REMOTE_CASE)
        self.check_line(proc, pattern, note=note)
