"""effect_commit: every row of the commit table, and every refusal writes no decision or effect."""

from __future__ import annotations

import pytest

from core.errors import InvalidInput, NotFound, OutcomeUncertain, PermissionRefused, StaleProposal
from effects.models import CommitAttempt, EffectRecord
from effects.services import effect_commit
from reviews.models import PendingReview, ReviewDecision
from reviews.services import proposal_revise
from tests.conftest import commit_lost, pending_review_of


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


def fail_at(monkeypatch, point):
    """Raise (instead of SIGKILL) at one of the commit's crash points."""
    from effects import services

    def crash_point(name):
        if name == point:
            raise RuntimeError(f"disk full at {name}")

    monkeypatch.setattr(services, "crash_point", crash_point)


@pytest.mark.parametrize(
    "point, decided, outcome, status",
    [
        ("commit-before-decision", (0, 0), "failed", "pending"),
        # The decision, the effect, the attempt row and the pending review were all written
        # by then, and all rolled back together.
        ("commit-after-decision", (0, 0), "failed", "pending"),
        ("commit-after-transaction", (1, 1), "committed", "completed"),
    ],
)
def test_a_failure_at_each_crash_point_rolls_back_or_has_committed(
    proposal, reviewer, monkeypatch, point, decided, outcome, status
):
    pending = pending_review_of(proposal)
    fail_at(monkeypatch, point)
    with pytest.raises(RuntimeError, match=point):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert written() == decided
    assert outcomes() == [outcome]
    pending.refresh_from_db()
    assert pending.status == status


def test_the_pending_review_is_completed_with_the_commit(proposal, reviewer, make_user):
    pending = pending_review_of(proposal)
    before = pending.updated_at
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    pending.refresh_from_db()
    assert pending.status == PendingReview.Status.COMPLETED and pending.updated_at > before
    # A replay and a conflict leave it completed (and write nothing else to it).
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=make_user("other"))
    assert list(PendingReview.objects.values_list("status", flat=True)) == ["completed"]
    assert outcomes() == ["committed", "replay", "conflict"]


@pytest.mark.parametrize("approved", [True, False])
def test_a_conflict_completes_a_pending_review_left_pending(proposal, reviewer, make_user, approved):
    # e.g. the decision came in through another path that did not complete the pause.
    effect_commit(operation_id=proposal.operation_id, approved=approved, reviewer=reviewer)
    pending = pending_review_of(proposal)
    result = effect_commit(operation_id=proposal.operation_id, approved=not approved, reviewer=make_user("other"))
    assert result.status == "ConflictingDecision"
    pending.refresh_from_db()
    assert pending.status == PendingReview.Status.COMPLETED


def test_a_stale_refusal_leaves_the_pending_review_alone(proposal, reviewer):
    pending = pending_review_of(proposal)
    proposal_revise(case=proposal.case, expected_operation_id=proposal.operation_id, body="Edited.", editor=reviewer)
    with pytest.raises(StaleProposal):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    pending.refresh_from_db()
    assert pending.status == PendingReview.Status.PENDING
    assert written() == (0, 0) and outcomes() == ["stale"]


def test_refusals_before_the_commit_still_name_the_case(proposal, lead):
    with pytest.raises(PermissionRefused):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=lead)
    with pytest.raises(InvalidInput):
        effect_commit(operation_id=proposal.operation_id, approved="yes", reviewer=lead)
    assert list(CommitAttempt.objects.values_list("case_id", flat=True)) == [proposal.case_id] * 2


def test_the_result_carries_the_decision_without_reading_it_again(proposal, reviewer, make_user):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    result = effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    stored = ReviewDecision.objects.get()
    with CaptureQueriesContext(connection) as captured:
        seen = (result.decision.pk, result.decision.approved, result.decision.decided_at)
        assert result.decision.reviewer.get_username() == "reviewer"
    assert captured.captured_queries == []
    assert seen == (stored.pk, True, stored.decided_at)
    assert not result.decision._state.adding
    # A conflict names the decision that stands, with its own reviewer.
    other = effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=make_user("other"))
    assert (other.decision.pk, other.decision.approved, other.decision.reviewer) == (stored.pk, True, reviewer)
    assert CommitAttempt.objects.order_by("id").last().detail == "already approved by reviewer"


