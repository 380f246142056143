"""A prototype of the recommended speed-up for ``decisionflow.identity.operation_id``.

Same protocol, same results (tests/bench checks it against the protocol vectors and the
real implementation); only the work per call differs: no newline replacement when the text
has no CR, no per-field label unless there is an error, one join instead of a growing
bytearray. It lives here because identity.py is not the benchmark's to change; the
finding and this prototype are the recommendation (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import hashlib

from decisionflow.identity import OPERATION_PREFIX, OPERATION_TAG, _encode


def _field(text: str, index: int) -> bytes:
    if type(text) is str and "\r" not in text:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            data = _encode(text, what=f"field {index}")  # raises the protocol's clear error
    else:
        data = _encode(text, what=f"field {index}")
    if len(data) > 0xFFFFFFFF:
        raise ValueError(f"field {index} is longer than 4 GiB and cannot be framed")
    return len(data).to_bytes(4, "big") + data


def operation_id(case_id: str, action: str, body: str, evidence_id: str, policy_id: str) -> str:
    fields = (OPERATION_TAG, case_id, action, body, evidence_id, policy_id)
    framed = b"".join([_field(f, i) for i, f in enumerate(fields)])
    return OPERATION_PREFIX + hashlib.sha256(framed).hexdigest()
