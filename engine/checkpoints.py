"""The workflow engine's checkpoints, stored in the database as JSON only.

agent-framework's own ``FileCheckpointStorage`` writes ``{"__pickled__": ...}`` for every
value that is not JSON and unpickles it on load. Nothing here ever unpickles: every message
the review workflow sends is a plain dict, request events are stored through
``WorkflowEvent.to_dict()`` / ``from_dict()``, and a payload that contains a pickle marker is
refused on load, never decoded. A value that is not plain JSON makes ``save`` raise (the
engine then only logs a warning, which is why the host checks the pause checkpoint itself).

``digest`` is an HMAC-SHA256 of the payload exactly as stored, keyed from ``SECRET_KEY``
(and accepted under any of ``SECRET_KEY_FALLBACKS``, so the secret can be rotated the way
Django rotates everything else it signs). A load whose payload no longer matches it
(tampering, corruption, a hand edit, a row forged by someone who can write the table but
does not hold the secret) is refused with ``WorkflowIncompatible``. Every process that
shares a database must therefore share the secret.

The engine calls only ``save`` and ``load``; the other four methods of its storage protocol
are here for the host and for operators. Two small stores sit beside the database one:
``PauseBuffer`` keeps a ``begin`` run's checkpoints in memory so that only the pause is
written, and ``BoundCheckpoint`` hands an answered run the one checkpoint the host has
already verified, and keeps what the engine saves during that run in memory (nothing
after the commit is needed for recovery: the effect store is the truth from then on).
"""

from __future__ import annotations

import hmac
import json
from datetime import datetime
from typing import Any

from agent_framework import WorkflowCheckpoint as EngineCheckpoint
from agent_framework import WorkflowEvent, WorkflowMessage
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils.crypto import salted_hmac

from core.errors import WorkflowIncompatible
from core.faults import crash_point
from engine.driver import on_caller
from reviews.models import WorkflowCheckpoint

FORMAT = "decisionflow.checkpoint.v2"  # v2: the digest is an HMAC

# The only payload types a request or a response may have: the workflow's messages are
# plain dicts. A request event naming any other type is refused instead of resolved.
_ALLOWED_TYPES = {"builtins.dict": dict}

# Markers of agent-framework's pickle encoding. Finding one means the payload did not come
# from this store (or was edited); it is refused, never decoded.
_PICKLE_MARKERS = ("__pickled__", "__type__")


class CheckpointRefused(WorkflowIncompatible):
    """A stored checkpoint that cannot be trusted or read: tampered, corrupt or not JSON-only."""


_HMAC_SALT = "workflow.checkpoint"


def payload_digest(payload: str, *, secret: str | None = None) -> str:
    """The HMAC stored beside a payload, keyed from ``SECRET_KEY`` (or the given secret)."""
    return salted_hmac(_HMAC_SALT, payload, secret=secret, algorithm="sha256").hexdigest()


def digest_verifies(payload: str, digest: str) -> bool:
    """Whether ``digest`` was made from ``payload`` with the secret or one of its fallbacks."""
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return any(hmac.compare_digest(payload_digest(payload, secret=secret), digest) for secret in secrets)


