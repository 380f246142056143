"""Crash battery: SIGKILL at every named crash point, then reconcile, then retry.

For each point and each iteration (a fresh case each time): run the real command in a new
process with ``DECISIONFLOW_CRASH_AT=<point>`` and require that it died of SIGKILL; run
``reconcile`` and require that it reports exactly what the tables hold (and the state the
crash point implies); retry the same command, then require one decision, at most one effect,
and an effect for every approval. ``make test`` runs one iteration per point;
``make reliability`` runs 20 per point on PostgreSQL and 10 on SQLite.

Begin is one transaction (proposal, pause checkpoint, pending review): killed inside it,
it leaves nothing behind, so reconcile has no operation to report for that case.
"""

from __future__ import annotations

import http.client
import json
import signal
import time

import pytest

from effects.models import CommitAttempt, EffectRecord
from reviews.models import PendingReview, ReviewDecision, WorkflowCheckpoint
from tests.reliability.conftest import (
    command,
    database_url,
    iterations,
    manage,
    new_case,
    reconcile,
    reconcile_json,
    record,
    tally,
    truth,
)

pytestmark = [pytest.mark.django_db(transaction=True)]

KILLED = -signal.SIGKILL

BEGIN_POINTS = ["begin-after-proposal", "begin-during-checkpoint-save"]
# (point, what reconcile must say right after the crash for an approval)
RESUME_POINTS = {
    "commit-before-decision": "Pending",  # killed before the decision insert
    "commit-after-decision": "Pending",  # killed with the rows built, before the write commits
    "commit-after-transaction": "Committed",  # killed after the commit, before the receipt
}
# The points a decline passes through: all three, since the decision, effect, attempt and
# pending review are one statement (a decline writes no effect, but passes the same points).
DECLINE_POINTS = {"commit-before-decision", "commit-after-decision", "commit-after-transaction"}


class Figures:
    def __init__(self, point, *, crash_at=None):
        self.point = point  # how the figures are labelled
        self.crash_at = crash_at or point  # where the process is killed
        self.started = time.monotonic()
        self.iterations = self.crashes = self.duplicates = self.lost = self.truthful = 0
        self.approvals = self.declines = 0
        self.extra = {}

    def add(self, case, *, approved: bool):
        t = tally(case)
        self.iterations += 1
        self.duplicates += t["duplicates"]
        self.lost += t["lost_approvals"]
        self.approvals += approved
        self.declines += not approved
        return t

    def save(self):
        record(
            "crash",
            point=self.point,
            iterations=self.iterations,
            crashes=self.crashes,
            reconcile_truthful=self.truthful,
            duplicates=self.duplicates,
            lost_approvals=self.lost,
            approvals=self.approvals,
            declines=self.declines,
            seconds=round(time.monotonic() - self.started, 1),
            **self.extra,
        )


def receipt(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("result=")]
    assert len(lines) == 1, stdout
    return json.loads(lines[0][len("result=") :])


def crash(figures, *args):
    proc = manage(*args, crash_at=figures.crash_at)
    assert proc.returncode == KILLED, (
        f"{args} did not die at {figures.crash_at}: rc={proc.returncode}\n{proc.stderr[-2000:]}"
    )
    figures.crashes += 1
    return proc


def reconcile_truthfully(figures, case, expected_state: str | None):
    """reconcile agrees with the tables; ``expected_state`` None: the case has no operation yet."""
    code, rows = reconcile_json(case.case_id)
    assert rows == truth([case.case_id]), rows
    assert [r["state"] for r in rows] == ([] if expected_state is None else [expected_state]), rows
    assert code == 0, rows
    figures.truthful += 1
    return rows


