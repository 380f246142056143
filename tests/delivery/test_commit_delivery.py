"""The delivery row in the commit: written by the commit's own statement
(PostgreSQL) or transaction (SQLite), only for a new approval and only with a helpdesk
configured; a replay, a decline or a conflict writes none, and racing approvals write one."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from django_tasks import default_task_backend

from effects import services
from effects.models import Delivery, DeliveryState, EffectRecord
from effects.services import effect_commit
from reviews.models import ReviewDecision

DUMMY = {"default": {"BACKEND": "django_tasks.backends.dummy.DummyBackend"}}


@pytest.fixture
def configured(settings):
    settings.DECISIONFLOW_DELIVERY_URL = "http://127.0.0.1:9/helpdesk"
    settings.TASKS = DUMMY
    default_task_backend.clear()
    yield
    default_task_backend.clear()


def enqueued() -> list[str]:
    return [result.args[0] for result in default_task_backend.results]


def test_a_new_approval_writes_one_queued_delivery_and_enqueues_it(
    proposal, reviewer, configured, django_capture_on_commit_callbacks
):
    # The test's transaction never commits: its commit callbacks are run as it would.
    with django_capture_on_commit_callbacks(execute=True):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    delivery = Delivery.objects.get()
    effect = EffectRecord.objects.get()
    assert (delivery.operation_id, delivery.effect_id, delivery.decision_id, delivery.case_id) == (
        proposal.operation_id,
        effect.pk,
        effect.decision_id,
        proposal.case_id,
    )
    assert (delivery.state, delivery.tries, delivery.reference, delivery.lease_until) == (
        DeliveryState.QUEUED,
        0,
        "",
        None,
    )
    assert enqueued() == [proposal.operation_id]
    # The same approval again is a replay: no second row, no second enqueue.
    with django_capture_on_commit_callbacks(execute=True):
        again = effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert again.replay and Delivery.objects.count() == 1 and enqueued() == [proposal.operation_id]


def test_a_decline_and_a_conflict_write_no_delivery(proposal, reviewer, make_user, configured):
    effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=reviewer)
    effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=reviewer)
    conflict = effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=make_user("other"))
    assert conflict.status == "ConflictingDecision"
    assert Delivery.objects.count() == 0 and enqueued() == []


def test_unconfigured_nothing_changes(proposal, reviewer, settings):
    settings.DECISIONFLOW_DELIVERY_URL = ""
    settings.TASKS = DUMMY
    default_task_backend.clear()
    result = effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert result.receipt() == {"Status": "Committed", "Replay": False, "EffectCount": 1}
    assert Delivery.objects.count() == 0 and enqueued() == []


def test_the_delivery_commits_or_rolls_back_with_the_decision(proposal, reviewer, configured, monkeypatch):
    def fail_at(name):
        if name == "commit-after-decision":
            raise RuntimeError("the transaction fails after the commit statement")

    monkeypatch.setattr(services, "crash_point", fail_at)
    with pytest.raises(RuntimeError):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count(), Delivery.objects.count()) == (0, 0, 0)
    assert enqueued() == []
    monkeypatch.undo()
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert Delivery.objects.count() == 1


def test_the_repair_of_a_missing_effect_writes_its_delivery(proposal, reviewer, configured):
    from effects.services import effects_repair, operation_reconcile
    from reviews.models import ReviewDecision as Decision

    Decision.objects.create(operation_id=proposal.operation_id, proposal=proposal, approved=True, reviewer=reviewer)
    row = operation_reconcile(proposal.operation_id)
    assert row is not None and row.state == "NoLocalEffectRecorded"
    effects_repair(rows=[row], dry_run=False)
    effects_repair(rows=[row], dry_run=False)
    assert Delivery.objects.get().effect_id == EffectRecord.objects.get().pk


@pytest.mark.django_db(transaction=True)
def test_five_concurrent_approvals_write_one_delivery(proposal, reviewer, configured, monkeypatch):
    # The dummy backend keeps its results per thread: count the enqueues here instead.
    calls: list[str] = []
    monkeypatch.setattr(services, "delivery_enqueue", lambda operation_id, **_: calls.append(operation_id))
    barrier = threading.Barrier(5)
    errors: list[BaseException] = []
    results = []

    def approve():
        try:
            barrier.wait()
            results.append(effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer))
        except BaseException as exc:  # noqa: BLE001 (the test asserts there are none)
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=approve) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(r.replay for r in results) == [False, True, True, True, True]
    assert Delivery.objects.count() == 1 and EffectRecord.objects.count() == 1
    assert calls == [proposal.operation_id]
