"""Delivery battery: the sending side against the reference helpdesk, each case run
``iterations()`` times (1 in ``make test``, 20 on PostgreSQL in ``make reliability``).

- the task worker (``manage.py db_worker``, a real process) SIGKILLed at each delivery crash
  point: before the send, after the helpdesk answered but before the answer was read, and
  after the answer but before the local state was written; then another worker;
- the helpdesk down (its process stopped) for a while (30 s in ``make reliability``) while
  approvals are made and a worker keeps trying;
- a lagging lookup: every send's answer is dropped after the helpdesk committed, and the
  lookup does not see the reply yet, so every delivery must be settled by a resend with the
  same key;
- two workers (two processes) draining queued deliveries.

Every case ends with the same checks: 0 duplicate replies on the helpdesk, 0 approved
operations without a delivery, every delivery Delivered with the reference the helpdesk's
own lookup gives, and ``reconcile --json`` saying the same.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from effects.models import Delivery, DeliveryState, EffectRecord
from effects.services import effect_commit
from helpdesk.testing import running_helpdesk
from reviews.models import ReviewDecision
from reviews.services import proposal_create
from tests.reliability.conftest import ROOT, child_env, iterations, new_case, reconcile, record

pytestmark = [pytest.mark.django_db(transaction=True)]

KILLED = -signal.SIGKILL
POINTS = ["deliver-before-send", "deliver-before-read", "deliver-after-send"]


@pytest.fixture
def helpdesk(tmp_path, settings):
    with running_helpdesk(tmp_path / "helpdesk", faults=True, token="t") as running:
        settings.DECISIONFLOW_DELIVERY_URL = running.url
        settings.DECISIONFLOW_DELIVERY_TOKEN = "t"
        settings.DECISIONFLOW_DELIVERY_READ_TIMEOUT = 2.0
        settings.DECISIONFLOW_DELIVERY_BACKOFF = 0.0
        settings.TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
        yield running


def worker_env(helpdesk, **extra) -> dict:
    return {
        "DECISIONFLOW_DELIVERY_URL": helpdesk.url,
        "DECISIONFLOW_DELIVERY_TOKEN": "t",
        "DECISIONFLOW_DELIVERY_READ_TIMEOUT": "2",
        "DECISIONFLOW_DELIVERY_LEASE": "1s",
        "DECISIONFLOW_DELIVERY_BACKOFF": "0",
        **extra,
    }


def worker(helpdesk, *args, crash_at=None, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "db_worker", "--batch", "--no-startup-delay", *args],
        cwd=ROOT,
        env=child_env(crash_at=crash_at, **worker_env(helpdesk, **extra)),
        capture_output=True,
        text=True,
        timeout=300,
    )


def start_worker(helpdesk, log, *args, **extra) -> subprocess.Popen:
    """A worker process in the background; its output goes to ``log`` (a pipe nobody reads
    would fill up and stop it)."""
    return subprocess.Popen(
        [sys.executable, "manage.py", "db_worker", "--no-startup-delay", "--no-reload", "-v0", *args],
        cwd=ROOT,
        env=child_env(**worker_env(helpdesk, **extra)),
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def approve(reviewer, tag: str):
    case = new_case(tag)
    proposal = proposal_create(case=case)
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    return case.case_id, proposal.operation_id


def wait_settled(operation_ids, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = Delivery.objects.filter(operation_id__in=operation_ids).exclude(state=DeliveryState.DELIVERED)
        if not left.exists():
            return
        time.sleep(0.2)


def check(helpdesk, approved: list[tuple[str, str]]) -> dict:
    """The battery's verdict for these approvals; asserts and returns the figures."""
    operation_ids = [op for _, op in approved]
    approvals = ReviewDecision.objects.filter(operation_id__in=operation_ids, approved=True).count()
    with_delivery = Delivery.objects.filter(operation_id__in=operation_ids).count()
    delivered = dict(
        Delivery.objects.filter(operation_id__in=operation_ids, state=DeliveryState.DELIVERED).values_list(
            "operation_id", "reference"
        )
    )
    helpdesk.set_faults(reset=True)  # a lagging lookup would answer 404 for the truth
    theirs = {op: helpdesk.lookup(op).json.get("reference") for op in operation_ids}
    code, out, err = reconcile(*sorted({case for case, _ in approved}), "--json")
    said = {r["operation_id"]: r.get("delivery_reference") for r in map(json.loads, out.splitlines())}
    stats = helpdesk.stats()
    figures = {
        "deliveries": len(operation_ids),
        "approvals_without_delivery": approvals - with_delivery,
        "delivered": len(delivered),
        "duplicate_replies": stats["duplicate_replies"],
        "helpdesk_agrees": sum(delivered.get(op) == theirs[op] for op in operation_ids),
        "reconcile_agrees": sum(said.get(op) == theirs[op] and theirs[op] is not None for op in operation_ids),
        "reconcile_exit": code,
    }
    assert approvals == len(operation_ids) == EffectRecord.objects.filter(operation_id__in=operation_ids).count()
    assert figures["approvals_without_delivery"] == 0 and figures["duplicate_replies"] == 0, figures
    assert figures["delivered"] == figures["helpdesk_agrees"] == figures["reconcile_agrees"] == len(operation_ids), (
        figures,
        err,
    )
    assert code == 0, err
    return figures


