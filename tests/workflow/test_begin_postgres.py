"""review_begin on PostgreSQL: its statements and round trips, the case lock it holds for its
one transaction, and what a busy case or a lost connection gives.

These run with real transactions (Django's test transaction would turn begin's BEGIN and
COMMIT into a savepoint, and hold its lock until the test ends), and hold locks from a
second connection.
"""

from __future__ import annotations

import tempfile
import threading
import time
from contextlib import contextmanager

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
from workflow.begin import review_begin
from workflow.decide import decision_record

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# What one first begin of a case sends, on any session (nothing is prepared on it), as
# ceilings that can fail: the read (the case with its evidence) and the one write, each a
# transaction of its own in Django's autocommit: no BEGIN, no COMMIT, no lock but the case
# row the write's pointer update takes.
BEGIN_STATEMENTS = 2
BEGIN_ROUND_TRIPS = 2


@contextmanager
def round_trips():
    """What the client sends on the wire, one list of statements per round trip (an answer
    that ends with "ReadyForQuery"), read from libpq's own trace once the block ends."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    trips: list[list[str]] = []
    with tempfile.TemporaryFile() as log:
        pgconn.trace(log.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        try:
            yield trips
        finally:
            pgconn.untrace()
        log.seek(0)
        lines = log.read().decode().splitlines()
    sent: list[str] = []
    for fields in (line.split("\t", 3) for line in lines):
        direction, message, rest = fields[0], fields[2] if len(fields) > 2 else "", fields[3:]
        if direction == "F" and message in ("Query", "Parse"):
            text = rest[0].strip()
            sent.append(text.removeprefix('"" ').removesuffix(" 0").strip('"')[:400])
        elif direction == "B" and message == "ReadyForQuery":
            trips.append(sent)
            sent = []
    assert not sent, sent  # every statement was answered


def fresh_case(t1042_data, case_id: str):
    return case_import(data={**t1042_data, "case_id": case_id}).case


def rows() -> tuple[int, int, int]:
    return Proposal.objects.count(), PendingReview.objects.count(), WorkflowCheckpoint.objects.count()


def advisory_locks_of_this_session() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        return cursor.fetchone()[0]


def statements_prepared_on_this_session() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        return cursor.fetchone()[0]


def held_by_another_session(case_id: str) -> bool:
    key = _advisory_key(f"case:{case_id}")
    with psycopg.connect(database_url(), autocommit=True) as other:
        got = other.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()[0]
        if got:
            other.execute("SELECT pg_advisory_unlock(%s)", [key])
        return not got


def test_a_first_begin_is_two_statements_and_two_round_trips(t1042_data, reviewer):
    review_begin(case=fresh_case(t1042_data, "T-WARM"))
    case = fresh_case(t1042_data, "T-COUNT")
    prepared = statements_prepared_on_this_session()  # the commit's, by earlier tests on this session
    with round_trips() as trips, CaptureQueriesContext(connection) as captured:
        begun = review_begin(case=case)
    statements = [q["sql"] for q in captured.captured_queries]
    assert len(statements) <= BEGIN_STATEMENTS, statements
    assert len(trips) <= BEGIN_ROUND_TRIPS, trips
    assert not any(s in ("BEGIN", "COMMIT") for s in statements), statements
    # One statement reads the case, its policy and its evidence, and draws the proposal's id.
    assert len(trips[0]) == 1 and trips[0][0].startswith('WITH c AS (SELECT c."current_proposal_id", c."policy_id"')
    assert "nextval(" in trips[0][0] and "FOR " not in trips[0][0], trips
    # One statement writes it all, the lock timeout first.
    assert len(trips[1]) == 1 and trips[1][0].startswith('WITH proposal AS (INSERT INTO "reviews_proposal"'), trips
    assert "SELECT set_config('lock_timeout', " in statements[1]
    sent = [statement for trip in trips for statement in trip]
    # Nothing prepared, nothing to unlock: the case lock ended with the transaction.
    assert not any(s.startswith(("PREPARE", "EXECUTE", "DEALLOCATE")) for s in sent), sent
    assert statements_prepared_on_this_session() == prepared
    assert advisory_locks_of_this_session() == 0 and not held_by_another_session("T-COUNT")
    # What it wrote is what the general way writes: the proposal is current, the pause and
    # the pending review point at each other, and a decision commits from them.
    case.refresh_from_db()
    pending = PendingReview.objects.get(operation_id=begun.operation_id)
    assert case.current_proposal_id == pending.proposal_id == begun.pending_review.proposal_id
    assert (pending.pk, pending.checkpoint_id, pending.status) == (
        begun.pending_review.pk,
        begun.pending_review.checkpoint_id,
        "pending",
    )
    assert begun.pending_review.checkpoint_at == pending.checkpoint_at
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


def test_begin_leaves_the_connection_to_django(t1042_data):
    """No statement prepared on the session, and psycopg's autocommit flag is Django's own
    throughout: off inside begin's transaction, on again after it."""
    connections.close_all()  # a new session
    seen = []

    def flags(execute, sql, params, many, context):
        seen.append((connection.get_autocommit(), connection.connection.autocommit))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(flags), CaptureQueriesContext(connection) as captured:
        review_begin(case=fresh_case(t1042_data, "T-FLAG1"))
        review_begin(case=fresh_case(t1042_data, "T-FLAG2"))
    assert not any(q["sql"].startswith(("PREPARE", "EXECUTE", "DEALLOCATE")) for q in captured.captured_queries)
    assert set(seen) <= {(False, False), (True, True)} and (False, False) in seen, seen
    assert connection.get_autocommit() and connection.connection.autocommit
    assert statements_prepared_on_this_session() == 0


