"""Writer locks for the workflow's own bookkeeping: one per case, and one per cron command.

Uniqueness never depends on these locks: the unique constraints on ``operation_id`` already
guarantee one decision and one effect per operation. The locks only keep the bookkeeping
tidy (one ``begin`` at a time per case, so two processes do not both run the workflow and
race to record the pending review; one ``reconcile`` run at a time, so two cron runs do not
overlap).

- The case lock (``case_lock``) is one transaction. On PostgreSQL it is a transaction-level
  advisory lock (``pg_advisory_xact_lock``), taken by the transaction's first statement
  and released by the server at COMMIT or ROLLBACK: nothing to unlock, and nothing a pooler
  in transaction mode could leave held on an idle server connection. On SQLite it is a file
  lock around the transaction.
- Cron's locks (``reconcile_lock``, ``cron_lock``, and ``case_session_lock`` for the cases
  ``reconcile --repair`` repairs) outlive any one transaction (a reconcile streams a million
  rows), so on PostgreSQL they are session-level advisory locks, released explicitly, and
  need a direct connection to the server (docs/DEPLOY.md, "Locks and poolers"); a crashed
  process releases them by disconnecting.
- A file lock (the pinned ``filelock`` package) lives in ``DECISIONFLOW_LOCK_DIR``
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
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, OperationalError, connection, transaction

from core.errors import CaseBusy, DecisionflowError, LockBusy
from core.observability import LockName, lock_waited

log = logging.getLogger(__name__)

# Bulk commands (repair) may wait this long; a decision waits only
# DECISIONFLOW_DECISION_LOCK_TIMEOUT seconds (see decision_lock_timeout()).
DEFAULT_TIMEOUT = 30.0

# PostgreSQL's lock_not_available: a lock wait outlasted lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"


def decision_lock_timeout() -> float:
    """How long a decision (or an edit) waits for its case before it answers "busy"."""
    return float(getattr(settings, "DECISIONFLOW_DECISION_LOCK_TIMEOUT", 3.0))


def lock_not_available(exc: BaseException) -> bool:
    """Whether a database error is PostgreSQL's answer to a lock wait past ``lock_timeout``."""
    return getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE


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
def _file_lock(name: str, *, timeout: float | None, busy: DecisionflowError):
    # Imported here: only SQLite takes file locks, and on PostgreSQL every command's start
    # would pay for it (~6 ms of cron start, python -X importtime).
    from filelock import FileLock, Timeout

    kind = name.split(":", 1)[0]  # the metric's label, a LockName
    started = time.monotonic()
    path = lock_dir() / f"{_key(name).hex()[:32]}.lock"
    # A fresh FileLock object per use: each one opens its own file description, so two
    # threads of one process exclude each other exactly like two processes do.
    lock = FileLock(path, thread_local=False)
    try:
        lock.acquire(timeout=-1 if timeout is None else timeout)
    except Timeout:
        lock_waited(kind, time.monotonic() - started, had=False)
        raise busy from None
    lock_waited(kind, time.monotonic() - started, had=True)
    try:
        yield
    finally:
        lock.release()


_POOLED = (
    "{what}: its one-run-at-a-time lock is a session advisory lock and needs a direct connection "
    "to PostgreSQL, not a pooler in transaction mode (docs/DEPLOY.md, Locks and poolers)"
)


