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
from decisionflow.core.errors import StaleProposal
from effects.models import CommitAttempt, EffectRecord
from effects.services import effect_commit
from reviews.models import Proposal, ReviewDecision
from reviews.services import proposal_create, proposal_revise

pytestmark = [pytest.mark.django_db(transaction=True)]


def race(calls):
    """Start every call at once; return (results, exceptions)."""
    barrier = threading.Barrier(len(calls))
    results, errors = [None] * len(calls), []

    def run(index, call):
        try:
            barrier.wait()
            results[index] = call()
        except Exception as exc:  # noqa: BLE001 - the test asserts there are none
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


@pytest.fixture
def live_proposal(case):
    return proposal_create(case=case)


def test_16_concurrent_approvals_write_one_effect(live_proposal, reviewer):
    op = live_proposal.operation_id
    results, errors = race([lambda: effect_commit(operation_id=op, approved=True, reviewer=reviewer)] * 16)
    assert errors == []
    assert Counter((r.status, r.replay) for r in results) == {("Committed", False): 1, ("Committed", True): 15}
    assert EffectRecord.objects.filter(operation_id=op).count() == 1
    assert ReviewDecision.objects.count() == 1
    assert CommitAttempt.objects.count() == 16


def test_8_approvals_racing_8_declines_have_one_first_decision(live_proposal, reviewer):
    op = live_proposal.operation_id
    calls = [lambda a=a: effect_commit(operation_id=op, approved=a, reviewer=reviewer) for a in [True, False] * 8]
    results, errors = race(calls)
    assert errors == []
    decision = ReviewDecision.objects.get()
    winner = "Committed" if decision.approved else "Declined"
    firsts = [r for r in results if r.status == winner and not r.replay]
    assert len(firsts) == 1
    assert all(r.status in (winner, "ConflictingDecision") for r in results)
    assert sum(r.status == "ConflictingDecision" for r in results) == 8
    assert EffectRecord.objects.count() == (1 if decision.approved else 0)


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
