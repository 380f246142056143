"""psycopg's prepared statements, on a direct connection to PostgreSQL and never behind a pooler.

The commit's statements and begin's write are sent with server-side binding
(core/statements.py ``bound_cursor``), so psycopg can prepare them on the server once a
statement has run ``prepare_threshold`` times on a connection (Django's
``OPTIONS["prepare_threshold"]``, from ``DATABASE_PREPARE_THRESHOLD``).
A prepared statement belongs to one server session. A pooler in transaction mode hands each
transaction whichever server session is free, so a statement prepared on one is missing on
the next ("prepared statement _pg3_0 does not exist"), and PgBouncer 1.18 (Debian 12) cannot
keep them in any mode. So each new connection is checked once: a pooler answers the start-up
with a backend key of its own (it must, to route cancel requests), while a direct
connection's key names the server process that runs the statements. When the two differ, a
pooler is in between and preparing is turned off on that connection before it runs
anything else.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

log = logging.getLogger(__name__)

# Why preparing is off, per open psycopg connection that asked for it.
_turned_off: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
# Said once per process: every connection of a host behind a pooler finds the same.
_said = False


def prepared_statements_guard(sender, connection, **kwargs) -> None:
    """``connection_created``: turn psycopg's preparing off on a connection that a pooler answers."""
    raw = connection.connection
    if connection.vendor != "postgresql" or getattr(raw, "prepare_threshold", None) is None:
        return
    with raw.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (server_pid,) = cursor.fetchone()
    if raw.info.backend_pid == server_pid:
        return
    raw.prepare_threshold = None
    _turned_off[raw] = reason = (
        f"a pooler answers for PostgreSQL (backend key {raw.info.backend_pid}, server process {server_pid}): "
        "prepared statements are off on this connection (docs/DEPLOY.md, Behind a connection pooler)"
    )
    global _said
    if not _said:
        _said = True
        log.info("%s", reason)


def prepared_statements(connection) -> dict:
    """Whether the connection prepares the commit's statements, and why not when it does not."""
    raw = connection.connection
    if connection.vendor != "postgresql" or raw is None:
        return {"on": False, "why": "not PostgreSQL"}
    if raw.prepare_threshold is not None:
        return {"on": True, "threshold": raw.prepare_threshold}
    return {"on": False, "why": _turned_off.get(raw, "DATABASE_PREPARE_THRESHOLD is empty")}