@contextmanager
def named_lock(
    name: str,
    *,
    what: str,
    timeout: float | None = DEFAULT_TIMEOUT,
    busy: type[DecisionflowError] = LockBusy,
    busy_message: str | None = None,
):
    """Hold an exclusive session lock called ``name``; ``timeout=0`` means do not wait at all.

    For cron's commands only: on PostgreSQL a session-level advisory lock, which outlives
    transactions and so needs the session to stay on one server connection. The lock is
    taken only by the server session that answered the statement before it, so a pooler in
    transaction mode is refused (``DirectConnectionRequired``) instead of leaving a lock
    behind on a pooled connection. Raises ``busy`` (``busy_message``, or one naming
    ``what``) if the lock cannot be had in time.
    """
    message = busy_message or f"{what} is locked by another process; try again later"
    if connection.vendor != "postgresql":
        with _file_lock(name, timeout=timeout, busy=busy(message)):
            yield
        return
    kind = name.split(":", 1)[0]
    started = time.monotonic()
    key = _advisory_key(name)
    deadline = started + (timeout or 0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
        while True:
            cursor.execute("SELECT CASE WHEN pg_backend_pid() = %s THEN pg_try_advisory_lock(%s) END", [pid, key])
            (got,) = cursor.fetchone()
            if got is None:
                raise LockBusy(_POOLED.format(what=what))
            if got:
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


def _advisory_unlock(key: int, what: str) -> None:
    """Release a session advisory lock; on a dead connection there is nothing to release.

    PostgreSQL drops a session's advisory locks when the session ends, so a connection lost
    mid-run has already released this one. Raising here would hide the real outcome of the
    work done under the lock (which is what the caller must report), so it is logged.
    """
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
            (released,) = cursor.fetchone()
    except DatabaseError as exc:
        log.warning("releasing the lock on %s failed (%s); the server releases it with the session", what, exc)
        _end_session()
        return
    if not released:
        # The session that took it is not this one any more: a pooler moved the connection.
        log.error("%s; the lock may stay held by a pooled server connection", _POOLED.format(what=what))
        _end_session()


def _end_session() -> None:
    """Close the connection so that the server releases the session's locks: a persistent
    connection (CONN_MAX_AGE) that still works would carry a lock into its next uses."""
    if connection.in_atomic_block:
        connection.close_at = 0  # closed when the request ends, not under the caller's transaction
    else:
        with contextlib.suppress(DatabaseError):
            connection.close()


# One statement for ``case_lock`` to run under the lock: SQL and its parameters.
Statement = tuple[str, Sequence[Any]]


def lock_timeout_ms(seconds: float) -> int:
    """``seconds`` as PostgreSQL's ``lock_timeout``, in milliseconds."""
    # lock_timeout = 0 would mean "wait forever": the shortest wait PostgreSQL takes is 1 ms.
    return max(1, round(seconds * 1000))


@contextmanager
def case_lock(case_id: str, *, timeout: float | None = None, reads: Sequence[Statement] = ()):
    """One transaction that holds the per-case writer lock: begin, edit, publishing, the
    decision that begins a review. The work goes inside the block.

    PostgreSQL: ``transaction.atomic()``, whose first statements bound every lock wait of the
    transaction with ``SET LOCAL lock_timeout`` and take the case's ``pg_advisory_xact_lock``;
    the server releases it when the transaction ends (inside an outer transaction, a test's,
    when that one ends). A wait past the timeout, for this lock or for any row the
    transaction goes on to lock, rolls the block back and raises ``CaseBusy``. SQLite: the
    case's file lock, then ``transaction.atomic()``.

    ``reads``: statements to run first, under the lock; the block gets their rows, a list
    per statement. On PostgreSQL they travel with the lock in one query string.

    It waits ``decision_lock_timeout()`` seconds by default: a person clicking Approve gets
    an answer, never a page that waits forever.
    """
    seconds = decision_lock_timeout() if timeout is None else timeout
    if connection.vendor != "postgresql":
        with (
            _file_lock(f"{LockName.CASE}:{case_id}", timeout=seconds, busy=CaseBusy.held(case_id)),
            transaction.atomic(),
        ):
            yield [_rows(statement) for statement in reads]
        return
    started = time.monotonic()
    try:
        with transaction.atomic():
            rows = _locked_reads(_advisory_key(f"{LockName.CASE}:{case_id}"), lock_timeout_ms(seconds), reads)
            lock_waited(LockName.CASE, time.monotonic() - started, had=True)
            yield rows
    except OperationalError as exc:
        if not lock_not_available(exc):
            raise
        lock_waited(LockName.CASE, time.monotonic() - started, had=False)
        raise CaseBusy.held(case_id) from exc


@contextmanager
def policy_lock(name: str, *, shared: bool, timeout: float = DEFAULT_TIMEOUT):
    """One transaction that holds policy ``name``'s lock: shared by the imports of cases
    under it, exclusive for a publish's switch of its cases onto a new version. So an import
    either commits before the switch (and is switched with the rest) or starts after it and
    sees the new version.

    PostgreSQL: ``transaction.atomic()`` whose first statements bound every lock wait of the
    transaction (``SET LOCAL lock_timeout``) and take ``pg_advisory_xact_lock_shared`` or
    ``pg_advisory_xact_lock``, released by the server when the transaction ends, so a pooler
    in transaction mode is safe. A wait past ``timeout`` rolls back and raises ``LockBusy``.
    SQLite: ``transaction.atomic()`` alone: every transaction opens with BEGIN IMMEDIATE and
    holds the database's write lock, which already orders an import against a publish.
    """
    if connection.vendor != "postgresql":
        with transaction.atomic():
            yield
        return
    take = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    started = time.monotonic()
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SET LOCAL lock_timeout = '{lock_timeout_ms(timeout)}ms'; SELECT {take}(%s)",
                    [_advisory_key(f"{LockName.POLICY}:{name}")],
                )
            lock_waited(LockName.POLICY, time.monotonic() - started, had=True)
            yield
    except OperationalError as exc:
        if not lock_not_available(exc):
            raise
        lock_waited(LockName.POLICY, time.monotonic() - started, had=False)
        raise LockBusy(
            f"policy {name}: another action held its lock, or a lock on one of its cases, for more than "
            f"{timeout:g} s (a publish, or an import into it); nothing was written; try again"
        ) from exc