@pytest.mark.parametrize("point", BEGIN_POINTS)
def test_crash_during_begin_then_reconcile_then_retry(point, reviewer_name):
    figures = Figures(point)
    for _ in range(iterations()):
        case = new_case("b")
        checkpoints = WorkflowCheckpoint.objects.count()
        crash(figures, "begin", case.case_id)
        # Killed before anything of begin committed (inside its one transaction, or before
        # the one statement of a lock-free first begin): nothing stands. No proposal, no pause
        # checkpoint, no pending review, the case pointing at nothing; reconcile reports no
        # operation for the case, which is the truth.
        case.refresh_from_db()
        assert case.current_proposal_id is None and case.proposals.count() == 0
        assert not PendingReview.objects.filter(case=case).exists()
        assert WorkflowCheckpoint.objects.count() == checkpoints
        reconcile_truthfully(figures, case, None)

        code, out, err = command("begin", case.case_id)
        assert code == 0, err
        pending = PendingReview.objects.get(case=case)
        assert out.splitlines()[0] == f"begin: status=PendingRequests op={pending.operation_id} checkpoints=1"
        assert WorkflowCheckpoint.objects.count() == checkpoints + 1

        code, out, err = command(
            "resume", case.case_id, "--operation-id", pending.operation_id, "--approve", "--reviewer", reviewer_name
        )
        assert code == 0, err
        assert receipt(out) == {"Status": "Committed", "Replay": False, "EffectCount": 1}
        t = figures.add(case, approved=True)
        assert (t["decisions"], t["effects"], t["duplicates"], t["lost_approvals"]) == (1, 1, 0, 0)
        # The retry begins from scratch: one proposal, decided once.
        assert case.proposals.count() == 1
        assert [r["state"] for r in reconcile_json(case.case_id)[1]] == ["Committed"]
    figures.save()
    assert figures.crashes == figures.iterations and figures.duplicates == 0 and figures.lost == 0


@pytest.mark.parametrize("point", list(RESUME_POINTS))
def test_crash_during_resume_then_reconcile_then_retry(point, reviewer_name):
    from workflow.begin import review_begin

    figures = Figures(point)
    for i in range(iterations()):
        # Every other iteration declines, at the points a decline passes through.
        approved = not (point in DECLINE_POINTS and i % 2 == 1)
        verb = "--approve" if approved else "--decline"
        case = new_case("r")
        op = review_begin(case=case).operation_id
        args = ("resume", case.case_id, "--operation-id", op, verb, "--reviewer", reviewer_name)

        crash(figures, *args)
        after = RESUME_POINTS[point] if approved else ("Declined" if point == "commit-after-transaction" else "Pending")
        reconcile_truthfully(figures, case, after)
        # The crash never left a half-written commit: a decision only with its effect.
        assert ReviewDecision.objects.filter(operation_id=op).count() == (0 if after == "Pending" else 1)
        assert EffectRecord.objects.filter(operation_id=op).count() == (1 if after == "Committed" else 0)

        code, out, err = command(*args)
        assert code == 0, err
        landed = after != "Pending"
        expected = {
            "Status": "Committed" if approved else "Declined",
            "Replay": landed,
            "EffectCount": 1 if approved else 0,
        }
        assert receipt(out) == expected
        t = figures.add(case, approved=approved)
        assert (t["decisions"], t["effects"], t["duplicates"], t["lost_approvals"]) == (1, int(approved), 0, 0)
        reconcile_state = [r["state"] for r in reconcile_json(case.case_id)[1]]
        assert reconcile_state == ["Committed" if approved else "Declined"]
    figures.save()
    assert figures.crashes == figures.iterations and figures.duplicates == 0 and figures.lost == 0


@pytest.mark.parametrize("point", list(RESUME_POINTS))
def test_crash_during_a_resume_that_began_the_case_then_retry(point, reviewer_name):
    """`resume` on a case nobody began begins it (its own transaction, committed), then dies
    in the commit step: the pause survives for the retry, the decision only as the point says."""
    from workflow.selectors import decidable_operation_id

    figures = Figures(f"{point} (resume begins the case)", crash_at=point)
    for _ in range(iterations()):
        case = new_case("rb")
        op = decidable_operation_id(case)
        args = ("resume", case.case_id, "--operation-id", op, "--approve", "--reviewer", reviewer_name)

        crash(figures, *args)
        after = RESUME_POINTS[point]
        pending = PendingReview.objects.get(case=case)
        assert pending.operation_id == op and case.proposals.count() == 1
        assert pending.status == ("pending" if after == "Pending" else "completed")
        reconcile_truthfully(figures, case, after)

        code, out, err = command(*args)
        assert code == 0, err
        assert receipt(out) == {"Status": "Committed", "Replay": after != "Pending", "EffectCount": 1}
        t = figures.add(case, approved=True)
        assert (t["decisions"], t["effects"], t["duplicates"], t["lost_approvals"]) == (1, 1, 0, 0)
        assert PendingReview.objects.filter(case=case).count() == 1
    figures.save()
    assert figures.crashes == figures.iterations and figures.duplicates == 0 and figures.lost == 0