def test_a_failed_audit_row_never_masks_the_failure(proposal, reviewer, monkeypatch, caplog):
    from django.db import DatabaseError

    from effects import services

    def record(self, outcome, detail=""):
        raise DatabaseError("the attempt table is unavailable")

    fail_at(monkeypatch, "commit-after-decision")
    monkeypatch.setattr(services._Call, "record", record)
    with pytest.raises(RuntimeError, match="disk full"):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert "could not record the failed attempt" in caplog.text
    assert written() == (0, 0)


@pytest.mark.django_db(transaction=True)
def test_a_failure_of_commit_itself_is_uncertain_and_not_recorded_as_failed(proposal, reviewer, caplog):
    """The commit may have been applied when it raises; a "failed" row could be a lie."""
    from django.db import OperationalError

    # Every caller of the service (the SLA expiry, a retry of a pruned pause), not only the
    # workflow's commit step, hears "uncertain" and where to look, never the bare error.
    uncertain = pytest.raises(OutcomeUncertain, match="may have been applied; run `manage.py reconcile`")
    with commit_lost(), uncertain as raised:
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert isinstance(raised.value.__cause__, OperationalError)
    assert raised.value.details["error"] == "OperationalError: server closed the connection unexpectedly"
    assert raised.value.details["operation_id"] == proposal.operation_id
    # Here nothing was applied; the point is that no row claims to know.
    assert outcomes() == []
    assert written() == (0, 0)
    assert "outcome unknown" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_write_the_database_refused_is_recorded_as_failed_not_uncertain(proposal, reviewer):
    """A statement the database answered with an error rolled back, even where the write
    commits as it runs: the failure is recorded as failed, never reported as uncertain. (In
    place of the write of the decision: a statement that fails.)"""
    from django.db import DatabaseError, connection

    failing = "SELECT 1 / 0" if connection.vendor == "postgresql" else "SELECT abs(-9223372036854775808)"

    def refused(execute, sql, params, many, context):
        if sql.startswith("WITH") or sql.startswith('INSERT INTO "reviews_reviewdecision"'):
            return execute(failing, None, many, context)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(refused), pytest.raises(DatabaseError) as raised:
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert not isinstance(raised.value, OutcomeUncertain)
    assert written() == (0, 0)
    assert outcomes() == ["failed"]


def test_the_error_classes_own_the_stale_and_conflict_wording():
    """Callers pass facts; the wording lives once, in core/errors.py (docs/COMMANDS.md)."""
    from core.errors import ConflictingDecision

    op, current = "op-v1-" + "e3976ac9e004" + "0" * 52, "op-v1-" + "41024899b342" + "0" * 52
    stale = StaleProposal.superseded(operation_id=op, case_id="T-1042", current_operation_id=current)
    assert stale.message == (
        "stale: op-v1-e3976ac9e004… is not the current proposal of case T-1042; the current one is op-v1-41024899b342…; "
        "nothing was written"
    )
    assert (stale.current_operation_id, stale.details["case_id"], stale.exit_code) == (current, "T-1042", 4)
    assert StaleProposal.superseded(operation_id=op, case_id="T-1", current_operation_id=None).message.endswith(
        "the current one is none; nothing was written"
    )
    conflict = ConflictingDecision.of(operation_id=op, approved=False, by="reviewer", result="receipt")
    assert conflict.message == (
        "conflicting decision: op-v1-e3976ac9e004… was already declined by reviewer; no decision or effect was written"
    )
    assert (conflict.result, conflict.details["operation_id"], conflict.exit_code) == ("receipt", op, 3)
    assert ConflictingDecision.standing(approved=True, by="lead") == "already approved by lead"
    assert ConflictingDecision.standing(approved=None, by=None) == "already decided the other way"