@pytest.mark.parametrize("point", POINTS)
def test_a_worker_killed_at_each_delivery_crash_point_leaves_one_reply(helpdesk, reviewer, point):
    started, approved, crashes = time.monotonic(), [], 0
    for i in range(iterations()):
        approved.append(approve(reviewer, f"k{i}"))
        crashed = worker(helpdesk, crash_at=point)
        assert crashed.returncode == KILLED, crashed.stderr
        crashes += 1
        # Killed mid-try: Sending, the lease still running. A worker past the lease (1 s)
        # sweeps it to Unknown and settles it (a lookup, then a resend if it is not there).
        assert Delivery.objects.get(operation_id=approved[-1][1]).state == DeliveryState.SENDING
        time.sleep(1.05)
        done = worker(helpdesk)
        assert done.returncode == 0, done.stderr
    figures = check(helpdesk, approved)
    assert crashes == len(approved)
    record(
        "delivery",
        scenario=f"worker SIGKILLed at `{point}`",
        iterations=len(approved),
        crashes=crashes,
        seconds=round(time.monotonic() - started, 1),
        **figures,
    )


def test_the_helpdesk_down_for_a_while_delays_and_never_duplicates(helpdesk, reviewer, tmp_path):
    # 30 s in make reliability; a couple of seconds in make test.
    outage = 30.0 if iterations() > 1 else 2.0
    started = time.monotonic()
    log = (tmp_path / "worker.log").open("wb")
    running = start_worker(
        helpdesk,
        log,
        "--interval",
        "0.1",
        DECISIONFLOW_DELIVERY_BACKOFF="1",
        DECISIONFLOW_DELIVERY_BACKOFF_MAX="3",
        DECISIONFLOW_DELIVERY_SWEEP_INTERVAL="1",
    )
    try:
        helpdesk.stop()
        down_since = time.monotonic()
        approved = [approve(reviewer, f"d{i}") for i in range(iterations())]
        waiting = Delivery.objects.filter(operation_id__in=[op for _, op in approved])
        # Down for the whole outage, and at least until the worker (slow to start on a busy
        # machine) has tried every delivery once.
        deadline = time.monotonic() + 120
        while time.monotonic() - down_since < outage or waiting.filter(tries=0).exists():
            assert time.monotonic() < deadline, "the worker never tried while the helpdesk was down"
            time.sleep(0.2)
        assert not waiting.filter(state=DeliveryState.DELIVERED).exists()
        helpdesk.start()
        wait_settled([op for _, op in approved], timeout=60)
    finally:
        running.send_signal(signal.SIGTERM)
        running.wait(30)
        log.close()
    figures = check(helpdesk, approved)
    record(
        "delivery",
        scenario=f"helpdesk down {outage:.0f} s",
        iterations=len(approved),
        crashes=0,
        seconds=round(time.monotonic() - started, 1),
        **figures,
    )


def test_a_lagging_lookup_is_settled_by_a_resend_with_the_same_key(helpdesk, reviewer):
    started = time.monotonic()
    n = iterations()
    helpdesk.set_faults(drop_after_commit=n, lookup_lag_s=600)
    approved = [approve(reviewer, f"l{i}") for i in range(n)]
    done = worker(helpdesk)
    assert done.returncode == 0, done.stderr
    stats = helpdesk.stats()
    # Every reply was stored by its first POST, its answer dropped; the lookup said 404; the
    # resend with the same key was answered as a replay.
    assert stats["outcomes"].get("dropped") == n and stats["outcomes"].get("replayed") == n, stats
    figures = check(helpdesk, approved)
    record(
        "delivery",
        scenario="lagging lookup (answer dropped, lookup 404)",
        iterations=n,
        crashes=0,
        seconds=round(time.monotonic() - started, 1),
        **figures,
    )


@pytest.mark.postgres
def test_two_workers_drain_the_queue_with_no_duplicates(helpdesk, reviewer, settings, tmp_path):
    n = 1000 if iterations() > 1 else 20
    settings.DECISIONFLOW_DELIVERY_URL = helpdesk.url
    approved = [approve(reviewer, f"q{i}") for i in range(n)]
    started = time.monotonic()
    logs = [(tmp_path / f"host-{h}.log").open("wb") for h in "ab"]
    hosts = [
        start_worker(helpdesk, log, "--batch", "--worker-id", f"host-{h}") for h, log in zip("ab", logs, strict=True)
    ]
    try:
        codes = [host.wait(900) for host in hosts]
    finally:
        for host in hosts:
            if host.poll() is None:
                host.kill()
                host.wait()
        for log in logs:
            log.close()
    assert codes == [0, 0], [(tmp_path / f"host-{h}.log").read_text()[-2000:] for h in "ab"]
    seconds = time.monotonic() - started
    stats = helpdesk.stats()
    # One POST per delivery: no delivery was sent twice, by one worker or by both.
    assert stats["posts"] == n and set(stats["posts_by_key"].values()) == {1}, stats["posts"]
    workers = set(Delivery.objects.values_list("lease_owner", flat=True))
    figures = check(helpdesk, approved)
    record(
        "delivery",
        scenario="two workers draining the queue",
        iterations=n,
        crashes=0,
        seconds=round(seconds, 1),
        per_second=round(n / seconds, 1),
        workers=len(workers),
        **figures,
    )
