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
host functions that drive the graph are ``workflow/begin.py`` and ``workflow/answer.py``.
"""

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Never

from agent_framework import Executor, WorkflowBuilder, WorkflowContext, WorkflowRunState, handler, response_handler
from django.db import OperationalError, connection

from cases.models import Case
from core import identity
from core.faults import LostReceipt, crash_point
from effects.services import CommitResult, effect_commit
from engine.driver import on_caller
from engine.messages import conform, graph_fingerprint
from engine.names import COMMIT_ID, EDGES, HUMAN_REVIEW_ID, PREPARE_ID, WORKFLOW_NAME, WORKFLOW_VERSION  # noqa: F401 - re-exported
from reviews.models import Proposal
from reviews.services import proposal_create

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


@dataclass
class Begin:
    """What the host hands the prepare step of one begin run, outside every message."""

    case: Case
    actor: Any = None
    # A case's first begin: the proposal the host built and writes with the pause after the
    # run (workflow/store.py). The prepare step then asks about it as it is, with no database
    # work of its own.
    proposal: Proposal | None = None


def _prepare_sync(message: dict, begin: Begin | None) -> dict:
    # The host's own case object when it is the one the message names (no second read).
    case = begin.case if begin is not None and begin.case.pk == message["case_pk"] else None
    if case is None:
        case = Case.objects.get(pk=message["case_pk"])
    # The pipeline prepared it: no human author, whoever began the review (the pending
    # review records who began it, and through which channel).
    proposal = proposal_create(case=case)
    return _review_request(message, case, proposal)


def _review_request(message: dict, case: Case, proposal: Proposal) -> dict:
    # Killed once the proposal is made (written, or on a case's first begin
    # built to be written with the pause), before anything records a pending review.
    crash_point("begin-after-proposal")
    return conform(
        "request",
        {
            "case_pk": case.pk,
            "case_id": case.case_id,
            "proposal_pk": proposal.pk,
            "operation_id": proposal.operation_id,
            "session_id": message["session_id"],
            "workflow_version": WORKFLOW_VERSION,
            # Signed with the pause checkpoint: the graph this pause was taken by.
            "graph_fingerprint": graph_fingerprint(),
        },
    )


class Prepare(Executor):
    def __init__(self, begin: Begin | None = None):
        super().__init__(id=PREPARE_ID)
        self._begin = begin

    @handler
    async def prepare(self, message: dict, ctx: WorkflowContext[dict]) -> None:
        begin = self._begin
        if begin is not None and begin.proposal is not None and begin.case.pk == message["case_pk"]:
            # Built by the host: nothing to read or write, so no crossing to the caller's thread.
            await ctx.send_message(_review_request(message, begin.case, begin.proposal))
            return
        await ctx.send_message(await on_caller(_prepare_sync, message, begin))


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
            conform(
                "commit",
                {
                    "case_id": original_request["case_id"],
                    "operation_id": original_request["operation_id"],
                    "approved": response.get("approved"),
                    "reviewer_pk": response.get("reviewer_pk"),
                    "channel": response.get("channel") or "workflow",
                    "decline_reason": response.get("decline_reason"),
                    "decline_note": response.get("decline_note"),
                },
            )
        )


FAULT_LOSE_RECEIPT = "lose-receipt"
FAULT_LOSE_CONNECTION = "lose-connection"
FAULTS = (FAULT_LOSE_RECEIPT, FAULT_LOSE_CONNECTION)


@dataclass
class Answer:
    """What the host hands the commit step of one answered run, outside every message.

    The reviewer object is the one the channel authenticated (its permission cache already
    filled), so the commit looks nobody up again; the receipt comes back as the object the
    review core returned, never packed into a dict and rebuilt. None of this reaches a
    message or a checkpoint.
    """

    reviewer: Any
    fault: str | None = None
    commit_started: bool = False
    result: CommitResult | None = None


def _lose_connection() -> None:
    """Test fault: the connection dropped right after COMMIT, before the answer came back.

    The session ends (so PostgreSQL releases its advisory locks, as it would for a real
    network failure) and the caller gets the error a lost connection gives.
    """
    connection.close()
    raise OperationalError("the connection to the database was lost after the commit")


# The answer of the run in progress, for a commit step built without one (the thread's
# reused resume workflow, ``resume_workflow``). Each run's task copies the context it was
# started in, so a run only ever sees its own answer.
_ANSWER: contextvars.ContextVar[Answer | None] = contextvars.ContextVar("decisionflow_answer", default=None)


class Commit(Executor):
    def __init__(self, answer: Answer | None = None):
        super().__init__(id=COMMIT_ID)
        self._answer = answer

    def current_answer(self) -> Answer | None:
        """The answer of the run in progress: the one this step was built with, or the run's own."""
        return self._answer if self._answer is not None else _ANSWER.get()

    @handler
    async def commit(self, decision: dict, ctx: WorkflowContext[Never, dict]) -> None:
        answer = self.current_answer()
        if answer is None:
            raise RuntimeError("the commit step ran without an answer from the host")
        reviewer = answer.reviewer
        if getattr(reviewer, "pk", None) != decision.get("reviewer_pk"):
            # The answer names a reviewer other than the one the channel authenticated.
            reviewer = None
        # From here on a failure may come after the commit statement ran: the host reports
        # it as an uncertain outcome, never as a refusal.
        answer.commit_started = True
        result = await on_caller(
            effect_commit,
            operation_id=decision["operation_id"],
            approved=decision["approved"],
            reviewer=reviewer,
            channel=decision["channel"],
            decline_reason=decision.get("decline_reason"),
            decline_note=decision.get("decline_note"),
        )
        if answer.fault == FAULT_LOSE_RECEIPT:
            # The transaction is durable by now; only the receipt goes missing.
            raise LostReceipt(f"the receipt for {identity.short(decision['operation_id'])} was lost after commit")
        if answer.fault == FAULT_LOSE_CONNECTION:
            await on_caller(_lose_connection)
        answer.result = result
        await ctx.yield_output(conform("output", result.receipt()))