def test_crash_midway_through_reconcile_repair_then_rerun(reviewer):
    """Several approved operations without an effect; the repair is killed after the first."""
    from reviews.services import proposal_create

    figures = Figures("repair-midway")
    repaired_total = 0
    per_run = 4
    runs = iterations()
    for _ in range(runs):
        cases, ops = [], []
        for _ in range(per_run):
            case = new_case("p")
            proposal = proposal_create(case=case)
            ReviewDecision.objects.create(
                operation_id=proposal.operation_id, proposal=proposal, approved=True, reviewer=reviewer
            )
            cases.append(case)
            ops.append(proposal.operation_id)
        case_ids = sorted(c.case_id for c in cases)
        assert {r["state"] for r in truth(case_ids)} == {"NoLocalEffectRecorded"}

        crash(figures, "reconcile", *case_ids, "--repair")
        # Each repair is its own transaction: exactly the first one landed, the rest untouched.
        code, rows = reconcile_json(*case_ids)
        assert rows == truth(case_ids)
        assert code == 1  # NoLocalEffectRecorded remains, and reconcile says so
        assert [r["state"] for r in rows] == ["Committed"] + ["NoLocalEffectRecorded"] * (per_run - 1)
        figures.truthful += 1

        code, out, err = reconcile(*case_ids, "--repair")
        assert code == 0, err
        assert out.count("repaired: ") == per_run - 1
        code, rows = reconcile_json(*case_ids)
        assert code == 0 and {r["state"] for r in rows} == {"Committed"}
        for op in ops:
            assert EffectRecord.objects.filter(operation_id=op).count() == 1
            assert CommitAttempt.objects.filter(operation_id=op, channel="repair").count() == 1
        repaired_total += per_run
        for case in cases:
            t = figures.add(case, approved=True)
            assert (t["duplicates"], t["lost_approvals"]) == (0, 0)
    assert repaired_total == figures.iterations == runs * per_run
    figures.iterations = runs
    figures.extra = {"operations_repaired": repaired_total}
    figures.save()
    assert figures.crashes == runs and figures.duplicates == 0 and figures.lost == 0


