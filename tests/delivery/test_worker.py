"""The delivery worker against the reference helpdesk: one reply on
the helpdesk whatever fails in between, Unknown kept until a lookup or a resend with the same
key settles it, and every try on the record."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler

import pytest
from django.db import connections
from django.utils import timezone

from effects import delivery
from effects.models import Delivery, DeliveryState, DeliveryTry
from effects.services import effect_commit
from effects.tasks import deliver
from tests.conftest import http_server

State, Outcome = DeliveryState, DeliveryTry.Outcome


def approve(proposal, reviewer) -> str:
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    return proposal.operation_id


def row(operation_id) -> Delivery:
    return Delivery.objects.get(operation_id=operation_id)


def tries(operation_id) -> list[tuple]:
    return list(
        DeliveryTry.objects.filter(operation_id=operation_id)
        .order_by("id")
        .values_list("kind", "outcome", "http_status")
    )


def replies(helpdesk) -> tuple[int, int]:
    stats = helpdesk.stats()
    return stats["replies"], stats["duplicate_replies"]


def test_happy_path_one_send_one_reply(proposal, reviewer, delivering):
    op = approve(proposal, reviewer)
    assert deliver.call(op) == "delivered"
    done = row(op)
    assert done.state == State.DELIVERED and done.reference.startswith("HD-") and done.settled_at
    assert (done.tries, done.reason, done.lease_until) == (1, "", None)
    assert tries(op) == [("send", "delivered", 201)]
    attempt = DeliveryTry.objects.get()
    assert attempt.worker and attempt.latency_ms is not None and attempt.error == ""
    # What the helpdesk stored is the approved reply itself.
    stored = delivering.lookup(op).json
    assert stored["reference"] == done.reference and stored["case_id"] == "T-1042"
    # Delivered is final: another try, or another enqueue, sends nothing.
    assert deliver.call(op) == "not_claimed"
    assert replies(delivering) == (1, 0) and delivering.stats()["posts"] == 1


@pytest.mark.django_db(transaction=True)
def test_two_workers_racing_on_one_delivery_send_once(proposal, reviewer, delivering):
    op = approve(proposal, reviewer)
    barrier, results = threading.Barrier(2), []

    def worker(name):
        try:
            barrier.wait()
            results.append(delivery.delivery_attempt(operation_id=op, worker=name)[0])
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == ["delivered", "not_claimed"]
    assert delivering.stats()["posts"] == 1 and replies(delivering) == (1, 0)
    assert row(op).tries == 1


def test_dropped_after_commit_is_unknown_then_the_lookup_settles_it(proposal, reviewer, delivering):
    op = approve(proposal, reviewer)
    delivering.set_faults(drop_after_commit=1)
    assert deliver.call(op) == "unknown"
    unknown = row(op)
    assert unknown.state == State.UNKNOWN and unknown.reference == "" and unknown.reason
    assert tries(op) == [("send", "unknown", None)]
    assert "RemoteProtocolError" in DeliveryTry.objects.get().error
    # The next try looks it up first and finds the stored reply: no second POST.
    assert deliver.call(op) == "delivered"
    assert tries(op) == [("send", "unknown", None), ("lookup", "delivered", 200)]
    assert row(op).reference == delivering.lookup(op).json["reference"]
    assert delivering.stats()["posts"] == 1 and replies(delivering) == (1, 0)


def test_a_lagging_lookup_is_not_evidence_the_resend_with_the_same_key_is_a_replay(proposal, reviewer, delivering):
    op = approve(proposal, reviewer)
    delivering.set_faults(drop_after_commit=1, lookup_lag_s=60)
    assert deliver.call(op) == "unknown"
    assert deliver.call(op) == "delivered"
    assert tries(op) == [("send", "unknown", None), ("lookup", "not_found", 404), ("send", "delivered", 200)]
    stats = delivering.stats()
    assert stats["posts_by_key"] == {op: 2} and stats["outcomes"]["replayed"] == 1
    assert replies(delivering) == (1, 0)


def test_a_503_window_goes_back_to_queued_with_backoff_then_delivers(proposal, reviewer, delivering, settings):
    settings.DECISIONFLOW_DELIVERY_BACKOFF = 2.0
    op = approve(proposal, reviewer)
    delivering.set_faults(unavailable_count=2)
    assert deliver.call(op) == "queued"
    queued = row(op)
    assert queued.state == State.QUEUED and "503" in queued.reason
    # Retry-After: 1 and a base of 2 s: the longer wait wins.
    assert queued.next_try_at - queued.updated_at >= timedelta(seconds=2)
    # Not due yet: a worker that picks it up early does nothing.
    assert deliver.call(op) == "not_claimed"
    # The second try backs off twice as long.
    Delivery.objects.filter(pk=queued.pk).update(next_try_at=timezone.now())
    assert deliver.call(op) == "queued"
    again = row(op)
    assert again.next_try_at - again.updated_at >= timedelta(seconds=4)
    Delivery.objects.filter(pk=queued.pk).update(next_try_at=timezone.now())
    assert deliver.call(op) == "delivered"
    assert tries(op) == [("send", "not_stored", 503), ("send", "not_stored", 503), ("send", "delivered", 201)]
    assert replies(delivering) == (1, 0)


def test_the_same_key_with_another_body_is_rejected_with_the_reason(proposal, reviewer, delivering):
    op = approve(proposal, reviewer)
    other = {
        "case_id": "T-1042",
        "operation_id": op,
        "body": "another text",
        "evidence_id": "ev",
        "policy_id": "pol",
        "source_versions": {},
    }
    assert delivering.post_reply(other).status == 201
    assert deliver.call(op) == "rejected"
    rejected = row(op)
    assert rejected.state == State.REJECTED and "422" in rejected.reason and "idempotency_key_reused" in rejected.reason
    assert rejected.settled_at and deliver.call(op) == "not_claimed"
    assert tries(op) == [("send", "rejected", 422)]


def test_a_bad_token_stays_queued_and_says_so(proposal, reviewer, delivering, settings):
    settings.DECISIONFLOW_DELIVERY_TOKEN = "wrong"
    op = approve(proposal, reviewer)
    assert deliver.call(op) == "queued"
    assert "401" in row(op).reason and "DECISIONFLOW_DELIVERY_TOKEN" in row(op).reason
    settings.DECISIONFLOW_DELIVERY_TOKEN = "t"
    assert deliver.call(op) == "delivered"


def test_helpdesk_down_is_not_stored_and_a_late_answer_is_unknown(proposal, reviewer, delivering):
    op = approve(proposal, reviewer)
    delivering.stop()
    assert deliver.call(op) == "queued"
    assert tries(op) == [("send", "not_stored", None)] and "ConnectError" in row(op).reason
    delivering.start()
    delivering.set_faults(delay_ms=1500)  # past the 1 s read timeout, after the commit
    assert deliver.call(op) == "unknown"
    assert "ReadTimeout" in row(op).reason
    delivering.set_faults(reset=True)
    assert deliver.call(op) == "delivered"
    assert [t[:2] for t in tries(op)][-1] == ("lookup", "delivered")
    assert replies(delivering) == (1, 0)


def test_a_lease_that_runs_out_turns_unknown_in_the_sweep_then_settles(proposal, reviewer, delivering):
    op = approve(proposal, reviewer)
    # A worker claims it and dies before any request (the claim is all it wrote).
    claim = delivery.delivery_claim(operation_id=op, worker="dead-worker")
    assert claim is not None and row(op).state == State.SENDING
    assert delivery.delivery_sweep(grace=timedelta(hours=1)) == (0, [])
    later = timezone.now() + delivery.lease() + timedelta(seconds=1)
    assert delivery.delivery_sweep(now=later, grace=timedelta(hours=1)) == (1, [op])
    unknown = row(op)
    assert unknown.state == State.UNKNOWN and "dead-worker" in unknown.reason
    # The dead worker's late write cannot overwrite what the sweep decided (the fence).
    assert delivery._settle(claim, delivery.Answer(Outcome.DELIVERED, 201, reference="HD-X"))[0] == "lost_claim"
    assert row(op).state == State.UNKNOWN
    Delivery.objects.filter(pk=unknown.pk).update(next_try_at=timezone.now())
    assert deliver.call(op) == "delivered"
    assert tries(op) == [("lookup", "not_found", 404), ("send", "delivered", 201)]


def test_the_sweep_enqueues_a_delivery_whose_enqueue_was_lost(proposal, reviewer, delivering, settings):
    from django_tasks import default_task_backend

    op = approve(proposal, reviewer)
    default_task_backend.clear()
    assert delivery.delivery_sweep()[1] == []  # due only just now: its own task is on the way
    later = timezone.now() + timedelta(minutes=5)
    assert delivery.delivery_sweep(now=later) == (0, [op])
    # Moved to now: the next sweep within the grace does not enqueue it again.
    assert delivery.delivery_sweep(now=later + timedelta(seconds=1)) == (0, [])


# -- bad answers: a stub that answers what the reference helpdesk never would ---------------


@pytest.fixture
def bad_helpdesk(settings, delivering):
    answer = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's hook name)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(answer["status"])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer["body"])))
            self.end_headers()
            self.wfile.write(answer["body"])

        do_GET = do_POST  # noqa: N815

        def log_message(self, *args):
            pass

    with http_server(Handler) as url:
        settings.DECISIONFLOW_DELIVERY_URL = url
        settings.DECISIONFLOW_DELIVERY_MAX_RESPONSE_BYTES = 4096
        yield answer


@pytest.mark.parametrize(
    "status, body, error",
    [
        (201, b"<html>stored</html>", "not JSON"),
        (201, json.dumps({"reference": "HD-1", "operation_id": "op", "pad": "x" * 5000}).encode(), "larger than"),
        (201, json.dumps({"reference": "HD-1", "operation_id": "op-v1-" + "0" * 64}).encode(), "another key"),
        (200, json.dumps({"operation_id": "{op}"}).encode(), "without a usable reference"),
        (502, b"bad gateway", "HTTP 502"),
    ],
)
def test_a_bad_answer_is_an_error_on_the_try_and_never_delivered(proposal, reviewer, bad_helpdesk, status, body, error):
    op = approve(proposal, reviewer)
    bad_helpdesk.update(status=status, body=body.replace(b"{op}", op.encode()))
    assert deliver.call(op) == "unknown"
    bad = DeliveryTry.objects.get()
    assert (bad.kind, bad.outcome, bad.http_status) == ("send", "unknown", status) and error in bad.error
    # Unknown stays Unknown: the next try looks up (the same bad answer) and resends.
    assert deliver.call(op) == "unknown"
    assert row(op).state == State.UNKNOWN and row(op).reference == ""
    assert [t[:2] for t in tries(op)] == [("send", "unknown"), ("lookup", "unknown"), ("send", "unknown")]