def build_workflow(*, begin: Begin | None = None, answer: Answer | None = None, checkpoint_storage=None):
    """The graph; ``begin`` and ``checkpoint_storage`` for a begin run, ``answer`` for a resume."""
    prepare, review, commit = Prepare(begin), HumanReview(), Commit(answer)
    return (
        WorkflowBuilder(name=WORKFLOW_NAME, start_executor=prepare, checkpoint_storage=checkpoint_storage)
        .add_edge(prepare, review)
        .add_edge(review, commit)
        .build()
    )


_RESUME = threading.local()  # each thread's resume workflow, and whether a resume is using it


@contextmanager
def resume_workflow(answer: Answer) -> Iterator[Any]:
    """The workflow for one answered run, whose commit step will use ``answer``.

    Building the graph (each executor's handler discovery, the builder's validation, the
    graph signature) is the largest fixed cost of a resume, so each thread keeps its resume
    workflow for the next one. That is safe because an answered run starts by restoring its
    bound checkpoint, which replaces everything a run keeps (shared state, executor and edge
    states, messages in flight, pending requests, events); the answer itself is never stored
    on the workflow. A run that raises, in the engine or in the host's checks of its result
    (inside this block), drops the workflow, so the next resume builds a fresh one; a resume
    nested in another's commit builds its own.
    """
    outer = getattr(_RESUME, "busy", False)
    cached = None if outer else getattr(_RESUME, "workflow", None)
    workflow = cached if cached is not None else build_workflow()
    _RESUME.busy, _RESUME.workflow = True, None
    token = _ANSWER.set(answer)
    try:
        yield workflow
    except BaseException:
        workflow = None
        raise
    finally:
        _ANSWER.reset(token)
        _RESUME.busy = outer
        if not outer:
            _RESUME.workflow = workflow


def _built_edges(workflow) -> tuple[tuple[str, str], ...]:
    # The engine adds an ``internal:<id>`` edge into every executor (its own plumbing).
    return tuple(
        (edge.source_id, edge.target_id)
        for group in workflow.edge_groups
        for edge in group.edges
        if not edge.source_id.startswith("internal:")
    )


# The graph never changes within a process; its hash is computed once.
_GRAPH = build_workflow()
GRAPH_SIGNATURE_HASH = _GRAPH.graph_signature_hash
# The fingerprint (messages.py) is computed from names.EDGES without building the graph; the
# graph must be wired exactly so, or the fingerprint would describe another graph.
if sorted(_built_edges(_GRAPH)) != sorted(EDGES):
    raise RuntimeError(f"build_workflow wires {_built_edges(_GRAPH)}, names.EDGES declares {EDGES}: make them agree")
del _GRAPH


async def run_workflow(workflow, **kwargs):
    """``workflow.run`` as a coroutine function, for ``driver.hosted`` and ``driver.run_on_caller``."""
    return await workflow.run(**kwargs)
