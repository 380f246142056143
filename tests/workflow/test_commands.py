"""The workflow commands as real ``manage.py`` processes: nothing survives between steps but
the database. Runs on SQLite and on PostgreSQL (``DATABASE_URL``)."""

from __future__ import annotations

import json
import re

import pytest
from django.db import connection

from effects.models import CommitAttempt, EffectRecord
from engine.graph import WORKFLOW_VERSION
from reviews.models import PendingReview, Proposal, ReviewDecision, WorkflowCheckpoint

BEGIN_LINE = re.compile(r"^begin: status=PendingRequests op=(op-v1-[0-9a-f]{64}) checkpoints=(\d+)$", re.M)
BOUND = "approve: resumed status=PendingRequests requestBound=True"
UNCERTAIN = "outcome uncertain: the commit step failed after it may have written"


def test_lost_receipt_story(manage, committed_case):
    begin = manage("begin", "T-1042")
    assert begin.returncode == 0, begin.stderr
    match = BEGIN_LINE.fullmatch(begin.stdout.strip())
    assert match, begin.stdout
    op, checkpoints = match.group(1), int(match.group(2))
    assert checkpoints == 1 == WorkflowCheckpoint.objects.count()  # begin writes the pause only
    pending = PendingReview.objects.get()
    assert (pending.operation_id, pending.workflow_version, pending.status) == (op, WORKFLOW_VERSION, "pending")

    approve = ["resume", "T-1042", "--operation-id", op, "--approve", "--reviewer", "reviewer"]
    lost = manage(*approve, "--fault", "lose-receipt")
    assert lost.returncode == 42, lost.stderr
    assert lost.stdout.strip() == BOUND  # no result line: no success is claimed
    assert lost.stderr.splitlines()[0].startswith(f"{UNCERTAIN} (LostReceipt)"), lost.stderr
    assert "manage.py reconcile T-1042" in lost.stderr
    # The effect's transaction committed; only the receipt was lost.
    assert EffectRecord.objects.filter(operation_id=op).count() == 1

    reconcile = manage("reconcile", "T-1042")
    assert (reconcile.returncode, reconcile.stdout.strip()) == (
        0,
        f"reconcile: case=T-1042 op={op} state=Committed effects=1",
    )

    again = manage(*approve)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [BOUND, 'result={"Status":"Committed","Replay":true,"EffectCount":1}']

    decline = manage("resume", "T-1042", "--operation-id", op, "--decline", "--reviewer", "reviewer")
    assert decline.returncode == 3
    assert decline.stdout.splitlines() == [
        "decline: resumed status=PendingRequests requestBound=True",
        'result={"Status":"ConflictingDecision","Replay":false,"EffectCount":1}',
    ]
    assert decline.stderr.startswith("conflicting decision: ")

    assert EffectRecord.objects.count() == 1 and ReviewDecision.objects.count() == 1
    assert PendingReview.objects.get().status == "completed"
    assert list(CommitAttempt.objects.order_by("id").values_list("outcome", flat=True)) == [
        "committed",
        "replay",
        "conflict",
    ]
    # The answered runs wrote no checkpoint rows: the pause is still the only one.
    assert WorkflowCheckpoint.objects.count() == 1


def test_a_connection_lost_after_the_commit_is_an_uncertain_outcome(manage, committed_case):
    """The server drops the connection right after COMMIT: no receipt, exit 42, and the truth is in the store."""
    from workflow.begin import review_begin

    op = review_begin(case=committed_case).operation_id
    approve = ["resume", "T-1042", "--operation-id", op, "--approve", "--reviewer", "reviewer"]
    lost = manage(*approve, "--fault", "lose-connection")
    assert lost.returncode == 42, (lost.stdout, lost.stderr)
    assert lost.stdout.strip() == BOUND and "result=" not in lost.stdout
    assert lost.stderr.splitlines()[0].startswith(f"{UNCERTAIN} (OperationalError)"), lost.stderr
    assert "Traceback" not in lost.stderr
    assert (ReviewDecision.objects.count(), EffectRecord.objects.filter(operation_id=op).count()) == (1, 1)

    reconcile = manage("reconcile", "T-1042")
    assert reconcile.stdout.strip() == f"reconcile: case=T-1042 op={op} state=Committed effects=1"
    again = manage(*approve)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [BOUND, 'result={"Status":"Committed","Replay":true,"EffectCount":1}']
    assert EffectRecord.objects.count() == 1


