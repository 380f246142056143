"""PostgreSQL: statements prepared once per session, and a transaction whose BEGIN travels
with its first statements. Used by the commit (effects) and by begin (workflow).

Django's psycopg cursors bind parameters client-side and prepare nothing, so a statement
with several CTEs is parsed and planned on every call (for the commit, 0.5 ms of server
time, more than running it). A statement prepared by name with SQL ``PREPARE`` can still
travel in one query string with BEGIN and a lock (``EXECUTE name(...)``), which psycopg's
protocol-level prepared statements cannot. PREPARE is not transactional: a statement
prepared on a session stays there, whether the transaction around it commits or not, until
the session ends. A pooler must keep sessions (docs/DEPLOY.md already requires it for the
advisory locks).
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Mapping
from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

# Per psycopg connection: the names of the statements prepared on its server session.
_prepared_on: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


class PreparedStatement:
    """One statement, prepared once per database session with SQL PREPARE.

    ``sql`` names its parameters ``%(name)s``; ``types`` gives each one's PostgreSQL type, in
    the order PREPARE declares them (each ``%(name)s`` becomes its ``$n``).
    """

    def __init__(self, sql: str, types: Mapping[str, str]):
        self.sql = sql
        self.types = dict(types)
        # Named after its text: a changed statement is a new statement.
        self.name = f"decisionflow_{hashlib.sha256(sql.encode()).hexdigest()[:16]}"
        self.parameters = [name for name in self.types if f"%({name})s" in sql]
        unknown = set(re.findall(r"%\((\w+)\)s", sql)) - set(self.parameters)
        if unknown:
            raise ImproperlyConfigured(f"statement parameters without a declared type: {unknown}")

    def prepare_sql(self) -> str:
        sql = self.sql
        for n, name in enumerate(self.parameters, 1):
            sql = sql.replace(f"%({name})s", f"${n}")
        types = ", ".join(self.types[name] for name in self.parameters)
        return f"PREPARE {self.name} ({types}) AS {sql}"

    def call_sql(self, cursor, pg=None) -> str:
        """What to send: ``EXECUTE name(...)``, once the statement is prepared on this
        session (preparing it first, in a statement of its own, the first time); the
        statement itself when psycopg's own prepared statements are turned on, because
        psycopg then deallocates every prepared statement at each rollback. ``pg`` is the
        psycopg connection under ``cursor`` (the default connection's when not given)."""
        if pg is None:
            pg = connection.connection
        if pg.prepare_threshold is not None:
            return self.sql
        prepared = _prepared_on.setdefault(pg, set())
        if self.name not in prepared:
            cursor.execute(self.prepare_sql())
            prepared.add(self.name)
        return f"EXECUTE {self.name} ({', '.join(f'%({name})s' for name in self.parameters)})"


def begin_in_query_string() -> bool:
    """Call first thing inside a fresh ``transaction.atomic()``: True when the caller must
    lead its first query string with ``BEGIN;`` (psycopg is then told not to send its own).

    psycopg sends the BEGIN that Django's atomic() asks for just before the first statement,
    as a round trip of its own. So when nothing has been sent yet, psycopg is told autocommit
    (it then sends no BEGIN) and the caller's own BEGIN leads its query string. psycopg's
    commit() and rollback() go by the server's transaction status, so atomic() still ends
    the transaction as usual, and then turns autocommit on, which is where psycopg's flag
    already is. Inside an outer transaction (a test's), atomic() made a savepoint and there
    is no BEGIN to send: False.
    """
    connection.ensure_connection()
    pg = connection.connection
    begin = pg.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if begin:
        pg.autocommit = True
    return begin
