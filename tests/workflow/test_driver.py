"""The engine's driver: the workflow runs on the caller's thread, and its ORM work on the
caller's connection and inside the caller's transaction, with no thread started."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction

from engine.driver import hosted, on_caller, run_on_caller
from reviews.models import PendingReview


def _where():
    return threading.get_ident(), id(connection.connection), connection.in_atomic_block


def test_sync_work_runs_on_the_callers_thread_connection_and_transaction(db):
    async def steps():
        first = await on_caller(_where)
        await asyncio.sleep(0)
        second = await asyncio.gather(on_caller(_where), on_caller(_where))  # two in one iteration
        return first, second

    threads = threading.active_count()
    connection.ensure_connection()
    with transaction.atomic():
        first, second = run_on_caller(steps)
        assert first == (threading.get_ident(), id(connection.connection), True)
        assert second == [first, first]
    assert threading.active_count() == threads  # no thread was started


def test_orm_work_between_iterations_passes_django_async_safety_check(db):
    # Django refuses ORM calls in a thread where an event loop is running
    # (SynchronousOnlyOperation): the driver runs them while its loop is stopped.
    async def count():
        return await on_caller(PendingReview.objects.count)

    assert run_on_caller(count) == 0


def test_errors_reach_the_step_that_asked_and_then_the_caller(db):
    def fails():
        raise ValueError("boom")

    async def steps():
        try:
            await on_caller(fails)
        except ValueError as exc:
            return f"caught {exc}"

    assert run_on_caller(steps) == "caught boom"

    async def uncaught():
        await on_caller(fails)

    with pytest.raises(ValueError, match="boom"):
        run_on_caller(uncaught)


def test_a_host_steps_the_run_and_makes_its_calls_on_its_own_stack(db):
    def caller_of_the_call():
        return sys._getframe(1).f_code.co_name  # the frame right under this call

    async def steps():
        first = await on_caller(caller_of_the_call)
        try:
            await on_caller(_where)
        except ValueError as exc:
            return first, str(exc)
        return first, None

    with hosted(steps) as run:
        call = run.next_call()
        assert call is not None
        call.returned(call.run())  # made here, by the host
        call = run.next_call()
        assert call is not None
        call.raised(ValueError("refused by the host"))
        assert run.next_call() is None
        assert run.finish() == ("test_a_host_steps_the_run_and_makes_its_calls_on_its_own_stack", "refused by the host")


def test_a_run_nested_in_a_sync_call_uses_its_own_loop_and_the_outer_run_goes_on(db):
    async def inner():
        return await on_caller(_where)

    async def outer():
        nested = await on_caller(run_on_caller, inner)
        return nested, await on_caller(_where)

    nested, after = run_on_caller(outer)
    assert nested[0] == after[0] == threading.get_ident()


def test_tasks_a_run_leaves_behind_are_cancelled(db):
    left: list[asyncio.Task] = []

    async def leaves_a_task():
        left.append(asyncio.get_running_loop().create_task(asyncio.sleep(3600)))
        return "done"

    assert run_on_caller(leaves_a_task) == "done"
    assert left[0].cancelled()
    assert run_on_caller(leaves_a_task) == "done"  # the thread's loop is clean for the next run


def test_refused_in_a_thread_with_a_running_loop():
    async def inside():
        run_on_caller(asyncio.sleep, 0)

    with pytest.raises(RuntimeError, match="running event loop"):
        asyncio.run(inside())


def test_outside_the_driver_on_caller_is_asgirefs_thread_sensitive_routing(db):
    async def steps():
        return await on_caller(_where)

    connection.ensure_connection()
    with transaction.atomic():
        assert async_to_sync(steps)() == (threading.get_ident(), id(connection.connection), True)


def test_a_thread_reuses_its_resume_workflow_and_drops_it_after_a_failure(case, reviewer, monkeypatch):
    """Each answered run restores its bound checkpoint, which replaces all the state a run keeps;
    the answer is the run's own (a context variable), and a run that fails leaves nothing behind."""
    from cases.services import case_import
    from engine import graph as engine
    from tests.conftest import load_fixture
    from workflow.begin import review_begin
    from workflow.decide import decision_record

    def decide(c, op):
        return decision_record(case=c, operation_id=op, approved=True, reviewer=reviewer, channel="test")

    cases = [case, case_import(data=load_fixture("t1077.json")).case]
    ops = [review_begin(case=c).operation_id for c in cases]
    third = case_import(data={**load_fixture("t1042.json"), "case_id": "T-9042"}).case
    op3 = review_begin(case=third).operation_id
    assert decide(cases[0], ops[0]).commit.operation_id == ops[0]
    reused = engine._RESUME.workflow
    assert reused is not None
    assert decide(cases[1], ops[1]).commit.operation_id == ops[1]  # another case, the same workflow
    assert engine._RESUME.workflow is reused

    def killed(**kwargs):
        raise SystemError("killed mid-commit")

    monkeypatch.setattr(engine, "effect_commit", killed)
    with pytest.raises(Exception, match="outcome uncertain"):
        decide(third, op3)
    assert engine._RESUME.workflow is None  # dropped: the next resume builds a fresh one
    monkeypatch.undo()
    assert decide(third, op3).commit.operation_id == op3
    assert engine._RESUME.workflow not in (None, reused)
