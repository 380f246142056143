"""Races on real connections: one effect, one first decision, one winning revision.

Each thread has its own connection. They run on both databases: on PostgreSQL (production)
the row lock and unique indexes decide; on SQLite, IMMEDIATE transactions serialize writers.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connections

from cases.models import Case
from core.errors import AlreadyDecided, StaleProposal
from effects.models import CommitAttempt, EffectRecord
from effects.services import effect_commit
from reviews.models import PendingReview, Proposal, ReviewDecision
from reviews.services import proposal_create, proposal_revise
from tests.conftest import race

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def live_proposal(case):
    proposal = proposal_create(case=case)
    # The workflow's pause for it, which the commit completes in its own transaction.
    PendingReview.objects.create(
        case=case,
        proposal=proposal,
        operation_id=proposal.operation_id,
        workflow_session_id="session",
        checkpoint_id="checkpoint",
        workflow_version="test",
    )
    return proposal


def attempts() -> Counter:
    return Counter(CommitAttempt.objects.values_list("outcome", flat=True))


def test_16_concurrent_approvals_write_one_effect(live_proposal, reviewer):
    op = live_proposal.operation_id
    results, errors = race([lambda: effect_commit(operation_id=op, approved=True, reviewer=reviewer)] * 16)
    assert errors == []
    assert Counter((r.status, r.replay) for r in results) == {("Committed", False): 1, ("Committed", True): 15}
    assert EffectRecord.objects.filter(operation_id=op).count() == 1
    assert ReviewDecision.objects.count() == 1
    assert attempts() == {"committed": 1, "replay": 15}
    assert set(CommitAttempt.objects.values_list("case_id", flat=True)) == {live_proposal.case_id}
    assert PendingReview.objects.get().status == PendingReview.Status.COMPLETED
    # Every result names the one decision.
    assert {r.decision.pk for r in results} == {ReviewDecision.objects.get().pk}


def test_8_approvals_racing_8_declines_have_one_first_decision(live_proposal, reviewer, make_user):
    op = live_proposal.operation_id
    other = make_user("other")
    calls = [
        lambda a=a: effect_commit(operation_id=op, approved=a, reviewer=reviewer if a else other)
        for a in [True, False] * 8
    ]
    results, errors = race(calls)
    assert errors == []
    decision = ReviewDecision.objects.get()
    winner = "Committed" if decision.approved else "Declined"
    firsts = [r for r in results if r.status == winner and not r.replay]
    assert len(firsts) == 1
    assert all(r.status in (winner, "ConflictingDecision") for r in results)
    assert sum(r.status == "ConflictingDecision" for r in results) == 8
    assert EffectRecord.objects.count() == (1 if decision.approved else 0)
    first = "committed" if decision.approved else "declined"
    assert attempts() == {first: 1, "replay": 7, "conflict": 8}
    assert set(CommitAttempt.objects.filter(outcome="conflict").values_list("detail", flat=True)) == {
        f"already {'approved' if decision.approved else 'declined'} by {decision.reviewer.get_username()}"
    }
    assert PendingReview.objects.get().status == PendingReview.Status.COMPLETED


def test_8_approvals_racing_an_edit_either_commit_once_or_are_all_stale(live_proposal, reviewer):
    case = Case.objects.get(pk=live_proposal.case_id)
    op = live_proposal.operation_id
    calls = [lambda: effect_commit(operation_id=op, approved=True, reviewer=reviewer)] * 8
    calls.append(lambda: proposal_revise(case=case, expected_operation_id=op, body="Racing edit.", editor=reviewer))
    results, errors = race(calls)
    case.refresh_from_db()
    if ReviewDecision.objects.filter(operation_id=op).exists():
        # An approval locked the case first: the edit is refused, the rest are replays.
        assert [type(e) for e in errors] == [AlreadyDecided]
        assert case.current_proposal_id == live_proposal.pk
        assert attempts() == {"committed": 1, "replay": 7}
        assert PendingReview.objects.get().status == PendingReview.Status.COMPLETED
    else:
        # The edit locked it first: every approval names a superseded proposal.
        assert len(errors) == 8 and all(isinstance(e, StaleProposal) for e in errors)
        assert case.current_proposal_id != live_proposal.pk
        assert attempts() == {"stale": 8}
        assert PendingReview.objects.get().status == PendingReview.Status.PENDING
    assert EffectRecord.objects.count() == ReviewDecision.objects.count()


def test_two_concurrent_revisions_from_one_identity_make_one_new_proposal(live_proposal, reviewer):
    case = Case.objects.get(pk=live_proposal.case_id)
    op = live_proposal.operation_id
    calls = [
        lambda b=b: proposal_revise(case=case, expected_operation_id=op, body=b, editor=reviewer)
        for b in ("Edit from tab A.", "Edit from tab B.")
    ]
    results, errors = race(calls)
    assert len(errors) == 1 and isinstance(errors[0], StaleProposal)
    winner = next(r for r in results if r is not None).proposal
    assert Proposal.objects.count() == 2
    case.refresh_from_db()
    assert case.current_proposal == winner


def test_an_edit_racing_an_approval_never_approves_a_superseded_proposal(live_proposal, reviewer):
    case = Case.objects.get(pk=live_proposal.case_id)
    op = live_proposal.operation_id
    calls = [
        lambda: effect_commit(operation_id=op, approved=True, reviewer=reviewer),
        lambda: proposal_revise(case=case, expected_operation_id=op, body="Racing edit.", editor=reviewer),
    ]
    results, errors = race(calls)
    case.refresh_from_db()
    decided = ReviewDecision.objects.filter(operation_id=op).exists()
    # Exactly one of the two won; never both (an approved proposal that is no longer current).
    assert decided != (case.current_proposal.operation_id != op)
    assert len(errors) == 1


def test_on_sqlite_another_writer_past_the_busy_timeout_is_case_busy(live_proposal, reviewer):
    """SQLite locks the whole database, so a write transaction stands in for a row lock."""
    from django.db import connection, transaction
    from django.db.models import F

    from core.errors import CaseBusy

    if connection.vendor != "sqlite":
        pytest.skip("SQLite only; tests/effects/test_commit_postgres.py holds a row lock instead")
    held, release = threading.Event(), threading.Event()

    def writer():
        try:
            with transaction.atomic():
                Case.objects.filter(pk=live_proposal.case_id).update(subject=F("subject"))
                held.set()
                release.wait(20)
        finally:
            connections.close_all()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert held.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout = 300")
        with pytest.raises(CaseBusy, match="^another action on case T-1042 is in progress; try again$"):
            effect_commit(operation_id=live_proposal.operation_id, approved=True, reviewer=reviewer)
    finally:
        release.set()
        thread.join(10)
    # Nothing written; not even the attempt row, which would have waited for the same lock.
    assert (ReviewDecision.objects.count(), CommitAttempt.objects.count()) == (0, 0)
    assert PendingReview.objects.get().status == PendingReview.Status.PENDING
    result = effect_commit(operation_id=live_proposal.operation_id, approved=True, reviewer=reviewer)
    assert result.receipt() == {"Status": "Committed", "Replay": False, "EffectCount": 1}


def test_two_reviewers_claiming_at_once_one_claim_one_named_refusal(live_proposal, make_user):
    """Of two claims at the same moment exactly one wins; the other is told who."""
    from core.errors import ClaimHeld
    from reviews.models import ReviewClaimEvent
    from workflow.queue import review_claim

    first, second = make_user("first"), make_user("second")
    pending = PendingReview.objects.get(operation_id=live_proposal.operation_id)
    for _ in range(2):  # twice: the second round finds the first round's claim still live
        results, errors = race(
            [
                lambda: review_claim(pending=PendingReview.objects.get(pk=pending.pk), user=first),
                lambda: review_claim(pending=PendingReview.objects.get(pk=pending.pk), user=second),
            ]
        )
        assert all(isinstance(e, ClaimHeld) for e in errors), errors
    events = list(ReviewClaimEvent.objects.values_list("user__username", flat=True))
    assert len(events) == 1
    pending.refresh_from_db()
    assert pending.claimed_by.get_username() == events[0]


def test_two_expiries_at_once_one_decision(live_proposal):
    """The fail-closed expiry run twice at once (two cron runs): one decline, one replay."""
    from workflow.queue import review_expire

    pending = PendingReview.objects.get(operation_id=live_proposal.operation_id)
    results, errors = race([lambda: review_expire(pending=pending), lambda: review_expire(pending=pending)])
    assert not errors, errors
    assert sorted(r.replay for r in results) == [False, True]
    decision = ReviewDecision.objects.get()
    assert (decision.decline_reason, decision.system_actor) == ("expired", "sla-expiry")
    assert EffectRecord.objects.count() == 0
