"""The decisionflow identity protocol, version 1 (see docs/PROTOCOL.md).

Three content identities are derived from canonical bytes:

- ``evidence_id``: the selected passages (source, version, quotation);
- ``policy_id``: the effective policy (name and typed parameters; the label is display only);
- ``operation_id``: case, action, draft body, evidence identity and policy identity.

Each field is normalized (CRLF, then lone CR, become LF; nothing else changes), encoded as
UTF-8, and framed with its byte length as a four-byte big-endian unsigned integer. The
identity is a prefix plus the lowercase hex SHA-256 of the framed fields. Text that cannot
be encoded (a lone surrogate) is refused, never replaced: two different inputs must never
collapse into one identity.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

OPERATION_TAG = "decisionflow.operation.v1"
EVIDENCE_TAG = "decisionflow.evidence.v1"
POLICY_TAG = "decisionflow.policy.v1"

OPERATION_PREFIX = "op-v1-"
EVIDENCE_PREFIX = "ev-v1-"
POLICY_PREFIX = "pol-v1-"

OPERATION_ID_RE = re.compile(r"^op-v1-[0-9a-f]{64}$")

_MAX_FIELD_BYTES = 0xFFFFFFFF


def normalize_newlines(text: str) -> str:
    """CRLF becomes LF, then every remaining lone CR becomes LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _encode(text: str, *, what: str) -> bytes:
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a string, not {type(text).__name__}")
    try:
        return normalize_newlines(text).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} contains a character that cannot be encoded as UTF-8 "
            f"(a lone surrogate at position {exc.start}); it is refused, not replaced"
        ) from None


def _frame(field: str, index: int) -> bytes:
    # The common case (a str with no CR that encodes cleanly) skips the newline scans and
    # the error label; anything else takes the slow path, which also raises the clear error.
    if type(field) is str and "\r" not in field:
        try:
            data = field.encode("utf-8")
        except UnicodeEncodeError:
            data = _encode(field, what=f"field {index}")
    else:
        data = _encode(field, what=f"field {index}")
    if len(data) > _MAX_FIELD_BYTES:
        raise ValueError(f"field {index} is longer than 4 GiB and cannot be framed")
    return len(data).to_bytes(4, "big") + data


def encode_fields(fields: Iterable[str]) -> bytes:
    """Frame each normalized UTF-8 field with its four-byte big-endian byte length."""
    return b"".join([_frame(field, index) for index, field in enumerate(fields)])


def _frame_exact(field: str, index: int) -> bytes:
    if not isinstance(field, str):
        raise TypeError(f"field {index} must be a string, not {type(field).__name__}")
    try:
        data = field.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"field {index} contains a character that cannot be encoded as UTF-8 "
            f"(a lone surrogate at position {exc.start}); it is refused, not replaced"
        ) from None
    if len(data) > _MAX_FIELD_BYTES:
        raise ValueError(f"field {index} is longer than 4 GiB and cannot be framed")
    return len(data).to_bytes(4, "big") + data


def encode_exact(fields: Iterable[str]) -> bytes:
    """The same framing without step 1: each field as stored, line endings included.

    An identity normalizes because two renderings of one draft are one proposal; a stored
    row's hash (core/chain.py) must not, or a row whose CRLF was rewritten to LF would still
    match its hash."""
    return b"".join([_frame_exact(field, index) for index, field in enumerate(fields)])


def _digest(prefix: str, fields: Iterable[str]) -> str:
    return prefix + hashlib.sha256(encode_fields(fields)).hexdigest()


def operation_id(case_id: str, action: str, body: str, evidence_id: str, policy_id: str) -> str:
    """The identity of exactly what a reviewer approves."""
    return _digest(OPERATION_PREFIX, (OPERATION_TAG, case_id, action, body, evidence_id, policy_id))


def evidence_id(passages: Iterable[Mapping]) -> str:
    """The identity of a selection of passages, independent of the order they were given in.

    Each passage is a mapping with ``source_id`` (str), ``version`` (int) and ``quotation``
    (str). Selecting the same source version twice is refused.
    """
    rows = []
    seen = set()
    for index, passage in enumerate(passages):
        try:
            source_id, version, quotation = (
                passage["source_id"],
                passage["version"],
                passage["quotation"],
            )
        except KeyError as exc:
            raise ValueError(f"passage {index} has no {exc.args[0]!r}") from None
        if not isinstance(source_id, str) or not isinstance(quotation, str):
            raise ValueError(f"passage {index}: source_id and quotation must be strings")
        # bool is an int subclass; a version of True is a mistake, not version 1.
        if not isinstance(version, int) or isinstance(version, bool):
            raise ValueError(f"passage {index}: version must be an integer, not {version!r}")
        key = (source_id, version)
        if key in seen:
            raise ValueError(f"source {source_id} version {version} is selected twice")
        seen.add(key)
        rows.append((source_id, version, quotation))
    # Python compares str by code point, which is the order the protocol names.
    rows.sort(key=lambda row: (row[0], row[1]))
    fields = [EVIDENCE_TAG]
    for source_id, version, quotation in rows:
        fields += [source_id, str(version), quotation]
    return _digest(EVIDENCE_PREFIX, fields)


def typed_value(value: object) -> str:
    """``int:9``, ``str:forbidden``, ``bool:true``; any other type is refused."""
    if isinstance(value, bool):
        return "bool:true" if value else "bool:false"
    if isinstance(value, int):
        return f"int:{value}"
    if isinstance(value, str):
        return f"str:{value}"
    raise TypeError(f"policy value {value!r} has type {type(value).__name__}; only int, str and bool are allowed")


def policy_id(name: str, parameters: Mapping[str, object]) -> str:
    """The identity of what a policy does: its name and typed parameters, not its label."""
    fields = [POLICY_TAG, name]
    for key in sorted(parameters):
        if not isinstance(key, str):
            raise TypeError(f"policy parameter name {key!r} must be a string")
        fields += [key, typed_value(parameters[key])]
    return _digest(POLICY_PREFIX, fields)


def short(identity: str, length: int = 12) -> str:
    """A readable abbreviation such as ``op-v1-e3976ac9e004…`` for lists and messages."""
    prefix, _, digest = identity.rpartition("-")
    return f"{prefix}-{digest[:length]}…" if digest else identity


def is_operation_id(value: object) -> bool:
    return isinstance(value, str) and OPERATION_ID_RE.fullmatch(value) is not None
