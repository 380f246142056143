"""The locks on PostgreSQL: every request path holds the case lock for one transaction only,
so nothing is left held after a request, on any pooler mode; cron's session locks refuse a
session that moves between statements (a pooler in transaction mode).

These run with real transactions: a test transaction would hold every transaction-level
lock until the test ends.
"""

from __future__ import annotations

import logging

import pytest
from django.db import connection

from cases.services import case_import
from core.errors import LockBusy
from core.locks import _advisory_key, case_lock, cron_lock
from tests.conftest import load_fixture
from workflow.begin import review_begin
from workflow.decide import decision_record
from workflow.edit import review_edit
from workflow.publishing import policy_publish

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

V4 = {
    "name": "support-reply",
    "label": "v4",
    "parameters": {"allowance_units": 10, "rollback_advice": "forbidden", "requires_human_review": True},
}
# What a session-level advisory lock is taken and released with.
SESSION_LOCK_CALLS = ("pg_advisory_lock", "pg_try_advisory_lock", "pg_advisory_unlock")


def advisory_locks(*, this_session: bool) -> int:
    mine = " AND pid = pg_backend_pid()" if this_session else ""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())" + mine
        )
        return cursor.fetchone()[0]


def new_case(case_id: str):
    return case_import(data={**load_fixture("t1042.json"), "case_id": case_id}).case


def test_begin_edit_publish_and_decisions_leave_no_advisory_lock(reviewer, editor, make_user):
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    publisher = make_user("publisher", group="leads")
    with connection.execute_wrapper(record):
        case = new_case("T-LOCKS")
        begun = review_begin(case=case)
        assert advisory_locks(this_session=True) == 0
        edited = review_edit(
            case=case,
            expected_operation_id=begun.operation_id,
            body=begun.pending_review.proposal.body + " More.",
            editor=editor,
        )
        assert edited.begun is not None and edited.begin_error is None
        assert advisory_locks(this_session=True) == 0
        published = policy_publish(data=V4, publisher=publisher, apply=True)
        assert (published.superseded, published.failed) == (1, [])
        assert advisory_locks(this_session=True) == 0
        case.refresh_from_db()
        decided = decision_record(
            case=case, operation_id=case.current_proposal.operation_id, approved=True, reviewer=reviewer, channel="test"
        )
        assert decided.outcome == "committed"
        # A decision that begins the review first (the case was never begun); a new case
        # comes in under the version now current.
        fresh = case_import(data={**load_fixture("t1042.json"), "case_id": "T-LOCKS-FRESH", "policy": V4}).case
        from workflow.selectors import decidable_operation_id

        first = decision_record(
            case=fresh, operation_id=decidable_operation_id(fresh), approved=True, reviewer=reviewer, channel="test"
        )
        assert first.begun and first.outcome == "committed"
    assert advisory_locks(this_session=True) == 0 and advisory_locks(this_session=False) == 0
    # Edit x2 and publish take the case lock; the two first begins (the case's own, and the
    # decision's that begins the review) take none: their one write is all or nothing.
    assert sum("pg_advisory_xact_lock" in sql for sql in sent) >= 3, sent
    assert not [sql for sql in sent if any(call in sql for call in SESSION_LOCK_CALLS)]


def test_the_case_lock_is_held_by_its_transaction_only():
    with case_lock("T-XACT"), connection.cursor() as cursor:
        cursor.execute("SELECT mode, granted FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        assert cursor.fetchall() == [("ExclusiveLock", True)]
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone() == ("3s",)
    assert advisory_locks(this_session=True) == 0
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")  # SET LOCAL: only for that transaction
        assert cursor.fetchone() == ("0",)


def test_a_cron_lock_refuses_a_session_that_moved_and_takes_nothing(caplog):
    """Behind a pooler in transaction mode the next statement may run on another server
    connection: the lock is then not taken, and the command says why in one line."""

    def moved(execute, sql, params, many, context):
        if "pg_try_advisory_lock" in sql:
            params = [params[0] + 1, *params[1:]]  # as if the previous statement ran elsewhere
        return execute(sql, params, many, context)

    with connection.execute_wrapper(moved), pytest.raises(LockBusy) as refused, cron_lock("prune_checkpoints"):
        pytest.fail("the lock must not be had")
    assert refused.value.message == (
        "prune_checkpoints: its one-run-at-a-time lock is a session advisory lock and needs a direct connection to "
        "PostgreSQL, not a pooler in transaction mode (docs/DEPLOY.md, Locks and poolers)"
    )
    assert advisory_locks(this_session=False) == 0


def test_a_cron_lock_released_by_another_session_says_so_and_ends_the_session(caplog):
    """The unlock finds no lock of this session: it was taken on another server connection."""
    with caplog.at_level(logging.ERROR, logger="core.locks"), cron_lock("sla_report"), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [_advisory_key("cron:sla_report")])
    assert "needs a direct connection to PostgreSQL" in caplog.text
    assert connection.connection is None  # closed: whatever this session held is released
