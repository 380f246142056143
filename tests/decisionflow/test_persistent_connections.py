"""Persistent database connections (settings: DATABASE_CONN_MAX_AGE) and the locks.

A web thread keeps its PostgreSQL connection between requests, so a lock that outlived its
request would stay held by that connection, and every other host would see the case busy.
The case lock is a transaction's (it ends with it, whatever happens inside); cron's session
locks that fail to release end the session when the request ends.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, close_old_connections, connection, transaction

from core.locks import case_lock, cron_lock

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_postgresql_connections_are_kept_and_checked_before_reuse():
    from django.conf import settings

    db = settings.DATABASES["default"]
    assert db["CONN_MAX_AGE"] > 0 and db["CONN_HEALTH_CHECKS"] is True


def held_by_another_session(name: str) -> bool:
    """Whether a second connection is refused the lock called ``name`` (it is held elsewhere)."""
    import psycopg

    from core.locks import _advisory_key
    from tests.conftest import database_url

    key = _advisory_key(name)
    with psycopg.connect(database_url(), autocommit=True) as other:
        got = other.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()[0]
        if got:
            other.execute("SELECT pg_advisory_unlock(%s)", [key])
        return not got


def test_a_case_lock_whose_work_fails_ends_with_its_transaction_and_keeps_the_connection():
    connection.ensure_connection()
    kept = connection.connection
    with pytest.raises(DatabaseError), case_lock("T-STUCK"):
        assert held_by_another_session("case:T-STUCK")
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1/0")
    assert not held_by_another_session("case:T-STUCK")
    close_old_connections()  # what Django does at the end of every request
    assert connection.connection is kept
    with case_lock("T-STUCK", timeout=0):  # and this thread can take it again at once
        pass


def test_a_cron_lock_that_failed_to_release_is_dropped_with_the_session_when_the_request_ends():
    with transaction.atomic():
        with cron_lock("T-STUCK"), pytest.raises(DatabaseError), connection.cursor() as cursor:
            cursor.execute("SELECT 1/0")  # the transaction is now aborted: the release fails
        assert held_by_another_session("cron:T-STUCK")  # still held by this session, for now
        transaction.set_rollback(True)
    close_old_connections()
    assert not held_by_another_session("cron:T-STUCK")
    with cron_lock("T-STUCK"):
        pass


def test_a_released_lock_keeps_the_connection():
    with case_lock("T-FINE"), cron_lock("T-FINE"):
        pass
    kept = connection.connection
    close_old_connections()
    assert connection.connection is kept
    assert not held_by_another_session("case:T-FINE") and not held_by_another_session("cron:T-FINE")
