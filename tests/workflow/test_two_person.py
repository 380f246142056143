"""Two-person approval: a policy that needs N distinct approvers (``approvals_required``).

Each approval is a row of its own against the operation identity; the decision and the
effect are written with the Nth, in one statement. The three channels' partial approval is
in the one table of tests/workflow/test_decision_service.py; this file covers the rule, the
parameter and its identity, the voiding by an edit, decline, four eyes, reconcile, the
review page and, on PostgreSQL, concurrent approvals.
"""

from __future__ import annotations

import threading

import pytest
from django.db import IntegrityError, connection, connections, transaction

from cases.models import APPROVALS_REQUIRED, Case, approvals_required
from cases.services import case_import, validate_policy_data
from core import identity
from core.append_only import AppendOnlyError
from core.errors import FourEyesRefused, InvalidInput
from core.outcomes import DecisionOutcome, OperationState
from effects.models import CommitAttempt, EffectRecord
from effects.services import effect_commit, operation_reconcile, operations_reconcile
from reviews.models import Approval, PendingReview, ReviewDecision
from tests.conftest import load_fixture
from workflow.begin import review_begin
from workflow.decide import decision_record
from workflow.edit import review_edit


def two_person(name: str = "t1042.json", required: int = 2) -> dict:
    data = load_fixture(name)
    data["policy"]["parameters"][APPROVALS_REQUIRED] = required
    return data


def begun(required: int = 2) -> Case:
    case = case_import(data=two_person(required=required)).case
    review_begin(case=case)
    case.refresh_from_db()
    return case


def decide(case: Case, reviewer, approved: bool = True, operation_id: str | None = None):
    case.refresh_from_db()
    return decision_record(
        case=case,
        operation_id=operation_id or case.current_proposal.operation_id,
        approved=approved,
        reviewer=reviewer,
        channel="test",
    )


@pytest.fixture
def reviewers(make_user):
    return [make_user(f"reviewer{i}") for i in range(4)]


# --- the parameter and the identity -------------------------------------------------------


def test_a_policy_without_the_parameter_keeps_its_identity_and_the_parameter_changes_it():
    t1042 = load_fixture("t1042.json")["policy"]
    assert approvals_required(t1042["parameters"]) == 1
    # The published vector (docs/PROTOCOL.md) is a policy without the parameter.
    assert (
        identity.policy_id(t1042["name"], t1042["parameters"])
        == "pol-v1-7df3c55cc3b2a9c77010eba24d6ca49777e5626e98dc79e789209c7ba090cd7f"
    )
    two = {**t1042["parameters"], APPROVALS_REQUIRED: 2}
    assert approvals_required(two) == 2
    # The vector docs/PROTOCOL.md gives for support-reply with two approvers.
    assert (
        identity.policy_id(t1042["name"], two)
        == "pol-v1-306b74ec98e8614a25536ea427f8d40f73071a444f434e1a88547d4a49d9b1bd"
    )


@pytest.mark.parametrize("value", [1, 0, -2, 10, True, "2", 2.0, None])
def test_a_bad_approvals_required_is_refused_and_nothing_is_written(db, value):
    data = two_person()
    data["policy"]["parameters"][APPROVALS_REQUIRED] = value
    with pytest.raises(InvalidInput, match=APPROVALS_REQUIRED):
        validate_policy_data(data["policy"])
    with pytest.raises(InvalidInput):
        case_import(data=data)
    assert not Case.objects.exists()


# --- the rule -----------------------------------------------------------------------------


def test_the_first_approval_awaits_the_second_and_the_second_writes_one_effect(db, reviewers):
    case = begun()
    first, second = reviewers[:2]
    partial = decide(case, first)
    assert partial.outcome == DecisionOutcome.AWAITING_APPROVAL
    assert (partial.commit.approvals, partial.commit.required) == (1, 2)
    assert partial.commit.approvals_shown == "1 of 2 approvals"
    assert partial.commit.receipt() == {"Status": "AwaitingApproval", "Replay": False, "EffectCount": 0}
    assert not ReviewDecision.objects.exists() and not EffectRecord.objects.exists()
    # The review stays open for the next approver.
    assert PendingReview.objects.get(case=case).status == PendingReview.Status.PENDING
    assert operation_reconcile(partial.operation_id).state == OperationState.AWAITING_APPROVAL

    # The same reviewer again is a replay, twice over: nothing new.
    for _ in range(2):
        again = decide(case, first)
        assert again.outcome == DecisionOutcome.REPLAY
        assert again.commit.approvals_shown == "1 of 2 approvals"
        assert Approval.objects.count() == 1

    done = decide(case, second)
    assert done.outcome == DecisionOutcome.COMMITTED
    assert done.commit.approvals_shown == "2 of 2 approvals"
    decision = ReviewDecision.objects.get()
    assert decision.approved and decision.reviewer == second
    assert EffectRecord.objects.get().operation_id == done.operation_id
    assert PendingReview.objects.get(case=case).status == PendingReview.Status.COMPLETED
    approvals = list(Approval.objects.values_list("reviewer__username", "ordinal", "required"))
    assert approvals == [(first.username, 1, 2), (second.username, 2, 2)]
    # Both approvals are of the proposal, chained after it.
    assert set(Approval.objects.values_list("prev_hash", flat=True)) == {case.current_proposal.row_hash}
    assert operation_reconcile(done.operation_id).state == OperationState.COMMITTED

    # After the decision, anyone approving again is the replay of the decision that stands.
    for who in (first, second, reviewers[2]):
        late = decide(case, who)
        assert late.outcome == DecisionOutcome.REPLAY
        assert late.commit.effect_count == 1
    assert (EffectRecord.objects.count(), Approval.objects.count()) == (1, 2)
    outcomes = list(CommitAttempt.objects.order_by("id").values_list("outcome", flat=True))
    assert outcomes == ["awaiting_approval", "replay", "replay", "committed", "replay", "replay", "replay"]


