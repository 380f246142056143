"""The review workflow on agent-framework, and the host functions that drive it.

Graph: ``prepare`` -> ``human-review-v1`` -> ``commit``.

- ``prepare`` builds the proposal through ``proposal_create`` and computes its operation
  identity once.
- ``human-review-v1`` asks for a decision with a typed ``request_info``: the request (a
  plain dict) carries the case and the operation identity, the response (a plain dict) is
  the decision. The request ID is derived from the operation identity, so a re-emitted
  request names the operation twice over.
- ``commit`` calls the review core's ``effect_commit``. It is the only step with a side
  effect, and it yields the receipt as the workflow's output.

Every message is a plain dict, so checkpoints are JSON only (see ``checkpoints.py``).

The host functions (``review_begin``, ``review_resume``, ``review_edit``) are synchronous, for
views, admin actions and commands. They drive the async engine with ``async_to_sync``; the
executors reach the ORM through ``sync_to_async(thread_sensitive=True)``, which under
``async_to_sync`` runs on the calling thread, so all database work uses the caller's
connection and transaction.

The engine is trusted for nothing it does silently (see ENGINE_NOTES.md): a checkpoint save
that fails only logs a warning, and a run can end without output or failure. So the host
checks that the pause checkpoint exists, loads and carries the request; that a resumed run
re-emits the request for exactly the recorded operation; and that an answered run produced
an output. Silence is an error, not success.
"""

import uuid
from dataclasses import dataclass
from typing import Any

from agent_framework import WorkflowRunState
from agent_framework.exceptions import WorkflowCheckpointException
from asgiref.sync import async_to_sync
from django.db import IntegrityError, transaction

from cases.models import Case
from decisionflow.core import faults, identity
from decisionflow.core.errors import (
    DecisionflowError,
    InvalidInput,
    NotFound,
    OutcomeUncertain,
    StaleProposal,
    WorkflowIncompatible,
)
from decisionflow.core.locks import case_lock
from effects.services import CommitResult, reviewer_check
from reviews.models import PendingReview, Proposal, ReviewDecision
from reviews.services import RevisionResult, proposal_revise

from .checkpoints import DatabaseCheckpointStorage
from .engine import (
    FAULT_LOSE_RECEIPT,
    FAULTS,
    WORKFLOW_VERSION,
    build_workflow,
    review_request_id,
    status_name,
)

# --- results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BeginResult:
    status: str  # "PendingRequests"
    operation_id: str
    checkpoints: int  # saved by this run, or recorded for the existing pending review
    pending_review: PendingReview
    created: bool  # False when begin found an existing pending review for this operation


@dataclass(frozen=True)
class ResumeResult:
    request_reemitted: bool
    result: CommitResult
    resumed_status: str = "PendingRequests"  # the run's state after the restore, before the answer


# --- begin ------------------------------------------------------------------------------


def _existing_begin(case: Case) -> BeginResult | None:
    case.refresh_from_db(fields=["current_proposal"])
    if case.current_proposal_id is None:
        return None
    operation_id = Proposal.objects.values_list("operation_id", flat=True).get(pk=case.current_proposal_id)
    pending = PendingReview.objects.filter(operation_id=operation_id).first()
    if pending is None:
        return None
    return BeginResult(
        status=status_name(WorkflowRunState.IDLE_WITH_PENDING_REQUESTS),
        operation_id=operation_id,
        checkpoints=DatabaseCheckpointStorage().lineage_length(pending.checkpoint_id),
        pending_review=pending,
        created=False,
    )


def _pause_is_usable(pending: PendingReview) -> bool:
    """Whether a recorded pause can be resumed: its checkpoint loads and carries the request."""
    try:
        checkpoint = DatabaseCheckpointStorage().load_sync(pending.checkpoint_id)
    except WorkflowIncompatible:
        return False
    request = checkpoint.pending_request_info_events.get(review_request_id(pending.operation_id))
    return request is not None and request.data.get("operation_id") == pending.operation_id


async def _begin_run(message: dict):
    storage = DatabaseCheckpointStorage()
    workflow = build_workflow(storage)
    try:
        result = await workflow.run(message)
    except DecisionflowError:
        raise
    except Exception as exc:
        raise DecisionflowError(f"begin: the workflow failed in prepare: {type(exc).__name__}: {exc}") from exc
    requests = result.get_request_info_events()
    state = result.get_final_state()
    pause = None
    if requests:
        pause = await workflow.resolve_pause_checkpoint_id([r.request_id for r in requests])
    return storage, state, requests, pause


