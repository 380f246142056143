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
from core.statements import bound_cursor
from effects import services
from effects.models import CommitAttempt, EffectRecord
from effects.services import attempt_record, effect_commit, reviewer_check
from reviews.models import PendingReview, ReviewDecision
from reviews.services import proposal_revise
from tests.conftest import database_url, pending_review_of

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# What one commit sends, round trip by round trip (round_trips() below reads the wire): two
# statements, each a transaction of its own in Django's autocommit: the read, and one
# statement with every write, which sets the lock timeout, locks the case row as the read saw
# it (the guard) and commits as it ends. No BEGIN, no COMMIT. The raw floor sends four
# (psycopg's BEGIN, the lock, one write, COMMIT). No SQL PREPARE: psycopg may prepare the two
# statements at the protocol level (tests/effects/test_store_contract.py), and nothing but
# set_config(…, true) touches the session, for the statement's transaction only.
READ = "SELECT … (the read)"
WRITE = "WITH … INSERT"
GUARD = "FOR NO KEY UPDATE"
QUIET = "set_config('synchronous_commit', 'off', true)"
COMMIT_SHAPE = [READ, WRITE]
# A replay or a conflict writes nothing but its attempt row, without waiting for the flush.
QUIET_SHAPE = COMMIT_SHAPE


def shape(captured) -> list[str]:
    """Each logged statement, cut down to what identifies it."""
    out = []
    for query in captured.captured_queries:
        sql = " ".join(query["sql"].split())
        if sql.startswith('SELECT "reviews_proposal"."id" AS "proposals__id"') and " FOR " not in sql:
            out.append(READ)
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


def test_a_first_approval_is_two_round_trips_and_sends_no_prepare(proposal, warm):
    reviewer, _ = warm
    with CaptureQueriesContext(connection) as log:
        result, logged, sent = measured(
            lambda: effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
        )
    assert result.receipt() == {"Status": "Committed", "Replay": False, "EffectCount": 1}
    assert logged == COMMIT_SHAPE and len(sent) == 2
    assert not any(s.strip('"').split(" ")[0] in ("BEGIN", "COMMIT") for s in sent)
    sql = [" ".join(query["sql"].split()) for query in log.captured_queries]
    # The read takes no lock; the write's guard locks the case row as the read saw it.
    assert " FOR " not in sql[0]
    # Every write in one statement: the guard, the decision, the effect, the attempt, the
    # pending review; the lock timeout is set before any of them can wait.
    assert sql[1].startswith('WITH guard AS (SELECT "cases_case"."current_proposal_id"')
    assert "FOR NO KEY UPDATE)" in sql[1] and "FOR UPDATE" not in sql[1]
    assert parts(sql[1]) == [
        ("decision", "reviews_reviewdecision"),
        ("effect", "effects_effectrecord"),
        ("attempt", "effects_commitattempt"),
        ("completion", "reviews_pendingreview"),
    ]
    assert '(SELECT "current_proposal_id" FROM guard)' in sql[1] and "(SELECT id FROM decision)" in sql[1]
    assert " SELECT set_config('lock_timeout', " in sql[1] and QUIET not in sql[1]
    assert not any(word in s for s in sent + sql for word in ("PREPARE", "EXECUTE", "DEALLOCATE"))
    # The lock timeout was the statement's own: the session is back to the server's default.
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "0"


@pytest.mark.parametrize(
    "first, then, receipt",
    [
        (True, True, {"Status": "Committed", "Replay": True, "EffectCount": 1}),
        (False, False, {"Status": "Declined", "Replay": True, "EffectCount": 0}),
        (True, False, {"Status": "ConflictingDecision", "Replay": False, "EffectCount": 1}),
        (False, True, {"Status": "ConflictingDecision", "Replay": False, "EffectCount": 0}),
    ],
)
def test_a_replay_and_a_conflict_are_two_round_trips_too(proposal, warm, first, then, receipt):
    reviewer, other = warm
    effect_commit(operation_id=proposal.operation_id, approved=first, reviewer=reviewer)
    with CaptureQueriesContext(connection) as log:
        result, logged, sent = measured(
            lambda: effect_commit(operation_id=proposal.operation_id, approved=then, reviewer=other)
        )
    assert result.receipt() == receipt
    assert logged == QUIET_SHAPE and len(sent) == 2
    write = " ".join(log.captured_queries[1]["sql"].split())
    # Nothing new: no guard, nothing to lock, only the attempt row, without the flush.
    assert parts(write) == [("attempt", "effects_commitattempt")] and write.endswith(f", {QUIET}")
    assert GUARD not in write
    # The setting is that transaction's own: the session is back to the server's default.
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


def test_a_first_decline_is_two_round_trips(proposal, warm):
    reviewer, _ = warm
    with CaptureQueriesContext(connection) as log:
        result, logged, sent = measured(
            lambda: effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=reviewer)
        )
    assert result.receipt() == {"Status": "Declined", "Replay": False, "EffectCount": 0}
    assert logged == COMMIT_SHAPE and len(sent) == 2
    assert parts(" ".join(log.captured_queries[1]["sql"].split())) == [
        ("decision", "reviews_reviewdecision"),
        ("attempt", "effects_commitattempt"),
        ("completion", "reviews_pendingreview"),
    ]


def test_the_guard_takes_no_key_update_on_the_case_only(db):
    from effects.store import _guard, _read

    guard = " ".join(_guard().sql.split())
    assert guard.endswith("FOR NO KEY UPDATE") and "FOR UPDATE" not in guard
    assert guard.startswith('SELECT "cases_case"."current_proposal_id" ') and " JOIN " not in guard
    assert "FOR " not in _read().sql and "set_config" not in _read().sql


