"""Reads of the delivery to the helpdesk, for the admin, the API and the demo (docs/DELIVERY.md)."""

from __future__ import annotations

from .models import Delivery, DeliveryState, DeliveryTry


def delivery_for(operation_id: str) -> Delivery | None:
    """The operation's delivery (None: a decline, not decided, or no helpdesk configured then)."""
    return Delivery.objects.filter(operation_id=operation_id).first()


def delivery_tries(operation_id: str) -> list[DeliveryTry]:
    """Every try, oldest first."""
    return list(DeliveryTry.objects.filter(operation_id=operation_id).order_by("started_at", "id"))


def delivery_status(operation_id: str) -> dict | None:
    """The delivery as plain data (the API's ``delivery`` field), or None when there is none.

    ``state`` is one of queued, sending, unknown, delivered, rejected; ``reference`` is the
    helpdesk's own id once delivered; ``reason`` is why it was rejected, or the last failed
    try's error while it is not settled.
    """
    found = delivery_for(operation_id)
    if found is None:
        return None
    return {
        "state": found.state,
        "label": DeliveryState(found.state).label,
        "reference": found.reference or None,
        "reason": found.reason or None,
        "tries": found.tries,
        "created_at": found.created_at,
        "updated_at": found.updated_at,
        "next_try_at": found.next_try_at if not found.final else None,
        "settled_at": found.settled_at,
    }
