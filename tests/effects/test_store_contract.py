"""The commit store's contract (effects/store.py), one suite for both databases.

The same cases run on SQLite and on PostgreSQL (`make test` runs the suite on each): what
the store reads, what it writes, what it answers when a unique key refuses a row or the case
moved on from the read, and what effect_commit makes of it, alone, twice and concurrently.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection
from django_tasks import default_task_backend

from cases.models import Case, Policy
from core import identity
from core.errors import NotFound, StaleProposal
from effects.models import CommitAttempt, Delivery, EffectRecord
from effects.services import _effect_fields, effect_commit
from effects.store import PostgresCommitStore, SqliteCommitStore, Writes, commit_store
from reviews.models import PendingReview, ReviewDecision
from reviews.services import proposal_create, proposal_revise
from tests.conftest import pending_review_of, race
from workflow.sources import source_version_add

HELPDESK = "http://127.0.0.1:9/helpdesk"


def attempts() -> list[tuple]:
    return list(CommitAttempt.objects.order_by("id").values_list("outcome", "approved", "detail", "case_id"))


def rows() -> tuple[int, int, int]:
    return ReviewDecision.objects.count(), EffectRecord.objects.count(), Delivery.objects.count()


@pytest.fixture
def pending(proposal):
    return pending_review_of(proposal)


@pytest.fixture
def delivering(settings):
    """A helpdesk configured; the enqueued deliveries go to the dummy task backend."""
    settings.DECISIONFLOW_DELIVERY_URL = HELPDESK
    settings.TASKS = {"default": {"BACKEND": "django_tasks.backends.dummy.DummyBackend"}}
    default_task_backend.clear()
    yield
    default_task_backend.clear()


def test_the_store_is_the_databases_own():
    expected = PostgresCommitStore if connection.vendor == "postgresql" else SqliteCommitStore
    assert isinstance(commit_store(), expected)


# -- the store itself ------------------------------------------------------------------------


def test_read_of_an_unknown_operation_is_none(db):
    store = commit_store()
    with store.transaction():
        assert store.read("op-v1-" + "0" * 64) is None
    assert store.read("op-v1-" + "0" * 64) is None


def test_read_finds_the_target_then_the_standing_decision(proposal, pending, reviewer):
    store = commit_store()
    with store.transaction():
        target = store.read(proposal.operation_id)
    assert (target.proposal.pk, target.proposal.passages, target.proposal.policy_snapshot) == (
        proposal.pk,
        proposal.passages,
        proposal.policy_snapshot,
    )
    assert (target.case_label, target.current_proposal_id) == ("T-1042", proposal.pk)
    assert store.current_operation(target) == proposal.operation_id
    # No decision: no effect can exist (it references the decision), and the pending review
    # is completed by whatever decision comes.
    assert (target.decision, target.effect_exists, target.pending_open) == (None, False, False)

    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    target = store.read(proposal.operation_id)
    stored = ReviewDecision.objects.get()
    decision = target.decision
    assert (decision.pk, decision.approved, decision.decided_at, decision.reviewer_id) == (
        stored.pk,
        True,
        stored.decided_at,
        reviewer.pk,
    )
    assert decision.reviewer.get_username() == "reviewer"
    assert (target.effect_exists, target.pending_open) == (True, False)
    PendingReview.objects.filter(pk=pending.pk).update(status=PendingReview.Status.PENDING)
    assert store.read(proposal.operation_id).pending_open is True


def test_write_inserts_what_it_is_given_and_answers_none_for_a_refused_row(proposal, pending, reviewer):
    store = commit_store()
    decision = ReviewDecision(operation_id=proposal.operation_id, proposal=proposal, approved=True, reviewer=reviewer)
    effect = EffectRecord(**_effect_fields(proposal, decision))
    attempt = CommitAttempt(operation_id=proposal.operation_id, case_id=proposal.case_id, outcome="committed")
    with store.transaction():
        target = store.read(proposal.operation_id)
        written = store.write(
            Writes(attempt=attempt, decision=decision, effect=effect, basis=target), lock_timeout_ms=1000
        )
    stored = ReviewDecision.objects.get()
    assert (written.decision_pk, written.effect_pk) == (stored.pk, EffectRecord.objects.get().pk)
    # The effect names the decision written before it in the same transaction.
    assert EffectRecord.objects.get().decision_id == stored.pk
    pending.refresh_from_db()
    assert pending.status == PendingReview.Status.COMPLETED
    # Again: the unique keys refuse, and the store says so instead of raising; nothing of
    # that write stands, its attempt row included (the commit then reads again).
    again = ReviewDecision(operation_id=proposal.operation_id, proposal=proposal, approved=False, reviewer=reviewer)
    refused = CommitAttempt(operation_id=proposal.operation_id, case_id=proposal.case_id, outcome="committed")
    with store.transaction():
        written = store.write(
            Writes(
                attempt=refused,
                decision=again,
                effect=EffectRecord(**_effect_fields(proposal, stored)),
                basis=store.read(proposal.operation_id),
            ),
            lock_timeout_ms=1000,
        )
    assert (written.decision_pk, written.effect_pk) == (None, None)
    assert rows() == (1, 1, 0)
    assert ReviewDecision.objects.get().approved is True
    assert CommitAttempt.objects.count() == 1


@pytest.mark.parametrize("moved_on", ["edit", "publish switch", "evidence mark"])
def test_write_answers_none_when_the_case_moved_on_from_the_read(proposal, pending, reviewer, make_user, moved_on):
    """PostgreSQL reads and writes in two transactions, so an edit, a publish's switch of
    the case's policy, or a new source version's mark of its evidence, can commit between
    them; the write then writes nothing at all (the guard holds the case row as read: its
    current proposal, its policy and its evidence hold). SQLite holds the
    database's write lock from the read to the write, so nothing can come between: the same
    write afterwards is refused there by the lock instead, and this case is PostgreSQL's alone."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's transaction excludes every other writer between the read and the write")
    store = commit_store()
    target = store.read(proposal.operation_id)
    if moved_on == "edit":
        proposal_revise(
            case=proposal.case, expected_operation_id=proposal.operation_id, body="Edited.", editor=reviewer
        )
    elif moved_on == "publish switch":
        switched(proposal.case)
    else:
        marked = source_version_add(
            source_id="HOLD-7",
            version=5,
            text="Known issue.",
            actor=make_user("pipeline", group="pipeline"),
            apply=True,
        )
        assert marked.marked == 1
    decision = ReviewDecision(operation_id=proposal.operation_id, proposal=proposal, approved=True, reviewer=reviewer)
    attempt = CommitAttempt(operation_id=proposal.operation_id, case_id=proposal.case_id, outcome="committed")
    with store.transaction():
        written = store.write(
            Writes(
                attempt=attempt,
                decision=decision,
                effect=EffectRecord(**_effect_fields(proposal, decision)),
                basis=target,
            ),
            lock_timeout_ms=1000,
        )
    assert (written.decision_pk, written.effect_pk) == (None, None)
    assert rows() == (0, 0, 0) and CommitAttempt.objects.count() == 0
    pending.refresh_from_db()
    assert pending.status == PendingReview.Status.PENDING
    # A fresh read of the case shows what moved on.
    with store.transaction():
        fresh = store.read(proposal.operation_id)
        seen = (target.current_proposal_id, target.case_policy_pk, target.evidence_hold)
        assert (fresh.current_proposal_id, fresh.case_policy_pk, fresh.evidence_hold) != seen


