"""The reliability battery's harness: manage.py subprocesses on the test database, fresh
generated cases, a truth oracle read straight from the tables, and the figures file.

- ``manage(...)`` runs ``python manage.py ...`` in a new process against the pytest test
  database (the data must be committed, so these tests use ``transaction=True``). With
  ``crash_at`` it sets ``DECISIONFLOW_FAULT_INJECTION=1`` and ``DECISIONFLOW_CRASH_AT``, and
  the process SIGKILLs itself at that point.
- ``command(...)`` runs a management command in this process (``call_command``) and returns
  the exit code and both streams, the way a shell would see them.
- ``iterations()`` is ``$DECISIONFLOW_RELIABILITY_ITERATIONS`` (default 1): ``make test``
  runs the quick version, ``make reliability`` the long one.
- ``record(...)`` appends one JSON line of figures to
  ``$DECISIONFLOW_RELIABILITY_OUT/figures.jsonl`` when that is set; ``reliability/report.py``
  turns those lines into docs/RELIABILITY.md.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from tests.conftest import ROOT, database_url, load_fixture

ITERATIONS_ENV = "DECISIONFLOW_RELIABILITY_ITERATIONS"
OUT_ENV = "DECISIONFLOW_RELIABILITY_OUT"


def iterations(default: int = 1) -> int:
    return max(1, int(os.environ.get(ITERATIONS_ENV) or default))


def vendor() -> str:
    from django.db import connection

    return connection.vendor


def child_env(*, crash_at: str | None = None, inject: bool = True, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECISIONFLOW_CRASH")}
    env.update(DATABASE_URL=database_url(), DEBUG="1", PYTHONUNBUFFERED="1")
    env.pop("DECISIONFLOW_FAULT_INJECTION", None)
    if crash_at:
        env.update(DECISIONFLOW_CRASH_AT=crash_at)
        if inject:
            env.update(DECISIONFLOW_FAULT_INJECTION="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def manage(
    *args: str, crash_at: str | None = None, inject: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess:
    """``python manage.py *args`` in a fresh process on the test database."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=child_env(crash_at=crash_at, inject=inject),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def command(name: str, *args: str, stdin_bytes: bytes | None = None) -> tuple[int, str, str]:
    """Run a command in this process; returns (exit code, stdout, stderr)."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin
    if stdin_bytes is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin_bytes))
    try:
        call_command(name, *args, stdout=out, stderr=err)
        code = 0
    except CommandError as exc:
        code = exc.returncode
        err.write(str(exc))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


def case_data(case_id: str, **overrides) -> dict:
    """The demo case T-1042 under another case ID (its sources are shared, as in production)."""
    return {**load_fixture("t1042.json"), "case_id": case_id, **overrides}


def new_case(tag: str, *, approvals_required: int | None = None):
    """A fresh case with a unique ID: cheaper than a fresh database per iteration.
    ``approvals_required``: under a policy that needs that many distinct approvers."""
    from cases.services import case_import

    data = case_data(f"R-{tag}-{uuid.uuid4().hex[:10]}")
    if approvals_required is not None:
        data["policy"] = {**data["policy"], "parameters": {**data["policy"]["parameters"]}}
        data["policy"]["parameters"]["approvals_required"] = approvals_required
    return case_import(data=data).case


def truth(case_ids) -> list[dict]:
    """What reconcile must say, computed independently from the tables (the test oracle).

    The operations of a case are its current proposal and every decided proposal.
    """
    from cases.models import Case
    from effects.models import EffectRecord
    from reviews.models import Approval, Proposal, ReviewDecision

    rows = []
    for case in Case.objects.filter(case_id__in=list(case_ids)).order_by("case_id"):
        for proposal in Proposal.objects.filter(case=case).order_by("id"):
            decision = ReviewDecision.objects.filter(operation_id=proposal.operation_id).first()
            if decision is None and case.current_proposal_id != proposal.pk:
                continue
            effects = EffectRecord.objects.filter(operation_id=proposal.operation_id).count()
            approvals = list(
                Approval.objects.filter(operation_id=proposal.operation_id).values_list("required", flat=True)
            )
            if decision is None:
                state = "AwaitingApproval" if approvals else "Pending"
            elif not decision.approved:
                state = "Declined"
            else:
                state = "Committed" if effects else "NoLocalEffectRecorded"
            rows.append(
                {
                    "case": case.case_id,
                    "operation_id": proposal.operation_id,
                    "state": state,
                    "effects": effects,
                    # Why it was declined, as the decision itself says (docs/QUEUE.md).
                    "decline_reason": decision.decline_reason if decision is not None else None,
                }
            )
            if decision is None and approvals:
                # A policy that needs several approvers: how many so far, of how many.
                rows[-1].update(approvals=len(approvals), approvals_required=approvals[0])
    return rows


def reconcile(*args: str) -> tuple[int, str, str]:
    """``reconcile`` as cron runs it, waiting out the lock of a process that was just killed.

    reconcile does not wait for its lock (a second cron run exits at once). A SIGKILLed
    ``reconcile --repair`` releases it when PostgreSQL notices the dropped connection, a few
    milliseconds later; until then the next run is refused, and cron would simply run again.
    """
    for _ in range(100):
        code, out, err = command("reconcile", *args)
        if "locked by another process" not in err:
            break
        time.sleep(0.1)
    return code, out, err


def reconcile_json(*case_ids: str) -> tuple[int, list[dict]]:
    code, out, err = reconcile(*case_ids, "--json")
    return code, [json.loads(line) for line in out.splitlines() if line.strip()]


def tally(case) -> dict:
    """Duplicates and lost approvals of one case, read from the tables."""
    from effects.models import EffectRecord
    from reviews.models import ReviewDecision

    decisions = list(ReviewDecision.objects.filter(proposal__case=case).values_list("operation_id", "approved"))
    effects = list(EffectRecord.objects.filter(case=case).values_list("operation_id", flat=True))
    approved = {op for op, ok in decisions if ok}
    return {
        "decisions": len(decisions),
        "effects": len(effects),
        # Anything beyond one decision and one effect per case is a duplicate here: every
        # scenario decides one operation of its case exactly once.
        "duplicates": max(0, len(decisions) - 1) + max(0, len(effects) - 1),
        "lost_approvals": len(approved - set(effects)),
    }


def record(family: str, **figures) -> None:
    out = os.environ.get(OUT_ENV)
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    line = {"family": family, "database": vendor(), **figures}
    with open(os.path.join(out, "figures.jsonl"), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, sort_keys=True) + "\n")


@pytest.fixture
def reviewer_name(reviewer):
    return reviewer.get_username()
