"""effect_commit on PostgreSQL: its round trips, the case row lock, and CaseBusy.

These run with real transactions (Django's test transaction would turn BEGIN and COMMIT
into savepoints), and lock rows from a second connection opened by the test.
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from core.errors import CaseBusy, StaleProposal
from effects import services
from effects.models import CommitAttempt, EffectRecord
from effects.services import attempt_record, effect_commit, reviewer_check
from reviews.models import PendingReview, ReviewDecision
from reviews.services import proposal_revise
from tests.conftest import database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# What one commit sends, round trip by round trip (round_trips() below reads the wire):
# Django's durable transaction: BEGIN, one statement that sets the lock timeout, locks the
# case row and reads the operation, one statement with every write, and COMMIT. The raw
# floor sends as many (psycopg's BEGIN, two inserts, COMMIT). No SQL PREPARE: psycopg may
# prepare the two statements at the protocol level (tests/effects/test_store_contract.py),
# and nothing but set_config(…, true) touches the session, for the transaction only.
LOCKED_READ = "SELECT … set_config('lock_timeout') … FOR NO KEY UPDATE"
WRITE = "WITH … INSERT"
QUIET = "set_config('synchronous_commit', 'off', true)"
COMMIT_SHAPE = ["BEGIN", LOCKED_READ, WRITE, "COMMIT"]
# A replay or a conflict writes nothing but its attempt row, without waiting for the flush.
QUIET_SHAPE = COMMIT_SHAPE


def shape(captured) -> list[str]:
    """Each logged statement, cut down to what identifies it."""
    out = []
    for query in captured.captured_queries:
        sql = " ".join(query["sql"].split())
        if sql.startswith("SELECT") and "set_config('lock_timeout'" in sql and "FOR NO KEY UPDATE" in sql:
            out.append(LOCKED_READ)
        elif sql.startswith("WITH") and " AS (INSERT INTO " in sql:
            out.append(WRITE)
        else:
            out.append(
                next(
                    (p for p in ["BEGIN", "COMMIT", "SELECT", "ROLLBACK", "INSERT INTO"] if sql.startswith(p)), sql[:60]
                )
            )
    return out


def parts(write: str) -> list[tuple[str, str]]:
    """The named parts of the write statement: (name, the table it inserts into or updates)."""
    return re.findall(r'(\w+) AS \((?:INSERT INTO|UPDATE) "(\w+)"', write)


@contextmanager
def round_trips():
    """Count the client's round trips on the wire with libpq's own trace.

    A round trip is one "ReadyForQuery" from the server, the answer to a simple Query (BEGIN,
    COMMIT, Django's client-side bound statements) or to an extended-protocol Sync (a
    statement bound on the server: Parse ... Sync, or only Bind ... Sync once psycopg has
    prepared it). Yields a list that holds the statements sent, one per round trip (the text
    of a prepared one is its name), once the block ends.
    """
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    sent: list[str] = []
    with tempfile.TemporaryFile() as log:
        pgconn.trace(log.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        try:
            yield sent
        finally:
            pgconn.untrace()
        log.seek(0)
        lines = log.read().decode().splitlines()
    fields = [line.split("\t", 3) for line in lines]
    batch: list[str] = []
    for f in fields:
        if f[0] != "F":
            continue
        if f[2] == "Query":
            sent.append(f[3].strip())
        elif f[2] in ("Parse", "Bind"):
            batch.append(f[3].strip())
        elif f[2] == "Sync":
            sent.append(batch[0] if batch else "")
            batch = []
    assert sum(f[0] == "B" and f[2] == "ReadyForQuery" for f in fields) == len(sent)


def measured(call):
    with round_trips() as sent, CaptureQueriesContext(connection) as captured:
        try:
            result = call()
        except Exception as exc:
            result = exc
    return result, shape(captured), sent


@pytest.fixture
def warm(reviewer, make_user):
    """The reviewers with their permission caches filled, as a channel leaves them."""
    other = make_user("other")
    for user in (reviewer, other):
        reviewer_check(user)
    return reviewer, other


def test_a_first_approval_is_four_round_trips_and_sends_no_prepare(proposal, warm):
    reviewer, _ = warm
    with CaptureQueriesContext(connection) as log:
        result, logged, sent = measured(
            lambda: effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
        )
    assert result.receipt() == {"Status": "Committed", "Replay": False, "EffectCount": 1}
    assert logged == COMMIT_SHAPE and len(sent) == 4
    assert [s.strip('"').split(" ")[0] for s in (sent[0], sent[3])] == ["BEGIN", "COMMIT"]
    sql = [" ".join(query["sql"].split()) for query in log.captured_queries]
    # The lock timeout, the case with the proposal, locking the case row, the decision, with
    # whether its effect and an open pending review exist.
    assert sql[1].endswith('FOR NO KEY UPDATE OF "cases_case"')
    # Every write in one statement: the decision, the effect, the attempt, the pending review.
    assert parts(sql[2]) == [
        ("decision", "reviews_reviewdecision"),
        ("effect", "effects_effectrecord"),
        ("attempt", "effects_commitattempt"),
        ("completion", "reviews_pendingreview"),
    ]
    assert "(SELECT id FROM decision)" in sql[2] and QUIET not in sql[2]
    assert not any(word in s for s in sent + sql for word in ("PREPARE", "EXECUTE", "DEALLOCATE"))


@pytest.mark.parametrize(
    "first, then, receipt",
    [
        (True, True, {"Status": "Committed", "Replay": True, "EffectCount": 1}),
        (False, False, {"Status": "Declined", "Replay": True, "EffectCount": 0}),
        (True, False, {"Status": "ConflictingDecision", "Replay": False, "EffectCount": 1}),
        (False, True, {"Status": "ConflictingDecision", "Replay": False, "EffectCount": 0}),
    ],
)
def test_a_replay_and_a_conflict_are_four_round_trips_too(proposal, warm, first, then, receipt):
    reviewer, other = warm
    effect_commit(operation_id=proposal.operation_id, approved=first, reviewer=reviewer)
    with CaptureQueriesContext(connection) as log:
        result, logged, sent = measured(
            lambda: effect_commit(operation_id=proposal.operation_id, approved=then, reviewer=other)
        )
    assert result.receipt() == receipt
    assert logged == QUIET_SHAPE and len(sent) == 4
    write = " ".join(log.captured_queries[2]["sql"].split())
    assert parts(write) == [("attempt", "effects_commitattempt")] and write.endswith(f"SELECT {QUIET}")
    # The setting is that transaction's own: the session is back to the server's default.
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


def test_a_first_decline_is_four_round_trips(proposal, warm):
    reviewer, _ = warm
    with CaptureQueriesContext(connection) as log:
        result, logged, sent = measured(
            lambda: effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=reviewer)
        )
    assert result.receipt() == {"Status": "Declined", "Replay": False, "EffectCount": 0}
    assert logged == COMMIT_SHAPE and len(sent) == 4
    assert parts(" ".join(log.captured_queries[2]["sql"].split())) == [
        ("decision", "reviews_reviewdecision"),
        ("attempt", "effects_commitattempt"),
        ("completion", "reviews_pendingreview"),
    ]


def test_the_lock_statement_takes_no_key_update_on_the_case_only(db):
    from django.db import transaction

    from effects.store import _read

    with transaction.atomic():
        lock = " ".join(_read(True).sql.split())
    assert lock.endswith('FOR NO KEY UPDATE OF "cases_case"') and "FOR UPDATE" not in lock
    assert lock.startswith('SELECT "reviews_proposal"."id" ')
    assert "FOR " not in _read(False).sql and "set_config" not in _read(False).sql


def test_a_stale_refusal_writes_nothing_and_names_the_current_proposal(proposal, warm):
    reviewer, _ = warm
    edited = proposal_revise(
        case=proposal.case, expected_operation_id=proposal.operation_id, body="Edited.", editor=reviewer
    )
    result, logged, sent = measured(
        lambda: effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    )
    assert isinstance(result, StaleProposal) and result.details["case_id"] == "T-1042"
    # The read under the lock found the proposal no longer current, and the current one's
    # operation was read for the answer; nothing was written, the transaction rolled back,
    # then the attempt row was appended.
    assert result.details["current_operation_id"] == edited.proposal.operation_id
    assert logged == ["BEGIN", LOCKED_READ, "SELECT", "ROLLBACK", "INSERT INTO"]
    assert len(sent) == 5
    assert list(CommitAttempt.objects.values_list("outcome", "case_id")) == [("stale", proposal.case_id)]
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)


def _synchronous_commit_at_commit(monkeypatch) -> list[str]:
    """What synchronous_commit is when COMMIT goes out: read inside the commit transaction,
    at its last crash point (after the writes, before COMMIT)."""
    seen: list[str] = []

    def crash_point(name):
        if name == "commit-after-decision":
            with connection.cursor() as cursor:
                cursor.execute("SHOW synchronous_commit")
                seen.append(cursor.fetchone()[0])

    monkeypatch.setattr(services, "crash_point", crash_point)
    return seen


@pytest.mark.parametrize("approved", [True, False])
def test_a_first_decision_and_a_replay_that_completes_a_pending_review_are_flushed(
    proposal, warm, monkeypatch, approved
):
    """A fresh decision or effect is flushed before COMMIT returns, and so is a replay
    that completes a pending review (a state change): both take the locked path."""
    reviewer, _ = warm
    seen = _synchronous_commit_at_commit(monkeypatch)
    effect_commit(operation_id=proposal.operation_id, approved=approved, reviewer=reviewer)
    # A pending review left pending by another path: the replay completes it, a state change.
    pending = PendingReview.objects.create(
        case=proposal.case,
        proposal=proposal,
        operation_id=proposal.operation_id,
        workflow_session_id="s",
        checkpoint_id="c",
        workflow_version="test",
    )
    assert effect_commit(operation_id=proposal.operation_id, approved=approved, reviewer=reviewer).replay
    pending.refresh_from_db()
    assert pending.status == PendingReview.Status.COMPLETED
    assert seen == ["on", "on"]


def test_only_a_commit_that_wrote_nothing_but_its_attempt_skips_the_wal_flush(proposal, warm, monkeypatch):
    """A fresh decision or effect is flushed before COMMIT returns; a replay or a conflict,
    whose only write is its own attempt row, does not wait for the flush."""
    reviewer, other = warm
    seen = _synchronous_commit_at_commit(monkeypatch)
    op = proposal.operation_id
    assert effect_commit(operation_id=op, approved=True, reviewer=reviewer).receipt()["Replay"] is False
    assert effect_commit(operation_id=op, approved=True, reviewer=reviewer).receipt()["Replay"] is True
    assert effect_commit(operation_id=op, approved=False, reviewer=other).status == "ConflictingDecision"
    assert seen == ["on", "off", "off"]
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


@contextmanager
def case_row_locked(case_pk: int, mode: str):
    """Another session holding a row lock on the case until the block ends."""
    with psycopg.connect(database_url()) as holder:
        holder.execute(f"SELECT id FROM cases_case WHERE id = %s {mode}", [case_pk])
        try:
            yield holder
        finally:
            holder.rollback()


# An edit holds the case row; so may anything that takes FOR UPDATE. Either way the busy
# attempt is recorded with its case: its references are not checked by the database
# (migration 0009), so recording it takes no lock on the case row.
@pytest.mark.parametrize("mode", ["FOR UPDATE", "FOR NO KEY UPDATE"])
def test_a_locked_case_row_answers_case_busy_then_commits(proposal, reviewer, settings, mode):
    settings.DECISIONFLOW_DECISION_LOCK_TIMEOUT = 0.5
    pending = PendingReview.objects.create(
        case=proposal.case,
        proposal=proposal,
        operation_id=proposal.operation_id,
        workflow_session_id="s",
        checkpoint_id="c",
        workflow_version="test",
    )
    with case_row_locked(proposal.case_id, mode):
        started = time.monotonic()
        with pytest.raises(CaseBusy) as busy:
            effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
        waited = time.monotonic() - started
    assert 0.4 < waited < 5
    assert busy.value.message == "another action on case T-1042 is in progress; try again"
    assert busy.value.exit_code == 6 and busy.value.details["case_id"] == "T-1042"
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)
    pending.refresh_from_db()
    assert pending.status == PendingReview.Status.PENDING
    attempt = CommitAttempt.objects.get()
    assert attempt.outcome == CommitAttempt.Outcome.REFUSED and attempt.detail.startswith("busy: ")
    assert attempt.case_id == proposal.case_id
    assert "T-1042" in attempt.detail and attempt.approved is True and attempt.reviewer == reviewer
    # The transaction rolled back, and its lock_timeout went with it.
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "0"

    # Released: the very same call commits.
    result = effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert result.receipt() == {"Status": "Committed", "Replay": False, "EffectCount": 1}
    pending.refresh_from_db()
    assert pending.status == PendingReview.Status.COMPLETED
    assert list(CommitAttempt.objects.order_by("id").values_list("outcome", flat=True)) == ["refused", "committed"]


def test_attempt_record_never_waits_for_the_case_row(proposal, reviewer):
    with connection.cursor() as cursor:
        # A foreign key check on the case row would wait here: fail rather than hang.
        cursor.execute("SET lock_timeout = '2s'")
    with case_row_locked(proposal.case_id, "FOR UPDATE"):
        started = time.monotonic()
        attempt_record(
            operation_id=proposal.operation_id,
            case=proposal.case,
            approved=True,
            reviewer=reviewer,
            channel="api",
            outcome=CommitAttempt.Outcome.REFUSED,
            detail="case_busy: try again",
        )
        assert time.monotonic() - started < 1
    attempt_record(
        operation_id=proposal.operation_id,
        case=proposal.case,
        approved=None,
        reviewer=None,
        channel="api",
        outcome=CommitAttempt.Outcome.REFUSED,
        detail="invalid_request",
    )
    with connection.cursor() as cursor:
        cursor.execute("RESET lock_timeout")
    rows = list(CommitAttempt.objects.order_by("id").values_list("case_id", "detail", "reviewer_id"))
    assert rows == [
        (proposal.case_id, "case_busy: try again", reviewer.pk),
        (proposal.case_id, "invalid_request", None),
    ]


def test_a_decision_committed_behind_the_lock_is_read_by_a_second_statement(proposal, reviewer, make_user):
    """A writer that skips the case lock commits the decision while our insert waits on it.

    The reads under the lock predate that decision, so the commit decides a first approval;
    the unique key refuses its decision, the transaction rolls back, and the commit is
    decided again from a fresh read: the decision that stands, a conflict.
    """
    other = make_user("other")
    answer: dict = {}

    def commit():
        try:
            answer["result"] = effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
        except Exception as exc:
            answer["error"] = exc
        finally:
            connections.close_all()

    # pg_stat_activity is read once per transaction, so the watcher has a session of its own.
    with psycopg.connect(database_url()) as writer, psycopg.connect(database_url(), autocommit=True) as watcher:
        writer.execute(
            "INSERT INTO reviews_reviewdecision (operation_id, proposal_id, approved, reviewer_id, decided_at) "
            "VALUES (%s, %s, false, %s, now())",
            [proposal.operation_id, proposal.pk, other.pk],
        )
        thread = threading.Thread(target=commit)
        thread.start()
        # Wait until the commit's decision insert is blocked on the uncommitted decision.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                ['%INSERT INTO "reviews_reviewdecision"%'],
            ).fetchone()
            if waiting and waiting[0]:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the commit never waited on the decision")
        writer.commit()
        thread.join(10)
    assert "error" not in answer, answer
    result = answer["result"]
    assert result.receipt() == {"Status": "ConflictingDecision", "Replay": False, "EffectCount": 0}
    assert result.decision.approved is False and result.decision.reviewer == other
    assert EffectRecord.objects.count() == 0
    attempt = CommitAttempt.objects.get()
    assert (attempt.outcome, attempt.detail) == ("conflict", "already declined by other")


def test_a_lock_wait_inside_the_writes_is_case_busy_too(proposal, reviewer, make_user, settings):
    """The lock timeout bounds every lock wait of the transaction, the writes' too; every row
    a commit can wait for belongs to this case (here: the decision of this very operation,
    inserted and not yet committed by a writer that skipped the case lock), so "another
    action on this case is in progress" is what happened."""
    settings.DECISIONFLOW_DECISION_LOCK_TIMEOUT = 0.5
    other = make_user("other")
    with psycopg.connect(database_url()) as writer:
        writer.execute(
            "INSERT INTO reviews_reviewdecision (operation_id, proposal_id, approved, reviewer_id, decided_at) "
            "VALUES (%s, %s, false, %s, now())",
            [proposal.operation_id, proposal.pk, other.pk],
        )
        with pytest.raises(CaseBusy):
            effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
        writer.rollback()
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)
    attempt = CommitAttempt.objects.get()
    assert (attempt.outcome, attempt.reason) == ("refused", "busy")
    result = effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert result.receipt() == {"Status": "Committed", "Replay": False, "EffectCount": 1}