# -- effect_commit on the store: every row of the commit table --------------------------------


def test_first_approval_then_replay(proposal, pending, reviewer):
    first = effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert first.receipt() == {"Status": "Committed", "Replay": False, "EffectCount": 1}
    again = effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert again.receipt() == {"Status": "Committed", "Replay": True, "EffectCount": 1}
    assert rows() == (1, 1, 0)
    assert attempts() == [("committed", True, "", proposal.case_id), ("replay", True, "", proposal.case_id)]
    assert first.decision.pk == again.decision.pk == ReviewDecision.objects.get().pk
    pending.refresh_from_db()
    assert pending.status == PendingReview.Status.COMPLETED


def test_decline_then_replay(proposal, pending, reviewer):
    first = effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=reviewer)
    assert first.receipt() == {"Status": "Declined", "Replay": False, "EffectCount": 0}
    again = effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=reviewer)
    assert again.receipt() == {"Status": "Declined", "Replay": True, "EffectCount": 0}
    assert rows() == (1, 0, 0)
    assert [a[:2] for a in attempts()] == [("declined", False), ("replay", False)]


@pytest.mark.parametrize("first, then, effects", [(True, False, 1), (False, True, 0)])
def test_conflict_both_ways(proposal, pending, reviewer, make_user, first, then, effects):
    effect_commit(operation_id=proposal.operation_id, approved=first, reviewer=reviewer)
    other = make_user("other")
    result = effect_commit(operation_id=proposal.operation_id, approved=then, reviewer=other)
    assert result.receipt() == {"Status": "ConflictingDecision", "Replay": False, "EffectCount": effects}
    assert (result.decision.approved, result.decision.reviewer.get_username()) == (first, "reviewer")
    assert rows() == (1, effects, 0)
    verb = "approved" if first else "declined"
    assert attempts()[-1] == ("conflict", then, f"already {verb} by reviewer", proposal.case_id)