def _begin_locked(case: Case, actor) -> BeginResult:
    existing = _existing_begin(case)
    if (
        existing is not None
        and existing.pending_review.workflow_version == WORKFLOW_VERSION
        and _pause_is_usable(existing.pending_review)
    ):
        if existing.pending_review.status == PendingReview.Status.SUPERSEDED:
            # An edit came back to this very operation (e.g. the text was restored): it is
            # the current proposal again, so its pause is live again.
            PendingReview.objects.filter(pk=existing.pending_review.pk).update(status=PendingReview.Status.PENDING)
            existing.pending_review.refresh_from_db()
        return existing

    session_id = f"ws-{uuid.uuid4().hex}"
    message = {"case_pk": case.pk, "actor_pk": getattr(actor, "pk", None), "session_id": session_id}
    storage, state, requests, pause = async_to_sync(_begin_run)(message)
    # `prepare` worked on its own copy of the case; show the caller where it points now.
    case.refresh_from_db(fields=["current_proposal"])

    if state != WorkflowRunState.IDLE_WITH_PENDING_REQUESTS or len(requests) != 1:
        raise DecisionflowError(
            f"begin: the workflow ended {status_name(state)} with {len(requests)} review request(s) instead of "
            "pausing at human-review-v1; nothing was recorded"
        )
    request = requests[0]
    operation_id = request.data.get("operation_id")
    if request.request_id != review_request_id(operation_id):
        raise DecisionflowError(f"begin: unexpected review request {request.request_id!r}; nothing was recorded")

    # The engine only logs a warning when a checkpoint save fails, so prove the pause is
    # durable: it must be the last checkpoint this run saved, load (digest and all) and
    # carry the request for this operation.
    if pause is None or not storage.saved or storage.saved[-1] != pause:
        raise WorkflowIncompatible(
            f"begin: the pause checkpoint for case {case.case_id} was not saved (the engine only logged a "
            "warning); no pending review was recorded, run begin again"
        )
    loaded = storage.load_sync(pause)
    stored_request = loaded.pending_request_info_events.get(request.request_id)
    if stored_request is None or stored_request.data.get("operation_id") != operation_id:
        raise WorkflowIncompatible(
            f"begin: the pause checkpoint {pause} does not carry the review request for "
            f"{identity.short(operation_id)}; no pending review was recorded"
        )

    fields = {
        "workflow_session_id": session_id,
        "checkpoint_id": pause,
        "workflow_version": WORKFLOW_VERSION,
    }
    if existing is not None:
        # The operation's pending review was recorded by another workflow version, or its
        # checkpoint is gone or refused (the refused row stays, as evidence): this run
        # replaces where it waits. A decision already made stays made: the review core
        # turns a second approval into a replay.
        PendingReview.objects.filter(pk=existing.pending_review.pk).update(
            status=PendingReview.Status.PENDING, **fields
        )
        existing.pending_review.refresh_from_db()
        return BeginResult(status_name(state), operation_id, len(storage.saved), existing.pending_review, True)
    try:
        with transaction.atomic():
            pending = PendingReview.objects.create(
                case=case,
                proposal_id=request.data["proposal_pk"],
                operation_id=operation_id,
                **fields,
            )
    except IntegrityError:
        # Another process recorded this operation first (the lock makes that rare).
        raced = _existing_begin(case)
        if raced is None:
            raise
        return raced
    return BeginResult(status_name(state), operation_id, len(storage.saved), pending, True)


def review_begin(*, case: Case, actor=None) -> BeginResult:
    """Run ``prepare`` and pause at ``human-review-v1``; record the pending review.

    Invariant: one pending review per operation. Begin for a case that is already pending
    on its current operation reports that pending review and writes nothing, unless that
    pause cannot be resumed (another workflow version, a missing or refused checkpoint):
    then it pauses again and moves the pending review to the new checkpoint. Raises
    ``WorkflowIncompatible`` if the pause checkpoint was not durably saved (then no pending
    review is recorded). Holds the case lock for the whole run.
    """
    with case_lock(case.case_id):
        return _begin_locked(case, actor)


