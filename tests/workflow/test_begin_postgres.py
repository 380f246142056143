"""review_begin on PostgreSQL: its statements and round trips, the case lock it holds for one
transaction, and what a busy case or a lost connection gives.

These run with real transactions (Django's test transaction would turn begin's BEGIN and
COMMIT into a savepoint, and hold its lock until the test ends), and hold locks from a
second connection.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from cases.services import case_import
from core.errors import CaseBusy, DecisionflowError
from core.locks import _advisory_key, case_lock
from core.outcomes import DecisionOutcome as Outcome
from engine import graph as engine
from reviews.models import PendingReview, Proposal, WorkflowCheckpoint
from tests.conftest import database_url, held_elsewhere
from tests.effects.test_commit_postgres import round_trips
from workflow import begin as services
from workflow.begin import review_begin
from workflow.decide import decision_record

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# Ceilings that can fail: what one first begin of a case sends, on a session that has
# prepared begin's statements (its first begin prepares them once).
BEGIN_STATEMENTS = 2  # the query string (BEGIN, lock timeout, case lock, both reads), the write
BEGIN_ROUND_TRIPS = 3  # those two, and COMMIT


def fresh_case(t1042_data, case_id: str):
    return case_import(data={**t1042_data, "case_id": case_id}).case


def rows() -> tuple[int, int, int]:
    return Proposal.objects.count(), PendingReview.objects.count(), WorkflowCheckpoint.objects.count()


def advisory_locks_of_this_session() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        return cursor.fetchone()[0]


def held_by_another_session(case_id: str) -> bool:
    key = _advisory_key(f"case:{case_id}")
    with psycopg.connect(database_url(), autocommit=True) as other:
        got = other.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()[0]
        if got:
            other.execute("SELECT pg_advisory_unlock(%s)", [key])
        return not got


def test_a_first_begin_is_two_statements_and_three_round_trips(t1042_data, reviewer):
    review_begin(case=fresh_case(t1042_data, "T-WARM"))  # prepares begin's statements on this session
    case = fresh_case(t1042_data, "T-COUNT")
    with round_trips() as sent, CaptureQueriesContext(connection) as captured:
        begun = review_begin(case=case)
    statements = [q["sql"] for q in captured.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(statements) <= BEGIN_STATEMENTS, statements
    assert len(sent) <= BEGIN_ROUND_TRIPS and sent[-1] == '"COMMIT"', sent
    first = [s.strip() for s in sent[0].strip('"').split(";")]
    assert first[:2] == ["BEGIN", "SET LOCAL lock_timeout = '3000ms'"] and len(first) == 5, first
    assert first[2].startswith("SELECT pg_advisory_xact_lock(")
    assert first[3].startswith(f"EXECUTE {services._begin_case_read().name} (")
    assert first[4].startswith(f"EXECUTE {services._begin_evidence_read().name} (")
    assert sent[1].strip('"').startswith(f"EXECUTE {services._begin_write_statement().name} (")
    # Nothing to unlock: the case lock ended with the transaction.
    assert advisory_locks_of_this_session() == 0 and not held_by_another_session("T-COUNT")
    # What it wrote is what the ORM path writes: the proposal is current, the pause and the
    # pending review point at each other, and a decision commits from them.
    case.refresh_from_db()
    pending = PendingReview.objects.get(operation_id=begun.operation_id)
    assert case.current_proposal_id == pending.proposal_id == begun.pending_review.proposal_id
    assert (pending.pk, pending.checkpoint_id, pending.status) == (
        begun.pending_review.pk,
        begun.pending_review.checkpoint_id,
        "pending",
    )
    proposal = Proposal.objects.get(pk=pending.proposal_id)
    assert (proposal.origin, proposal.parent_id, proposal.author_id, proposal.unchecked_sentences) == (
        "prepared",
        None,
        None,
        [],
    )
    assert WorkflowCheckpoint.objects.get(checkpoint_id=pending.checkpoint_id).created_at == pending.checkpoint_at
    decided = decision_record(
        case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer, channel="command"
    )
    assert decided.outcome == Outcome.COMMITTED and not decided.begun


def test_the_first_begin_of_a_session_prepares_its_statements_once(t1042_data):
    connections.close_all()  # a new session: nothing prepared on it
    review_begin(case=fresh_case(t1042_data, "T-PREP1"))
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements")
        names = {row[0] for row in cursor.fetchall()}
    mine = {services._begin_case_read().name, services._begin_evidence_read().name}
    mine.add(services._begin_write_statement().name)
    assert mine <= names
    case = fresh_case(t1042_data, "T-PREP2")
    with CaptureQueriesContext(connection) as captured:
        review_begin(case=case)
    assert not any(q["sql"].startswith("PREPARE") for q in captured.captured_queries)


def test_begin_matches_the_proposal_the_orm_path_would_build(t1042_data):
    """The proposal written by the one statement is proposal_create's, field for field."""
    from reviews.services import prepared_content

    case = fresh_case(t1042_data, "T-SAME")
    expected = prepared_content(case)
    begun = review_begin(case=case)
    proposal = Proposal.objects.get(operation_id=begun.operation_id)
    for field in ("action", "body", "passages", "findings", "policy_snapshot", "evidence_id", "policy_id"):
        assert getattr(proposal, field) == expected[field], field
    assert proposal.operation_id == expected["operation_id"]


