"""A re-draft racing an approval of the proposal it replaces ends one way only: the approval
commits and the re-draft is refused as decided, or the re-draft supersedes and the approval
is refused as stale. Never both, never neither."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from cases.models import Case
from cases.services import case_import
from core.errors import AlreadyDecided, StaleProposal
from reviews.models import Origin, PendingReview, ReviewDecision
from tests.conftest import load_fixture
from workflow.begin import review_begin
from workflow.decide import decision_record
from workflow.redraft import case_redraft

CASES = 16


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_16_redrafts_racing_16_approvals_each_end_one_way(make_user):
    reviewer, pipeline = make_user("reviewer"), make_user("pipeline", group="pipeline")
    cases = []
    for i in range(CASES):
        case = case_import(data={**load_fixture(), "case_id": f"T-R{i:02}"}).case
        review_begin(case=case)
        case.refresh_from_db()
        cases.append((case, case.current_proposal.operation_id))
    barrier = threading.Barrier(2 * CASES)
    approvals: dict[int, object] = {}
    redrafts: dict[int, object] = {}

    def approving(case, op):
        try:
            barrier.wait(20)
            approvals[case.pk] = decision_record(
                case=Case.objects.get(pk=case.pk), operation_id=op, approved=True, reviewer=reviewer, channel="test"
            ).outcome.value
        except Exception as exc:  # noqa: BLE001 - classified below
            approvals[case.pk] = exc
        finally:
            connections.close_all()

    def redrafting(case, op):
        try:
            barrier.wait(20)
            redrafts[case.pk] = case_redraft(
                case=Case.objects.get(pk=case.pk),
                expected_operation_id=op,
                draft=f"Hello,\n\nA new draft for {case.case_id}.\n\nSupport",
                actor=pipeline,
                channel="test",
            ).revision.changed
        except Exception as exc:  # noqa: BLE001 - classified below
            redrafts[case.pk] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=f, args=pair) for pair in cases for f in (approving, redrafting)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    outcomes = {"approval": 0, "redraft": 0}
    for case, op in cases:
        approval, redraft = approvals[case.pk], redrafts[case.pk]
        current = Case.objects.select_related("current_proposal").get(pk=case.pk).current_proposal
        decided = ReviewDecision.objects.filter(proposal__case=case)
        if approval == "committed":
            # The approval won: the re-draft was refused, the decided proposal is still current.
            assert isinstance(redraft, AlreadyDecided), (case.case_id, redraft)
            assert current.operation_id == op and list(decided.values_list("operation_id", flat=True)) == [op]
            outcomes["approval"] += 1
        else:
            # The re-draft won: the approval was refused as stale and nothing was decided.
            assert isinstance(approval, StaleProposal), (case.case_id, approval)
            assert redraft is True, (case.case_id, redraft)
            assert current.origin == Origin.PIPELINE_REDRAFT and current.parent.operation_id == op
            assert not decided.exists()
            statuses = dict(PendingReview.objects.filter(case=case).values_list("operation_id", "status"))
            assert statuses == {op: PendingReview.Status.SUPERSEDED, current.operation_id: PendingReview.Status.PENDING}
            outcomes["redraft"] += 1
        # The tables agree: a decision exists XOR a pipeline re-draft is current.
        assert decided.exists() != (current.origin == Origin.PIPELINE_REDRAFT)
    assert sum(outcomes.values()) == CASES, outcomes
