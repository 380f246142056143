"""Writer locks for the workflow's own bookkeeping: one per case, and one for reconcile runs.

Uniqueness never depends on these locks: the unique constraints on ``operation_id`` already
guarantee one decision and one effect per operation. The locks only keep the bookkeeping
tidy (one ``begin`` at a time per case, so two processes do not both run the workflow and
race to record the pending review; one ``reconcile`` run at a time, so two cron runs do not
overlap).

- PostgreSQL: session-level advisory locks (``pg_try_advisory_lock``), held on the caller's
  connection and released explicitly; a crashed process releases them by disconnecting.
- SQLite: a file lock (the pinned ``filelock`` package) in ``DECISIONFLOW_LOCK_DIR``
  (default: ``<tmp>/decisionflow-locks``). The file name includes a hash of the database
  path, so two SQLite databases on one machine (the demo's scratch file, a test database)
  never block each other. The OS releases a file lock when its process dies.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from django.db import connection
from filelock import FileLock, Timeout

from decisionflow.core.errors import DecisionflowError

DEFAULT_TIMEOUT = 30.0


class LockBusy(DecisionflowError):
    """Another process holds the lock (and we were told not to wait, or waited too long)."""

    code = "lock_busy"
    exit_code = 1


def _key(name: str) -> bytes:
    db_name = str(connection.settings_dict.get("NAME") or "")
    return hashlib.sha256(f"decisionflow\0{connection.vendor}\0{db_name}\0{name}".encode()).digest()


def _advisory_key(name: str) -> int:
    # pg advisory locks take one signed 64-bit key.
    return int.from_bytes(_key(name)[:8], "big", signed=True)


def lock_dir() -> Path:
    path = Path(os.environ.get("DECISIONFLOW_LOCK_DIR") or Path(tempfile.gettempdir()) / "decisionflow-locks")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def named_lock(name: str, *, what: str, timeout: float | None = DEFAULT_TIMEOUT):
    """Hold an exclusive lock called ``name``; ``timeout=0`` means do not wait at all.

    Raises ``LockBusy`` (with ``what`` in the message) if the lock cannot be had in time.
    """
    if connection.vendor == "postgresql":
        key = _advisory_key(name)
        deadline = time.monotonic() + (timeout or 0)
        with connection.cursor() as cursor:
            while True:
                cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
                if cursor.fetchone()[0]:
                    break
                if time.monotonic() >= deadline:
                    raise LockBusy(f"{what} is locked by another process; try again later")
                time.sleep(0.05)
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
    else:
        path = lock_dir() / f"{_key(name).hex()[:32]}.lock"
        # A fresh FileLock object per use: each one opens its own file description, so two
        # threads of one process exclude each other exactly like two processes do.
        lock = FileLock(path, thread_local=False)
        try:
            lock.acquire(timeout=-1 if timeout is None else timeout)
        except Timeout:
            raise LockBusy(f"{what} is locked by another process; try again later") from None
        try:
            yield
        finally:
            lock.release()


def case_lock(case_id: str, *, timeout: float | None = DEFAULT_TIMEOUT):
    """The per-case writer lock taken by begin, resume, edit and reconcile --repair."""
    return named_lock(f"case:{case_id}", what=f"case {case_id}", timeout=timeout)


def reconcile_lock():
    """One reconcile run at a time. It does not wait: a second cron run exits at once."""
    return named_lock("reconcile", what="reconcile", timeout=0)
