"""Reads of the second effect, the reply's delivery to the helpdesk (docs/DELIVERY.md): what
the review and history pages, the deliveries list, the API and the demo show. Nothing here
writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from effects.delivery import delivery_configured
from effects.models import Delivery, DeliveryState, DeliveryTry

# The pages show this many tries, newest first; the rest are on the delivery's own page.
PANEL_TRIES = 10


def delivery_for(operation_id: str) -> Delivery | None:
    """The operation's delivery (None: a decline, not decided, or no helpdesk configured then)."""
    return Delivery.objects.filter(operation_id=operation_id).first()


STATE_SENTENCES = {
    DeliveryState.QUEUED: "Waiting for a task worker to send the reply to the helpdesk.",
    DeliveryState.SENDING: "A task worker is sending the reply to the helpdesk now.",
    DeliveryState.UNKNOWN: (
        "The helpdesk may have received it; reconcile is checking. A request went out and no answer came back, "
        "so nobody can say yet whether the customer's ticket has the reply."
    ),
    DeliveryState.DELIVERED: "The helpdesk stored the reply on the customer's ticket.",
    DeliveryState.REJECTED: "The helpdesk refused the reply for good; it is not on the ticket.",
    DeliveryState.NEEDS_CHECK: (
        "Needs a person: the reply may already be on the ticket. An earlier request got no answer, and the helpdesk "
        "refused the resend with the same key, so nobody can say whether the customer's ticket has the reply."
    ),
}
# What the person does for a delivery that needs one: the panel and the list say it.
NEEDS_CHECK_ADVICE = (
    "Look at the customer's ticket first: if the reply is there, nothing more is needed. Post it by hand only "
    "when the ticket does not have it; nothing resends it."
)


@dataclass(frozen=True)
class DeliveryPanel:
    """The delivery panel of one operation (review page) or of one case (history page).

    ``delivery`` is None when there is none to show; then ``note`` says why (a decline, an
    approval made while no helpdesk was configured, a proposal not decided yet).
    """

    delivery: Delivery | None
    tries: list[DeliveryTry] = field(default_factory=list)
    more_tries: int = 0
    note: str = ""
    sentence: str = ""
    # What a person should do, where the state needs one (NeedsCheck).
    advice: str = ""
    # Queued past its due time by more than this: is a worker running?
    overdue: bool = False
    due_at: datetime | None = None


def _panel_for(delivery: Delivery) -> DeliveryPanel:
    tries = list(DeliveryTry.objects.filter(delivery=delivery).order_by("-started_at", "-id")[: PANEL_TRIES + 1])
    shown = tries[:PANEL_TRIES]
    # The row's own counter says how many there are in all; fewer fetched means we saw them all.
    more = max(delivery.tries, len(tries)) - len(shown) if len(tries) > PANEL_TRIES else 0
    overdue = delivery.state == DeliveryState.QUEUED and (timezone.now() - delivery.next_try_at).total_seconds() > 60
    return DeliveryPanel(
        delivery=delivery,
        tries=shown,
        more_tries=more,
        sentence=STATE_SENTENCES[DeliveryState(delivery.state)],
        advice=NEEDS_CHECK_ADVICE if delivery.state == DeliveryState.NEEDS_CHECK else "",
        overdue=overdue,
        due_at=delivery.next_try_at,
    )


def delivery_panel(*, operation_id: str, approved: bool | None) -> DeliveryPanel | None:
    """The panel for one operation, or None when there is nothing to say.

    ``approved`` is the operation's decision (None: undecided). No delivery and no helpdesk
    configured: no panel at all, as before the helpdesk existed.
    """
    delivery = delivery_for(operation_id)
    if delivery is not None:
        return _panel_for(delivery)
    if not delivery_configured():
        return None
    if approved is False:
        return DeliveryPanel(None, note="Declined: nothing is sent for a decline.")
    if approved is True:
        return DeliveryPanel(
            None,
            note="Approved while no helpdesk was configured: only the local effect record exists, nothing is sent.",
        )
    return DeliveryPanel(None, note="Not decided yet: an approval queues the reply for the helpdesk.")


def case_delivery_panels(*, case_pk: int, decisions: dict[str, bool]) -> list[DeliveryPanel]:
    """The panels for a case's history: each delivery of its operations, newest first, and
    a note for each decided operation without one (a decline, or an approval made while no
    helpdesk was configured). ``decisions``: operation identity -> approved."""
    panels = [_panel_for(d) for d in Delivery.objects.filter(case_id=case_pk).order_by("-created_at", "-id")]
    if not delivery_configured():
        return panels
    delivered = {p.delivery.operation_id for p in panels if p.delivery is not None}
    for operation_id, approved in decisions.items():
        if operation_id in delivered:
            continue
        panel = delivery_panel(operation_id=operation_id, approved=approved)
        if panel is not None:
            panels.append(panel)
    return panels


def delivery_data(delivery: Delivery | None) -> dict | None:
    """The API's ``delivery`` of one operation (docs/API.md), from its delivery row as the
    caller read it (the API reads it with the decision): None when it has none. One query,
    for the newest try, and none without a delivery."""
    if delivery is None:
        return None
    last = DeliveryTry.objects.filter(delivery=delivery).order_by("-started_at", "-id").first()
    return {
        "state": delivery.state,
        "reference": delivery.reference or None,
        "reason": delivery.reason or None,
        "tries": delivery.tries,
        "created_at": delivery.created_at,
        "settled_at": delivery.settled_at,
        "last_try": None
        if last is None
        else {
            "kind": last.kind,
            "outcome": last.outcome,
            "worker": last.worker,
            "http_status": last.http_status,
            "error": last.error or None,
            "latency_ms": last.latency_ms,
            "started_at": last.started_at,
        },
    }
