"""The graph fingerprint covers message schemas, and drain_workflow moves
the pauses of an older version (or graph) onto the current one. Runs on SQLite and, with
DATABASE_URL set, on PostgreSQL."""

from __future__ import annotations

import io
import json
import typing
from typing import NotRequired, TypedDict

import pytest
from django.core.management import CommandError, call_command

from cases.models import Case
from cases.services import case_import
from core.errors import DecisionflowError, WorkflowIncompatible
from core.outcomes import DecisionOutcome as Outcome
from effects.models import EffectRecord
from engine import messages, names
from reviews.models import PendingReview, ReviewDecision, WorkflowCheckpoint
from tests.conftest import load_fixture
from workflow.begin import review_begin
from workflow.decide import decision_record

FIXTURES = ("t1042.json", "t1077.json", "t1150.json")


@pytest.fixture
def fingerprint_cache():
    """Every test starts and ends with the fingerprint of the code as written."""
    messages.graph_fingerprint.cache_clear()
    yield
    messages.graph_fingerprint.cache_clear()


def new_code(monkeypatch, role: str = "request", field: str = "priority"):
    """Deploy "new code": the ``role`` message gains an optional field, WORKFLOW_VERSION unchanged.

    Optional, so the running steps still conform; only the declaration changed, which is
    exactly what a version label alone cannot see.
    """
    declared = messages.MESSAGES[role]
    fields = dict(typing.get_type_hints(declared, include_extras=True), **{field: NotRequired[int]})
    monkeypatch.setitem(messages.MESSAGES, role, TypedDict(declared.__name__, fields))  # type: ignore[operator]
    messages.graph_fingerprint.cache_clear()


def _begin(name: str) -> Case:
    case = case_import(data=load_fixture(name)).case
    review_begin(case=case)
    case.refresh_from_db()
    return case


def _op(case: Case) -> str:
    case.refresh_from_db()
    return case.current_proposal.operation_id


def _pauses() -> dict[str, tuple]:
    return {
        p.operation_id: (p.checkpoint_id, p.workflow_version, p.graph_fingerprint, p.status)
        for p in PendingReview.objects.all()
    }


def _drain(*args) -> tuple[list[str], int]:
    out = io.StringIO()
    try:
        call_command("drain_workflow", *args, stdout=out, stderr=io.StringIO())
    except CommandError as exc:
        return out.getvalue().splitlines(), exc.returncode
    return out.getvalue().splitlines(), 0


# --- the fingerprint ---------------------------------------------------------------------


def test_the_fingerprint_covers_schemas_edges_and_executor_ids(fingerprint_cache, monkeypatch):
    before = messages.graph_fingerprint()
    described = messages.graph_description()
    assert described["executors"] == [names.PREPARE_ID, names.HUMAN_REVIEW_ID, names.COMMIT_ID]
    assert described["messages"]["request"]["graph_fingerprint"] == {"type": "str", "required": True}
    assert described["messages"]["response"]["reviewer_pk"]["type"] == ["None", "int"]
    seen = {before}
    for role in ("request", "response", "commit", "output"):
        with monkeypatch.context() as patch:
            new_code(patch, role)
            seen.add(messages.graph_fingerprint())
        messages.graph_fingerprint.cache_clear()
        assert messages.graph_fingerprint() == before  # undone: back to the code as written
    with monkeypatch.context() as patch:
        patch.setattr(messages, "EDGES", (("prepare", "commit"), ("human-review-v1", "commit")))
        messages.graph_fingerprint.cache_clear()
        seen.add(messages.graph_fingerprint())
    with monkeypatch.context() as patch:
        patch.setattr(messages, "HUMAN_REVIEW_ID", "human-review-v2")
        messages.graph_fingerprint.cache_clear()
        seen.add(messages.graph_fingerprint())
    assert len(seen) == 7  # each change its own fingerprint, none equal to the original