def test_three_approvers(db, reviewers):
    case = begun(required=3)
    said = [decide(case, r).commit.approvals_shown for r in reviewers[:3]]
    assert said == ["1 of 3 approvals", "2 of 3 approvals", "3 of 3 approvals"]
    assert EffectRecord.objects.count() == 1


def test_a_decline_after_an_approval_ends_the_review_declined(db, reviewers):
    case = begun()
    decide(case, reviewers[0])
    declined = decide(case, reviewers[1], approved=False)
    assert declined.outcome == DecisionOutcome.DECLINED
    assert not EffectRecord.objects.exists()
    assert operation_reconcile(declined.operation_id).state == OperationState.DECLINED
    from core.errors import ConflictingDecision

    with pytest.raises(ConflictingDecision):
        decide(case, reviewers[2])
    assert not EffectRecord.objects.exists() and Approval.objects.count() == 1


def test_an_edit_voids_the_approvals_before_it(db, reviewers):
    case = begun()
    old = case.current_proposal.operation_id
    decide(case, reviewers[0])
    review_edit(case=case, expected_operation_id=old, body="A different reply.", editor=reviewers[1])
    case.refresh_from_db()
    new = case.current_proposal.operation_id
    assert new != old
    # The approval was of another operation: the edited proposal starts again from none.
    first = decide(case, reviewers[2])
    assert first.outcome == DecisionOutcome.AWAITING_APPROVAL
    assert first.commit.approvals_shown == "1 of 2 approvals"
    # Four eyes: the editor is never one of the two.
    with pytest.raises(FourEyesRefused):
        decide(case, reviewers[1])
    assert not ReviewDecision.objects.exists()
    # The first approver of the old operation counts again only by approving the new one.
    assert decide(case, reviewers[0]).outcome == DecisionOutcome.COMMITTED
    assert set(Approval.objects.filter(operation_id=new).values_list("reviewer", flat=True)) == {
        reviewers[2].pk,
        reviewers[0].pk,
    }
    assert EffectRecord.objects.get().operation_id == new


def test_a_stale_approval_after_an_edit_is_refused(db, reviewers):
    from core.errors import StaleProposal

    case = begun()
    old = case.current_proposal.operation_id
    decide(case, reviewers[0])
    review_edit(case=case, expected_operation_id=old, body="A different reply.", editor=reviewers[1])
    with pytest.raises(StaleProposal):
        decide(case, reviewers[2], operation_id=old)
    assert Approval.objects.filter(operation_id=old).count() == 1 and not ReviewDecision.objects.exists()


def test_one_approver_writes_no_approval_row(db, reviewers):
    case = case_import(data=load_fixture("t1042.json")).case
    review_begin(case=case)
    assert decide(case, reviewers[0]).outcome == DecisionOutcome.COMMITTED
    assert not Approval.objects.exists()


def test_effect_commit_alone_applies_the_same_rule(db, reviewers):
    case = begun()
    op = case.current_proposal.operation_id
    first = effect_commit(operation_id=op, approved=True, reviewer=reviewers[0])
    assert first.receipt()["Status"] == "AwaitingApproval"
    assert effect_commit(operation_id=op, approved=True, reviewer=reviewers[1]).effect_count == 1


# --- the table ----------------------------------------------------------------------------


