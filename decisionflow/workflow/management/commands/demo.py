"""`manage.py demo`: the lost-receipt story (docs/COMMANDS.md), one process per step.

Each step is a separate ``manage.py`` child process on a scratch SQLite file, so nothing
survives in memory between steps: only the database does. The last part is the control
experiment. It resumes a real pause through the real workflow with one change, the commit
step's key: a fresh random ID per attempt (a small table this command creates in the
scratch database) instead of the operation identity. The retry after the lost receipt
then writes a second record.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from unittest import mock

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from cases.selectors import case_by_id
from decisionflow.core import identity
from decisionflow.core.commandline import WorkflowCommand
from decisionflow.workflow import engine
from decisionflow.workflow.services import decision_record
from effects.services import CommitResult

FIRST_CASE = "T-1042"
SECOND_CASE = "T-1077"
CONTROL_CASE = "T-1103"

NAIVE_TABLE = "demo_naive_effect"
_OP = re.compile(r"op-v1-[0-9a-f]{64}")


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
    return CommitResult("Committed", False, _naive_count(operation_id), operation_id)


def _naive_count(operation_id: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM {NAIVE_TABLE} WHERE operation_id = %s", [operation_id])
        return cursor.fetchone()[0]


class Command(WorkflowCommand):
    # The story migrates its own scratch database; this process never uses the configured one.
    requires_migrations_checks = False

    help = (
        "Replay the lost-receipt story (docs/COMMANDS.md) on a scratch SQLite database: `python manage.py demo`. "
        "Every step is a separate manage.py process: begin, approve with a lost receipt (exit 42), "
        "reconcile, approve again (a replay), approve again, a decline on a second case, an approval of that "
        "case (ConflictingDecision), a decline after the approval, and finally the control experiment with "
        "the effect keyed by a fresh random ID per attempt (EffectCount 2). Exits 0 only if every step "
        "behaved as expected. Touches no other database."
    )

    def add_arguments(self, parser):
        parser.add_argument("--keep", action="store_true", help="Keep the scratch database and print its path.")
        # Internal: one step of the control experiment, run by the demo in a child process.
        parser.add_argument("--naive-step", choices=["approve", "count"], help=__import__("argparse").SUPPRESS)
        parser.add_argument("--case", help=__import__("argparse").SUPPRESS)
        parser.add_argument("--operation-id", help=__import__("argparse").SUPPRESS)
        parser.add_argument("--fault", help=__import__("argparse").SUPPRESS)

    def handle(self, *args, keep, naive_step, **options):
        if naive_step:
            return self.naive_step(naive_step, options["case"], options["operation_id"], options["fault"])
        return self.story(keep=keep)

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

    def story(self, *, keep: bool):
        scratch = Path(tempfile.mkdtemp(prefix="decisionflow-demo-"))
        self.db_path = scratch / "demo.sqlite3"
        self.env = {
            k: v for k, v in os.environ.items() if k not in ("DECISIONFLOW_CRASH_AT", "DECISIONFLOW_SQLITE_TEST_NAME")
        }
        self.env.update(
            DATABASE_URL=f"sqlite:///{self.db_path}",
            DEBUG="1",
            SECRET_KEY=settings.SECRET_KEY,
            DECISIONFLOW_FAULT_INJECTION="1",
            DECISIONFLOW_REVIEWER="reviewer",
            PYTHONUNBUFFERED="1",
        )
        self.failures = 0
        self.stdout.write(f"demo: scratch database {self.db_path} (each line below is a separate process)")
        try:
            self.run_story()
        finally:
            if keep:
                self.stdout.write(f"demo: kept {self.db_path}")
            else:
                shutil.rmtree(scratch, ignore_errors=True)
        if self.failures:
            self.fail(1, f"demo: {self.failures} step(s) did not behave as expected")
        self.stdout.write("demo: every step behaved as expected")

    def manage(self, *argv: str):
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
            self.stdout.write(f"{text:<55} <- {note}" if note and index == len(lines) - 1 else text)
        if not ok:
            self.failures += 1
            self.stdout.write(f"  UNEXPECTED: exit {proc.returncode} (expected {rc}); missing {missing}")
            for line in (proc.stdout + proc.stderr).strip().splitlines()[-10:]:
                self.stdout.write(f"  | {line}")
        return proc

    def op_of(self, proc) -> str:
        match = _OP.search(proc.stdout)
        return match.group(0) if match else "op-v1-" + "0" * 64

    def run_story(self):
        for argv in (["migrate", "--noinput", "-v", "0"], ["load_demo"]):
            proc = self.manage(*argv)
            if proc.returncode != 0:
                self.failures += 1
                self.stdout.write(
                    f"  UNEXPECTED: {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}"
                )
                return

        begin = self.step("", ["begin", FIRST_CASE], rc=0)
        op = self.op_of(begin)
        if not re.search(r"^begin: status=PendingRequests op=\S+ checkpoints=\d+$", begin.stdout, re.M):
            self.failures += 1
            self.stdout.write("  UNEXPECTED: begin did not pause at PendingRequests")
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
            self.stdout.write(f"  UNEXPECTED: begin {SECOND_CASE} exited {second.returncode}")
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
        self.stdout.write("control: the same steps, the effect keyed by a fresh random ID per attempt")
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
