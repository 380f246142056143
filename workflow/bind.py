"""Bind before running: a pending review's pause checkpoint must be exactly this case's
review of this operation, from this workflow version and graph, before the engine runs.
"""

from __future__ import annotations

import functools
import json

from agent_framework import WorkflowCheckpoint as EngineCheckpoint
from django.db import connection

from cases.models import Case
from core import identity
from core.errors import DecisionflowError, NotFound, StaleProposal, WorkflowIncompatible
from core.observability import CHECKPOINT_REFUSED, counts_refusals
from effects.store import read_beside
from engine.checkpoints import DatabaseCheckpointStorage
from engine.graph import GRAPH_SIGNATURE_HASH, HUMAN_REVIEW_ID, WORKFLOW_VERSION, review_request_id
from engine.messages import graph_fingerprint, short_fingerprint
from reviews.models import Origin, PendingReview, Proposal, WorkflowCheckpoint
from workflow.selectors import decidable_operation_id


@functools.cache
def _pending_sql() -> tuple[str, list[str]]:
    # Raw SQL on the hot path of every decision: the ORM spent more time compiling this
    # (a join on a non-foreign key) than the database spent answering it.
    fields = [f.column for f in PendingReview._meta.concrete_fields if f.column]
    columns = [f"pr.{c}" for c in fields] + [f"ck.{c}" for c in DatabaseCheckpointStorage.COLUMNS]
    # Four eyes, without a query of its own on the common path: did the deciding user make any
    # human change in this case? Only then is the proposal's chain read (four_eyes_check).
    changed = (
        f"EXISTS (SELECT 1 FROM {Proposal._meta.db_table} hp WHERE hp.case_id = pr.case_id "
        "AND hp.origin <> %s AND hp.author_id = %s)"
    )
    # The policy the operation was prepared under, for its reviewer groups (reviewer_groups.py).
    sql = (
        f"SELECT {', '.join(columns)}, pp.policy_snapshot, {changed} FROM {PendingReview._meta.db_table} pr "
        f"JOIN {Proposal._meta.db_table} pp ON pp.id = pr.proposal_id "
        f"LEFT JOIN {WorkflowCheckpoint._meta.db_table} ck ON ck.checkpoint_id = pr.checkpoint_id "
        "WHERE pr.case_id = %s AND pr.operation_id = %s"
    )
    return sql, fields


def pending_with_checkpoint(case: Case, operation_id: str, reviewer=None) -> PendingReview | None:
    """The operation's pending review with its checkpoint row's columns, in one query; its
    ``reviewer_changed_case`` says whether ``reviewer`` made a human change in the case, its
    ``policy_snapshot`` is its proposal's, its ``read_ahead`` the commit's read of the operation
    (``effects.store.read_beside``; None on SQLite), for ``answering``."""
    sql, fields = _pending_sql()
    params = [Origin.PREPARED.value, getattr(reviewer, "pk", None), case.pk, operation_id]
    # The commit's read of the operation comes with it (PostgreSQL): a resume then sends two
    # statements, this and the commit's write.
    row, ahead = read_beside(sql, params, operation_id)
    if row is None:
        return None
    pending = PendingReview.from_db(connection.alias, fields, row[: len(fields)])
    pending.read_ahead = ahead
    for name, value in zip(DatabaseCheckpointStorage.COLUMNS, row[len(fields) : -2], strict=True):
        setattr(pending, f"checkpoint_{name}", value)
    snapshot = row[-2]
    # The backends hand JSON columns over as text (Django decodes them in the field).
    pending.policy_snapshot = json.loads(snapshot) if isinstance(snapshot, str | bytes) else snapshot
    pending.reviewer_changed_case = bool(row[-1])
    return pending


def no_pending_review(case: Case, operation_id: str) -> DecisionflowError:
    older = Proposal.objects.filter(case=case, operation_id=operation_id).exists()
    current = decidable_operation_id(case)
    if older and current != operation_id:
        return StaleProposal.superseded(operation_id=operation_id, case_id=case.case_id, current_operation_id=current)
    return NotFound(
        f"no pending review for case {case.case_id} and operation {identity.short(operation_id)}; "
        f"the case's decidable operation is {identity.short(current or '')}"
    )


