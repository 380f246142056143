"""The workflow commands as real ``manage.py`` processes: nothing survives between steps but
the database. Runs on SQLite and on PostgreSQL (``DATABASE_URL``)."""

from __future__ import annotations

import json
import re

import pytest
from django.db import connection

from decisionflow.workflow.engine import WORKFLOW_VERSION
from effects.models import CommitAttempt, EffectRecord
from reviews.models import PendingReview, Proposal, ReviewDecision, WorkflowCheckpoint

BEGIN_LINE = re.compile(r"^begin: status=PendingRequests op=(op-v1-[0-9a-f]{64}) checkpoints=(\d+)$", re.M)
REEMITTED = "approve: resumed status=PendingRequests requestReemitted=True"


def test_lost_receipt_story(manage, committed_case):
    begin = manage("begin", "T-1042")
    assert begin.returncode == 0, begin.stderr
    match = BEGIN_LINE.fullmatch(begin.stdout.strip())
    assert match, begin.stdout
    op, checkpoints = match.group(1), int(match.group(2))
    assert checkpoints == 3 == WorkflowCheckpoint.objects.count()
    pending = PendingReview.objects.get()
    assert (pending.operation_id, pending.workflow_version, pending.status) == (op, WORKFLOW_VERSION, "pending")

    approve = ["resume", "T-1042", "--operation-id", op, "--approve", "--reviewer", "reviewer"]
    lost = manage(*approve, "--fault", "lose-receipt")
    assert lost.returncode == 42, lost.stderr
    assert lost.stdout.strip() == REEMITTED  # no result line: no success is claimed
    assert lost.stderr.splitlines()[0] == "executor failed: LostReceipt"
    # The effect's transaction committed; only the receipt was lost.
    assert EffectRecord.objects.filter(operation_id=op).count() == 1

    reconcile = manage("reconcile", "T-1042")
    assert (reconcile.returncode, reconcile.stdout.strip()) == (
        0,
        f"reconcile: case=T-1042 op={op} state=Committed effects=1",
    )

    again = manage(*approve)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [REEMITTED, 'result={"Status":"Committed","Replay":true,"EffectCount":1}']

    decline = manage("resume", "T-1042", "--operation-id", op, "--decline", "--reviewer", "reviewer")
    assert decline.returncode == 3
    assert decline.stdout.splitlines()[-1] == 'result={"Status":"ConflictingDecision","Replay":false,"EffectCount":1}'

    assert EffectRecord.objects.count() == 1 and ReviewDecision.objects.count() == 1
    assert PendingReview.objects.get().status == "completed"
    assert list(CommitAttempt.objects.order_by("id").values_list("outcome", flat=True)) == [
        "committed",
        "replay",
        "conflict",
    ]


def test_one_checkpoint_resumed_five_times_at_once_writes_one_effect(spawn, committed_case):
    from decisionflow.workflow.services import review_begin

    begun = [spawn("begin", "T-1042") for _ in range(2)]
    outs = [(p.wait(timeout=120), *p.communicate()) for p in begun]
    assert [rc for rc, _, _ in outs] == [0, 0], outs
    ops = {BEGIN_LINE.search(out).group(1) for _, out, _ in outs}
    assert len(ops) == 1 and PendingReview.objects.count() == 1  # two begins at once, one pause
    assert sorted("nothing new was created" in out for _, out, _ in outs) == [False, True]
    op = ops.pop()
    assert review_begin(case=committed_case).created is False

    resumes = [spawn("resume", "T-1042", "--operation-id", op, "--approve", "--reviewer", "reviewer") for _ in range(5)]
    results = []
    for proc in resumes:
        rc = proc.wait(timeout=120)
        out, err = proc.communicate()
        assert rc == 0, err
        assert out.splitlines()[0] == REEMITTED
        results.append(json.loads(out.splitlines()[1].removeprefix("result=")))
    assert sorted(r["Replay"] for r in results) == [False, True, True, True, True]
    assert {(r["Status"], r["EffectCount"]) for r in results} == {("Committed", 1)}
    assert EffectRecord.objects.filter(operation_id=op).count() == 1
    assert ReviewDecision.objects.count() == 1


def test_stale_operation_after_an_edit(manage, committed_case, tmp_path):
    from decisionflow.workflow.services import review_begin

    op = review_begin(case=committed_case).operation_id
    body = tmp_path / "body.txt"
    body.write_bytes(Proposal.objects.get().body.encode() + b"\r\nWe will call you tomorrow.")

    edit = manage("edit", "T-1042", "--expected-operation-id", op, "--body-file", str(body), "--editor", "reviewer")
    assert edit.returncode == 0, edit.stderr
    lines = edit.stdout.splitlines()
    new_op = re.fullmatch(r"edit: op=(op-v1-[0-9a-f]{64}) origin=human_edit", lines[0]).group(1)
    assert new_op != op and BEGIN_LINE.fullmatch(lines[1]).group(1) == new_op
    assert dict(PendingReview.objects.values_list("operation_id", "status")) == {op: "superseded", new_op: "pending"}

    counts = (Proposal.objects.count(), ReviewDecision.objects.count(), EffectRecord.objects.count())
    old = manage("resume", "T-1042", "--operation-id", op, "--approve", "--reviewer", "reviewer")
    assert old.returncode == 4, old.stderr
    assert old.stderr.startswith("stale: ") and "result=" not in old.stdout
    stale_edit = manage(
        "edit", "T-1042", "--expected-operation-id", op, "--body-file", str(body), "--editor", "reviewer"
    )
    assert stale_edit.returncode == 4 and stale_edit.stdout == ""
    assert "stale" in stale_edit.stderr
    assert (Proposal.objects.count(), ReviewDecision.objects.count(), EffectRecord.objects.count()) == counts


