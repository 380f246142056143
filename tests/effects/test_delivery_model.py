"""The delivery row's promises, kept by the database itself (effects/migrations/0006):
its identity is write-once, its state moves only forward, final states are final, nothing
is deleted, and every try row is append-only. Both databases, through raw SQL, so that no
Python guard can be what refuses."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from effects.models import DELIVERY_TRANSITIONS, Delivery, DeliveryState, DeliveryTry, EffectRecord
from effects.services import effect_commit

STATES = list(DeliveryState.values)


@pytest.fixture
def delivery(proposal, reviewer):
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    effect = EffectRecord.objects.get(operation_id=proposal.operation_id)
    # Made here directly: what writes it in production is the commit statement (not this test's subject).
    return Delivery.objects.create(
        operation_id=effect.operation_id,
        case_id=effect.case_id,
        decision_id=effect.decision_id,
        effect=effect,
        next_try_at=timezone.now(),
    )


def _force(delivery: Delivery, state: str) -> None:
    """Put the row in ``state`` whatever the table says, for the test's set-up only: the
    trigger is bypassed for this one update (PostgreSQL: replica mode; SQLite: dropped and
    re-created)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute(
                "UPDATE effects_delivery SET state = %s, reference = 'HD-1', reason = 'r', lease_until = now() "
                "WHERE id = %s",
                [state, delivery.pk],
            )
            cursor.execute("SET LOCAL session_replication_role = origin")
        else:
            cursor.execute("SELECT sql FROM sqlite_master WHERE name = 'effects_delivery_forward_only'")
            (create,) = cursor.fetchone()
            cursor.execute("DROP TRIGGER effects_delivery_forward_only")
            cursor.execute(
                "UPDATE effects_delivery SET state = %s, reference = 'HD-1', reason = 'r', lease_until = %s "
                "WHERE id = %s",
                [state, timezone.now(), delivery.pk],
            )
            cursor.execute(create)


def _move(delivery: Delivery, state: str) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE effects_delivery SET state = %s, reference = 'HD-1', reason = 'r', lease_until = %s WHERE id = %s",
            [state, timezone.now(), delivery.pk],
        )


@pytest.mark.parametrize("old", STATES)
@pytest.mark.parametrize("new", STATES)
def test_the_database_allows_exactly_the_forward_transitions(delivery, old, new):
    _force(delivery, old)
    allowed = new in DELIVERY_TRANSITIONS[old] or (new == old and bool(DELIVERY_TRANSITIONS[old]))
    if allowed:
        _move(delivery, new)
        assert Delivery.objects.get(pk=delivery.pk).state == new
    else:
        with pytest.raises((IntegrityError, DatabaseError)):
            _move(delivery, new)
        assert Delivery.objects.get(pk=delivery.pk).state == old


@pytest.mark.parametrize(
    "column, value", [("operation_id", "f" * 64), ("case_id", None), ("decision_id", None), ("effect_id", None)]
)
def test_the_identity_is_write_once(delivery, column, value):
    if value is None:
        value = getattr(delivery, column) + 1000
    with pytest.raises((IntegrityError, DatabaseError)), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"UPDATE effects_delivery SET {column} = %s WHERE id = %s", [value, delivery.pk])
    assert getattr(Delivery.objects.get(pk=delivery.pk), column) == getattr(delivery, column)


def test_a_delivery_is_never_deleted_and_its_tries_never_change(delivery):
    DeliveryTry.objects.create(
        delivery=delivery,
        operation_id=delivery.operation_id,
        kind=DeliveryTry.Kind.SEND,
        outcome=DeliveryTry.Outcome.UNKNOWN,
        started_at=timezone.now(),
    )
    for sql in (
        "DELETE FROM effects_deliverytry",
        "UPDATE effects_deliverytry SET error = 'x'",
        "DELETE FROM effects_delivery",
    ):
        with pytest.raises((IntegrityError, DatabaseError)), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql)
    assert Delivery.objects.count() == 1
    assert DeliveryTry.objects.get().error == ""


def test_one_delivery_per_operation_and_final_states_say_what_they_are(delivery):
    with pytest.raises(IntegrityError), transaction.atomic():
        Delivery.objects.create(
            operation_id=delivery.operation_id,
            case_id=delivery.case_id,
            decision_id=delivery.decision_id,
            effect_id=delivery.effect_id,
            next_try_at=timezone.now(),
        )
    for state, column in (
        (DeliveryState.DELIVERED, "reference"),
        (DeliveryState.REJECTED, "reason"),
        (DeliveryState.NEEDS_CHECK, "reason"),
    ):
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "UPDATE effects_delivery SET state = 'sending', lease_until = %s WHERE id = %s",
                [timezone.now(), delivery.pk],
            )
            cursor.execute(f"UPDATE effects_delivery SET state = %s, {column} = '' WHERE id = %s", [state, delivery.pk])
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE effects_delivery SET state = 'sending', lease_until = NULL WHERE id = %s", [delivery.pk])


def test_needs_check_says_what_the_helpdesk_answered_both_ways(delivery):
    delivery.state, delivery.reason = DeliveryState.NEEDS_CHECK, ""
    with pytest.raises(ValidationError, match="delivery_needs_check_has_reason"):
        delivery.full_clean(exclude=["case", "decision", "effect"], validate_unique=False)
    # The check refuses it (not the row's keys, which it shares with the fixture's).
    with pytest.raises(IntegrityError, match="delivery_needs_check_has_reason"), transaction.atomic():
        Delivery.objects.create(
            operation_id="op-v1-" + "0" * 64,
            case_id=delivery.case_id,
            decision_id=delivery.decision_id,
            effect_id=delivery.effect_id,
            next_try_at=timezone.now(),
            state=DeliveryState.NEEDS_CHECK,
        )
