"""decision_record on PostgreSQL: a resume sends two statements (the pending review with the
commit's read, then the commit's write), and a read made ahead that went stale is read again.

Real transactions: inside Django's test transaction the commit's statements would run in
savepoints, which are statements too.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cases.services import case_import
from core.errors import StaleProposal
from core.outcomes import DecisionOutcome as Outcome
from effects.models import EffectRecord
from effects.services import COMMITTED, CONFLICTING, effect_commit
from effects.store import read_ahead, read_beside
from reviews.models import ReviewDecision
from tests.conftest import load_fixture
from workflow.begin import review_begin
from workflow.decide import decision_record
from workflow.edit import review_edit

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# A ceiling that can fail: the pending review read with the commit's read, and the write.
RESUME_STATEMENTS = 2


def begun(case_id: str) -> tuple:
    case = case_import(data={**load_fixture("t1042.json"), "case_id": case_id}).case
    return case, review_begin(case=case).operation_id


def decide(case, op, reviewer, *, approved=True):
    return decision_record(case=case, operation_id=op, approved=approved, reviewer=reviewer, channel="test")


def test_a_resume_sends_two_statements_and_its_replay_too(reviewer):
    case, op = begun("T-TWO")
    decide(*begun("T-WARM"), reviewer)  # one-time lookups (the reviewer's permissions) are not counted
    for expected in (Outcome.COMMITTED, Outcome.REPLAY):
        with CaptureQueriesContext(connection) as captured:
            assert decide(case, op, reviewer).outcome == expected
        sql = [q["sql"] for q in captured.captured_queries]
        assert len(sql) == RESUME_STATEMENTS, sql
        assert "reviews_pendingreview" in sql[0] and '"effects_effectrecord"' in sql[0], sql
        assert sql[1].startswith("WITH "), sql
    assert EffectRecord.objects.filter(operation_id=op).count() == 1


def test_a_read_ahead_then_a_decision_elsewhere_is_read_again(reviewer, editor):
    """The read made ahead says undecided; another reviewer decides before the commit: its
    unique key refuses the write, the commit reads again and answers from what stands."""
    case, op = begun("T-AHEAD")
    (_, ahead), (_, opposite) = read_beside("SELECT 1", [], op), read_beside("SELECT 1", [], op)
    assert ahead is not None and ahead.target is not None and ahead.target.decision is None
    assert effect_commit(operation_id=op, approved=True, reviewer=editor, channel="test").status == COMMITTED
    with read_ahead(ahead):
        assert effect_commit(operation_id=op, approved=True, reviewer=reviewer, channel="test").replay
    with read_ahead(opposite):
        assert effect_commit(operation_id=op, approved=False, reviewer=reviewer, channel="test").status == CONFLICTING
    assert ahead.taken and opposite is not None and opposite.taken
    assert (ReviewDecision.objects.filter(operation_id=op).count(), EffectRecord.objects.count()) == (1, 1)


def test_a_read_ahead_then_an_edit_is_stale(reviewer, editor):
    """The case moved on after the read ahead (an edit made a new current proposal): the
    guard refuses the write, and the commit reads again and finds the operation stale."""
    case, op = begun("T-MOVED")
    _, ahead = read_beside("SELECT 1", [], op)
    proposal = case.proposals.get(operation_id=op)
    review_edit(case=case, expected_operation_id=op, body=proposal.body + " More.", editor=editor)
    with read_ahead(ahead), pytest.raises(StaleProposal):
        effect_commit(operation_id=op, approved=True, reviewer=reviewer, channel="test")
    assert ahead.taken
    assert not ReviewDecision.objects.filter(operation_id=op).exists() and not EffectRecord.objects.exists()
