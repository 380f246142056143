"""Fault switches: the ways a real helpdesk fails a sender, on demand.

Set at start-up (flags or environment, only with --faults) and changed at run time by
`POST /_faults`. Each switch acts on `/replies` only; /healthz, /_faults and /_stats always
answer, so a test can always steer and read the helpdesk.
"""

from __future__ import annotations

import math
import random
import threading
import time
from typing import Any


class FaultError(ValueError):
    """A fault setting that is not understood; the caller answers 400 and changes nothing."""


# name -> (type, the value that turns it off)
SWITCHES: dict[str, tuple[type, float]] = {
    # Commit the reply, then close the connection without answering: the next N POSTs that
    # reach a stored reply (new or replayed), and/or each such POST with this probability.
    "drop_after_commit": (int, 0),
    "drop_after_commit_probability": (float, 0.0),
    # Answer a POST this late, after its commit.
    "delay_ms": (int, 0),
    # Answer 503 with Retry-After, storing nothing: for this many seconds from now, and/or
    # for the next N requests to /replies.
    "unavailable_for_s": (float, 0.0),
    "unavailable_count": (int, 0),
    # The lookup does not see replies younger than this (404), though they are stored.
    "lookup_lag_s": (float, 0.0),
    # The ticket was closed: the next N valid POSTs answer 422 ticket_closed and store
    # nothing, whether or not their key already holds a reply (it is checked first).
    "ticket_closed_count": (int, 0),
}


def parse_value(name: str, raw: Any) -> int | float:
    """Check one switch's value (a JSON number, or a string from a flag or the environment)."""
    if name not in SWITCHES:
        raise FaultError(f"unknown fault switch {name!r}; known: {', '.join(sorted(SWITCHES))}")
    kind = SWITCHES[name][0]
    if isinstance(raw, bool):
        raise FaultError(f"{name} must be a number, not {raw!r}")
    try:
        value: int | float = kind(raw) if isinstance(raw, str) else raw
    except ValueError:
        raise FaultError(f"{name} must be {'an integer' if kind is int else 'a number'}, not {raw!r}") from None
    if kind is int and not isinstance(value, int):
        raise FaultError(f"{name} must be an integer, not {raw!r}")
    if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise FaultError(f"{name} must be a finite number >= 0, not {raw!r}")
    if name == "drop_after_commit_probability" and value > 1:
        raise FaultError(f"{name} must be between 0 and 1, not {raw!r}")
    return kind(value)


class Faults:
    """The current switches, shared by the request threads of one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        self._drop_count = 0
        self._drop_probability = 0.0
        self._delay_ms = 0
        self._unavailable_until = 0.0  # time.monotonic()
        self._unavailable_count = 0
        self._lookup_lag_s = 0.0
        self._ticket_closed_count = 0

    def update(self, values: dict[str, Any], *, reset: bool = False) -> None:
        """Apply several switches at once, or none of them if one is wrong."""
        parsed = {name: parse_value(name, raw) for name, raw in values.items()}
        with self._lock:
            if reset:
                self._clear()
            for name, value in parsed.items():
                if name == "drop_after_commit":
                    self._drop_count = int(value)
                elif name == "drop_after_commit_probability":
                    self._drop_probability = float(value)
                elif name == "delay_ms":
                    self._delay_ms = int(value)
                elif name == "unavailable_for_s":
                    self._unavailable_until = time.monotonic() + value if value else 0.0
                elif name == "unavailable_count":
                    self._unavailable_count = int(value)
                elif name == "lookup_lag_s":
                    self._lookup_lag_s = float(value)
                elif name == "ticket_closed_count":
                    self._ticket_closed_count = int(value)

    def take_unavailable(self) -> int | None:
        """Seconds for Retry-After when this request is to be refused with 503, else None."""
        with self._lock:
            remaining = self._unavailable_until - time.monotonic()
            if remaining > 0:
                return max(1, math.ceil(remaining))
            if self._unavailable_count > 0:
                self._unavailable_count -= 1
                return 1
            return None

    def take_ticket_closed(self) -> bool:
        """Whether to refuse this POST as if its ticket were closed; counts one of the next N off."""
        with self._lock:
            if self._ticket_closed_count > 0:
                self._ticket_closed_count -= 1
                return True
            return False

    def take_drop(self) -> bool:
        """Whether to drop this POST's answer; counts one of the next N off."""
        with self._lock:
            if self._drop_count > 0:
                self._drop_count -= 1
                return True
            return self._drop_probability > 0 and random.random() < self._drop_probability

    @property
    def delay_s(self) -> float:
        return self._delay_ms / 1000

    @property
    def lookup_lag_s(self) -> float:
        return self._lookup_lag_s

    def snapshot(self) -> dict[str, int | float]:
        with self._lock:
            return {
                "drop_after_commit": self._drop_count,
                "drop_after_commit_probability": self._drop_probability,
                "delay_ms": self._delay_ms,
                "unavailable_for_s": round(max(0.0, self._unavailable_until - time.monotonic()), 3),
                "unavailable_count": self._unavailable_count,
                "lookup_lag_s": self._lookup_lag_s,
                "ticket_closed_count": self._ticket_closed_count,
            }
