"""One request to the helpdesk has one deadline (docs/DELIVERY.md, "Deadlines"): an answer
that trickles in within every read timeout, or a helpdesk silent for longer than the
deadline, is cut off at it, and since the request went out the try is Unknown (the helpdesk
may have stored the reply), never Rejected and never Delivered.

Against a local stub (http.server) in front of nothing: what the reference helpdesk never
does, a trickle of an answer it would otherwise give in full.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from effects import delivery
from effects.models import Delivery, DeliveryState, DeliveryTry
from effects.services import effect_commit
from effects.tasks import deliver
from tests.conftest import http_server

TRICKLE_FOR_S = 6.0  # the stub gives up after this (the old, unbounded read waited it out)


@pytest.fixture
def slow_helpdesk(settings, delivering):
    """A stub helpdesk whose answer is the ``answer`` dict's: its status and JSON body, sent
    after ``silent_s`` seconds, then one byte every ``every_s`` seconds."""
    answer: dict = {"silent_s": 0.0, "every_s": 0.2}
    # "finished" is set by the server's thread after its last byte, which the worker may have
    # read already: a test waits for it (``finished.wait``) rather than read it at once.
    finished = threading.Event()
    written = {"bytes": 0, "finished": finished}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's hook name)
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body = json.dumps(answer["body"](request)).encode()
            padded = body + b" " * 64  # JSON allows the whitespace: a longer trickle of one valid answer
            try:
                time.sleep(answer["silent_s"])
                self.send_response(answer["status"])
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(padded)))
                self.end_headers()
                self.wfile.flush()
                until = time.monotonic() + TRICKLE_FOR_S
                for i in range(len(padded)):
                    if time.monotonic() > until:
                        return
                    self.wfile.write(padded[i : i + 1])
                    self.wfile.flush()
                    written["bytes"] += 1
                    time.sleep(answer["every_s"])
                finished.set()
            except OSError:
                pass  # the worker hung up

        def log_message(self, *args):
            pass

    with http_server(Handler) as url:
        settings.DECISIONFLOW_DELIVERY_URL = url
        settings.DECISIONFLOW_DELIVERY_DEADLINE = "1s"
        yield answer, written


def acknowledged(request: dict) -> dict:
    return {"reference": "HD-1", "operation_id": request["operation_id"], "replay": False}


def refused(request: dict) -> dict:
    return {"error": "the key is already used with another body"}


def timed_try(operation_id: str) -> tuple[str, float]:
    began = time.monotonic()
    said = deliver.call(operation_id)
    return said, time.monotonic() - began


@pytest.mark.parametrize("status, body", [(201, acknowledged), (422, refused)])
def test_a_trickling_answer_is_cut_at_the_deadline_and_the_try_is_unknown(
    proposal, reviewer, slow_helpdesk, status, body
):
    answer, written = slow_helpdesk
    answer.update(status=status, body=body)
    op = proposal.operation_id
    effect_commit(operation_id=op, approved=True, reviewer=reviewer)
    # One byte every 0.2 s keeps each read within its 1 s timeout: only the deadline cuts it.
    said, took = timed_try(op)
    assert took < 3.0, took
    assert said == "unknown"
    row = Delivery.objects.get(operation_id=op)
    assert (row.state, row.reference, row.settled_at) == (DeliveryState.UNKNOWN, "", None)
    attempt = DeliveryTry.objects.get(operation_id=op)
    assert (attempt.kind, attempt.outcome, attempt.http_status) == ("send", "unknown", None)
    assert "DeadlinePassed" in attempt.error and "1 s deadline" in attempt.error
    assert "1 s deadline" in row.reason
    assert not written["finished"].is_set()


def test_a_silent_helpdesk_is_cut_at_the_deadline_not_at_the_longer_read_timeout(
    proposal, reviewer, slow_helpdesk, settings
):
    answer, _ = slow_helpdesk
    # Silent for 4 s, within the 10 s read timeout; the 1 s deadline caps the read timeout.
    answer.update(status=201, body=acknowledged, silent_s=4.0, every_s=0.0)
    settings.DECISIONFLOW_DELIVERY_READ_TIMEOUT = 10.0
    op = proposal.operation_id
    effect_commit(operation_id=op, approved=True, reviewer=reviewer)
    said, took = timed_try(op)
    assert took < 3.0, took
    assert said == "unknown"
    attempt = DeliveryTry.objects.get(operation_id=op)
    assert (attempt.outcome, attempt.http_status) == ("unknown", None) and "ReadTimeout" in attempt.error


def test_an_answer_within_the_deadline_is_delivered(proposal, reviewer, slow_helpdesk):
    """The check can pass: the same trickle, shorter than the deadline, is read to the end."""
    answer, written = slow_helpdesk
    answer.update(status=201, body=acknowledged, every_s=0.0)
    op = proposal.operation_id
    effect_commit(operation_id=op, approved=True, reviewer=reviewer)
    assert deliver.call(op) == "delivered" and written["finished"].wait(5)
    assert Delivery.objects.get(operation_id=op).reference == "HD-1"


def test_the_deadline_is_a_duration_setting(settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.DECISIONFLOW_DELIVERY_DEADLINE = "1.5m"
    assert delivery.deadline().total_seconds() == 90
    settings.DECISIONFLOW_DELIVERY_DEADLINE = "soon"
    with pytest.raises(ImproperlyConfigured, match="DECISIONFLOW_DELIVERY_DEADLINE"):
        delivery.deadline()
