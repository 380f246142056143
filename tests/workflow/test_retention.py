"""Checkpoint retention (reviews/retention.py, `manage.py prune_checkpoints`) and fast cron start."""

from __future__ import annotations

import html
import re
import signal
import subprocess
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from core.errors import ConflictingDecision, InvalidInput, LockBusy
from core.locks import cron_lock
from reviews.models import PendingReview, WorkflowCheckpoint
from reviews.retention import checkpoints_prune, parse_window
from tests.conftest import held_elsewhere, load_fixture
from tests.workflow.conftest import child_env, manage_argv

WINDOW = timedelta(days=30)
OLD = timedelta(days=40)


def _case(case_id: str):
    from cases.services import case_import

    return case_import(data={**load_fixture("t1042.json"), "case_id": case_id}).case


def _begun(case_id: str):
    from workflow.begin import review_begin

    case = _case(case_id)
    begun = review_begin(case=case)
    case.refresh_from_db()
    return case, begun.pending_review


def _approve(case, operation_id, reviewer, approved=True):
    from workflow.decide import decision_record

    return decision_record(case=case, operation_id=operation_id, approved=approved, reviewer=reviewer, channel="test")


def _age(*, checkpoints=None, reviews=None):
    """Move rows back in time, as if they were written 40 days ago."""
    then = timezone.now() - OLD
    (checkpoints if checkpoints is not None else WorkflowCheckpoint.objects.all()).update(created_at=then)
    if reviews is not None:
        reviews.update(updated_at=then)


def _orphans(n: int) -> list[str]:
    """Checkpoint rows no pending review points at (pauses that begin replaced)."""
    ids = [f"orphan-{i}" for i in range(n)]
    WorkflowCheckpoint.objects.bulk_create(
        WorkflowCheckpoint(checkpoint_id=i, workflow_name="w", graph_signature_hash="g", payload="{}", digest="d" * 64)
        for i in ids
    )
    _age(checkpoints=WorkflowCheckpoint.objects.filter(checkpoint_id__in=ids))
    return ids


def _ids() -> set[str]:
    return set(WorkflowCheckpoint.objects.values_list("checkpoint_id", flat=True))


@pytest.mark.django_db
def test_pruning_keeps_what_recovery_needs_and_nothing_else(reviewer, editor, lead):
    from core.outcomes import DecisionOutcome as Outcome
    from workflow.edit import review_edit

    decided, decided_pr = _begun("T-3001")  # approved 40 days ago: its pause goes
    _approve(decided, decided_pr.operation_id, reviewer)
    edited, superseded_pr = _begun("T-3002")  # edited 40 days ago: the old pause goes, the new stays
    edit = review_edit(
        case=edited,
        expected_operation_id=superseded_pr.operation_id,
        body=edited.current_proposal.body + "\nEdited.",
        editor=editor,
    )
    live_pr = edit.begun.pending_review
    waiting, waiting_pr = _begun("T-3003")  # pending for 40 days: kept whatever its age
    recent, recent_pr = _begun("T-3004")  # decided yesterday: kept for the window after its decision
    _approve(recent, recent_pr.operation_id, reviewer)
    _age(reviews=PendingReview.objects.exclude(case=recent))
    orphans = _orphans(3)
    before = _ids()
    gone = {decided_pr.checkpoint_id, superseded_pr.checkpoint_id, *orphans}
    kept = {live_pr.checkpoint_id, waiting_pr.checkpoint_id, recent_pr.checkpoint_id}
    assert before == gone | kept

    dry = checkpoints_prune(older_than=WINDOW)
    assert (dry.applied, dry.rows, dry.kept_for_pending) == (False, len(gone), 2)
    assert _ids() == before  # the dry run wrote nothing

    done = checkpoints_prune(older_than=WINDOW, batch_size=2, apply=True)
    assert (done.rows, done.batches) == (len(gone), 3)
    assert _ids() == kept
    again = checkpoints_prune(older_than=WINDOW, batch_size=2, apply=True)
    assert (again.rows, again.batches) == (0, 0) and _ids() == kept

    # Every pending review still resumes from its pause.
    for case, pr in ((waiting, waiting_pr), (edited, live_pr)):
        assert _approve(case, pr.operation_id, reviewer).outcome == Outcome.COMMITTED
    # A retry of a decision whose pause was pruned is still a replay, or a conflict.
    assert _approve(decided, decided_pr.operation_id, reviewer).outcome == Outcome.REPLAY
    with pytest.raises(ConflictingDecision):
        _approve(decided, decided_pr.operation_id, reviewer, approved=False)
    # Begin on the decided case finds its review and writes no new pause.
    from workflow.begin import review_begin

    again_begun = review_begin(case=decided)
    assert (again_begun.created, again_begun.checkpoints) == (False, 0) and _ids() == kept

    # The history still shows each pause checkpoint and when it was taken.
    client = Client()
    client.force_login(lead)
    page = html.unescape(client.get(reverse("admin:cases_case_history", args=[edited.pk])).content.decode())
    for pr in PendingReview.objects.filter(case=edited):
        assert pr.checkpoint_at is not None
        assert f"pause checkpoint {pr.checkpoint_id} taken" in page
    assert superseded_pr.checkpoint_id not in _ids()