@counts_refusals(CHECKPOINT_REFUSED, WorkflowIncompatible)
def bound_checkpoint(case: Case, pending: PendingReview) -> EngineCheckpoint:
    """Prove that ``pending``'s checkpoint is the pause of this case's review of this operation.

    Runs before the engine executes anything. Refuses (``WorkflowIncompatible``) a pause of
    another workflow version or graph, a checkpoint whose HMAC does not verify, one whose
    pending request names another case or operation, and one holding any message in flight
    (a checkpoint saved mid-commit still carries the approval it was delivering).
    """
    op = identity.short(pending.operation_id)
    if pending.workflow_version != WORKFLOW_VERSION:
        raise WorkflowIncompatible(
            f"incompatible workflow version: the pending review of {op} was recorded by workflow "
            f"{pending.workflow_version}, this is {WORKFLOW_VERSION}; it will not be resumed across versions. "
            f"Run `manage.py begin {case.case_id}` (or `manage.py drain_workflow --from {pending.workflow_version} "
            f"--apply` for every such case) to pause it again on {WORKFLOW_VERSION}"
        )
    if pending.graph_fingerprint != graph_fingerprint():
        raise WorkflowIncompatible(
            f"incompatible workflow graph: the pending review of {op} was recorded by a graph with the "
            f"fingerprint {short_fingerprint(pending.graph_fingerprint)}, this code's is "
            f"{short_fingerprint(graph_fingerprint())} (executors, edges or message schemas changed); it will "
            f"not be resumed. Run `manage.py drain_workflow --from {pending.workflow_version} --apply` (or "
            f"`manage.py begin {case.case_id}`) to pause it again on this graph"
        )
    where = f"checkpoint {pending.checkpoint_id}"
    # HMAC, JSON only, no pickle; from the columns read with the pending review, if they were.
    columns = {c: getattr(pending, f"checkpoint_{c}", None) for c in DatabaseCheckpointStorage.COLUMNS}
    if columns["payload"] is not None:
        checkpoint = DatabaseCheckpointStorage.from_row(pending.checkpoint_id, columns)
    else:
        checkpoint = DatabaseCheckpointStorage().load_sync(pending.checkpoint_id)
    if checkpoint.graph_signature_hash != GRAPH_SIGNATURE_HASH:
        raise WorkflowIncompatible(
            f"incompatible workflow graph: {where} was saved by another graph "
            f"({checkpoint.graph_signature_hash[:12]}…, this is {GRAPH_SIGNATURE_HASH[:12]}…); nothing ran"
        )
    in_flight = sum(len(messages) for messages in checkpoint.messages.values())
    if in_flight:
        raise WorkflowIncompatible(
            f"{where} is not a pause: it holds {in_flight} message(s) in flight; refusing to resume it, nothing ran"
        )
    wanted = review_request_id(pending.operation_id)
    requests = checkpoint.pending_request_info_events
    request = requests.get(wanted)
    data = request.data if request is not None and isinstance(request.data, dict) else {}
    if (
        set(requests) != {wanted}
        or request is None
        or request.source_executor_id != HUMAN_REVIEW_ID
        or data.get("case_id") != case.case_id
        or data.get("case_pk") != case.pk
        or data.get("operation_id") != pending.operation_id
    ):
        named = ", ".join(sorted(requests)) or "no request"
        raise WorkflowIncompatible(
            f"{where} does not belong to case {case.case_id} and operation {op}: it holds {named[:200]}; "
            "refusing to resume it, nothing ran"
        )
    if data.get("workflow_version") != WORKFLOW_VERSION:
        raise WorkflowIncompatible(
            f"incompatible workflow version: {where} holds a request of workflow "
            f"{data.get('workflow_version')!r}, this is {WORKFLOW_VERSION}; nothing ran"
        )
    if data.get("graph_fingerprint") != graph_fingerprint():
        raise WorkflowIncompatible(
            f"incompatible workflow graph: {where} holds a request of the graph fingerprint "
            f"{short_fingerprint(str(data.get('graph_fingerprint') or ''))}, this code's is "
            f"{short_fingerprint(graph_fingerprint())}; nothing ran"
        )
    return checkpoint


def pause_pruned(pending: PendingReview) -> bool:
    """A completed review whose checkpoint row is gone (the join found none): pruned."""
    return pending.status == PendingReview.Status.COMPLETED and getattr(pending, "checkpoint_payload", 0) is None