# --- resume -----------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """The decision as the response message carries it. Non-JSON values become their repr,
    so the review core still sees (and refuses, and records) a non-boolean."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


async def _resume_run(workflow, pending: PendingReview, case_id: str, response: dict):
    operation_id = pending.operation_id
    try:
        first = await workflow.run(checkpoint_id=pending.checkpoint_id)
    except WorkflowCheckpointException as exc:
        cause = exc.__cause__
        if isinstance(cause, DecisionflowError):
            raise cause from None
        raise WorkflowIncompatible(f"resume: checkpoint {pending.checkpoint_id} cannot be restored: {exc}") from exc

    requests = first.get_request_info_events()
    wanted = review_request_id(operation_id)
    carried = [r.data.get("operation_id") if isinstance(r.data, dict) else None for r in requests]
    if (
        len(requests) != 1
        or requests[0].request_id != wanted
        or carried[0] != operation_id
        or requests[0].data.get("case_id") != case_id
    ):
        raise StaleProposal(
            f"stale: the request re-emitted from checkpoint {pending.checkpoint_id} carries "
            f"{', '.join(identity.short(str(c)) for c in carried) or 'no operation'}, not the recorded "
            f"{identity.short(operation_id)}; nothing was answered"
        )
    if requests[0].data.get("workflow_version") != WORKFLOW_VERSION:
        raise WorkflowIncompatible(
            f"incompatible workflow version: checkpoint {pending.checkpoint_id} holds a request of workflow "
            f"{requests[0].data.get('workflow_version')!r}, this is {WORKFLOW_VERSION}; nothing was answered"
        )
    resumed = {"resumed_status": status_name(first.get_final_state()), "request_reemitted": True}

    try:
        second = await workflow.run(responses={wanted: response})
    except DecisionflowError as exc:
        # A refusal from the review core (stale, not a boolean, no permission): it wrote no
        # decision and no effect, and recorded the attempt.
        exc.details.update(resumed)
        raise
    except Exception as exc:
        raise OutcomeUncertain(
            f"executor failed: {type(exc).__name__}",
            operation_id=operation_id,
            error=f"{type(exc).__name__}: {exc}",
            **resumed,
        ) from exc

    failures = [e for e in second if e.type in ("executor_failed", "failed")]
    if failures:
        raise OutcomeUncertain(f"executor failed: {failures[0].type}", operation_id=operation_id, **resumed)
    outputs = second.get_outputs()
    if len(outputs) != 1 or not isinstance(outputs[0], dict):
        raise OutcomeUncertain(
            f"resume: the answered run ended {status_name(second.get_final_state())} with "
            f"{len(outputs)} output(s) and no failure; silence is not success. Run "
            f"`manage.py reconcile` to see whether {identity.short(operation_id)} committed",
            operation_id=operation_id,
            **resumed,
        )
    return resumed, outputs[0]


def review_resume(
    *,
    case: Case,
    operation_id: str,
    approved: bool,
    reviewer,
    channel: str = "command",
    fault: str | None = None,
) -> ResumeResult:
    """Resume the recorded pause of ``operation_id`` in this process and answer it.

    Checks, in order: a pending review exists for this case and operation (``NotFound``,
    or ``StaleProposal`` when the operation is an older proposal of the case); it was
    recorded by this ``WORKFLOW_VERSION`` and its checkpoint loads intact
    (``WorkflowIncompatible``); the re-emitted request carries exactly the recorded
    operation (``StaleProposal``). The answer then goes to the review core, which refuses
    a non-boolean, a reviewer without permission, or an operation that is no longer
    current, and records every attempt. ``ConflictingDecision`` comes back as a result.
    A failed commit step, or a run that ends without output, is ``OutcomeUncertain``: the
    receipt is missing, and only reconcile can say what happened.

    The same pause can be resumed any number of times; the effect is written once.
    """
    return resume_with(
        case=case, operation_id=operation_id, approved=approved, reviewer=reviewer, channel=channel, fault=fault
    )