def test_an_unknown_fault_is_refused_before_anything_runs(manage, committed_case):
    from workflow.begin import review_begin

    op = review_begin(case=committed_case).operation_id
    proc = manage("resume", "T-1042", "--operation-id", op, "--approve", "--reviewer", "reviewer", "--fault", "explode")
    assert proc.returncode == 1 and "unknown fault 'explode'" in proc.stderr
    assert proc.stdout == "" and ReviewDecision.objects.count() == 0 and CommitAttempt.objects.count() == 0


def test_resume_on_a_never_begun_case_begins_it_and_commits(manage, committed_case):
    """The CLI begins a never-begun case and decides it, as the admin and the API do."""
    from workflow.selectors import decidable_operation_id

    op = decidable_operation_id(committed_case)
    assert (Proposal.objects.count(), PendingReview.objects.count()) == (0, 0)
    approve = ["resume", "T-1042", "--operation-id", op, "--approve", "--reviewer", "reviewer"]
    proc = manage(*approve)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [BOUND, 'result={"Status":"Committed","Replay":false,"EffectCount":1}']
    assert Proposal.objects.get().operation_id == op
    pending = PendingReview.objects.get()
    assert (pending.operation_id, pending.status) == (op, "completed")
    assert WorkflowCheckpoint.objects.count() == 1 and EffectRecord.objects.count() == 1
    again = manage(*approve)
    assert again.returncode == 0 and again.stdout.splitlines()[1].endswith('"Replay":true,"EffectCount":1}')
    assert PendingReview.objects.count() == 1


def test_resume_naming_an_operation_neither_pending_nor_decidable_is_not_found(manage, committed_case):
    unknown = "op-v1-" + "0" * 64
    proc = manage("resume", "T-1042", "--operation-id", unknown, "--approve", "--reviewer", "reviewer")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("no pending review for case T-1042") and "run begin first" not in proc.stderr
    # Nothing was begun for it, and the refusal is in the audit log.
    assert (Proposal.objects.count(), PendingReview.objects.count(), ReviewDecision.objects.count()) == (0, 0, 0)
    attempt = CommitAttempt.objects.get()
    assert (attempt.outcome, attempt.channel, attempt.reason) == ("refused", "command", "not_found")
    assert attempt.detail == proc.stderr.strip().splitlines()[0]


def test_resume_on_a_busy_case_exits_6_and_writes_nothing(manage, committed_case):
    """Another action holds the case (here: this process) past the timeout: busy, try again."""
    from tests.conftest import case_held_elsewhere
    from workflow.selectors import decidable_operation_id

    op = decidable_operation_id(committed_case)
    approve = ["resume", "T-1042", "--operation-id", op, "--approve", "--reviewer", "reviewer"]
    with case_held_elsewhere("T-1042"):
        busy = manage(*approve, DECISIONFLOW_DECISION_LOCK_TIMEOUT="0.5")
    assert busy.returncode == 6, (busy.stdout, busy.stderr)
    assert busy.stderr.startswith("another action on case T-1042 is in progress; try again")
    assert busy.stdout == "" and (Proposal.objects.count(), ReviewDecision.objects.count()) == (0, 0)
    assert CommitAttempt.objects.get().detail == "another action on case T-1042 is in progress; try again"
    retried = manage(*approve)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.splitlines()[1] == 'result={"Status":"Committed","Replay":false,"EffectCount":1}'


def test_one_checkpoint_resumed_five_times_at_once_writes_one_effect(spawn, committed_case):
    from workflow.begin import review_begin

    # Every child waits for the case as long as it takes: this test is about duplicates, not
    # about busy answers (those have their own test).
    wait = {"DECISIONFLOW_DECISION_LOCK_TIMEOUT": "60"}
    begun = [spawn("begin", "T-1042", **wait) for _ in range(2)]
    outs = [(p.wait(timeout=120), *p.communicate()) for p in begun]
    assert [rc for rc, _, _ in outs] == [0, 0], outs
    ops = {BEGIN_LINE.search(out).group(1) for _, out, _ in outs}
    assert len(ops) == 1 and PendingReview.objects.count() == 1  # two begins at once, one pause
    assert sorted("nothing new was created" in out for _, out, _ in outs) == [False, True]
    op = ops.pop()
    assert review_begin(case=committed_case).created is False

    resumes = [
        spawn("resume", "T-1042", "--operation-id", op, "--approve", "--reviewer", "reviewer", **wait) for _ in range(5)
    ]
    results = []
    for proc in resumes:
        rc = proc.wait(timeout=120)
        out, err = proc.communicate()
        assert rc == 0, err
        assert out.splitlines()[0] == BOUND
        results.append(json.loads(out.splitlines()[1].removeprefix("result=")))
    assert sorted(r["Replay"] for r in results) == [False, True, True, True, True]
    assert {(r["Status"], r["EffectCount"]) for r in results} == {("Committed", 1)}
    assert EffectRecord.objects.filter(operation_id=op).count() == 1
    assert ReviewDecision.objects.count() == 1
    assert WorkflowCheckpoint.objects.count() == 1  # five answered runs, still only the pause