def _strict_json(value: Any, where: str) -> Any:
    """Return ``value`` if it is plain JSON (dict with str keys, list, str, int, float, bool, None).

    ``json.dumps`` would quietly turn a tuple into a list or call ``default``; a checkpoint
    must round-trip exactly, so anything else is refused at save time.
    """
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, list):
        return [_strict_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: key {key!r} is not a string; checkpoints hold JSON only")
            if key in _PICKLE_MARKERS:
                raise TypeError(f"{where}: key {key!r} is reserved; checkpoints hold JSON only")
            out[key] = _strict_json(item, f"{where}.{key}")
        return out
    raise TypeError(f"{where} is a {type(value).__name__}; checkpoints hold plain JSON values only")


def _event_to_json(event: WorkflowEvent, where: str) -> dict:
    encoded = event.to_dict()
    for key in ("request_type", "response_type"):
        if encoded.get(key) not in _ALLOWED_TYPES:
            raise TypeError(f"{where}: {key} {encoded.get(key)!r} is not allowed; requests carry plain dicts")
    return _strict_json(encoded, where)


def _event_from_json(data: Any, where: str) -> WorkflowEvent:
    if not isinstance(data, dict):
        raise CheckpointRefused(f"{where} is not a request event")
    for key in ("request_type", "response_type"):
        if data.get(key) not in _ALLOWED_TYPES:
            raise CheckpointRefused(f"{where}: {key} {data.get(key)!r} is not allowed")
    return WorkflowEvent.from_dict(data, allowed_types=_ALLOWED_TYPES)


def _message_to_json(message: WorkflowMessage, where: str) -> dict:
    encoded = message.to_dict()
    event = encoded.pop("original_request_info_event")
    out = _strict_json(encoded, where)
    out["original_request_info_event"] = None if event is None else _event_to_json(event, f"{where}.request")
    return out


def _message_from_json(data: Any, where: str) -> WorkflowMessage:
    if not isinstance(data, dict):
        raise CheckpointRefused(f"{where} is not a message")
    data = dict(data)
    event = data.get("original_request_info_event")
    data["original_request_info_event"] = None if event is None else _event_from_json(event, f"{where}.request")
    # from_dict turns "type" into the engine's MessageType enum and refuses unknown values.
    return WorkflowMessage.from_dict(data)


def encode_checkpoint(checkpoint: EngineCheckpoint) -> str:
    """The JSON text stored for one checkpoint. Raises TypeError on anything not plain JSON."""
    document = {
        "format": FORMAT,
        "workflow_name": checkpoint.workflow_name,
        "graph_signature_hash": checkpoint.graph_signature_hash,
        "checkpoint_id": checkpoint.checkpoint_id,
        "previous_checkpoint_id": checkpoint.previous_checkpoint_id,
        "timestamp": checkpoint.timestamp,
        "iteration_count": checkpoint.iteration_count,
        "version": checkpoint.version,
        "metadata": _strict_json(checkpoint.metadata, "metadata"),
        "state": _strict_json(checkpoint.state, "state"),
        "messages": {
            source: [_message_to_json(m, f"messages.{source}[{i}]") for i, m in enumerate(messages)]
            for source, messages in checkpoint.messages.items()
        },
        "pending_request_info_events": {
            request_id: _event_to_json(event, f"pending_request_info_events.{request_id}")
            for request_id, event in checkpoint.pending_request_info_events.items()
        },
    }
    return json.dumps(document, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _refuse_pickle_markers(value: Any, where: str = "payload") -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in _PICKLE_MARKERS:
                raise CheckpointRefused(
                    f"checkpoint refused: {where} contains the pickle marker {key!r}; "
                    "this store holds JSON only and never unpickles"
                )
            _refuse_pickle_markers(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_pickle_markers(item, f"{where}[{index}]")


def decode_checkpoint(*, checkpoint_id: str, payload: str, digest: str) -> EngineCheckpoint:
    """Rebuild an engine checkpoint from a stored row, refusing anything untrustworthy."""
    if not digest_verifies(payload, digest):
        raise CheckpointRefused(
            f"checkpoint {checkpoint_id} is corrupt or was modified: its content does not match the "
            "HMAC stored beside it (or it was signed with another SECRET_KEY); refusing to resume from it"
        )
    try:
        document = json.loads(payload)
    except ValueError:
        raise CheckpointRefused(f"checkpoint {checkpoint_id} is not valid JSON") from None
    _refuse_pickle_markers(document)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CheckpointRefused(f"checkpoint {checkpoint_id} is not in the {FORMAT} format")
    if document.get("checkpoint_id") != checkpoint_id:
        raise CheckpointRefused(f"checkpoint {checkpoint_id} holds the content of another checkpoint")
    try:
        return EngineCheckpoint(
            workflow_name=document["workflow_name"],
            graph_signature_hash=document["graph_signature_hash"],
            checkpoint_id=document["checkpoint_id"],
            previous_checkpoint_id=document["previous_checkpoint_id"],
            timestamp=document["timestamp"],
            iteration_count=document["iteration_count"],
            version=document["version"],
            metadata=document["metadata"],
            state=document["state"],
            messages={
                source: [_message_from_json(m, f"messages.{source}[{i}]") for i, m in enumerate(messages)]
                for source, messages in document["messages"].items()
            },
            pending_request_info_events={
                request_id: _event_from_json(event, f"pending_request_info_events.{request_id}")
                for request_id, event in document["pending_request_info_events"].items()
            },
        )
    except CheckpointRefused:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointRefused(f"checkpoint {checkpoint_id} cannot be read: {type(exc).__name__}: {exc}") from None


def checkpoint_row(checkpoint: EngineCheckpoint, payload: str) -> WorkflowCheckpoint:
    """The database row of an engine checkpoint whose encoded form is ``payload``, unsaved."""
    return WorkflowCheckpoint(
        checkpoint_id=checkpoint.checkpoint_id,
        workflow_name=checkpoint.workflow_name,
        graph_signature_hash=checkpoint.graph_signature_hash,
        previous_checkpoint_id=checkpoint.previous_checkpoint_id,
        iteration_count=checkpoint.iteration_count,
        payload=payload,
        digest=payload_digest(payload),
    )


class DatabaseCheckpointStorage:
    """agent-framework's CheckpointStorage protocol over ``reviews.WorkflowCheckpoint`` rows.

    ORM work runs through ``driver.on_caller``: on the calling thread, so a checkpoint is
    written on the caller's connection (and inside its transaction, if it has one).
    """

    def __init__(self) -> None:
        # Checkpoint IDs this instance saved, in order: `begin` reports how many it wrote.
        self.saved: list[str] = []
        # When ``write`` stored the last pause (the row's created_at).
        self.written_at: datetime | None = None

    # --- the two methods the engine calls -------------------------------------------------

    async def save(self, checkpoint: EngineCheckpoint) -> str:
        payload = encode_checkpoint(checkpoint)
        checkpoint_id = await on_caller(self._save_sync, checkpoint, payload)
        self.saved.append(checkpoint_id)
        return checkpoint_id

    async def load(self, checkpoint_id: str) -> EngineCheckpoint:
        return await on_caller(self.load_sync, checkpoint_id)

    # --- the rest of the protocol, for the host ---------------------------------------------

    async def list_checkpoints(self, *, workflow_name: str) -> list[EngineCheckpoint]:
        ids = await self.list_checkpoint_ids(workflow_name=workflow_name)
        return [await self.load(checkpoint_id) for checkpoint_id in ids]

    async def list_checkpoint_ids(self, *, workflow_name: str) -> list[str]:
        def ids():
            return list(
                WorkflowCheckpoint.objects.filter(workflow_name=workflow_name)
                .order_by("created_at", "id")
                .values_list("checkpoint_id", flat=True)
            )

        return await on_caller(ids)

    async def delete(self, checkpoint_id: str) -> bool:
        def delete():
            return WorkflowCheckpoint.objects.filter(checkpoint_id=checkpoint_id).delete()[0] > 0

        return await on_caller(delete)

    async def get_latest(self, *, workflow_name: str) -> EngineCheckpoint | None:
        def latest():
            return (
                WorkflowCheckpoint.objects.filter(workflow_name=workflow_name)
                .order_by("-created_at", "-id")
                .values_list("checkpoint_id", flat=True)
                .first()
            )

        checkpoint_id = await on_caller(latest)
        return None if checkpoint_id is None else await self.load(checkpoint_id)

    # --- sync helpers -----------------------------------------------------------------------

    @staticmethod
    def _insert(checkpoint: EngineCheckpoint, payload: str) -> WorkflowCheckpoint:
        row = checkpoint_row(checkpoint, payload)
        row.save(force_insert=True)
        if checkpoint.pending_request_info_events:
            # A process killed while the pause checkpoint is being saved, after the
            # insert and before it commits.
            crash_point("begin-during-checkpoint-save")
        return row

    def _save_sync(self, checkpoint: EngineCheckpoint, payload: str) -> str:
        try:
            with transaction.atomic():
                self._insert(checkpoint, payload)
        except IntegrityError:
            # Saving the same checkpoint twice is harmless only if it is the same content.
            stored = WorkflowCheckpoint.objects.filter(checkpoint_id=checkpoint.checkpoint_id).first()
            if stored is None or stored.digest != payload_digest(payload):
                raise
        return checkpoint.checkpoint_id

    def write(self, checkpoint: EngineCheckpoint, payload: str | None = None) -> str:
        """Store one new checkpoint now, in the caller's transaction (begin's pause).

        ``payload``: its encoding (``encode_checkpoint``), when the caller made it already.
        A plain insert, no savepoint: its id is a fresh UUID, and if the insert fails the
        caller's whole transaction (proposal, pending review) must fail with it.
        """
        row = self._insert(checkpoint, encode_checkpoint(checkpoint) if payload is None else payload)
        # The pending review keeps this time: the row itself may be pruned once decided.
        self.written_at = row.created_at
        return checkpoint.checkpoint_id

    # The columns ``load_sync`` reads, for a caller that reads them in its own query.
    COLUMNS = ("payload", "digest", "graph_signature_hash", "workflow_name")

    def load_sync(self, checkpoint_id: str) -> EngineCheckpoint:
        row = WorkflowCheckpoint.objects.filter(checkpoint_id=checkpoint_id).values(*self.COLUMNS).first()
        return self.from_row(checkpoint_id, row)

    @staticmethod
    def from_row(checkpoint_id: str, row: dict | None) -> EngineCheckpoint:
        """Decode a stored row (``COLUMNS``), refusing one that is missing or untrustworthy."""
        if row is None or row.get("payload") is None:
            raise CheckpointRefused(f"checkpoint {checkpoint_id} does not exist")
        checkpoint = decode_checkpoint(checkpoint_id=checkpoint_id, payload=row["payload"], digest=row["digest"])
        if (checkpoint.graph_signature_hash, checkpoint.workflow_name) != (
            row["graph_signature_hash"],
            row["workflow_name"],
        ):
            raise CheckpointRefused(f"checkpoint {checkpoint_id}: its columns and its content disagree")
        return checkpoint


class PauseBuffer:
    """A ``begin`` run's checkpoints, kept in memory until the host knows which one is the pause.

    The engine saves one before the first superstep and one after each; only the pause is
    needed to resume, so the host encodes and writes that one (``DatabaseCheckpointStorage.write``)
    in the same transaction as the proposal and the pending review, and drops the rest
    unencoded. A pause that is not plain JSON fails when the host encodes it, exactly as it
    would have failed in the database store.
    """

    def __init__(self) -> None:
        self.saved: list[EngineCheckpoint] = []

    async def save(self, checkpoint: EngineCheckpoint) -> str:
        self.saved.append(checkpoint)
        return checkpoint.checkpoint_id

    async def load(self, checkpoint_id: str) -> EngineCheckpoint:
        for checkpoint in self.saved:
            if checkpoint.checkpoint_id == checkpoint_id:
                return checkpoint
        raise CheckpointRefused(f"checkpoint {checkpoint_id} was not saved by this run")

    async def list_checkpoints(self, *, workflow_name: str) -> list[EngineCheckpoint]:
        return [c for c in self.saved if c.workflow_name == workflow_name]

    async def list_checkpoint_ids(self, *, workflow_name: str) -> list[str]:
        return [c.checkpoint_id for c in self.saved if c.workflow_name == workflow_name]

    async def delete(self, checkpoint_id: str) -> bool:
        return False

    async def get_latest(self, *, workflow_name: str) -> EngineCheckpoint | None:
        mine = [c for c in self.saved if c.workflow_name == workflow_name]
        return mine[-1] if mine else None


class BoundCheckpoint(PauseBuffer):
    """The one checkpoint an answered run may restore: already loaded and verified by the host.

    The engine restores through ``load``, so it gets exactly the object the binding checks
    looked at (no second read that could differ). What it saves during the answered run
    stays in memory, unencoded: once the commit has happened, recovery reads the effect
    store, not a checkpoint, so an answered run writes no checkpoint rows.
    """

    def __init__(self, checkpoint: EngineCheckpoint) -> None:
        super().__init__()
        self.checkpoint = checkpoint

    async def load(self, checkpoint_id: str) -> EngineCheckpoint:
        if checkpoint_id != self.checkpoint.checkpoint_id:
            raise CheckpointRefused(f"checkpoint {checkpoint_id} is not the one this resume was bound to")
        return self.checkpoint
