"""Writer locks for the workflow's own bookkeeping: one per case, and one for reconcile runs.

Uniqueness never depends on these locks: the unique constraints on ``operation_id`` already
guarantee one decision and one effect per operation. The locks only keep the bookkeeping
tidy (one ``begin`` at a time per case, so two processes do not both run the workflow and
race to record the pending review; one ``reconcile`` run at a time, so two cron runs do not
overlap).

- PostgreSQL: session-level advisory locks (``pg_try_advisory_lock``), held on the caller's
  connection and released explicitly; a crashed process releases them by disconnecting.
  A begin on PostgreSQL takes the same lock as a transaction-level advisory lock instead
  (``case_transaction_lock``): it travels with the transaction's first statements and ends
  with it, so there is no unlock to send and none to lose.
- SQLite: a file lock (the pinned ``filelock`` package) in ``DECISIONFLOW_LOCK_DIR``
  (default: ``<tmp>/decisionflow-locks``). The file name includes a hash of the database
  path, so two SQLite databases on one machine (the demo's scratch file, a test database)
  never block each other. The OS releases a file lock when its process dies.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, OperationalError, connection
from filelock import FileLock, Timeout

from core.errors import CaseBusy, DecisionflowError, LockBusy
from core.observability import lock_waited

log = logging.getLogger(__name__)

# Bulk commands (repair) may wait this long; a decision waits only
# DECISIONFLOW_DECISION_LOCK_TIMEOUT seconds (see decision_lock_timeout()).
DEFAULT_TIMEOUT = 30.0


def decision_lock_timeout() -> float:
    """How long a decision (or an edit) waits for its case before it answers "busy"."""
    return float(getattr(settings, "DECISIONFLOW_DECISION_LOCK_TIMEOUT", 3.0))


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
def named_lock(
    name: str,
    *,
    what: str,
    timeout: float | None = DEFAULT_TIMEOUT,
    busy: type[DecisionflowError] = LockBusy,
    busy_message: str | None = None,
):
    """Hold an exclusive lock called ``name``; ``timeout=0`` means do not wait at all.

    Raises ``busy`` (``busy_message``, or one naming ``what``) if the lock cannot be had in time.
    """
    message = busy_message or f"{what} is locked by another process; try again later"
    kind = name.split(":", 1)[0]  # the metric's label: "case", "reconcile"
    started = time.monotonic()
    if connection.vendor == "postgresql":
        key = _advisory_key(name)
        deadline = started + (timeout or 0)
        with connection.cursor() as cursor:
            while True:
                cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
                if cursor.fetchone()[0]:
                    break
                if time.monotonic() >= deadline:
                    lock_waited(kind, time.monotonic() - started, had=False)
                    raise busy(message)
                time.sleep(0.05)
        lock_waited(kind, time.monotonic() - started, had=True)
        try:
            yield
        finally:
            _advisory_unlock(key, what)
    else:
        path = lock_dir() / f"{_key(name).hex()[:32]}.lock"
        # A fresh FileLock object per use: each one opens its own file description, so two
        # threads of one process exclude each other exactly like two processes do.
        lock = FileLock(path, thread_local=False)
        try:
            lock.acquire(timeout=-1 if timeout is None else timeout)
        except Timeout:
            lock_waited(kind, time.monotonic() - started, had=False)
            raise busy(message) from None
        lock_waited(kind, time.monotonic() - started, had=True)
        try:
            yield
        finally:
            lock.release()


def _advisory_unlock(key: int, what: str) -> None:
    """Release a session advisory lock; on a dead connection there is nothing to release.

    PostgreSQL drops a session's advisory locks when the session ends, so a connection lost
    mid-decision has already released this one. Raising here would hide the real outcome of
    the work done under the lock (which is what the caller must report), so it is logged.
    """
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
    except DatabaseError as exc:
        log.warning("releasing the lock on %s failed (%s); the server releases it with the session", what, exc)
        # End the session, so that the server does release it: a persistent connection
        # (CONN_MAX_AGE) that still works would carry the lock into its next requests.
        if connection.in_atomic_block:
            connection.close_at = 0  # closed when the request ends, not under the caller's transaction
        else:
            with contextlib.suppress(DatabaseError):
                connection.close()


def case_lock(case_id: str, *, timeout: float | None = None):
    """The per-case writer lock taken by begin, resume, edit and reconcile --repair.

    It waits ``decision_lock_timeout()`` seconds by default, then raises ``CaseBusy``: a
    person clicking Approve gets an answer, never a page that waits forever.
    """
    return named_lock(
        f"case:{case_id}",
        what=f"case {case_id}",
        busy_message=f"another action on case {case_id} is in progress; try again",
        timeout=decision_lock_timeout() if timeout is None else timeout,
        busy=CaseBusy,
    )


# PostgreSQL's lock_not_available: a lock wait outlasted lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"


class CaseTransactionLock:
    """The case lock of ``case_lock``, held by one PostgreSQL transaction (a begin).

    ``sql`` goes first in the transaction's first query string (after BEGIN): it bounds every
    lock wait of the transaction with ``SET LOCAL lock_timeout`` (the decision lock timeout)
    and takes the case's advisory lock with ``pg_advisory_xact_lock``, the same key as
    ``case_lock``'s session lock, so each excludes the other. The server releases it at
    COMMIT or ROLLBACK, or when the session ends: no unlock round trip, and no unlock that a
    dead connection could fail (issue 12, items 4 and 5). Inside an outer transaction (a
    test's) it is held until that one ends.

    Use ``waits()`` around the whole transaction: a lock wait past the timeout, for this lock
    or for any row the transaction writes (all of them this case's), rolls it back and
    becomes ``CaseBusy``, as ``case_lock`` answers.
    """

    def __init__(self, case_id: str, *, timeout: float | None = None):
        self.case_id = case_id
        seconds = decision_lock_timeout() if timeout is None else timeout
        # lock_timeout = 0 would mean "wait forever": the shortest wait PostgreSQL takes is 1 ms.
        self.sql = (
            f"SET LOCAL lock_timeout = '{max(1, round(seconds * 1000))}ms'; SELECT pg_advisory_xact_lock(%(case_lock)s)"
        )
        self.params = {"case_lock": _advisory_key(f"case:{case_id}")}
        self._started = 0.0

    def granted(self) -> None:
        """Call once the query string that holds ``sql`` has answered: the wait is over."""
        lock_waited("case", time.monotonic() - self._started, had=True)

    @contextmanager
    def waits(self):
        self._started = time.monotonic()
        try:
            yield self
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
            lock_waited("case", time.monotonic() - self._started, had=False)
            raise CaseBusy(f"another action on case {self.case_id} is in progress; try again") from exc


def case_transaction_lock(case_id: str, *, timeout: float | None = None) -> CaseTransactionLock:
    """``case_lock`` for one PostgreSQL transaction; see ``CaseTransactionLock``."""
    return CaseTransactionLock(case_id, timeout=timeout)


def reconcile_lock():
    """One reconcile run at a time. It does not wait: a second cron run exits at once."""
    return named_lock("reconcile", what="reconcile", timeout=0)


def cron_lock(command: str):
    """One run of a cron command (e.g. prune_checkpoints) at a time. It does not wait: a
    second run exits at once (``LockBusy``), and the next cron tick tries again."""
    return named_lock(f"cron:{command}", what=command, timeout=0)


@contextmanager
def sqlite_bounded_wait():
    """On SQLite, a decision waits for the database's write lock no longer than for its case.

    SQLite has no row locks: a writer waits for the whole database (the connection's busy
    timeout, 30 s by default). Within a decision that wait is cut to
    ``decision_lock_timeout()``, and a "database is locked" answer becomes ``CaseBusy``.
    Other databases are unchanged (PostgreSQL bounds its waits with ``lock_timeout``).
    """
    if connection.vendor != "sqlite":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        previous = cursor.fetchone()[0]
        cursor.execute(f"PRAGMA busy_timeout = {int(decision_lock_timeout() * 1000)}")
    try:
        yield
    except OperationalError as exc:
        if "locked" not in str(exc):
            raise
        lock_waited("database", decision_lock_timeout(), had=False)
        raise CaseBusy("another action on this case is in progress (the database is locked); try again") from exc
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {int(previous)}")
