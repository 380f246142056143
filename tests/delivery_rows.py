"""Delivery rows for the tests of what people see (admin, API, browser): made directly and
moved through the states the database allows (effects migration 0006), as a worker would.
What writes them in production (the commit statement, the workers, reconcile --repair) is
tested in tests/effects."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from effects.models import Delivery, DeliveryState, DeliveryTry, EffectRecord
from effects.services import effect_commit
from reviews.models import Proposal

# The last try's HTTP status per final state; Unknown: no answer came back, so none.
_LAST_STATUS = {
    DeliveryState.DELIVERED: 201,
    DeliveryState.REJECTED: 422,
    DeliveryState.NEEDS_CHECK: 422,
    DeliveryState.UNKNOWN: None,
}


def approved(proposal: Proposal, reviewer) -> EffectRecord:
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    return EffectRecord.objects.get(operation_id=proposal.operation_id)


def delivery_in(effect: EffectRecord, state: str, *, tries: int = 0, start=None) -> Delivery:
    """A delivery of ``effect`` moved to ``state`` by the transitions a worker makes, with
    ``tries`` try rows one second apart (the newest last in time)."""
    start = start or timezone.now() - timedelta(minutes=5)
    delivery = Delivery.objects.create(
        operation_id=effect.operation_id,
        case_id=effect.case_id,
        decision_id=effect.decision_id,
        effect=effect,
        next_try_at=start,
    )
    outcomes = {
        DeliveryState.QUEUED: DeliveryTry.Outcome.NOT_STORED,
        DeliveryState.SENDING: DeliveryTry.Outcome.NOT_STORED,
        DeliveryState.UNKNOWN: DeliveryTry.Outcome.UNKNOWN,
        DeliveryState.DELIVERED: DeliveryTry.Outcome.DELIVERED,
        DeliveryState.REJECTED: DeliveryTry.Outcome.REJECTED,
        DeliveryState.NEEDS_CHECK: DeliveryTry.Outcome.REJECTED,
    }
    for n in range(tries):
        last = n == tries - 1
        DeliveryTry.objects.create(
            delivery=delivery,
            operation_id=effect.operation_id,
            kind=DeliveryTry.Kind.SEND,
            outcome=outcomes[DeliveryState(state)] if last else DeliveryTry.Outcome.NOT_STORED,
            worker=f"host-a:{100 + n}",
            http_status=_LAST_STATUS.get(DeliveryState(state), 503) if last else 503,
            error="ReadTimeout: no answer within 5 s" if last and state == DeliveryState.UNKNOWN else "",
            latency_ms=10 + n,
            started_at=start + timedelta(seconds=n),
        )
    if state == DeliveryState.QUEUED:
        Delivery.objects.filter(pk=delivery.pk).update(tries=tries)
        delivery.refresh_from_db()
        return delivery
    delivery.state = DeliveryState.SENDING
    delivery.lease_owner = "host-l:1"
    delivery.lease_until = timezone.now() + timedelta(minutes=1)
    delivery.tries = tries
    delivery.save()
    if state == DeliveryState.SENDING:
        return delivery
    delivery.state = state
    if state == DeliveryState.DELIVERED:
        delivery.reference = "HD-REPLY-77"
    if state == DeliveryState.REJECTED:
        delivery.reason = "422: the ticket T-1042 is closed"
    if state == DeliveryState.NEEDS_CHECK:
        delivery.reason = "HTTP 422: ticket_closed"
    if state in (DeliveryState.DELIVERED, DeliveryState.REJECTED):
        delivery.settled_at = timezone.now()
    delivery.save()
    return delivery