def test_a_stale_refusal_writes_nothing_and_names_the_current_proposal(proposal, warm):
    reviewer, _ = warm
    edited = proposal_revise(
        case=proposal.case, expected_operation_id=proposal.operation_id, body="Edited.", editor=reviewer
    )
    result, logged, sent = measured(
        lambda: effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    )
    assert isinstance(result, StaleProposal) and result.details["case_id"] == "T-1042"
    # The read found the proposal no longer current, and the current one's operation was
    # read for the answer; nothing was written, then the attempt row was appended.
    assert result.details["current_operation_id"] == edited.proposal.operation_id
    assert logged == [READ, "SELECT", "INSERT INTO"]
    assert len(sent) == 3
    assert list(CommitAttempt.objects.values_list("outcome", "case_id")) == [("stale", proposal.case_id)]
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)


def test_an_edit_that_commits_between_the_read_and_the_write_makes_the_commit_stale(proposal, warm, monkeypatch):
    """The read saw the proposal current; an edit commits before the write. The write's
    guard finds the case row changed and writes nothing; the commit reads again and answers
    stale, with nothing of its first decision left."""
    reviewer, _ = warm
    edits = []

    def crash_point(name):
        if name == "commit-after-decision" and not edits:
            edits.append(
                proposal_revise(
                    case=proposal.case, expected_operation_id=proposal.operation_id, body="Edited.", editor=reviewer
                )
            )

    monkeypatch.setattr(services, "crash_point", crash_point)
    with pytest.raises(StaleProposal) as stale:
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert stale.value.current_operation_id == edits[0].proposal.operation_id
    assert (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)
    assert list(CommitAttempt.objects.values_list("outcome", flat=True)) == ["stale"]


def test_a_publish_switch_between_the_read_and_the_write_makes_the_commit_stale(proposal, warm, monkeypatch, make_user):
    """The read saw the case under v3; a publish's switch onto v4 commits before the write.
    The guard finds the case's policy changed and writes nothing; the commit reads again and
    answers stale, naming v4."""
    from workflow.publishing import _switch, publish_plan

    reviewer, _ = warm
    publisher = make_user("publisher", group="leads")
    v4 = {
        **proposal.policy_snapshot,
        "label": "v4",
        "parameters": {**proposal.policy_snapshot["parameters"], "allowance_units": 10},
    }
    switches = []

    def crash_point(name):
        if name == "commit-after-decision" and not switches:
            switches.append(_switch(publish_plan(data=v4), v4, publisher, 100))

    monkeypatch.setattr(services, "crash_point", crash_point)
    with pytest.raises(StaleProposal, match="support-reply v4 has been published since"):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert switches and (ReviewDecision.objects.count(), EffectRecord.objects.count()) == (0, 0)
    assert list(CommitAttempt.objects.values_list("outcome", flat=True)) == ["stale"]


def _write_flushes(log) -> list[bool]:
    """For each write statement logged, whether its commit waits for the WAL flush (the
    statement sets synchronous_commit off for its own transaction when it need not)."""
    writes = [" ".join(q["sql"].split()) for q in log.captured_queries if q["sql"].startswith("WITH")]
    return [QUIET not in write for write in writes]


@pytest.mark.parametrize("approved", [True, False])
def test_a_first_decision_and_a_replay_that_completes_a_pending_review_are_flushed(proposal, warm, approved):
    """A fresh decision or effect is flushed before the commit returns, and so is a replay
    that completes a pending review (a state change)."""
    reviewer, _ = warm
    with CaptureQueriesContext(connection) as log:
        effect_commit(operation_id=proposal.operation_id, approved=approved, reviewer=reviewer)
        # A pending review left pending by another path: the replay completes it, a state change.
        pending = pending_review_of(proposal)
        assert effect_commit(operation_id=proposal.operation_id, approved=approved, reviewer=reviewer).replay
    pending.refresh_from_db()
    assert pending.status == PendingReview.Status.COMPLETED
    assert _write_flushes(log) == [True, True]


def test_only_a_commit_that_wrote_nothing_but_its_attempt_skips_the_wal_flush(proposal, warm):
    """A fresh decision or effect is flushed before the commit returns; a replay or a
    conflict, whose only write is its own attempt row, does not wait for the flush."""
    reviewer, other = warm
    op = proposal.operation_id
    with CaptureQueriesContext(connection) as log:
        assert effect_commit(operation_id=op, approved=True, reviewer=reviewer).receipt()["Replay"] is False
        assert effect_commit(operation_id=op, approved=True, reviewer=reviewer).receipt()["Replay"] is True
        assert effect_commit(operation_id=op, approved=False, reviewer=other).status == "ConflictingDecision"
    assert _write_flushes(log) == [True, False, False]
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
    pending = pending_review_of(proposal)
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
    assert attempt.outcome == CommitAttempt.Outcome.REFUSED and attempt.reason == "busy"
    assert attempt.case_id == proposal.case_id
    assert attempt.detail == busy.value.message and attempt.approved is True and attempt.reviewer == reviewer
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


def test_the_bound_cursor_is_kept_for_its_connection_and_replaced_with_it(proposal, reviewer):
    # One psycopg cursor carries the thread's bound statements (its dumpers and loaders stay
    # looked up); a new connection gets a new cursor, and the commit works on it.
    with bound_cursor() as first:
        kept = first.cursor
    with bound_cursor() as second:
        assert second.cursor is kept and not kept.closed
    connection.close()
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    with bound_cursor() as third:
        assert third.cursor is not kept and third.cursor.connection is connection.connection
    assert EffectRecord.objects.filter(operation_id=proposal.operation_id).count() == 1
