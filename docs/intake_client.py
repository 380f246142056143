#!/usr/bin/env python3
"""A reference client for decisionflow's intake (docs/INTAKE.md): copy it into the pipeline.

It computes the operation identity of the case file itself, from docs/PROTOCOL.md alone (no
decisionflow import), sends it with the file, and retries the way the protocol expects:
with the same Idempotency-Key, after a lost answer, a 5xx or a 409 ``in_progress`` (waiting
``Retry-After``). Every retry is then either the first answer again or the first run's
result, never a second case.

    python docs/intake_client.py --url https://decisionflow.internal --token "$TOKEN" case.json

Needs httpx (``pip install httpx``). Exit codes: 0 the case is in (a replay included), 1 refused
(the answer says why), 2 no answer after the retries.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import uuid

import httpx

# --- docs/PROTOCOL.md, version 1 -----------------------------------------------------------


def _field(value: str) -> bytes:
    data = value.replace("\r\n", "\n").replace("\r", "\n").encode("utf-8")  # a lone surrogate raises
    return len(data).to_bytes(4, "big") + data


def _digest(prefix: str, fields: list[str]) -> str:
    return prefix + hashlib.sha256(b"".join(_field(f) for f in fields)).hexdigest()


def _typed(value) -> str:
    if isinstance(value, bool):
        return "bool:true" if value else "bool:false"
    if isinstance(value, int):
        return f"int:{value}"
    if isinstance(value, str):
        return f"str:{value}"
    raise TypeError(f"a policy parameter is an int, a str or a bool, not {type(value).__name__}")


def evidence_id(passages: list[dict]) -> str:
    fields = ["decisionflow.evidence.v1"]
    for p in sorted(passages, key=lambda p: (p["source_id"], p["version"])):
        fields += [p["source_id"], str(p["version"]), p["quotation"]]
    return _digest("ev-v1-", fields)


def policy_id(name: str, parameters: dict) -> str:
    fields = ["decisionflow.policy.v1", name]
    for key in sorted(parameters):
        fields += [key, _typed(parameters[key])]
    return _digest("pol-v1-", fields)


def operation_id(case: dict) -> str:
    """The identity of the proposal decisionflow prepares from this case file."""
    policy = case["policy"]
    return _digest(
        "op-v1-",
        [
            "decisionflow.operation.v1",
            case["case_id"],
            case["action"],
            case["draft"],
            evidence_id(case["selected_evidence"]),
            policy_id(policy["name"], policy["parameters"]),
        ],
    )


# --- sending -------------------------------------------------------------------------------


def send(url: str, token: str, case: dict, *, key: str | None = None, tries: int = 5, timeout: float = 30.0):
    """POST the case with its identity; returns the final response (or None: no answer)."""
    body = {**case, "operation_id": operation_id(case)}
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": key or str(uuid.uuid4())}
    with httpx.Client(timeout=timeout) as client:
        for attempt in range(tries):
            try:
                response = client.post(f"{url.rstrip('/')}/api/cases", json=body, headers=headers)
            except httpx.TransportError:
                response = None  # the answer was lost: the same key again is safe
            if response is not None and response.status_code < 500 and response.status_code != 409:
                return response
            if response is not None and response.status_code == 409 and response.json().get("code") != "in_progress":
                return response  # a refusal, not "still running"
            wait = float(response.headers.get("Retry-After", 1)) if response is not None else 2.0**attempt
            time.sleep(min(wait, 30.0))
    return response


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--key", help="the Idempotency-Key (default: a new UUID)")
    parser.add_argument("file")
    args = parser.parse_args(argv)
    with open(args.file, encoding="utf-8") as fh:
        case = json.load(fh)
    response = send(args.url, args.token, case, key=args.key)
    if response is None:
        print("intake: no answer after the retries; send it again with the same --key", file=sys.stderr)
        return 2
    answer = response.json()
    if response.status_code in (200, 201):
        replay = " (a replay of the first answer)" if response.headers.get("Idempotent-Replayed") else ""
        print(f"intake: {case['case_id']} op={answer['operation_id']} created={answer['created']}{replay}")
        return 0
    print(f"intake: refused {response.status_code} {answer.get('code')}: {answer.get('message')}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