def resume_with(*, case, operation_id, approved, reviewer, channel, fault, writer=None) -> ResumeResult:
    """``review_resume`` with a replaceable effect writer: only the demo's naive-key control
    passes one, so that it runs the very same resume path with a different key."""
    if fault is not None:
        if fault not in FAULTS:
            raise InvalidInput(f"unknown fault {fault!r}; the only fault is {FAULT_LOSE_RECEIPT}")
        if not faults.enabled():
            raise InvalidInput(f"--fault {fault} is accepted only when DECISIONFLOW_FAULT_INJECTION=1")

    with case_lock(case.case_id):
        pending = PendingReview.objects.filter(case=case, operation_id=str(operation_id)).first()
        if pending is None:
            older = Proposal.objects.filter(case=case, operation_id=str(operation_id)).exists()
            case.refresh_from_db(fields=["current_proposal"])
            current = (
                Proposal.objects.filter(pk=case.current_proposal_id).values_list("operation_id", flat=True).first()
            )
            if older and current != operation_id:
                raise StaleProposal(
                    f"stale: {identity.short(str(operation_id))} is not the current proposal of case "
                    f"{case.case_id}; the current one is {identity.short(current or '')}",
                    current_operation_id=current,
                )
            raise NotFound(
                f"no pending review for case {case.case_id} and operation {identity.short(str(operation_id))}; "
                "run begin first"
            )
        if pending.workflow_version != WORKFLOW_VERSION:
            raise WorkflowIncompatible(
                f"incompatible workflow version: the pending review of {identity.short(pending.operation_id)} was "
                f"recorded by workflow {pending.workflow_version}, this is {WORKFLOW_VERSION}; it will not be "
                f"resumed across versions. Run `manage.py begin {case.case_id}` to pause it again on "
                f"{WORKFLOW_VERSION}"
            )

        storage = DatabaseCheckpointStorage()
        workflow = build_workflow(storage, fault=fault, writer=writer)
        checkpoint = storage.load_sync(pending.checkpoint_id)  # refuses missing/tampered/pickled
        if checkpoint.graph_signature_hash != workflow.graph_signature_hash:
            raise WorkflowIncompatible(
                f"incompatible workflow graph: checkpoint {pending.checkpoint_id} was saved by another graph "
                f"({checkpoint.graph_signature_hash[:12]}…, this is {workflow.graph_signature_hash[:12]}…)"
            )

        response = {
            "approved": _jsonable(approved),
            "reviewer_pk": getattr(reviewer, "pk", None) if getattr(reviewer, "is_authenticated", False) else None,
            "channel": str(channel)[:20],
        }
        resumed, output = async_to_sync(_resume_run)(workflow, pending, case.case_id, response)

        result = CommitResult(
            status=output["status"],
            replay=output["replay"],
            effect_count=output["effect_count"],
            operation_id=output["operation_id"],
            decision=ReviewDecision.objects.filter(pk=output["decision_pk"]).first(),
        )
        PendingReview.objects.filter(pk=pending.pk, status=PendingReview.Status.PENDING).update(
            status=PendingReview.Status.COMPLETED
        )
        return ResumeResult(
            request_reemitted=resumed["request_reemitted"], result=result, resumed_status=resumed["resumed_status"]
        )


# --- edit -------------------------------------------------------------------------------


def review_edit(
    *,
    case: Case,
    expected_operation_id: str,
    body: str | None = None,
    source_versions: dict[str, int] | None = None,
    editor,
) -> tuple[RevisionResult, BeginResult | None]:
    """Revise the current proposal (``proposal_revise``) and begin the workflow for the new one.

    The editor needs the review permission. A stale ``expected_operation_id`` is refused
    and writes nothing. When the revision changes the identity, the case's other pending
    reviews are marked superseded (resuming one is refused as stale by the review core),
    and the workflow is begun for the new proposal; ``None`` is returned in its place when
    nothing changed. The revision commits before begin runs: if begin fails, the new
    proposal is current and ``begin`` can be run again.
    """
    reviewer_check(editor)
    with case_lock(case.case_id):
        with transaction.atomic():
            revision = proposal_revise(
                case=case,
                expected_operation_id=expected_operation_id,
                body=body,
                source_versions=source_versions,
                editor=editor,
            )
            if revision.changed:
                PendingReview.objects.filter(case=case, status=PendingReview.Status.PENDING).exclude(
                    operation_id=revision.proposal.operation_id
                ).update(status=PendingReview.Status.SUPERSEDED)
        if not revision.changed:
            return revision, None
        return revision, _begin_locked(case, editor)
