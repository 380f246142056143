"""Test-only fault switches. They do nothing unless DECISIONFLOW_FAULT_INJECTION is on.

``crash_point(name)`` kills the process with SIGKILL when ``DECISIONFLOW_CRASH_AT`` names
that point: no cleanup, no ``finally``, exactly like a power cut or an OOM kill.
"""

from __future__ import annotations

import os
import signal

from django.conf import settings


def enabled() -> bool:
    return bool(getattr(settings, "DECISIONFLOW_FAULT_INJECTION", False))


def crash_point(name: str) -> None:
    if enabled() and os.environ.get("DECISIONFLOW_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


class LostReceipt(Exception):
    """Raised after the commit transaction is durable, before the receipt is returned."""