def _rows(statement: Statement) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(*statement)
        return cursor.fetchall()


def _locked_reads(key: int, timeout_ms: int, reads: Sequence[Statement]) -> list[list[tuple]]:
    """PostgreSQL: the lock timeout, the case lock and ``reads``, in one query string (one
    round trip after psycopg's BEGIN); each statement runs after the one before it, so the
    reads see the database as it is once the lock is held."""
    sql = "; ".join([f"SET LOCAL lock_timeout = '{timeout_ms}ms'", "SELECT pg_advisory_xact_lock(%s)"])
    params: list[Any] = [key]
    for statement, statement_params in reads:
        sql, params = f"{sql}; {statement}", [*params, *statement_params]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        results = []
        cursor.nextset()  # past the SET: the lock's result
        while cursor.nextset():
            results.append(cursor.fetchall())
    return results


def case_session_lock(case_id: str, *, timeout: float = DEFAULT_TIMEOUT):
    """The case lock for a cron command that commits several transactions under it
    (``reconcile --repair``: each repair is its own transaction, so a crash mid-way leaves
    every earlier one repaired). A session-level lock on ``case_lock``'s key, so each
    excludes the other; cron connects to PostgreSQL directly (see ``named_lock``)."""
    return named_lock(
        f"{LockName.CASE}:{case_id}",
        what=f"case {case_id}",
        timeout=timeout,
        busy=CaseBusy,
        busy_message=CaseBusy.held(case_id).message,
    )


def reconcile_lock():
    """One reconcile run at a time. It does not wait: a second cron run exits at once."""
    return named_lock(LockName.RECONCILE, what="reconcile", timeout=0)


def cron_lock(command: str):
    """One run of a cron command (e.g. prune_checkpoints) at a time. It does not wait: a
    second run exits at once (``LockBusy``), and the next cron tick tries again."""
    return named_lock(f"{LockName.CRON}:{command}", what=command, timeout=0)


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
        lock_waited(LockName.DATABASE, decision_lock_timeout(), had=False)
        raise CaseBusy("another action on this case is in progress (the database is locked); try again") from exc
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {int(previous)}")
