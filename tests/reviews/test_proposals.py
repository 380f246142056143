"""proposal_create and proposal_revise: identities, origins, stale refusals, no-change edits."""

from __future__ import annotations

import pytest

from cases.models import Case
from core.errors import AlreadyDecided, InvalidInput, StaleProposal
from effects.services import effect_commit
from reviews.models import Origin, Proposal
from reviews.services import proposal_create, proposal_revise
from tests.decisionflow.test_identity import T1042_EVIDENCE, T1042_OPERATION, T1042_POLICY


def state(case):
    case.refresh_from_db()
    return Proposal.objects.count(), case.current_proposal_id


def test_create_binds_the_protocol_identities_and_sets_current(case):
    proposal = proposal_create(case=case)
    assert (proposal.evidence_id, proposal.policy_id, proposal.operation_id) == (
        T1042_EVIDENCE,
        T1042_POLICY,
        T1042_OPERATION,
    )
    assert proposal.origin == Origin.PREPARED and proposal.body == case.draft
    assert [p["source_id"] for p in proposal.passages] == ["HOLD-7", "KB-311"]
    assert proposal.policy_snapshot["label"] == "v3"
    case.refresh_from_db()
    assert case.current_proposal == proposal


def test_the_snapshot_follows_the_positions_not_the_insert_order(case):
    """Passages and findings are read in one query, each kind in its positions' order."""
    from reviews.services import prepared_content

    before = prepared_content(case)
    for related in (case.passages, case.findings):
        rows = list(related.order_by("position"))
        top = max(r.position for r in rows)
        for r in rows:  # reverse the order through the positions alone
            type(r).objects.filter(pk=r.pk).update(position=top + 1 - r.position + 100)
    after = prepared_content(case)
    assert after["passages"] == before["passages"][::-1] and after["findings"] == before["findings"][::-1]
    assert [p["source_id"] for p in after["passages"]] == ["KB-311", "HOLD-7"]
    assert set(after["findings"][0]) == {"finding", "licensed_clause", "source_id", "version"}
    assert after["evidence_id"] == T1042_EVIDENCE  # the identity itself does not depend on the order


def test_create_twice_finds_the_same_proposal(case):
    first = proposal_create(case=case)
    assert proposal_create(case=case) == first
    assert Proposal.objects.count() == 1


def test_body_edit_is_a_new_human_edit_with_unchecked_sentences(proposal, reviewer):
    case = proposal.case
    body = proposal.body.replace("Kind regards,", "You can also roll back to 4.1.3 today.\n\nKind regards,")
    result = proposal_revise(case=case, expected_operation_id=proposal.operation_id, body=body, editor=reviewer)
    new = result.proposal
    assert result.changed and new.origin == Origin.HUMAN_EDIT and new.parent == proposal
    assert new.operation_id != proposal.operation_id and new.author == reviewer
    assert new.unchecked_sentences == ["You can also roll back to 4.1.3 today."]
    assert state(case) == (2, new.pk)
    assert Proposal.objects.get(pk=proposal.pk).body == proposal.body  # the parent is untouched


def test_line_ending_only_edit_is_no_change(proposal, reviewer):
    result = proposal_revise(
        case=proposal.case,
        expected_operation_id=proposal.operation_id,
        body=proposal.body.replace("\n", "\r\n"),
        editor=reviewer,
    )
    assert result.changed is False and result.proposal == proposal
    assert state(proposal.case) == (1, proposal.pk)


def test_evidence_change_with_identical_quotation_gets_a_new_identity(proposal, reviewer):
    case = proposal.case
    result = proposal_revise(
        case=case, expected_operation_id=proposal.operation_id, source_versions={"HOLD-7": 4}, editor=reviewer
    )
    new = result.proposal
    assert new.origin == Origin.EVIDENCE_CHANGE and new.body == proposal.body
    assert [p["quotation"] for p in new.passages] == [p["quotation"] for p in proposal.passages]
    assert {p["source_id"]: p["version"] for p in new.passages} == {"HOLD-7": 4, "KB-311": 3}
    assert all(f["version"] == 4 for f in new.findings)
    assert new.operation_id != proposal.operation_id and new.unchecked_sentences == []
    # The hard case: same visible text, and the old identity is refused.
    with pytest.raises(StaleProposal) as exc:
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert exc.value.current_operation_id == new.operation_id


def test_stale_expected_identity_is_refused_and_writes_nothing(proposal, reviewer):
    case = proposal.case
    proposal_revise(case=case, expected_operation_id=proposal.operation_id, body="First edit.", editor=reviewer)
    before = state(case)
    with pytest.raises(StaleProposal):
        proposal_revise(case=case, expected_operation_id=proposal.operation_id, body="Second edit.", editor=reviewer)
    assert state(case) == before


def test_a_decided_proposal_cannot_be_revised(proposal, reviewer):
    effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=reviewer)
    with pytest.raises(AlreadyDecided, match="already decided"):
        proposal_revise(case=proposal.case, expected_operation_id=proposal.operation_id, body="x.", editor=reviewer)
    assert state(proposal.case) == (1, proposal.pk)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "needs a new body"),
        ({"body": "   "}, "must not be empty"),
        ({"body": "bad \ud800"}, "U\\+D800 LONE SURROGATE at position 5"),
        ({"source_versions": {"HOLD-7": 3}}, "HOLD-7 has no version 3"),
        ({"source_versions": {"NOPE-1": 1}}, "not among this proposal's selected evidence"),
        ({"source_versions": {"HOLD-7": "4"}}, "HOLD-7: must be a non-negative integer"),
    ],
)
def test_bad_edits_are_refused_and_write_nothing(proposal, reviewer, kwargs, message):
    with pytest.raises(InvalidInput, match=message):
        proposal_revise(case=proposal.case, expected_operation_id=proposal.operation_id, editor=reviewer, **kwargs)
    assert state(proposal.case) == (1, proposal.pk)


def test_moving_to_a_version_without_the_quotation_is_refused(db, reviewer):
    from cases.services import case_import
    from tests.conftest import load_fixture

    case = case_import(data=load_fixture("t1077.json")).case
    proposal = proposal_create(case=case)
    # KB-090 v2 still has the quotation, so that move works; a missing one is refused.
    proposal_revise(
        case=case, expected_operation_id=proposal.operation_id, source_versions={"KB-090": 2}, editor=reviewer
    )
    assert Case.objects.get(pk=case.pk).current_proposal.origin == Origin.EVIDENCE_CHANGE