def test_a_source_version_change_with_identical_text_refuses_the_old_operation(manage, committed_case):
    from decisionflow.workflow.services import review_begin

    op = review_begin(case=committed_case).operation_id
    edit = manage("edit", "T-1042", "--expected-operation-id", op, "--source", "HOLD-7=4", "--editor", "reviewer")
    assert edit.returncode == 0, edit.stderr
    new_op = re.fullmatch(r"edit: op=(\S+) origin=evidence_change", edit.stdout.splitlines()[0]).group(1)
    new = Proposal.objects.get(operation_id=new_op)
    assert new.body == Proposal.objects.get(operation_id=op).body  # the visible text is identical

    old = manage("resume", "T-1042", "--operation-id", op, "--approve", "--reviewer", "reviewer")
    assert old.returncode == 4, old.stderr
    assert ReviewDecision.objects.count() == 0 and EffectRecord.objects.count() == 0


def test_a_pending_review_from_another_workflow_version_is_refused(manage, committed_case):
    from decisionflow.workflow.services import review_begin

    op = review_begin(case=committed_case).operation_id
    PendingReview.objects.update(workflow_version="review-v0")
    proc = manage("resume", "T-1042", "--operation-id", op, "--approve", "--reviewer", "reviewer")
    assert proc.returncode == 5
    assert proc.stderr.startswith("incompatible workflow version:") and "review-v0" in proc.stderr
    assert proc.stdout == "" and ReviewDecision.objects.count() == 0 and EffectRecord.objects.count() == 0


def test_a_tampered_checkpoint_is_refused(manage, committed_case):
    from decisionflow.workflow.services import review_begin

    begun = review_begin(case=committed_case)
    row = WorkflowCheckpoint.objects.get(checkpoint_id=begun.pending_review.checkpoint_id)
    # Same length, one field changed, digest left as it was.
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(
        payload=row.payload.replace('"case_id":"T-1042"', '"case_id":"T-1043"')
    )
    assert WorkflowCheckpoint.objects.get(pk=row.pk).payload != row.payload

    proc = manage("resume", "T-1042", "--operation-id", begun.operation_id, "--approve", "--reviewer", "reviewer")
    assert proc.returncode == 5
    assert "corrupt or was modified" in proc.stderr and proc.stdout == ""
    assert ReviewDecision.objects.count() == 0 and CommitAttempt.objects.count() == 0


@pytest.fixture
def failing_pause_save(transactional_db):
    """The database refuses to store the pause checkpoint (the one carrying the review request),
    as a full disk or a lost connection would. The engine only logs a warning for that."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                "CREATE TRIGGER test_fail_pause BEFORE INSERT ON reviews_workflowcheckpoint "
                "WHEN NEW.payload LIKE '%\"request_id\":\"review:%' BEGIN SELECT RAISE(ABORT, 'disk full'); END"
            )
        else:
            cursor.execute(
                "CREATE FUNCTION test_fail_pause() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.payload LIKE '%\"request_id\":\"review:%' THEN RAISE EXCEPTION 'disk full'; END IF; "
                "RETURN NEW; END $$"
            )
            cursor.execute(
                "CREATE TRIGGER test_fail_pause BEFORE INSERT ON reviews_workflowcheckpoint "
                "FOR EACH ROW EXECUTE FUNCTION test_fail_pause()"
            )
    yield
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("DROP TRIGGER test_fail_pause")
        else:
            cursor.execute("DROP TRIGGER test_fail_pause ON reviews_workflowcheckpoint")
            cursor.execute("DROP FUNCTION test_fail_pause()")


def test_a_begin_whose_pause_checkpoint_is_not_saved_reports_failure(manage, committed_case, failing_pause_save):
    proc = manage("begin", "T-1042")
    assert proc.returncode == 5, (proc.stdout, proc.stderr)
    assert "begin: status=" not in proc.stdout
    assert "pause checkpoint" in proc.stderr and "was not saved" in proc.stderr
    assert PendingReview.objects.count() == 0
    # The checkpoints before the pause were stored; none of them carries the request.
    assert WorkflowCheckpoint.objects.count() == 2
    assert not WorkflowCheckpoint.objects.filter(payload__contains='"request_id":"review:').exists()


def test_reconcile_overlap_and_repair(manage, committed_case, reviewer):
    from decisionflow.core.locks import reconcile_lock
    from reviews.services import proposal_create

    proposal = proposal_create(case=committed_case)
    ReviewDecision.objects.create(
        operation_id=proposal.operation_id, proposal=proposal, approved=True, reviewer=reviewer
    )
    with reconcile_lock():
        busy = manage("reconcile", "--all")
    assert busy.returncode == 1 and "locked by another process" in busy.stderr and busy.stdout == ""

    found = manage("reconcile", "--all")
    assert found.returncode == 1
    assert (
        found.stdout.strip()
        == f"reconcile: case=T-1042 op={proposal.operation_id} state=NoLocalEffectRecorded effects=0"
    )
    assert "--repair" in found.stderr and EffectRecord.objects.count() == 0

    repaired = manage("reconcile", "T-1042", "--repair", "--json")
    assert repaired.returncode == 0, repaired.stderr
    assert [json.loads(line)["state"] for line in repaired.stdout.splitlines()] == [
        "NoLocalEffectRecorded",
        "Committed",
    ]
    assert EffectRecord.objects.count() == 1