def test_stale_operation_after_an_edit(manage, committed_case, tmp_path):
    from workflow.begin import review_begin

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
    from workflow.begin import review_begin

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
    from workflow.begin import review_begin

    op = review_begin(case=committed_case).operation_id
    PendingReview.objects.update(workflow_version="review-v0")
    proc = manage("resume", "T-1042", "--operation-id", op, "--approve", "--reviewer", "reviewer")
    assert proc.returncode == 5
    assert proc.stderr.startswith("incompatible workflow version:") and "review-v0" in proc.stderr
    assert proc.stdout == "" and ReviewDecision.objects.count() == 0 and EffectRecord.objects.count() == 0
    attempt = CommitAttempt.objects.get()
    assert (attempt.outcome, attempt.reason) == ("refused", "checkpoint")
    assert attempt.detail == proc.stderr.strip().splitlines()[0]


def test_a_tampered_checkpoint_is_refused(manage, committed_case):
    from workflow.begin import review_begin

    begun = review_begin(case=committed_case)
    row = WorkflowCheckpoint.objects.get(checkpoint_id=begun.pending_review.checkpoint_id)
    # Same length, one field changed, digest left as it was.
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(
        payload=row.payload.replace('"case_id":"T-1042"', '"case_id":"T-1043"')
    )
    assert WorkflowCheckpoint.objects.get(pk=row.pk).payload != row.payload

    proc = manage("resume", "T-1042", "--operation-id", begun.operation_id, "--approve", "--reviewer", "reviewer")
    assert proc.returncode == 5
    assert "corrupt or was modified" in proc.stderr and "HMAC" in proc.stderr and proc.stdout == ""
    assert ReviewDecision.objects.count() == 0 and EffectRecord.objects.count() == 0
    # Nothing ran; the refusal is recorded as an attempt.
    attempt = CommitAttempt.objects.get()
    assert (attempt.outcome, attempt.reason) == ("refused", "checkpoint")
    assert attempt.detail == proc.stderr.strip().splitlines()[0]


def test_a_checkpoint_whose_request_names_another_operation_is_refused(manage, committed_case):
    """Rewritten by someone holding the secret (a valid HMAC), it still cannot change what is approved."""
    from engine.checkpoints import payload_digest
    from workflow.begin import review_begin

    begun = review_begin(case=committed_case)
    other = "op-v1-" + "a" * 64
    row = WorkflowCheckpoint.objects.get(checkpoint_id=begun.pending_review.checkpoint_id)
    payload = row.payload.replace(begun.operation_id, other)
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(payload=payload, digest=payload_digest(payload))

    proc = manage("resume", "T-1042", "--operation-id", begun.operation_id, "--approve", "--reviewer", "reviewer")
    assert proc.returncode == 5, proc.stderr
    assert "does not belong to case T-1042 and operation" in proc.stderr and proc.stdout == ""
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)
    assert CommitAttempt.objects.get().detail == proc.stderr.strip().splitlines()[0]


class FullDisk:
    """The database refuses to store a checkpoint, as a full disk or a lost connection would.

    Begin writes one checkpoint row, the pause; so this makes every begin fail to store it.
    """

    def arm(self):
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute(
                    "CREATE TRIGGER test_full_disk BEFORE INSERT ON reviews_workflowcheckpoint "
                    "BEGIN SELECT RAISE(ABORT, 'disk full'); END"
                )
            else:
                cursor.execute(
                    "CREATE FUNCTION test_full_disk() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    "RAISE EXCEPTION 'disk full'; END $$"
                )
                cursor.execute(
                    "CREATE TRIGGER test_full_disk BEFORE INSERT ON reviews_workflowcheckpoint "
                    "FOR EACH ROW EXECUTE FUNCTION test_full_disk()"
                )

    def lift(self):
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute("DROP TRIGGER IF EXISTS test_full_disk")
            else:
                cursor.execute("DROP TRIGGER IF EXISTS test_full_disk ON reviews_workflowcheckpoint")
                cursor.execute("DROP FUNCTION IF EXISTS test_full_disk()")


