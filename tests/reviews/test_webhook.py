"""The notification webhook's bounds (docs/QUEUE.md): one deadline for the whole call, an
answer read no further than a cap, no redirects, and only a whole 2xx answer is Sent.

Against a local receiver (http.server) that answers what a broken or hostile one would: a
trickle of bytes, an endless body, a redirect to another address. Each part of the answer
it manages to write is counted, so the tests assert what was sent and read, not memory.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from reviews import notifications
from reviews.models import Notification, NotificationKind, NotificationState
from tests.conftest import ROOT
from tests.workflow.conftest import child_env

KINDS = list(NotificationKind)
# Larger than any socket buffers between two local sockets: a receiver that manages to write
# all of it was read to the end.
ENDLESS_BYTES = 64 * 1024 * 1024
TRICKLE_FOR_S = 6.0  # the trickle ends on its own after this (the old, unbounded read waited it out)


class Receiver:
    """One local HTTP server; ``answer`` says how it answers the next POST."""

    def __init__(self) -> None:
        self.answer: dict = {"mode": "status", "status": 200}
        self.requests: list[tuple[str, str]] = []
        self.written = 0
        self.finished = False
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                receiver.requests.append((self.command, self.path))
                receiver.respond(self)

            do_POST = do_GET = _any  # noqa: N815 (http.server's hook names)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def respond(self, handler: BaseHTTPRequestHandler) -> None:
        answer = self.answer
        mode = answer["mode"]
        handler.send_response(answer.get("status", 200))
        for name, value in answer.get("headers", {}).items():
            handler.send_header(name, value)
        if mode == "status":
            body = answer.get("body", b"ok")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return
        # No Content-Length (HTTP/1.0): the body ends when the connection closes.
        handler.end_headers()
        try:
            if mode == "trickle":
                until = time.monotonic() + TRICKLE_FOR_S
                while time.monotonic() < until:
                    handler.wfile.write(b" ")
                    handler.wfile.flush()
                    self.written += 1
                    time.sleep(0.2)
            elif mode == "endless":
                chunk = b"x" * 65536
                while self.written < ENDLESS_BYTES:
                    handler.wfile.write(chunk)
                    self.written += len(chunk)
            self.finished = True
        except OSError:
            pass  # the client hung up: what it read is all it wanted

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings):
    with Receiver() as running:
        settings.DECISIONFLOW_NOTIFY_EMAIL_TO = []
        settings.DECISIONFLOW_NOTIFY_WEBHOOK_URL = running.url
        settings.DECISIONFLOW_NOTIFY_WEBHOOK_DEADLINE = "1s"
        settings.TASKS = {"default": {"BACKEND": "django_tasks.backends.dummy.DummyBackend"}}
        yield running


@pytest.fixture
def target():
    """Another address, where a redirect points: it must never be asked anything."""
    with Receiver() as running:
        yield running


def one_send(case, n: int = 0) -> tuple[str, Notification, float]:
    """Write one notification and run its send; returns what the task said, the row after it,
    and how long the send took."""
    row = notifications.notify(case=case, operation_id=f"op-webhook-{n}", kind=KINDS[0])
    assert row is not None
    began = time.monotonic()
    said = notifications.send_notification.call(row.pk)
    took = time.monotonic() - began
    row.refresh_from_db()
    return said, row, took


@pytest.mark.django_db
def test_a_trickling_answer_is_cut_at_the_deadline_and_is_a_failed_try(case, receiver):
    receiver.answer = {"mode": "trickle", "status": 200}
    said, row, took = one_send(case)
    # One byte every 0.2 s keeps each read within its 10 s timeout: only the 1 s deadline cuts it.
    assert took < 3.0, took
    assert (said, row.state, row.attempts, row.sent_at) == ("retry", NotificationState.QUEUED, 1, None)
    assert "DeadlinePassed" in row.last_error and "1 s deadline" in row.last_error
    assert not receiver.finished and receiver.written < TRICKLE_FOR_S / 0.2


@pytest.mark.django_db
def test_an_endless_answer_is_read_no_further_than_the_cap(case, receiver, monkeypatch):
    pulled = []
    iter_bytes = httpx.Response.iter_bytes

    def counted(self, *args, **kwargs):
        for chunk in iter_bytes(self, *args, **kwargs):
            pulled.append(len(chunk))
            yield chunk

    monkeypatch.setattr(httpx.Response, "iter_bytes", counted)
    receiver.answer = {"mode": "endless", "status": 200}
    said, row, _ = one_send(case)
    assert (said, row.state) == ("retry", NotificationState.QUEUED)
    assert f"longer than {notifications.WEBHOOK_MAX_ANSWER_BYTES} bytes" in row.last_error
    # Read: the cap and at most one chunk past it. The receiver could not write it all.
    assert notifications.WEBHOOK_MAX_ANSWER_BYTES < sum(pulled) <= notifications.WEBHOOK_MAX_ANSWER_BYTES + 65536
    assert not receiver.finished and receiver.written < ENDLESS_BYTES


@pytest.mark.django_db
def test_a_redirect_is_not_followed_and_not_sent(case, receiver, target):
    receiver.answer = {"mode": "status", "status": 302, "headers": {"Location": target.url}, "body": b""}
    said, row, _ = one_send(case)
    assert (said, row.state, row.sent_at) == ("retry", NotificationState.QUEUED, None)
    assert "HTTP 302, a redirect to" in row.last_error and "not followed" in row.last_error
    assert target.requests == []
    assert receiver.requests == [("POST", "/hook")]


@pytest.mark.django_db
def test_only_a_2xx_answer_is_sent(case, receiver, target, settings):
    settings.DECISIONFLOW_NOTIFY_MAX_ATTEMPTS = 1
    outcomes = {}
    for n, status in enumerate((200, 201, 202, 204, 301, 302, 303, 307, 308, 304, 400, 404, 410, 500, 503)):
        headers = {"Location": target.url} if 300 <= status < 400 else {}
        receiver.answer = {
            "mode": "status",
            "status": status,
            "headers": headers,
            "body": b"" if status == 204 else b"ok",
        }
        said, row, _ = one_send(case, n)
        outcomes[status] = (said, str(row.state), f"HTTP {status}" in row.last_error or row.last_error == "")
    sent = {status for status, (said, state, _) in outcomes.items() if state == NotificationState.SENT}
    assert sent == {200, 201, 202, 204}, outcomes
    assert all(outcome == ("failed", NotificationState.FAILED, True) for s, outcome in outcomes.items() if s >= 300)
    assert target.requests == []


def test_the_deadline_is_a_duration_setting(settings):
    settings.DECISIONFLOW_NOTIFY_WEBHOOK_DEADLINE = "2.5s"
    assert notifications.webhook_deadline().total_seconds() == 2.5
    settings.DECISIONFLOW_NOTIFY_WEBHOOK_DEADLINE = "0s"
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="DECISIONFLOW_NOTIFY_WEBHOOK_DEADLINE"):
        notifications.webhook_deadline()


def _imported(argv: list[str]) -> str:
    run = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, (argv, run.stderr[-2000:])
    return run.stderr


@pytest.mark.any_database
def test_cron_commands_load_the_webhook_without_httpx(transactional_db):
    """notify_sweep and sla_report import reviews.notifications, and start without httpx
    (about 0.2 s): only the worker that sends imports it."""
    for argv in (("notify_sweep",), ("sla_report", "--help")):
        stderr = _imported([str(ROOT / "manage.py"), *argv])
        assert re.search(r"\|\s+reviews\.notifications$", stderr, re.M), argv
        assert not re.search(r"\|\s+httpx$", stderr, re.M), argv
    # The check can fail: the first send loads it.
    send = "import django; django.setup(); from reviews import notifications; notifications._webhook_client()"
    assert re.search(r"\|\s+httpx$", _imported(["-c", send]), re.M)