def test_approvals_are_append_only_and_unique(db, reviewers):
    case = begun()
    decide(case, reviewers[0])
    row = Approval.objects.get()
    with pytest.raises(AppendOnlyError):
        Approval.objects.filter(pk=row.pk).update(ordinal=2)
    with pytest.raises(AppendOnlyError):
        row.delete()
    fields = {
        "operation_id": row.operation_id,
        "proposal_id": row.proposal_id,
        "required": 2,
        "channel": "test",
    }
    for duplicate in ({"reviewer": reviewers[0], "ordinal": 2}, {"reviewer": reviewers[1], "ordinal": 1}):
        with pytest.raises(IntegrityError), transaction.atomic():
            Approval.objects.create(**fields, **duplicate)
    with pytest.raises(IntegrityError), transaction.atomic():
        Approval.objects.create(**{**fields, "required": 2}, reviewer=reviewers[1], ordinal=3)
    with connection.cursor() as cursor, pytest.raises(Exception, match="append-only"), transaction.atomic():
        cursor.execute(f"UPDATE {Approval._meta.db_table} SET ordinal = 2")


def test_reconcile_lists_a_partly_approved_operation(db, reviewers):
    case = begun()
    op = decide(case, reviewers[0]).operation_id
    rows = [row for row in operations_reconcile() if row.operation_id == op]
    assert [row.state for row in rows] == [OperationState.AWAITING_APPROVAL]


# --- concurrency (PostgreSQL) -------------------------------------------------------------


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_sixteen_concurrent_approvals_by_four_reviewers_write_one_effect(transactional_db, reviewers):
    case = begun()
    op = case.current_proposal.operation_id
    start = threading.Barrier(16)
    said: list = []
    errors: list = []

    def approve(reviewer):
        try:
            start.wait()
            said.append(decide(Case.objects.get(pk=case.pk), reviewer, operation_id=op).outcome)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=approve, args=(reviewers[i % 4],)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert EffectRecord.objects.filter(operation_id=op).count() == 1
    assert ReviewDecision.objects.filter(operation_id=op).count() == 1
    approvers = list(Approval.objects.filter(operation_id=op).values_list("reviewer_id", flat=True))
    assert len(approvers) == 2 and len(set(approvers)) == 2
    assert said.count(DecisionOutcome.COMMITTED) == 1
    assert said.count(DecisionOutcome.AWAITING_APPROVAL) == 1
    assert ReviewDecision.objects.get().reviewer_id in approvers


# --- what the channels show ---------------------------------------------------------------


def test_the_review_page_history_picture_and_api_show_one_of_two(db, reviewers):
    from django.test import Client
    from django.urls import reverse

    from api.services import token_create

    case = begun()
    first, second = reviewers[:2]
    decide(case, first)
    proposal = case.current_proposal
    page_of = {}
    for who in (first, second):
        client = Client()
        client.force_login(who)
        page_of[who] = client.get(reverse("admin:reviews_proposal_review", args=[proposal.pk])).content.decode()
    for page in page_of.values():
        assert 'id="df-approvals-count">1 of 2 approvals</strong>' in page
        assert f"approved by <strong>{first.username}</strong>" in page
    # Who approved already sees why instead of Approve; the second approver sees Approve.
    assert 'id="df-approved-by-you"' in page_of[first] and 'id="df-approve"' not in page_of[first]
    assert 'id="df-approve"' in page_of[second] and 'id="df-approved-by-you"' not in page_of[second]

    client = Client()
    client.force_login(second)
    history = client.get(reverse("admin:cases_case_history", args=[case.pk])).content.decode()
    assert 'class="df-approval-count">1 of 2 approvals</strong>' in history
    assert "workflow " in history and "; 1 of 2 approvals" in history  # the picture's waiting step

    headers = {"Authorization": f"Bearer {token_create(user=second, name='t')[1]}"}
    operation = client.get(f"/api/operations/{proposal.operation_id}", headers=headers).json()
    assert (operation["state"], operation["approvals"]) == ("AwaitingApproval", "1 of 2 approvals")
    shown = client.get(f"/api/cases/{case.case_id}", headers=headers).json()
    assert shown["status"] == "AwaitingApproval" and shown["reconcile"]["approvals"] == "1 of 2 approvals"

    decide(case, second)
    history = client.get(reverse("admin:cases_case_history", args=[case.pk])).content.decode()
    assert 'class="df-approval-count">2 of 2 approvals</strong>' in history
    operation = client.get(f"/api/operations/{proposal.operation_id}", headers=headers).json()
    assert (operation["state"], operation["approvals"]) == ("Committed", None)


def test_reconcile_prints_how_far_the_approvals_are(db, reviewers):
    import io
    import json

    from django.core.management import call_command

    case = begun()
    op = decide(case, reviewers[0]).operation_id
    out = io.StringIO()
    call_command("reconcile", case.case_id, stdout=out)
    assert f'op={op} state=AwaitingApproval effects=0 approvals="1 of 2 approvals"' in out.getvalue()
    out = io.StringIO()
    call_command("reconcile", case.case_id, "--json", stdout=out)
    line = json.loads(out.getvalue().splitlines()[0])
    assert (line["state"], line["approvals"], line["approvals_required"]) == ("AwaitingApproval", 1, 2)
    assert operation_reconcile(op).as_dict() == line
