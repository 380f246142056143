"""Answer: restore the bound pause checkpoint and answer its request, in one engine run."""

from __future__ import annotations

from typing import Any

from agent_framework import WorkflowCheckpoint as EngineCheckpoint
from agent_framework.exceptions import WorkflowCheckpointException

from core import identity
from core.errors import DecisionflowError, OutcomeUncertain, WorkflowIncompatible
from effects.services import CommitResult
from engine.checkpoints import BoundCheckpoint
from engine.driver import run_on_caller
from engine.graph import Answer, resume_workflow, review_request_id, run_workflow, status_name
from engine.messages import conform


def _jsonable(value: Any) -> Any:
    """The decision as the response message carries it. Non-JSON values become their repr,
    so the review core still sees (and refuses, and records) a non-boolean."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def answer(
    checkpoint: EngineCheckpoint,
    *,
    operation_id: str,
    approved,
    reviewer,
    channel: str,
    fault,
    decline_reason: str | None = None,
    decline_note: str | None = None,
) -> CommitResult:
    """Restore the bound checkpoint and answer its request: one engine run, one crossing."""
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
    with resume_workflow(answer) as workflow:
        try:
            run = run_on_caller(
                run_workflow,
                workflow,
                checkpoint_id=checkpoint.checkpoint_id,
                responses={review_request_id(operation_id): response},
                checkpoint_storage=BoundCheckpoint(checkpoint),
            )
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
        failures = [event for event in run if event.type in ("executor_failed", "failed")]
        if failures or answer.result is None or len(run.get_outputs()) != 1:
            if not answer.commit_started:
                raise WorkflowIncompatible(
                    f"resume: the answered run of checkpoint {checkpoint.checkpoint_id} ended "
                    f"{status_name(run.get_final_state())} before the commit step; nothing was written"
                )
            # Silence is not success.
            raise OutcomeUncertain(
                f"outcome uncertain: the answered run ended {status_name(run.get_final_state())} without a receipt; "
                f"run `manage.py reconcile` to see whether {short} committed",
                operation_id=operation_id,
            )
        return answer.result
