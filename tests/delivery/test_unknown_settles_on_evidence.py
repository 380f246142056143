"""Unknown is never turned into a false final state (docs/DELIVERY.md, "What Unknown means").

Once a delivery has been Unknown, only positive evidence settles it: a lookup that finds
the reply, or a resend answered as stored. A permanent refusal of the resend is NeedsCheck
(a person looks at the ticket: the reply may be on it), never Rejected. A delivery that was
never Unknown is Rejected on a permanent refusal, as before.

First every pair of (what happened before, what the helpdesk answered now), through the
HTTP exchange (httpx with a mock transport), ``classify`` and ``delivery_next_state``; then
the whole sequence through the reference helpdesk.
"""

from __future__ import annotations

import json

import httpx
import pytest

from effects import delivery
from effects.models import Delivery, DeliveryState, DeliveryTry
from effects.services import effect_commit
from effects.tasks import deliver

State, Outcome = DeliveryState, DeliveryTry.Outcome
OP = "op-v1-" + "ab" * 32
REPLY = {"reference": "HD-000007", "operation_id": OP, "case_id": "T-1042", "created_at": "2026-12-01T03:09:55Z"}


def _answering(status: int, data: dict):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=data)

    return handler


def _timing_out(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("no answer within the read timeout", request=request)


# now: (how the request is made, what the helpdesk does)
NOW = {
    "2xx stored": ("send", _answering(201, {**REPLY, "replay": False})),
    "2xx already stored (replay)": ("send", _answering(200, {**REPLY, "replay": True})),
    "409 already stored": ("send", _answering(409, {"error": "already_exists", "detail": "the key holds a reply"})),
    "lookup found": ("lookup", _answering(200, REPLY)),
    "404 on lookup (lagging)": ("lookup", _answering(404, {"error": "not_found"})),
    "4xx on resend (422 ticket_closed)": ("send", _answering(422, {"error": "ticket_closed"})),
    "5xx (500)": ("send", _answering(500, {"error": "internal_error"})),
    "5xx (503, stored nothing)": ("send", _answering(503, {"error": "unavailable"})),
    "timeout, answer lost": ("send", _timing_out),
}

# (before, now) -> the delivery's next state. before: "first" = never Unknown.
EXPECTED = {
    ("first", "2xx stored"): State.DELIVERED,
    ("first", "2xx already stored (replay)"): State.DELIVERED,
    ("first", "409 already stored"): State.REJECTED,
    ("first", "lookup found"): State.DELIVERED,
    # A first try never looks up; were it to, a 404 would prove nothing either way.
    ("first", "404 on lookup (lagging)"): State.UNKNOWN,
    ("first", "4xx on resend (422 ticket_closed)"): State.REJECTED,
    ("first", "5xx (500)"): State.UNKNOWN,
    ("first", "5xx (503, stored nothing)"): State.QUEUED,
    ("first", "timeout, answer lost"): State.UNKNOWN,
    ("unknown", "2xx stored"): State.DELIVERED,
    ("unknown", "2xx already stored (replay)"): State.DELIVERED,
    ("unknown", "409 already stored"): State.NEEDS_CHECK,
    ("unknown", "lookup found"): State.DELIVERED,
    ("unknown", "404 on lookup (lagging)"): State.UNKNOWN,
    ("unknown", "4xx on resend (422 ticket_closed)"): State.NEEDS_CHECK,
    ("unknown", "5xx (500)"): State.UNKNOWN,
    ("unknown", "5xx (503, stored nothing)"): State.UNKNOWN,
    ("unknown", "timeout, answer lost"): State.UNKNOWN,
}


def test_the_table_covers_every_pair():
    assert set(EXPECTED) == {(before, now) for before in ("first", "unknown") for now in NOW}


@pytest.fixture
def mock_helpdesk(settings, monkeypatch):
    """The exchange's httpx client, answered by the handler a test sets."""
    settings.DECISIONFLOW_DELIVERY_URL = "http://helpdesk.test"
    settings.DECISIONFLOW_DELIVERY_TOKEN = "t"
    handler = {}

    def client():
        return httpx.Client(transport=httpx.MockTransport(lambda request: handler["now"](request)))

    monkeypatch.setattr(delivery, "_http_client", client)
    return handler


@pytest.mark.parametrize(("before", "now"), sorted(EXPECTED))
def test_each_answer_after_each_history(mock_helpdesk, before, now):
    kind, handler = NOW[now]
    mock_helpdesk["now"] = handler
    if kind == "lookup":
        answer = delivery.helpdesk_lookup(operation_id=OP)
    else:
        answer = delivery.helpdesk_send(operation_id=OP, body=b"{}")
    state = delivery.delivery_next_state(from_unknown=before == "unknown", answer=answer)
    assert state == EXPECTED[(before, now)], answer
    if before == "unknown":
        # Only positive evidence settles an Unknown one: never Rejected, never back to Queued.
        assert state not in (State.REJECTED, State.QUEUED)
    if state == State.DELIVERED:
        assert answer.reference == REPLY["reference"]


@pytest.mark.parametrize("status", [400, 409, 413, 422])
def test_classify_says_what_the_answer_proves_and_the_history_decides_the_state(status):
    # The try's own outcome is the helpdesk's refusal of that request, before or after Unknown.
    answer = delivery.classify(status, json.dumps({"error": "ticket_closed"}).encode(), OP, lookup=False)
    assert (answer.outcome, answer.http_status) == (Outcome.REJECTED, status)
    assert delivery.delivery_next_state(from_unknown=False, answer=answer) == State.REJECTED
    assert delivery.delivery_next_state(from_unknown=True, answer=answer) == State.NEEDS_CHECK


def tries(operation_id) -> list[tuple]:
    return list(
        DeliveryTry.objects.filter(operation_id=operation_id)
        .order_by("id")
        .values_list("kind", "outcome", "http_status")
    )


def test_stored_answer_lost_then_a_lagging_lookup_then_a_refused_resend_needs_a_person(proposal, reviewer, delivering):
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    op = proposal.operation_id
    # The first send is stored by the helpdesk and its answer lost.
    delivering.set_faults(drop_after_commit=1, lookup_lag_s=600)
    assert deliver.call(op) == "unknown"
    # The lookup lags (404), and the resend with the same key is refused: the ticket closed.
    delivering.set_faults(ticket_closed_count=1)
    assert deliver.call(op) == "needs_check"
    assert tries(op) == [("send", "unknown", None), ("lookup", "not_found", 404), ("send", "rejected", 422)]
    row = Delivery.objects.get(operation_id=op)
    assert row.state == State.NEEDS_CHECK and row.state != State.REJECTED
    assert "422" in row.reason and "ticket_closed" in row.reason
    assert (row.reference, row.settled_at, row.lease_until) == ("", None, None)
    # And the reply is on the ticket, once: what a person finds when they look.
    stats = delivering.stats()
    assert (stats["replies"], stats["duplicate_replies"]) == (1, 0)
    delivering.set_faults(lookup_lag_s=0)
    assert delivering.lookup(op).status == 200
    # Nothing automatic resends it or settles it by a guess.
    assert deliver.call(op) == "not_claimed"
    assert delivering.stats()["posts"] == 2


def test_a_first_send_refused_is_still_rejected(proposal, reviewer, delivering):
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    op = proposal.operation_id
    delivering.set_faults(ticket_closed_count=1)
    assert deliver.call(op) == "rejected"
    row = Delivery.objects.get(operation_id=op)
    assert row.state == State.REJECTED and "ticket_closed" in row.reason and row.settled_at
    assert tries(op) == [("send", "rejected", 422)]
    assert delivering.stats()["replies"] == 0