@pytest.fixture
def full_disk(transactional_db):
    disk = FullDisk()
    yield disk
    disk.lift()


def test_a_begin_whose_pause_checkpoint_is_not_stored_reports_failure_and_records_nothing(
    manage, committed_case, full_disk
):
    full_disk.arm()
    proc = manage("begin", "T-1042")
    assert proc.returncode == 5, (proc.stdout, proc.stderr)
    assert "begin: status=" not in proc.stdout
    assert proc.stderr.startswith("begin: the pause checkpoint for case T-1042 could not be stored")
    assert "disk full" in proc.stderr and "no pending review was recorded" in proc.stderr
    # One transaction: no proposal, no checkpoint, no pending review, the pointer untouched.
    assert (Proposal.objects.count(), WorkflowCheckpoint.objects.count(), PendingReview.objects.count()) == (0, 0, 0)
    committed_case.refresh_from_db()
    assert committed_case.current_proposal_id is None

    full_disk.lift()  # the disk has room again: a rerun of begin works
    again = manage("begin", "T-1042")
    assert again.returncode == 0, again.stderr
    assert BEGIN_LINE.fullmatch(again.stdout.strip()).group(2) == "1"
    assert (Proposal.objects.count(), WorkflowCheckpoint.objects.count(), PendingReview.objects.count()) == (1, 1, 1)


def test_an_edit_whose_review_cannot_be_begun_is_saved_and_exits_7(manage, committed_case, editor, full_disk, tmp_path):
    from workflow.begin import review_begin

    op = review_begin(case=committed_case).operation_id
    full_disk.arm()  # for the edit's begin only
    body = tmp_path / "body.txt"
    body.write_text("Hello,\n\nAn edit whose review could not be begun.\n\nSupport")
    edit = manage("edit", "T-1042", "--expected-operation-id", op, "--body-file", str(body), "--editor", "editor")
    assert edit.returncode == 7, (edit.stdout, edit.stderr)
    new_op = re.fullmatch(r"edit: op=(op-v1-[0-9a-f]{64}) origin=human_edit", edit.stdout.strip()).group(1)
    # (The service also logs a warning line on stderr before the command's own message.)
    saved = [line for line in edit.stderr.splitlines() if line.startswith("edit: saved, but")]
    assert len(saved) == 1 and saved[0].startswith(
        "edit: saved, but the review of the new proposal was not begun: "
        "begin: the pause checkpoint for case T-1042 could not be stored ("
    ), edit.stderr
    assert "disk full" in saved[0]
    assert edit.stderr.splitlines()[-1].startswith("edit: run `manage.py begin T-1042`")
    # Saved and current; only its review is missing.
    committed_case.refresh_from_db()
    assert committed_case.current_proposal.operation_id == new_op
    assert dict(PendingReview.objects.values_list("operation_id", "status")) == {op: "superseded"}

    full_disk.lift()
    # The first decision on the new proposal begins it.
    decided = manage("resume", "T-1042", "--operation-id", new_op, "--approve", "--reviewer", "reviewer")
    assert decided.returncode == 0, decided.stderr
    assert decided.stdout.splitlines() == [BOUND, 'result={"Status":"Committed","Replay":false,"EffectCount":1}']
    assert PendingReview.objects.get(operation_id=new_op).status == "completed"


def test_reconcile_overlap_and_repair(manage, committed_case, reviewer):
    from core.locks import reconcile_lock
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
    assert found.stdout.splitlines() == [
        f"reconcile: case=T-1042 op={proposal.operation_id} state=NoLocalEffectRecorded effects=0",
        found.stdout.splitlines()[-1],
    ]
    assert found.stdout.splitlines()[-1].startswith("reconcile: summary: 1 operation(s) of 1 case(s)")
    assert "--repair" in found.stderr and EffectRecord.objects.count() == 0

    repaired = manage("reconcile", "T-1042", "--repair", "--json")
    assert repaired.returncode == 0, repaired.stderr
    assert [json.loads(line)["state"] for line in repaired.stdout.splitlines()] == [
        "NoLocalEffectRecorded",
        "Committed",
    ]
    assert EffectRecord.objects.count() == 1
    # The listing goes to standard output's binary layer, the summary after it as text.
    listed = manage("reconcile", "--all", "--json")
    assert listed.returncode == 0, listed.stderr
    *lines, summary = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [line["state"] for line in lines] == ["Committed"] and summary["states"] == {"Committed": 1}