@pytest.mark.django_db
def test_bad_input_is_refused_and_nothing_is_deleted():
    _orphans(2)
    for window, batch in ((timedelta(0), 10), (WINDOW, 0), (WINDOW, 10**6)):
        with pytest.raises(InvalidInput):
            checkpoints_prune(older_than=window, batch_size=batch, apply=True)
    for text in ("", "0d", "-3d", "30x", "d", "30D"):
        with pytest.raises(InvalidInput, match=f"^--older-than: {text!r} "):
            parse_window(text)
    assert (
        parse_window("30d") == WINDOW
        and parse_window("12h") == timedelta(hours=12)
        and parse_window("1.5d") == timedelta(hours=36)
        and parse_window("7") == timedelta(7)
    )
    assert WorkflowCheckpoint.objects.count() == 2


def test_prune_command_dry_run_kill_and_rerun(manage, committed_case, reviewer):
    from workflow.begin import review_begin

    pause = review_begin(case=committed_case).pending_review
    _age()
    PendingReview.objects.update(updated_at=timezone.now() - OLD)
    orphans = _orphans(5)
    everything = _ids()

    dry = manage("prune_checkpoints", "--older-than", "30d")
    assert dry.returncode == 0, dry.stderr
    assert "dry run: 5 checkpoint(s)" in dry.stdout and "1 kept as the pause of a pending review" in dry.stdout
    assert _ids() == everything

    # Killed (SIGKILL) inside the second batch: the first batch stays deleted, the second rolls back.
    killed = manage(
        "prune_checkpoints", "--older-than", "30d", "--apply", "--batch-size", "2",
        DECISIONFLOW_CRASH_AT="prune-checkpoints-batch-2",
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
    assert len(_ids()) == len(everything) - 2 and pause.checkpoint_id in _ids()

    rerun = manage("prune_checkpoints", "--older-than", "30d", "--apply", "--batch-size", "2")
    assert rerun.returncode == 0, rerun.stderr
    assert "deleted 3 checkpoint(s)" in rerun.stdout
    assert _ids() == {pause.checkpoint_id} and not set(orphans) & _ids()
    twice = manage("prune_checkpoints", "--older-than", "30d", "--apply")
    assert twice.returncode == 0 and "deleted 0 checkpoint(s)" in twice.stdout
    assert _ids() == {pause.checkpoint_id}


def test_one_prune_at_a_time(manage):
    _orphans(1)
    with held_elsewhere(lambda: cron_lock("prune_checkpoints")):
        busy = manage("prune_checkpoints", "--older-than", "30d", "--apply")
        with pytest.raises(LockBusy):
            checkpoints_prune(older_than=WINDOW, apply=True)
    assert busy.returncode == 1 and "prune_checkpoints is locked" in busy.stderr
    assert WorkflowCheckpoint.objects.count() == 1


def _imports(*argv: str) -> subprocess.CompletedProcess:
    argv_ = manage_argv(*argv)
    return subprocess.run(
        [argv_[0], "-X", "importtime", *argv_[1:]], env=child_env(), capture_output=True, text=True, timeout=120
    )


@pytest.mark.any_database
def test_cron_commands_import_no_agent_framework(transactional_db):
    """reconcile and prune_checkpoints (admin autodiscovery included) start without the engine."""
    for argv in (("reconcile", "--all"), ("prune_checkpoints", "--older-than", "30d"), ("load_case", "--help")):
        run = _imports(*argv)
        assert run.returncode == 0, (argv, run.stderr[-2000:])
        assert "| django.contrib.admin\n" in run.stderr or "django.contrib.admin" in run.stderr
        assert "agent_framework" not in run.stderr, argv
        # Nor the API's stack (django-ninja and pydantic, ~0.1 s): /api/docs needs its files, not the app.
        assert not re.search(r"\|\s+(ninja|pydantic)\b", run.stderr), argv
    # The check can fail: a command that runs the workflow does import it.
    assert "agent_framework" in _imports("resume", "--help").stderr
