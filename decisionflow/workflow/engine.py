"""The review workflow on agent-framework: its executors and its graph.

Graph: ``prepare`` -> ``human-review-v1`` -> ``commit``.

- ``prepare`` builds the proposal through ``proposal_create`` and computes its operation
  identity once.
- ``human-review-v1`` asks for a decision with a typed ``request_info``: the request (a
  plain dict) carries the case and the operation identity, the response (a plain dict) is
  the decision. The request ID is derived from the operation identity, so a re-emitted
  request names the operation twice over.
- ``commit`` calls the review core's ``effect_commit``. It is the only step with a side
  effect, and it yields the receipt as the workflow's output.

Every message is a plain dict, so checkpoints are JSON only (see ``checkpoints.py``). The
host functions that drive the graph are in ``services.py``.
"""

from typing import Never

from agent_framework import Executor, WorkflowBuilder, WorkflowContext, WorkflowRunState, handler, response_handler
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from cases.models import Case
from decisionflow.core import identity
from decisionflow.core.faults import LostReceipt, crash_point
from effects.services import effect_commit
from reviews.services import proposal_create

from .checkpoints import DatabaseCheckpointStorage

# The workflow's own version. It is recorded with every pending review, and a pending review
# from another version is never resumed by this code. Bump it whenever a message's shape or
# an executor's meaning changes: the engine's graph hash covers neither.
WORKFLOW_VERSION = "review-v2"
WORKFLOW_NAME = "decisionflow-review"

PREPARE_ID = "prepare"
HUMAN_REVIEW_ID = "human-review-v1"
COMMIT_ID = "commit"

FAULT_LOSE_RECEIPT = "lose-receipt"
FAULTS = (FAULT_LOSE_RECEIPT,)

_STATUS_NAMES = {
    WorkflowRunState.IDLE_WITH_PENDING_REQUESTS: "PendingRequests",
    WorkflowRunState.IDLE: "Idle",
    WorkflowRunState.FAILED: "Failed",
    WorkflowRunState.CANCELLED: "Cancelled",
    WorkflowRunState.IN_PROGRESS: "InProgress",
    WorkflowRunState.IN_PROGRESS_PENDING_REQUESTS: "InProgressPendingRequests",
    WorkflowRunState.STARTED: "Started",
}


def status_name(state) -> str:
    return _STATUS_NAMES.get(state, str(state))


def review_request_id(operation_id: str) -> str:
    """The stable request ID of the human step: the operation identity is in it."""
    return f"review:{operation_id}"


# --- executors --------------------------------------------------------------------------


def _prepare_sync(message: dict) -> dict:
    case = Case.objects.get(pk=message["case_pk"])
    actor_pk = message.get("actor_pk")
    actor = get_user_model().objects.filter(pk=actor_pk).first() if actor_pk else None
    proposal = proposal_create(case=case, author=actor)
    # Issue 7: killed after the proposal is written, before anything records a pending review.
    crash_point("begin-after-proposal")
    return {
        "case_pk": case.pk,
        "case_id": case.case_id,
        "proposal_pk": proposal.pk,
        "operation_id": proposal.operation_id,
        "session_id": message["session_id"],
        "workflow_version": WORKFLOW_VERSION,
    }


class Prepare(Executor):
    def __init__(self):
        super().__init__(id=PREPARE_ID)

    @handler
    async def prepare(self, message: dict, ctx: WorkflowContext[dict]) -> None:
        await ctx.send_message(await sync_to_async(_prepare_sync, thread_sensitive=True)(message))


class HumanReview(Executor):
    def __init__(self):
        super().__init__(id=HUMAN_REVIEW_ID)

    @handler
    async def ask(self, request: dict, ctx: WorkflowContext[dict]) -> None:
        await ctx.request_info(request, dict, request_id=review_request_id(request["operation_id"]))

    @response_handler
    async def answer(self, original_request: dict, response: dict, ctx: WorkflowContext[dict]) -> None:
        # The operation comes from the request this answer is correlated with, never from
        # the answer: a decision can only be about what was asked.
        await ctx.send_message(
            {
                "case_id": original_request["case_id"],
                "operation_id": original_request["operation_id"],
                "approved": response.get("approved"),
                "reviewer_pk": response.get("reviewer_pk"),
                "channel": response.get("channel") or "workflow",
            }
        )


def _commit_sync(decision: dict, fault: str | None) -> dict:
    pk = decision.get("reviewer_pk")
    reviewer = get_user_model().objects.filter(pk=pk).first() if pk is not None else None
    result = effect_commit(
        operation_id=decision["operation_id"],
        approved=decision["approved"],
        reviewer=reviewer,
        channel=decision["channel"],
    )
    if fault == FAULT_LOSE_RECEIPT:
        # The transaction is durable by now; only the receipt goes missing.
        raise LostReceipt(f"the receipt for {identity.short(decision['operation_id'])} was lost after commit")
    return {
        "status": result.status,
        "replay": result.replay,
        "effect_count": result.effect_count,
        "operation_id": result.operation_id,
        "decision_pk": result.decision.pk if result.decision is not None else None,
    }


class Commit(Executor):
    def __init__(self, fault: str | None = None, writer=None):
        super().__init__(id=COMMIT_ID)
        # Host-side only, never part of a message or a checkpoint: the test fault, and the
        # effect writer (always ``effect_commit``, except in the demo's naive-key control).
        self._fault = fault
        self._writer = writer or _commit_sync

    @handler
    async def commit(self, decision: dict, ctx: WorkflowContext[Never, dict]) -> None:
        await ctx.yield_output(await sync_to_async(self._writer, thread_sensitive=True)(decision, self._fault))


def build_workflow(storage: DatabaseCheckpointStorage, *, fault: str | None = None, writer=None):
    prepare, review, commit = Prepare(), HumanReview(), Commit(fault, writer)
    return (
        WorkflowBuilder(name=WORKFLOW_NAME, start_executor=prepare, checkpoint_storage=storage)
        .add_edge(prepare, review)
        .add_edge(review, commit)
        .build()
    )


def graph_signature_hash() -> str:
    return build_workflow(DatabaseCheckpointStorage()).graph_signature_hash