def test_an_approval_whose_effect_is_missing_writes_it(proposal, reviewer):
    ReviewDecision.objects.create(
        operation_id=proposal.operation_id, proposal=proposal, approved=True, reviewer=reviewer
    )
    result = effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert result.receipt() == {"Status": "Committed", "Replay": False, "EffectCount": 1}
    assert rows() == (1, 1, 0)
    assert attempts()[-1][0] == "committed"


def test_stale(proposal, pending, reviewer):
    new = proposal_revise(
        case=proposal.case, expected_operation_id=proposal.operation_id, body="Edited.", editor=reviewer
    )
    with pytest.raises(StaleProposal) as stale:
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    current = new.proposal.operation_id
    assert stale.value.message == (
        f"stale: {proposal.operation_id[:18]}… is not the current proposal of case T-1042; "
        f"the current one is {current[:18]}…; nothing was written"
    )
    assert (stale.value.current_operation_id, stale.value.details["case_id"]) == (current, "T-1042")
    assert rows() == (0, 0, 0)
    assert attempts() == [("stale", True, stale.value.message, proposal.case_id)]
    pending.refresh_from_db()
    assert pending.status == PendingReview.Status.PENDING


def switched(case, label="v4", allowance=10) -> Policy:
    """What a publish's switch does to one case: its policy becomes a new version, while its
    current proposal stays the one prepared under the old (until it is prepared again)."""
    parameters = {**case.policy.parameters, "allowance_units": allowance}
    policy = Policy.objects.create(
        name=case.policy.name,
        label=label,
        parameters=parameters,
        policy_id=identity.policy_id(case.policy.name, parameters),
    )
    Case.objects.filter(pk=case.pk).update(policy=policy)
    return policy


def test_stale_when_a_publish_switched_the_case_onto_another_policy_version(proposal, pending, reviewer):
    switched(proposal.case)
    for approved in (True, False):
        with pytest.raises(StaleProposal) as stale:
            effect_commit(operation_id=proposal.operation_id, approved=approved, reviewer=reviewer)
        assert stale.value.message == (
            f"stale: {proposal.operation_id[:18]}… was prepared under policy support-reply v3, and support-reply v4 "
            "has been published since; case T-1042 is being prepared again under v4 (reload to review its new "
            "proposal); nothing was written"
        )
        assert stale.value.current_operation_id is None and stale.value.details["current_policy_label"] == "v4"
    assert rows() == (0, 0, 0)
    assert [a[0] for a in attempts()] == ["stale", "stale"]
    pending.refresh_from_db()
    assert pending.status == PendingReview.Status.PENDING


def test_a_switch_to_a_new_label_of_the_same_version_is_not_stale(proposal, pending, reviewer):
    """The label is not part of the identity: the proposal is still under the case's policy."""
    switched(proposal.case, label="v3 (renamed)", allowance=proposal.case.policy.parameters["allowance_units"])
    assert effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer).status == "Committed"


