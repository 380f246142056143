"""Answer: restore the bound pause checkpoint and answer its request, in one engine run."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from agent_framework import WorkflowCheckpoint as EngineCheckpoint
from agent_framework.exceptions import WorkflowCheckpointException

from core import identity
from core.errors import DecisionflowError, OutcomeUncertain, WorkflowIncompatible
from effects.services import CommitResult
from effects.store import ReadAhead, read_ahead
from engine.checkpoints import BoundCheckpoint
from engine.driver import hosted
from engine.graph import Answer, resume_workflow, review_request_id, run_workflow, status_name
from engine.messages import conform


def _jsonable(value: Any) -> Any:
    """The decision as the response message carries it. Non-JSON values become their repr,
    so the review core still sees (and refuses, and records) a non-boolean."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


@dataclass
class CommitStep:
    """The answered run's commit step, waiting for its write while the engine's loop is stopped.

    ``write()`` is ``effect_commit`` with the arguments the step took from the answered
    request, in the step's own context; the caller makes it and hands its receipt back with
    ``made``, and the run goes on to its end as the ``answering`` block ends.
    """

    write: Callable[[], CommitResult]
    receipt: CommitResult | None = None

    def made(self, receipt: CommitResult) -> CommitResult:
        self.receipt = receipt
        return receipt


@contextmanager
def answering(
    checkpoint: EngineCheckpoint,
    *,
    operation_id: str,
    approved,
    reviewer,
    channel: str,
    fault,
    decline_reason: str | None = None,
    decline_note: str | None = None,
    ahead: ReadAhead | None = None,
) -> Iterator[CommitStep]:
    """Restore the bound checkpoint and answer its request, in one engine run, up to the
    commit step's write, which the block makes (``step.made(step.write())``): so the write
    runs on the decision service's own stack, under its frame, and the route of an approval
    is the decision service, the review core and its store. A failure once the commit step
    has started is ``OutcomeUncertain``; silence is not success. ``ahead``: the commit's read,
    made with the pending review (``pending_with_checkpoint``), taken by the commit step's write."""
    answer = Answer(reviewer=reviewer, fault=fault)
    response = conform(
        "response",
        {
            "approved": _jsonable(approved),
            "reviewer_pk": getattr(reviewer, "pk", None) if getattr(reviewer, "is_authenticated", False) else None,
            "channel": str(channel)[:20],
            "decline_reason": decline_reason,
            "decline_note": decline_note,
        },
    )
    short = identity.short(operation_id)
    # The thread's resume workflow (a fresh one after any failure): see engine.resume_workflow.
    with resume_workflow(answer) as workflow, read_ahead(ahead):
        try:
            with hosted(
                run_workflow,
                workflow,
                checkpoint_id=checkpoint.checkpoint_id,
                responses={review_request_id(operation_id): response},
                checkpoint_storage=BoundCheckpoint(checkpoint),
            ) as run:
                call = run.next_call()
                while call is not None and not answer.commit_started:
                    call.make()
                    call = run.next_call()
                if call is not None:
                    step = CommitStep(write=call.run)
                    try:
                        yield step
                    except BaseException as exc:  # noqa: BLE001 - handed to the commit step, as if raised there
                        call.raised(exc)
                    else:
                        call.returned(step.receipt)
                result = run.finish()
        except DecisionflowError:
            # Refusals of the review core (stale, not a boolean, no permission, busy) are raised
            # before its transaction writes; it recorded the attempt. OutcomeUncertain passes too.
            raise
        except WorkflowCheckpointException as exc:
            raise WorkflowIncompatible(
                f"resume: checkpoint {checkpoint.checkpoint_id} cannot be restored: {exc}"
            ) from exc
        except Exception as exc:
            if answer.commit_started:
                raise OutcomeUncertain(
                    f"outcome uncertain: the commit step failed after it may have written ({type(exc).__name__}); "
                    f"run `manage.py reconcile` to see whether {short} committed",
                    operation_id=operation_id,
                    error=f"{type(exc).__name__}: {exc}",
                ) from exc
            raise WorkflowIncompatible(
                f"resume: checkpoint {checkpoint.checkpoint_id} could not be restored and answered "
                f"({type(exc).__name__}: {exc}); the commit step did not run"
            ) from exc
        failures = [event for event in result if event.type in ("executor_failed", "failed")]
        if failures or answer.result is None or len(result.get_outputs()) != 1:
            if not answer.commit_started:
                raise WorkflowIncompatible(
                    f"resume: the answered run of checkpoint {checkpoint.checkpoint_id} ended "
                    f"{status_name(result.get_final_state())} before the commit step; nothing was written"
                )
            # Silence is not success.
            raise OutcomeUncertain(
                f"outcome uncertain: the answered run ended {status_name(result.get_final_state())} without a receipt; "
                f"run `manage.py reconcile` to see whether {short} committed",
                operation_id=operation_id,
            )
        if call is None:
            # The run made the write without handing it to this host: a bridge that makes its
            # steps' calls itself (bench/driver.py's asgiref) did, inside the run.
            yield CommitStep(write=functools.partial(getattr, answer, "result"))
