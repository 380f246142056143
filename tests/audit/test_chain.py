"""The chain's row hashes (core/chain.py, docs/AUDIT.md): each append-only row carries the
hash of its canonical bytes and the hash of the row it follows, computed as it is inserted,
on every insert path, and recomputed equal from the row as the database gives it back."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from core import chain
from core.errors import NotFound
from effects.models import CommitAttempt, Delivery, DeliveryTry, EffectRecord
from effects.services import effect_commit
from reviews.models import Notification, NotificationEvent, NotificationKind, Proposal, ReviewDecision
from reviews.services import proposal_revise

pytestmark = pytest.mark.django_db


def _fresh(row):
    return type(row).objects.get(pk=row.pk)


def test_canonical_values_are_typed_so_no_two_share_a_rendering():
    renderings = [chain.canonical(v) for v in (None, "", "n", 1, "1", True, "true", [1], {"a": 1}, "i:1")]
    assert len(set(renderings)) == len(renderings)
    at = dt.datetime(2026, 12, 4, 18, 0, tzinfo=dt.UTC)
    assert chain.canonical(at) == "t:2026-12-04T18:00:00.000000Z"
    assert chain.canonical(at.astimezone(dt.timezone(dt.timedelta(hours=2)))) == chain.canonical(at)
    with pytest.raises(ValueError, match="aware"):
        chain.canonical(dt.datetime(2026, 12, 4))  # noqa: DTZ001 - the naive one is the point
    with pytest.raises(TypeError, match="canonical"):
        chain.canonical(1.5)
    # JSON: the keys' order does not matter, their values do.
    assert chain.canonical({"b": 1, "a": 2}) == chain.canonical({"a": 2, "b": 1}) != chain.canonical({"a": 1})


def test_line_endings_are_hashed_as_stored():
    assert chain.row_hash("x.y", "", ["a\r\nb"]) != chain.row_hash("x.y", "", ["a\nb"])
    assert chain.row_hash("x.y", "", ["ab", "c"]) != chain.row_hash("x.y", "", ["a", "bc"])
    assert chain.row_hash("x.y", "", ["a"]) != chain.row_hash("x.y", "p", ["a"])
    assert chain.row_hash("x.y", "", ["a"]).startswith("rh-v1-")


def test_an_approval_chains_proposal_decision_and_effect_and_hashes_its_attempt(proposal, reviewer):
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    proposal = _fresh(proposal)
    decision = ReviewDecision.objects.get(operation_id=proposal.operation_id)
    effect = EffectRecord.objects.get(operation_id=proposal.operation_id)
    attempt = CommitAttempt.objects.get(operation_id=proposal.operation_id)
    assert proposal.prev_hash == ""  # a prepared proposal is its case's root
    assert decision.prev_hash == proposal.row_hash
    assert effect.prev_hash == decision.row_hash
    for row in (proposal, decision, effect, attempt):
        assert row.row_hash and row.row_hash.startswith("rh-v1-")
        # Recomputed from the row as the database gives it back: the same bytes.
        assert chain.hash_of(row) == row.row_hash, type(row).__name__
    assert len({proposal.row_hash, decision.row_hash, effect.row_hash, attempt.row_hash}) == 4


def test_a_decline_with_a_crlf_note_and_a_refusal_are_hashed_as_stored(proposal, reviewer):
    effect_commit(
        operation_id=proposal.operation_id,
        approved=False,
        reviewer=reviewer,
        decline_reason="tone",
        decline_note="too curt\r\nsee the macro",
    )
    with pytest.raises(NotFound):  # refused, and its attempt row written
        effect_commit(operation_id="op-v1-" + "0" * 64, approved=True, reviewer=reviewer)
    assert CommitAttempt.objects.count() == 2
    decision = ReviewDecision.objects.get(operation_id=proposal.operation_id)
    assert decision.decline_note == "too curt\r\nsee the macro"
    assert chain.hash_of(decision) == decision.row_hash
    for attempt in CommitAttempt.objects.all():
        assert attempt.row_hash == chain.hash_of(attempt)
    decision.decline_note = "too curt\nsee the macro"
    assert chain.hash_of(decision) != decision.row_hash


def test_an_edit_follows_the_proposal_it_revises(proposal, editor):
    revised = proposal_revise(
        case=proposal.case, expected_operation_id=proposal.operation_id, body=proposal.body + " Thanks.", editor=editor
    ).proposal
    revised = _fresh(revised)
    assert revised.prev_hash == _fresh(proposal).row_hash
    assert chain.hash_of(revised) == revised.row_hash


def test_bulk_create_hashes_too(proposal):
    copy = {f.attname: getattr(proposal, f.attname) for f in Proposal._meta.concrete_fields}
    copy.update(id=None, operation_id="op-v1-" + "1" * 64, row_hash=None, prev_hash=None)
    (made,) = Proposal.objects.bulk_create([Proposal(**copy)])
    made = Proposal.objects.get(operation_id=made.operation_id)
    assert made.row_hash == chain.hash_of(made)


def test_delivery_tries_follow_the_effect_then_each_other(proposal, reviewer):
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    effect = EffectRecord.objects.get(operation_id=proposal.operation_id)
    delivery = Delivery.objects.create(
        operation_id=effect.operation_id,
        case_id=effect.case_id,
        decision_id=effect.decision_id,
        effect=effect,
        next_try_at=timezone.now(),
    )
    tries = [
        DeliveryTry.objects.create(
            delivery=delivery, operation_id=effect.operation_id, kind="send", outcome=outcome, started_at=timezone.now()
        )
        for outcome in ("not_stored", "delivered")
    ]
    first, second = (_fresh(t) for t in tries)
    assert first.prev_hash == effect.row_hash
    assert second.prev_hash == first.row_hash
    assert chain.hash_of(second) == second.row_hash


def test_notification_events_follow_each_other(proposal):
    notification = Notification.objects.create(
        operation_id=proposal.operation_id, kind=NotificationKind.REVIEW_BEGUN, case=proposal.case, channels="email"
    )
    events = [
        NotificationEvent.objects.create(
            notification=notification,
            case=proposal.case,
            operation_id=proposal.operation_id,
            kind=notification.kind,
            outcome=outcome,
            attempt=attempt,
        )
        for attempt, outcome in ((1, "retry"), (2, "sent"))
    ]
    first, second = (_fresh(e) for e in events)
    assert first.prev_hash == ""
    assert second.prev_hash == first.row_hash
    assert chain.hash_of(second) == second.row_hash