def test_unknown_operation(db, reviewer):
    unknown = "op-v1-" + "0" * 64
    with pytest.raises(NotFound, match=f"no proposal has operation {unknown}"):
        effect_commit(operation_id=unknown, approved=True, reviewer=reviewer)
    assert rows() == (0, 0, 0)
    assert attempts() == [("refused", True, f"no proposal has operation {unknown}", None)]


def test_a_delivery_row_only_for_a_new_approval_with_delivery_configured(case, reviewer, make_user, delivering):
    approved = proposal_create(case=case)
    assert effect_commit(operation_id=approved.operation_id, approved=True, reviewer=reviewer).replay is False
    delivery = Delivery.objects.get()
    effect = EffectRecord.objects.get()
    assert (delivery.operation_id, delivery.effect_id, delivery.decision_id, delivery.state) == (
        approved.operation_id,
        effect.pk,
        effect.decision_id,
        "queued",
    )
    # A replay and a conflict add none.
    effect_commit(operation_id=approved.operation_id, approved=True, reviewer=reviewer)
    effect_commit(operation_id=approved.operation_id, approved=False, reviewer=make_user("other"))
    assert Delivery.objects.count() == 1


def test_no_delivery_row_without_a_helpdesk_or_for_a_decline(proposal, reviewer, settings):
    settings.DECISIONFLOW_DELIVERY_URL = ""
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert Delivery.objects.count() == 0


def test_no_delivery_row_for_a_decline(proposal, reviewer, delivering):
    effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=reviewer)
    assert rows() == (1, 0, 0)


# -- twice, concurrently ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_n_threads_committing_one_operation_write_one_decision_and_effect(proposal, pending, reviewer, delivering):
    op = proposal.operation_id
    results, errors = race([lambda: effect_commit(operation_id=op, approved=True, reviewer=reviewer)] * 8)
    assert errors == []
    assert Counter((r.status, r.replay) for r in results) == {("Committed", False): 1, ("Committed", True): 7}
    assert rows() == (1, 1, 1)
    assert Counter(a[0] for a in attempts()) == {"committed": 1, "replay": 7}
    assert {r.decision.pk for r in results} == {ReviewDecision.objects.get().pk}


@pytest.mark.django_db(transaction=True)
def test_opposite_decisions_concurrently_one_decision_the_other_a_conflict(proposal, pending, reviewer, make_user):
    op = proposal.operation_id
    other = make_user("other")
    results, errors = race(
        [
            lambda: effect_commit(operation_id=op, approved=True, reviewer=reviewer),
            lambda: effect_commit(operation_id=op, approved=False, reviewer=other),
        ]
    )
    assert errors == []
    decision = ReviewDecision.objects.get()
    statuses = sorted(r.status for r in results)
    assert statuses == sorted(["ConflictingDecision", "Committed" if decision.approved else "Declined"])
    assert rows()[:2] == (1, 1 if decision.approved else 0)
    verb = "approved" if decision.approved else "declined"
    conflict = CommitAttempt.objects.get(outcome="conflict")
    assert conflict.detail == f"already {verb} by {decision.reviewer.get_username()}"


def _prepared_commit_statements() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s OR statement LIKE %s",
            ['WITH %INSERT INTO "effects_commitattempt"%', 'SELECT "reviews_proposal"."id"%'],
        )
        return cursor.fetchone()[0]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("threshold, prepared", [(1, True), (None, False)])
def test_the_commits_statements_are_prepared_by_psycopg_only_when_the_setting_asks(
    t1042_data, reviewer, threshold, prepared
):
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    from cases.services import case_import

    connection.close()  # a fresh server session, which holds no prepared statement yet
    connection.ensure_connection()
    connection.connection.prepare_threshold = threshold
    operations = []
    for i in range(3):
        case = case_import(data={**t1042_data, "case_id": f"T-PREP-{i}"}).case
        operation_id = proposal_create(case=case).operation_id
        result = effect_commit(operation_id=operation_id, approved=True, reviewer=reviewer, channel="t")
        assert result.status == "Committed" and not result.replay
        operations.append(operation_id)
    assert (_prepared_commit_statements() > 0) is prepared
    assert EffectRecord.objects.filter(operation_id__in=operations).count() == 3
    connection.close()  # the next test gets the setting's own threshold again