def test_begin_matches_the_proposal_the_orm_path_would_build(t1042_data):
    """The proposal the first begin builds and writes is proposal_create's, field for field."""
    from reviews.services import prepared_content

    case = fresh_case(t1042_data, "T-SAME")
    expected = prepared_content(case)
    begun = review_begin(case=case)
    proposal = Proposal.objects.get(operation_id=begun.operation_id)
    for field in ("action", "body", "passages", "findings", "policy_snapshot", "evidence_id", "policy_id"):
        assert getattr(proposal, field) == expected[field], field
    assert proposal.operation_id == expected["operation_id"]


def test_begin_on_a_case_held_elsewhere_is_busy_within_its_timeout_and_writes_nothing(t1042_data, settings):
    """A begin of a case that has a proposal holds the case lock for its run: with the lock
    held elsewhere it answers busy within the timeout."""
    case = fresh_case(t1042_data, "T-BUSY")
    first = review_begin(case=case)
    PendingReview.objects.filter(pk=first.pending_review.pk).delete()  # a begin that must pause again
    settings.DECISIONFLOW_DECISION_LOCK_TIMEOUT = 0.3
    with held_elsewhere(lambda: case_lock("T-BUSY", timeout=5)):
        started = time.monotonic()
        with pytest.raises(CaseBusy, match="another action on case T-BUSY is in progress; try again") as busy:
            review_begin(case=case)
        assert time.monotonic() - started < 3
    assert (busy.value.code, busy.value.http_status) == ("case_busy", 409)
    assert rows() == (1, 0, 1)
    assert advisory_locks_of_this_session() == 0
    assert review_begin(case=case).created  # free again


def test_a_first_begin_takes_no_case_lock_and_a_begin_under_it_finds_its_pause(t1042_data):
    """A case's first begin reads and writes without the case lock (its write is all or
    nothing by itself), so a lock held elsewhere that touches no row of the case does not
    hold it up; a begin that then runs under the lock finds the pause it recorded."""
    case = fresh_case(t1042_data, "T-FREE")
    with held_elsewhere(lambda: case_lock("T-FREE", timeout=5)):
        begun = review_begin(case=case)
    assert begun.created and rows() == (1, 1, 1)
    again = review_begin(case=case)
    assert (again.created, again.operation_id) == (False, begun.operation_id)
    assert rows() == (1, 1, 1)


def test_a_first_begin_that_loses_the_pointer_writes_nothing_and_finds_the_winner(t1042_data, monkeypatch):
    """Another begin makes the case's first proposal while this one runs its engine: this
    one's write finds the pointer moved, writes nothing at all (not its proposal, not its
    pause), and the careful way under the lock reports the winner's pending review."""
    case = fresh_case(t1042_data, "T-LOSE")
    real = engine._review_request
    won, failed, started = [], [], []

    def begin_elsewhere():
        from cases.models import Case

        try:
            won.append(review_begin(case=Case.objects.get(pk=case.pk)))
        except Exception as exc:  # noqa: BLE001 - reported below
            failed.append(exc)
        finally:
            connections.close_all()

    def another_begin_first(message, case_, proposal):
        if not started:  # once: the other begin's own engine run comes through here too
            started.append(True)
            # On another connection, while this begin's engine runs (the engine's loop is
            # async: the other begin needs a thread of its own).
            other = threading.Thread(target=begin_elsewhere)
            other.start()
            other.join(20)
        return real(message, case_, proposal)

    monkeypatch.setattr(engine, "_review_request", another_begin_first)
    lost = review_begin(case=case)
    monkeypatch.undo()
    assert failed == [] and len(won) == 1, (failed, won)
    assert (won[0].created, lost.created) == (True, False)
    assert lost.operation_id == won[0].operation_id
    assert rows() == (1, 1, 1)


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
    # The write went out as a transaction of its own on a dead connection: the client cannot
    # tell whether it ran, and says so; a begin again finds whatever it left.
    with pytest.raises(DecisionflowError, match="it may have been recorded: run begin again, which finds it"):
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