def test_an_output_change_refuses_the_old_pause_without_a_version_bump(db, fingerprint_cache, monkeypatch, reviewer):
    case = _begin("t1042.json")
    op = _op(case)
    pause = PendingReview.objects.get()
    assert pause.graph_fingerprint == messages.graph_fingerprint()
    version = names.WORKFLOW_VERSION
    new_code(monkeypatch, "request")
    assert version == names.WORKFLOW_VERSION  # the label was not bumped
    with pytest.raises(WorkflowIncompatible, match="incompatible workflow graph") as refused:
        decision_record(case=case, operation_id=op, approved=True, reviewer=reviewer, channel="test")
    assert refused.value.exit_code == 5 and "drain_workflow" in refused.value.message
    assert not ReviewDecision.objects.exists() and not EffectRecord.objects.exists()
    # The signed request inside the checkpoint is checked too, not only the column.
    PendingReview.objects.update(graph_fingerprint=messages.graph_fingerprint())
    with pytest.raises(WorkflowIncompatible, match="holds a request of the graph fingerprint"):
        decision_record(case=case, operation_id=op, approved=True, reviewer=reviewer, channel="test")
    assert not ReviewDecision.objects.exists()


def test_a_step_whose_output_drifts_from_its_declaration_fails_and_writes_nothing(db, fingerprint_cache, monkeypatch):
    declared = typing.get_type_hints(messages.ReviewRequest)
    del declared["session_id"]  # prepare still sends it: undeclared
    monkeypatch.setitem(messages.MESSAGES, "request", TypedDict("ReviewRequest", declared))  # type: ignore[operator]
    case = case_import(data=load_fixture()).case
    with pytest.raises(DecisionflowError, match="undeclared \\['session_id'\\]"):
        review_begin(case=case)
    assert not PendingReview.objects.exists() and not WorkflowCheckpoint.objects.exists()


# --- drain --------------------------------------------------------------------------------


def test_drain_dry_run_apply_and_again_then_approve_commits_once(db, fingerprint_cache, reviewer):
    cases = [_begin(name) for name in FIXTURES[:2]]
    PendingReview.objects.update(workflow_version="review-v1")  # recorded by the older version
    before = _pauses()

    lines, code = _drain("--from", "review-v1")
    assert code == 0 and len(lines) == 3
    assert all(line.startswith("drain_workflow: would re-begin case=") for line in lines[:2])
    assert lines[2].startswith("drain_workflow: dry run: 2 pending review(s) would be re-begun on review-v3")
    assert _pauses() == before  # a dry run changes nothing

    assert _drain("--from", "review-v0")[0][-1].startswith("drain_workflow: dry run: 0 pending")

    lines, code = _drain("--from", "review-v1", "--apply", "--batch-size", "1")
    assert code == 0 and lines[-1].startswith("drain_workflow: re-begun 2 of 2 pending review(s)"), lines
    assert "in 2 batch(es)" in lines[-1]
    after = _pauses()
    assert set(after) == set(before)  # the same operations: no new proposal, no duplicate
    for op, (checkpoint_id, version, fingerprint, status) in after.items():
        assert (
            checkpoint_id != before[op][0] and WorkflowCheckpoint.objects.filter(checkpoint_id=checkpoint_id).exists()
        )
        assert (version, fingerprint, status) == ("review-v3", messages.graph_fingerprint(), "pending")

    lines, code = _drain("--apply", "--json")  # again: nothing to do
    assert code == 0 and json.loads(lines[-1])["candidates"] == 0 and _pauses() == after

    for case in cases:
        first = decision_record(case=case, operation_id=_op(case), approved=True, reviewer=reviewer, channel="t")
        again = decision_record(case=case, operation_id=_op(case), approved=True, reviewer=reviewer, channel="t")
        assert (first.outcome, again.outcome) == (Outcome.COMMITTED, Outcome.REPLAY)
        assert first.checkpoint_id == after[_op(case)][0]
    assert EffectRecord.objects.count() == 2 and ReviewDecision.objects.count() == 2


def test_drain_across_a_schema_change_then_approve_commits_once(db, fingerprint_cache, monkeypatch, reviewer):
    case = _begin("t1042.json")
    op = _op(case)
    new_code(monkeypatch, "commit")  # same label, another graph
    with pytest.raises(WorkflowIncompatible):
        decision_record(case=case, operation_id=op, approved=True, reviewer=reviewer, channel="t")
    lines, code = _drain("--from", names.WORKFLOW_VERSION, "--apply")
    assert code == 0 and "re-begun 1 of 1" in lines[-1]
    assert PendingReview.objects.get().graph_fingerprint == messages.graph_fingerprint()
    result = decision_record(case=case, operation_id=op, approved=True, reviewer=reviewer, channel="t")
    assert result.outcome == Outcome.COMMITTED and EffectRecord.objects.filter(operation_id=op).count() == 1


