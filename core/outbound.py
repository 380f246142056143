"""Bounded outbound HTTP calls: one deadline for a whole call, and a cap on the answer read
(docs/DELIVERY.md, "Deadlines"; docs/QUEUE.md for the webhook).

httpx's timeouts bound each phase (connecting, each read, each write, the wait for a pooled
connection), not a call: an answer that sends one byte within every read timeout holds its
worker for as long as the other side likes. A ``Deadline`` is the budget of one call. The
caller caps each phase's timeout by the time left when it sends (``Deadline.timeouts``), and
reads the answer with ``read_capped``, which checks the deadline after every chunk, so a
trickling answer is cut at the deadline plus at most one read.

Nothing here imports httpx: the callers pass their own request's response in (httpx is
imported only in the process that sends, see effects/delivery.py), and this module is as
cheap to import as the rest of the ground floor.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol


class DeadlinePassed(TimeoutError):
    """The call's deadline passed before its answer ended. The request may have been read
    and acted on by the other side: the caller decides what an answer cut off means."""


class StreamedResponse(Protocol):
    """The part of an ``httpx.Response`` (opened with ``stream=True``) that is read here."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def iter_bytes(self) -> Iterator[bytes]: ...


@dataclass(frozen=True)
class Deadline:
    """The end of one call's time, on the monotonic clock."""

    seconds: float
    at: float

    @classmethod
    def after(cls, duration: timedelta) -> Deadline:
        seconds = duration.total_seconds()
        return cls(seconds=seconds, at=time.monotonic() + seconds)

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def check(self, read: int = 0) -> None:
        """Raise ``DeadlinePassed`` once the deadline has passed (``read`` bytes so far)."""
        if time.monotonic() >= self.at:
            raise DeadlinePassed(f"the answer did not end within the {self.seconds:g} s deadline ({read} bytes read)")

    def timeouts(self, *, connect: float, read: float, write: float, pool: float) -> dict[str, float]:
        """The per-phase timeouts of a request sent now, each at most the time left (the
        keyword arguments of ``httpx.Timeout``)."""
        self.check()
        left = self.left()
        return {
            "connect": min(connect, left),
            "read": min(read, left),
            "write": min(write, left),
            "pool": min(pool, left),
        }


def read_capped(response: StreamedResponse, *, cap: int, deadline: Deadline) -> bytes | None:
    """The answer's body, or None when it is longer than ``cap`` bytes: never more than
    ``cap`` bytes and one chunk are read. Raises ``DeadlinePassed`` when the body has not
    ended by the deadline (checked after each chunk; each chunk's wait is bounded by the
    request's read timeout, itself at most the time left)."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        return None
    data = bytearray()
    for chunk in response.iter_bytes():
        data += chunk
        if len(data) > cap:
            return None
        deadline.check(len(data))
    return bytes(data)
