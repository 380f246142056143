"""The helpdesk's ticket replies, in one SQLite file.

The idempotency key is UNIQUE in the table, so "one reply per key" holds whatever the
number of threads or processes writing to the file: each write is one BEGIN IMMEDIATE
transaction (SQLite's write lock) that inserts with ON CONFLICT DO NOTHING and reads the
row back, and the row it reads is the one that won.
"""

from __future__ import annotations

import enum
import hashlib
import json
import queue
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Writers wait this long for SQLite's write lock before giving up; a test fires dozens of
# identical POSTs at once from several processes, and each holds the lock for a moment.
BUSY_TIMEOUT_MS = 30_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS replies (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL,
    body_sha256 TEXT NOT NULL,
    case_id TEXT NOT NULL,
    body TEXT NOT NULL,
    evidence_id TEXT NOT NULL,
    policy_id TEXT NOT NULL,
    source_versions TEXT NOT NULL,
    created_at TEXT NOT NULL,
    -- Seconds since the epoch, for the lagging lookup (a fault switch) across processes.
    created_ts REAL NOT NULL,
    CONSTRAINT replies_idempotency_key_unique UNIQUE (idempotency_key),
    CONSTRAINT replies_key_is_sha256_hex CHECK (
        (length(idempotency_key) = 64 AND idempotency_key NOT GLOB '*[^0-9a-f]*')
        OR (length(idempotency_key) = 70 AND idempotency_key GLOB 'op-v1-*'
            AND substr(idempotency_key, 7) NOT GLOB '*[^0-9a-f]*')
    )
);
"""


class Outcome(enum.StrEnum):
    CREATED = "created"
    REPLAYED = "replayed"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class Reply:
    id: int
    idempotency_key: str
    body_sha256: str
    case_id: str
    created_at: str
    created_ts: float

    @property
    def reference(self) -> str:
        return f"HD-{self.id:06d}"

    def as_json(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "operation_id": self.idempotency_key,
            "case_id": self.case_id,
            "created_at": self.created_at,
        }


def canonical_sha256(payload: dict[str, Any]) -> str:
    """The hash that decides "same body": key order and whitespace do not count."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def connect(path: Path) -> sqlite3.Connection:
    # Autocommit mode (isolation_level=None): every transaction below is explicit.
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    # In WAL mode, NORMAL syncs at checkpoints rather than at every commit: a committed reply
    # survives a crash or SIGKILL of the helpdesk (what the tests and the battery do to it),
    # though not a power cut. FULL costs an fsync per reply (about 15 ms here).
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def initialise(path: Path) -> None:
    """Create the file and its table; safe when several processes start on one file at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = connect(path)
    try:
        # WAL lets lookups read while a POST writes, from any process on the same host.
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(SCHEMA)
        conn.execute("COMMIT")
    finally:
        conn.close()


class ConnectionPool:
    """Connections kept open between requests.

    A connection per request costs about 8 ms here: closing the last connection to a WAL file
    checkpoints and removes the WAL, and the next one creates it again.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._idle: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            conn = connect(self.path)
        try:
            yield conn
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._idle.put(conn)

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


_COLUMNS = "id, idempotency_key, body_sha256, case_id, created_at, created_ts"


def _reply(row: tuple[Any, ...]) -> Reply:
    return Reply(*row)


def reply_store(conn: sqlite3.Connection, *, payload: dict[str, Any]) -> tuple[Outcome, Reply]:
    """Store the reply for payload's operation_id once, or find the one already stored.

    One BEGIN IMMEDIATE transaction: the insert either wins (CREATED) or meets the UNIQUE key
    and does nothing; the row read back then says whether the stored body is the same one
    (REPLAYED) or another (CONFLICT: the caller refuses, and nothing new is stored).
    """
    sha = canonical_sha256(payload)
    now = time.time()
    created_at = datetime.fromtimestamp(now, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    conn.execute("BEGIN IMMEDIATE")
    try:
        cursor = conn.execute(
            "INSERT INTO replies (idempotency_key, body_sha256, case_id, body, evidence_id, policy_id,"
            " source_versions, created_at, created_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (idempotency_key) DO NOTHING",
            (
                payload["operation_id"],
                sha,
                payload["case_id"],
                payload["body"],
                payload["evidence_id"],
                payload["policy_id"],
                json.dumps(payload["source_versions"], sort_keys=True),
                created_at,
                now,
            ),
        )
        inserted = cursor.rowcount == 1
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM replies WHERE idempotency_key = ?", (payload["operation_id"],)
        ).fetchone()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    reply = _reply(row)
    if inserted:
        return Outcome.CREATED, reply
    if reply.body_sha256 == sha:
        return Outcome.REPLAYED, reply
    return Outcome.CONFLICT, reply


def reply_get(conn: sqlite3.Connection, *, operation_id: str) -> Reply | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM replies WHERE idempotency_key = ?", (operation_id,)).fetchone()
    return _reply(row) if row else None


def replies_summary(conn: sqlite3.Connection) -> dict[str, Any]:
    """Counts for tests: replies stored, and how many a customer would see twice.

    A duplicate is a second stored reply with the same case and the same text under another
    key (the naive "fresh key per try" sender makes them); one key never has two rows.
    """
    total = conn.execute("SELECT count(*) FROM replies").fetchone()[0]
    by_case = dict(conn.execute("SELECT case_id, count(*) FROM replies GROUP BY case_id").fetchall())
    duplicates = conn.execute(
        "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM replies GROUP BY case_id, body)"
    ).fetchone()[0]
    return {"replies": total, "replies_by_case": by_case, "duplicate_replies": duplicates}
