"""The row hashes of the tamper-evident chain (docs/AUDIT.md, "The chain").

Every append-only row of the audit trail (proposals, decisions, effects, commit attempts,
delivery tries, notification events) carries ``row_hash``: the SHA-256 over its canonical
bytes, framed as in docs/PROTOCOL.md (each field with its four-byte length, as stored: no
newline normalization), with ``rh-v1-`` in front. A chained row also carries ``prev_hash``,
the hash of the row it follows in its case's chain, and its own hash covers that link:

- a proposal follows its parent (the proposal it revises; a prepared proposal is a root);
- a decision follows its proposal, an effect its decision;
- a delivery try follows the delivery's previous try (the first one, the effect);
- a notification event follows the notification's previous event.

Each link is a row the writer has in hand already (read by the commit's own read, or written
by the same statement), so no writer reads a chain head and nothing serialises on one. A
commit attempt links to nothing: refusals must never wait for the case, so attempts join
the trail through the seals alone (audit/seals.py), like every other row.

The hash is computed as the row is inserted, in ``RowHashField.pre_save``, after the
timestamps' own ``pre_save``: every insert path (``save()``, ``bulk_create()`` and the
commit's compiled statement, core/statements.py) calls it. A row loaded from a fixture
(``raw``) keeps the hash it brings.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import models

from core.identity import encode_exact

ROW_TAG = "decisionflow.row.v1"
ROW_PREFIX = "rh-v1-"
HASH_LENGTH = len(ROW_PREFIX) + 64


def canonical(value: object) -> str:
    """One stored value as text, typed so that no two values share a rendering: ``n`` (NULL),
    ``b:true``, ``i:42``, ``s:text``, ``t:2026-12-04T18:00:00.000000Z`` (UTC, microseconds),
    ``j:{...}`` (JSON with sorted keys and no spaces)."""
    if value is None:
        return "n"
    if isinstance(value, bool):
        return "b:true" if value else "b:false"
    if isinstance(value, int):
        return f"i:{value}"
    if isinstance(value, str):
        return f"s:{value}"
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ValueError("a row's timestamp must be aware (USE_TZ): a naive one has no single rendering")
        return "t:" + value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, (dict, list)):
        return "j:" + json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    raise TypeError(f"a row value of type {type(value).__name__} has no canonical form")


def row_hash(label: str, prev_hash: str | None, values: Iterable[object]) -> str:
    """The hash of one row of the model ``label`` (``app.model``), after ``prev_hash``."""
    fields = [ROW_TAG, label, "" if prev_hash is None else prev_hash, *(canonical(v) for v in values)]
    return ROW_PREFIX + hashlib.sha256(encode_exact(fields)).hexdigest()


def hash_of(obj: models.Model) -> str:
    """The hash ``obj`` has as stored now (recomputed: the verifier compares it with its
    ``row_hash``). Its model names the hashed fields in ``CHAIN_FIELDS``."""
    model = type(obj)
    fields: Sequence[str] = model.CHAIN_FIELDS  # type: ignore[attr-defined]  # each chained model declares it
    return row_hash(model._meta.label_lower, getattr(obj, "prev_hash", None), [getattr(obj, f) for f in fields])


def follows(row: models.Model, earlier: models.Model) -> None:
    """Chain ``row`` after ``earlier``, whose hash may be computed only as it is inserted in
    the same statement (a new decision, then its effect): ``row``'s link is taken when it
    is inserted itself."""
    row.__dict__["_chain_after"] = earlier


class _ComputedHash(models.CharField):
    """A hash column the insert computes, never given. Migrations see a plain CharField:
    they never run this code. Nullable, for a row written before the chain began
    (docs/AUDIT.md, "Rows from before the chain"), and so that adding the column is a plain
    ADD COLUMN (SQLite would rebuild a NOT NULL column's table and lose its append-only
    triggers)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("max_length", HASH_LENGTH)
        kwargs.setdefault("null", True)
        kwargs.setdefault("blank", True)
        kwargs.setdefault("editable", False)
        super().__init__(*args, **kwargs)

    def deconstruct(self):
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.CharField", args, kwargs

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        if not add:
            return getattr(model_instance, self.attname)
        value = self.computed(model_instance)
        setattr(model_instance, self.attname, value)
        return value

    def computed(self, obj: models.Model) -> str:
        raise NotImplementedError


class PrevHashField(_ComputedHash):
    """``prev_hash``: the hash of the row this one follows, "" for the first row of its
    chain. Taken, in this order, from the row ``follows()`` named, from the value the writer
    gave, or from the model's ``chain_link()``."""

    def computed(self, obj: models.Model) -> str:
        earlier = obj.__dict__.get("_chain_after")
        if earlier is not None:
            return earlier.row_hash or ""
        given = getattr(obj, self.attname)
        if given is not None:
            return given
        link = getattr(obj, "chain_link", None)
        return link() if link is not None else ""


class RowHashField(_ComputedHash):
    """``row_hash``. Declare it last in the model (after ``prev_hash``), so that its
    ``pre_save`` runs after every other field's, the timestamps' included."""

    def computed(self, obj: models.Model) -> str:
        return hash_of(obj)