def test_drain_leaves_decided_and_superseded_reviews_alone(db, fingerprint_cache, reviewer):
    decided, waiting = _begin("t1042.json"), _begin("t1077.json")
    decision_record(case=decided, operation_id=_op(decided), approved=True, reviewer=reviewer, channel="t")
    PendingReview.objects.update(workflow_version="review-v1")
    before = _pauses()
    lines, code = _drain("--apply")
    assert code == 0 and "re-begun 1 of 1" in lines[-1]
    assert _pauses()[_op(decided)] == before[_op(decided)]  # decided means decided
    assert _pauses()[_op(waiting)][1] == "review-v3"


def test_bad_batch_size_is_refused_and_nothing_changes(db, fingerprint_cache):
    _begin("t1042.json")
    PendingReview.objects.update(workflow_version="review-v1")
    before = _pauses()
    lines, code = _drain("--apply", "--batch-size", "0")
    assert code == 1 and lines == [] and _pauses() == before


@pytest.mark.parametrize("crash_at", ["drain-workflow-batch-1", "begin-during-checkpoint-save"])
def test_sigkill_mid_drain_then_two_reruns_at_once_leave_no_gap_and_no_duplicate(manage, spawn, reviewer, crash_at):
    cases = [_begin(name) for name in FIXTURES]
    PendingReview.objects.update(workflow_version="review-v1")
    before = _pauses()
    checkpoints = WorkflowCheckpoint.objects.count()

    killed = manage(
        "drain_workflow", "--from", "review-v1", "--apply", "--batch-size", "1", DECISIONFLOW_CRASH_AT=crash_at
    )
    assert killed.returncode == -9, killed.stderr
    moved = [op for op, pause in _pauses().items() if pause[1] == "review-v3"]
    # Between batches: the first case is moved. Inside the first case's transaction: none.
    assert len(moved) == (1 if crash_at == "drain-workflow-batch-1" else 0)

    runs = [spawn("drain_workflow", "--from", "review-v1", "--apply", "--json") for _ in range(2)]
    outs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outs
    summaries = [json.loads(out.splitlines()[-1]) for out, _ in outs]
    after = _pauses()
    assert set(after) == set(before) and all(p[1:] == ("review-v3", p[2], "pending") for p in after.values())
    # Each case re-paused exactly once over all three runs: no duplicate pause, no gap.
    assert sum(s["rebegun"] for s in summaries) == 3 - len(moved)
    assert WorkflowCheckpoint.objects.count() == checkpoints + 3
    for case in cases:
        result = decision_record(case=case, operation_id=_op(case), approved=True, reviewer=reviewer, channel="t")
        assert result.outcome == Outcome.COMMITTED
    assert EffectRecord.objects.count() == 3


def test_approvals_racing_a_drain_commit_once_and_only_on_the_new_pause(spawn, reviewer):
    """Four reviewers keep approving while a drain runs in another process: each attempt is
    refused as incompatible (before the case moved) or resumes the new pause; one commits."""
    import threading
    import time

    from django.db import connection

    from core.errors import CaseBusy

    case = _begin("t1042.json")
    op = _op(case)
    PendingReview.objects.update(workflow_version="review-v1")
    old_checkpoint = PendingReview.objects.get().checkpoint_id
    outcomes: list[str] = []
    checkpoints: set[str] = set()
    errors: list[BaseException] = []
    start = threading.Barrier(5)

    def approve():
        try:
            start.wait()
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                try:
                    result = decision_record(case=case, operation_id=op, approved=True, reviewer=reviewer, channel="t")
                except (WorkflowIncompatible, CaseBusy):
                    outcomes.append("refused")
                    time.sleep(0.02)
                    continue
                outcomes.append(result.outcome)
                checkpoints.add(result.checkpoint_id)
                return
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=approve) for _ in range(4)]
    for thread in threads:
        thread.start()
    start.wait()
    drain = spawn("drain_workflow", "--apply")
    out, err = drain.communicate(timeout=120)
    for thread in threads:
        thread.join(120)
    assert drain.returncode == 0 and "re-begun 1 of 1" in out, (out, err)
    assert not errors, errors
    assert len(outcomes) > 4  # the drain started after the approvals: some were refused first
    assert sorted(o for o in outcomes if o != "refused") == [Outcome.COMMITTED] + [Outcome.REPLAY] * 3
    assert old_checkpoint not in checkpoints and checkpoints == {PendingReview.objects.get().checkpoint_id}
    assert EffectRecord.objects.filter(operation_id=op).count() == 1 and ReviewDecision.objects.count() == 1