def test_begin_on_a_case_held_elsewhere_is_busy_within_its_timeout_and_writes_nothing(t1042_data, settings):
    case = fresh_case(t1042_data, "T-BUSY")
    settings.DECISIONFLOW_DECISION_LOCK_TIMEOUT = 0.3
    with held_elsewhere(lambda: case_lock("T-BUSY", timeout=5)):
        started = time.monotonic()
        with pytest.raises(CaseBusy, match="another action on case T-BUSY is in progress; try again") as busy:
            review_begin(case=case)
        assert time.monotonic() - started < 3
    assert (busy.value.code, busy.value.http_status) == ("case_busy", 409)
    assert rows() == (0, 0, 0)
    assert advisory_locks_of_this_session() == 0
    assert review_begin(case=case).created  # free again


def test_begin_on_a_case_whose_row_is_locked_is_busy_within_its_timeout(t1042_data, settings):
    """The lock timeout bounds every wait of begin's transaction, not only the case lock:
    here the pointer's UPDATE waits for a row lock another session holds."""
    case = fresh_case(t1042_data, "T-ROW")
    settings.DECISIONFLOW_DECISION_LOCK_TIMEOUT = 0.3
    with psycopg.connect(database_url()) as other:
        other.execute("SELECT id FROM cases_case WHERE id = %s FOR UPDATE", [case.pk])
        started = time.monotonic()
        with pytest.raises(CaseBusy, match="another action on case T-ROW is in progress; try again"):
            review_begin(case=case)
        assert time.monotonic() - started < 3
        other.rollback()
    assert rows() == (0, 0, 0)
    case.refresh_from_db()
    assert case.current_proposal_id is None
    assert review_begin(case=case).created


def test_a_begin_whose_connection_dies_mid_run_reports_it_and_leaves_no_lock(t1042_data, monkeypatch):
    """No unlock to send, so none to fail: the server dropped the lock with the session."""
    case = fresh_case(t1042_data, "T-DEAD")
    real = engine._review_request
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]

    def killed(message, case, proposal):
        with psycopg.connect(database_url(), autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
        return real(message, case, proposal)

    monkeypatch.setattr(engine, "_review_request", killed)
    with pytest.raises(DecisionflowError, match="no pending review was recorded"):
        review_begin(case=case)
    monkeypatch.undo()
    connections.close_all()
    assert not held_by_another_session("T-DEAD")
    assert rows() == (0, 0, 0)
    assert review_begin(case=case).created


def test_two_begins_of_one_case_at_once_record_one_pending_review(t1042_data):
    case = fresh_case(t1042_data, "T-TWICE")
    results, errors = [], []
    start = threading.Barrier(2)

    def begin():
        try:
            from cases.models import Case

            mine = Case.objects.get(pk=case.pk)
            start.wait(5)
            results.append(review_begin(case=mine))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=begin) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert sorted(r.created for r in results) == [False, True]
    assert len({r.operation_id for r in results}) == 1
    assert rows() == (1, 1, 1)