def http_call(port, method, path, token, body=None):
    """One request on a new connection; (None, {}) when the connection dies without an answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Authorization": f"Bearer {token}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    except (OSError, http.client.HTTPException):
        return None, {}
    finally:
        conn.close()


def test_a_host_killed_mid_request_and_the_client_retries_on_the_other_host(reviewer, tmp_path):
    """Two gunicorn hosts on one database; on host A every commit dies at the crash point.

    The client's approval to A gets no answer (its worker was SIGKILLed); it asks host B
    what happened to the operation, reconcile agrees, and it retries on B: exactly one
    decision and one effect, whichever side of the commit A died on.
    """
    from django.conf import settings

    from api.services import token_create
    from reliability.load import Servers, free_port

    token = token_create(user=reviewer, name="failover")[1]
    url = database_url()
    # Every process on one database shares SECRET_KEY: checkpoint digests are HMACs keyed
    # from it, so a pause that host A wrote must verify on host B.
    secret = settings.SECRET_KEY
    clean_port = free_port()
    clean = Servers(url, [clean_port], 1, 2, tmp_path, secret_key=secret)
    try:
        clean.wait_ready()
        for point, after in RESUME_POINTS.items():
            figures = Figures(f"{point} (HTTP, host killed)")
            port = free_port()
            faulty = Servers(
                url,
                [port],
                1,
                2,
                tmp_path / point,
                extra_env={"DECISIONFLOW_FAULT_INJECTION": "1", "DECISIONFLOW_CRASH_AT": point},
                secret_key=secret,
            )
            try:
                faulty.wait_ready()
                for _ in range(iterations()):
                    case = new_case("h")
                    path = f"/api/cases/{case.case_id}"
                    status, shown = http_call(clean_port, "GET", path, token)
                    assert status == 200, shown
                    op = shown["operation_id"]
                    approve = {"operation_id": op, "approved": True}
                    status, body = http_call(port, "POST", f"{path}/decision", token, approve)
                    assert status is None, (status, body)  # the worker died: no answer at all
                    figures.crashes += 1
                    status, body = http_call(clean_port, "GET", f"/api/operations/{op}", token)
                    assert status == 200 and body["state"] == after, body
                    reconcile_truthfully(figures, case, after)
                    # Host A began the review (its own transaction) before it died in the commit.
                    assert PendingReview.objects.filter(case=case, operation_id=op).count() == 1
                    status, body = http_call(clean_port, "POST", f"{path}/decision", token, approve)
                    assert status == 200, body
                    assert body == {
                        "status": "Committed",
                        "replay": after == "Committed",
                        "effect_count": 1,
                        "operation_id": op,
                        "outcome": "replay" if after == "Committed" else "committed",
                        "decline_reason": None,
                        "approvals": None,
                    }
                    t = figures.add(case, approved=True)
                    assert (t["decisions"], t["effects"], t["duplicates"], t["lost_approvals"]) == (1, 1, 0, 0)
            finally:
                faulty.stop()
            figures.save()
            assert figures.crashes == figures.iterations and figures.duplicates == 0 and figures.lost == 0
    finally:
        clean.stop()


def test_a_crash_point_is_inert_without_fault_injection(reviewer_name):
    """DECISIONFLOW_CRASH_AT alone (fault injection off, as in production) kills nothing."""
    from workflow.begin import review_begin

    case = new_case("inert")
    op = review_begin(case=case).operation_id
    proc = manage(
        "resume",
        case.case_id,
        "--operation-id",
        op,
        "--approve",
        "--reviewer",
        reviewer_name,
        crash_at="commit-after-decision",
        inject=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert receipt(proc.stdout) == {"Status": "Committed", "Replay": False, "EffectCount": 1}
    assert EffectRecord.objects.filter(operation_id=op).count() == 1


@pytest.mark.parametrize("point", list(RESUME_POINTS))
def test_crash_during_each_of_two_approvals_then_reconcile_then_retry(point, reviewer_name, make_user):
    """Under a policy that needs two approvers: the first approval (its approval row and its
    attempt) and the second (its approval row, the decision, the effect) are each killed at
    the point, reconciled and retried. No approval is lost or doubled, and the effect is
    written once, with the second. ``make test`` kills the last point only (each point costs
    two child processes); ``make reliability`` kills every point, each approval, 20 times."""
    if iterations() == 1 and point != "commit-after-transaction":
        pytest.skip("make reliability kills this point (DECISIONFLOW_RELIABILITY_ITERATIONS > 1)")
    from reviews.models import Approval
    from workflow.begin import review_begin

    second_name = make_user("second-approver").get_username()
    # What reconcile says right after the kill, for the first and for the second approval.
    after = {
        "commit-before-decision": ("Pending", "AwaitingApproval"),
        "commit-after-decision": ("Pending", "AwaitingApproval"),
        "commit-after-transaction": ("AwaitingApproval", "Committed"),
    }[point]
    receipts = (
        {"Status": "AwaitingApproval", "EffectCount": 0},
        {"Status": "Committed", "EffectCount": 1},
    )
    first = Figures(f"{point} (first of two approvals)", crash_at=point)
    second = Figures(f"{point} (second of two approvals)", crash_at=point)
    for _ in range(iterations()):
        case = new_case("a", approvals_required=2)
        op = review_begin(case=case).operation_id
        for nth, (figures, name) in enumerate(((first, reviewer_name), (second, second_name))):
            args = ("resume", case.case_id, "--operation-id", op, "--approve", "--reviewer", name)
            crash(figures, *args)
            reconcile_truthfully(figures, case, after[nth])
            landed = after[nth] != ("Pending", "AwaitingApproval")[nth]
            code, out, err = command(*args)
            assert code == 0, err
            assert receipt(out) == {**receipts[nth], "Replay": landed}
            approvers = list(Approval.objects.filter(operation_id=op).values_list("reviewer__username", flat=True))
            t = figures.add(case, approved=True)
            # Every approval given is there once: the first reviewer's, then the second's.
            figures.lost += len({reviewer_name, second_name}.difference(approvers)) - (1 - nth)
            figures.duplicates += len(approvers) - len(set(approvers))
            assert approvers == [reviewer_name, second_name][: nth + 1]
            assert (t["decisions"], t["effects"], t["duplicates"], t["lost_approvals"]) == (nth, nth, 0, 0)
    for figures in (first, second):
        figures.save()
        assert figures.crashes == figures.iterations and figures.duplicates == 0 and figures.lost == 0
