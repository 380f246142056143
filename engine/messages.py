"""The review workflow's messages, declared, and the graph fingerprint that covers them.

Every message is a plain dict at run time (checkpoints hold JSON only, see checkpoints.py);
each one's shape is declared here as a TypedDict. The engine checks every message it sends
against its declaration (``conform``), so a step whose output gains, loses or renames a
field fails until its declaration says so, and changing a declaration changes the graph
fingerprint.

The graph fingerprint is recorded with every pause (on the pending review, and inside the
signed pause checkpoint's request). It covers the workflow's name, its executor ids, its
edges and the schema of every message, request and response, so a pause taken by other code
is refused (``WorkflowIncompatible``) even when ``WORKFLOW_VERSION`` was not bumped. It is
not the checkpoint's HMAC (which proves who wrote a checkpoint, not which graph it fits).

No agent-framework import here: pages and cron commands read the fingerprint too.
"""

from __future__ import annotations

import functools
import hashlib
import json
import types
import typing
from typing import Any, TypedDict

from engine.names import COMMIT_ID, EDGES, HUMAN_REVIEW_ID, PREPARE_ID, WORKFLOW_NAME

# What a decision may carry before the review core refuses it: the response keeps a value
# that is not a boolean (as its repr) so that the refusal can name it.
Scalar = bool | int | float | str | None


class StartMessage(TypedDict):
    """The host's message to ``prepare`` at begin."""

    case_pk: int
    actor_pk: int | None
    session_id: str


class ReviewRequest(TypedDict):
    """``prepare`` to ``human-review-v1``, and the request the pause waits on."""

    case_pk: int
    case_id: str
    proposal_pk: int
    operation_id: str
    session_id: str
    workflow_version: str
    graph_fingerprint: str


class ReviewResponse(TypedDict):
    """The host's answer to the request: the decision as a channel received it."""

    approved: Scalar
    reviewer_pk: int | None
    channel: str
    decline_reason: str | None  # a DeclineReason value, or None (approvals, declines without one)
    decline_note: str | None


class CommitMessage(TypedDict):
    """``human-review-v1`` to ``commit``: the decision about exactly what was asked."""

    case_id: str
    operation_id: str
    approved: Scalar
    reviewer_pk: int | None
    channel: str
    decline_reason: str | None
    decline_note: str | None


class Receipt(TypedDict):
    """The workflow's output: the review core's receipt (``CommitResult.receipt``)."""

    Status: str
    Replay: bool
    EffectCount: int


# Every message of the graph by its role. The fingerprint reads this mapping, so a test (or a
# future change) that swaps a declaration changes the fingerprint.
MESSAGES: dict[str, type] = {
    "start": StartMessage,
    "request": ReviewRequest,
    "response": ReviewResponse,
    "commit": CommitMessage,
    "output": Receipt,
}


def _type_name(hint: Any) -> Any:
    """A canonical, JSON-able spelling of one field's type (stable across Python versions)."""
    if hint is type(None):
        return "None"
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return sorted((_type_name(arg) for arg in typing.get_args(hint)), key=lambda v: json.dumps(v, sort_keys=True))
    if typing.is_typeddict(hint):
        return schema_of(hint)
    origin = typing.get_origin(hint)
    if origin is not None:
        return {"of": _type_name(origin), "args": [_type_name(arg) for arg in typing.get_args(hint)]}
    return getattr(hint, "__qualname__", None) or repr(hint)


def schema_of(message_type: type) -> dict:
    """A TypedDict's fields, their types and which are required, as canonical JSON-able data."""
    hints = typing.get_type_hints(message_type)
    required = getattr(message_type, "__required_keys__", frozenset(hints))
    return {name: {"type": _type_name(hints[name]), "required": name in required} for name in sorted(hints)}


def graph_description() -> dict:
    """What the fingerprint covers, as data (shown by tests and useful when two differ)."""
    return {
        "workflow": WORKFLOW_NAME,
        "executors": [PREPARE_ID, HUMAN_REVIEW_ID, COMMIT_ID],
        "edges": [list(edge) for edge in EDGES],
        "messages": {role: schema_of(message_type) for role, message_type in sorted(MESSAGES.items())},
    }


@functools.cache
def graph_fingerprint() -> str:
    """SHA-256 of the canonical JSON of ``graph_description()``; computed once per process."""
    canonical = json.dumps(graph_description(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def short_fingerprint(fingerprint: str) -> str:
    return (fingerprint or "none")[:12]


@functools.cache
def _declared_fields(declared: type) -> tuple[frozenset[str], frozenset[str]]:
    # Read once per declaration: conform runs for every message of every resume (hot path).
    hints = typing.get_type_hints(declared)
    return frozenset(hints), frozenset(getattr(declared, "__required_keys__", hints))


def conform(role: str, message: Any) -> Any:
    """Return ``message`` if it has exactly the fields its declaration names; TypeError otherwise.

    Field names only (values are checked where they are used): what the fingerprint must
    notice is a change of shape, and a shape that drifts from its declaration fails here.
    """
    declared = MESSAGES[role]
    if not isinstance(message, dict):
        raise TypeError(f"the {role} message is a {type(message).__name__}, not a dict")
    fields, required = _declared_fields(declared)
    missing, extra = required - message.keys(), message.keys() - fields
    if missing or extra:
        raise TypeError(
            f"the {role} message does not match its declared schema {declared.__name__}: "
            f"missing {sorted(missing)}, undeclared {sorted(extra)}; declare the change in "
            "engine/messages.py (which changes the graph fingerprint)"
        )
    return message
