"""effect_commit: every row of the commit table, and every refusal writes no decision or effect."""

from __future__ import annotations

import pytest

from decisionflow.core.errors import InvalidInput, NotFound, PermissionRefused, StaleProposal
from effects.models import CommitAttempt, EffectRecord
from effects.services import effect_commit
from reviews.models import ReviewDecision
from reviews.services import proposal_revise


def written():
    return ReviewDecision.objects.count(), EffectRecord.objects.count()


def outcomes():
    return list(CommitAttempt.objects.order_by("id").values_list("outcome", flat=True))


def test_first_approval_then_the_same_approval_again(proposal, reviewer):
    first = effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert first.receipt() == {"Status": "Committed", "Replay": False, "EffectCount": 1}
    assert written() == (1, 1)
    again = effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert again.receipt() == {"Status": "Committed", "Replay": True, "EffectCount": 1}
    assert written() == (1, 1)
    assert outcomes() == ["committed", "replay"]
    effect = EffectRecord.objects.get()
    assert effect.operation_id == proposal.operation_id and effect.body == proposal.body
    assert effect.source_versions == {"HOLD-7": 2, "KB-311": 3}
    assert effect.policy_snapshot["parameters"]["allowance_units"] == 9
    assert effect.reviewer == reviewer and effect.decision.approved is True


def test_first_decline_then_the_same_decline_again(proposal, reviewer):
    first = effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=reviewer)
    assert first.receipt() == {"Status": "Declined", "Replay": False, "EffectCount": 0}
    again = effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=reviewer)
    assert again.receipt() == {"Status": "Declined", "Replay": True, "EffectCount": 0}
    assert written() == (1, 0)
    assert outcomes() == ["declined", "replay"]


@pytest.mark.parametrize("first, then, effects", [(True, False, 1), (False, True, 0)])
def test_the_opposite_decision_is_a_conflict_never_an_update(proposal, reviewer, make_user, first, then, effects):
    effect_commit(operation_id=proposal.operation_id, approved=first, reviewer=reviewer)
    other = make_user("second-reviewer")
    result = effect_commit(operation_id=proposal.operation_id, approved=then, reviewer=other)
    assert result.receipt() == {"Status": "ConflictingDecision", "Replay": False, "EffectCount": effects}
    decision = ReviewDecision.objects.get()
    assert decision.approved is first and decision.reviewer == reviewer
    assert written() == (1, effects)
    assert outcomes()[-1] == "conflict"


@pytest.mark.parametrize("approved", [None, "true", "yes", 1, 0, 1.0, [], {}])
def test_a_non_boolean_decision_is_refused(proposal, reviewer, approved):
    with pytest.raises(InvalidInput, match="omitted decision is not consent"):
        effect_commit(operation_id=proposal.operation_id, approved=approved, reviewer=reviewer)
    assert written() == (0, 0)
    assert outcomes() == ["refused"]


def test_a_stale_operation_is_refused(proposal, reviewer):
    new = proposal_revise(
        case=proposal.case,
        expected_operation_id=proposal.operation_id,
        body="Hello,\n\nA shorter reply.",
        editor=reviewer,
    ).proposal
    with pytest.raises(StaleProposal) as exc:
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert exc.value.current_operation_id == new.operation_id
    assert exc.value.exit_code == 4
    assert written() == (0, 0)
    assert outcomes() == ["stale"]


def test_a_reviewer_without_the_permission_is_refused(proposal, lead):
    with pytest.raises(PermissionRefused, match="does not have the review permission"):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=lead)
    assert written() == (0, 0)


def test_no_reviewer_and_inactive_reviewer_are_refused(proposal, reviewer):
    with pytest.raises(PermissionRefused):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=None)
    reviewer.is_active = False
    reviewer.save()
    with pytest.raises(PermissionRefused):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert written() == (0, 0)


@pytest.mark.parametrize(
    "operation_id, error",
    [
        ("op-v1-" + "0" * 64, NotFound),
        ("op-v1-" + "A" * 64, InvalidInput),
        ("op-v1-abc", InvalidInput),
        ("'; DROP TABLE effects_effectrecord; --", InvalidInput),
        ("", InvalidInput),
        (None, InvalidInput),
    ],
)
def test_unknown_or_malformed_operations_are_refused(proposal, reviewer, operation_id, error):
    with pytest.raises(error):
        effect_commit(operation_id=operation_id, approved=True, reviewer=reviewer)
    assert written() == (0, 0)


def test_a_failure_inside_the_transaction_rolls_back_and_is_recorded(proposal, reviewer, monkeypatch):
    from effects import services

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(services, "_effect_fields", boom)
    with pytest.raises(RuntimeError):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    # The decision was inserted before the failure, and rolled back with it.
    assert written() == (0, 0)
    assert outcomes() == ["failed"]
