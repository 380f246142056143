"""Notifications sent by the task workers (docs/QUEUE.md).

Through a real SMTP server (aiosmtpd) and a local webhook receiver (http.server), both
started here: one message per (operation, kind) with a retry and with two workers at once,
a failed send retried then given up, the crash between acceptance and the state write
(Unknown, then exactly one resend) through the database backend and its worker, and no
settings -> nothing written or enqueued.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from datetime import timedelta
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler
from io import StringIO

import pytest
from aiosmtpd.controller import Controller
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from reviews import notifications
from reviews.models import Notification, NotificationEvent, NotificationKind, NotificationState, PendingReview
from tests.conftest import ROOT, http_server
from workflow.begin import review_begin

IMMEDIATE = {"default": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend"}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Inbox:
    def __init__(self):
        self.messages: list = []
        self.lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's hook name)
        with self.lock:
            self.messages.append(message_from_bytes(envelope.content))
        return "250 OK"


@pytest.fixture
def smtp():
    inbox = _Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    yield controller, inbox
    controller.stop()


@pytest.fixture
def webhook():
    received: list[dict] = []
    state = {"fail": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's hook name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if state["fail"]:
                state["fail"] -= 1
                self.send_response(500)
                self.end_headers()
                return
            received.append(body)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    with http_server(Handler) as url:
        yield f"{url}/hook", received, state


@pytest.fixture
def notify_on(settings, smtp, webhook):
    controller, inbox = smtp
    url, received, state = webhook
    settings.DECISIONFLOW_NOTIFY_EMAIL_TO = ["leads@example.test"]
    settings.DECISIONFLOW_NOTIFY_WEBHOOK_URL = url
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = controller.port
    settings.DECISIONFLOW_REVIEW_SLA = "4h"
    return inbox.messages, received, state


def age(pending: PendingReview, hours: float) -> None:
    PendingReview.objects.filter(pk=pending.pk).update(created_at=timezone.now() - timedelta(hours=hours))


def sla_report() -> None:
    # Exit 10 when breached: the report's own tests cover its codes.
    with contextlib.suppress(CommandError):
        call_command("sla_report", stdout=StringIO(), stderr=StringIO())


@pytest.mark.django_db
def test_no_settings_nothing_written_or_enqueued(case, reviewer, settings):
    settings.DECISIONFLOW_REVIEW_SLA = "4h"
    pending = review_begin(case=case, actor=reviewer).pending_review
    age(pending, 3.5)
    sla_report()
    age(pending, 5)
    sla_report()
    assert Notification.objects.count() == 0
    assert DBTaskResult.objects.count() == 0


@pytest.mark.django_db
def test_begin_sends_one_message_per_channel_and_a_retry_sends_none(
    case, reviewer, notify_on, settings, django_capture_on_commit_callbacks
):
    mails, hooks, _ = notify_on
    settings.TASKS = IMMEDIATE
    with django_capture_on_commit_callbacks(execute=True):
        op = review_begin(case=case, actor=reviewer).operation_id
    row = Notification.objects.get()
    assert (row.operation_id, row.kind, row.state, row.attempts) == (op, "review_begun", "sent", 1)
    assert len(mails) == 1 and len(hooks) == 1
    assert mails[0]["Message-ID"] == notifications.message_id(op, "review_begun")
    assert mails[0]["To"] == "leads@example.test" and "T-1042 is waiting for a review" in mails[0]["Subject"]
    assert hooks[0] == {"text": f"decisionflow: case T-1042 is waiting for a review (operation {op})."}
    # A retried begin, a second enqueue and a sweep: still one row, no second message.
    with django_capture_on_commit_callbacks(execute=True):
        review_begin(case=case, actor=reviewer)
    assert notifications.send_notification.call(row.pk) == "not_claimed"
    notifications.notify_sweep(now=timezone.now() + timedelta(days=1))
    assert Notification.objects.count() == 1 and len(mails) == 1 and len(hooks) == 1


@pytest.mark.django_db
def test_sla_report_notifies_at_risk_then_breached_once_each(
    case, reviewer, notify_on, settings, django_capture_on_commit_callbacks
):
    mails, hooks, _ = notify_on
    settings.TASKS = IMMEDIATE
    with django_capture_on_commit_callbacks(execute=True):
        pending = review_begin(case=case, actor=reviewer).pending_review
    age(pending, 3.5)
    for _ in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            sla_report()
    assert sorted(Notification.objects.values_list("kind", "state")) == [("at_risk", "sent"), ("review_begun", "sent")]
    age(pending, 5)
    for _ in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            sla_report()
    assert Notification.objects.filter(state="sent").count() == 3
    assert [m["Message-ID"] for m in mails] == [
        notifications.message_id(pending.operation_id, kind) for kind in ("review_begun", "at_risk", "breached")
    ]
    # At risk and breached thread under the review's first message.
    assert mails[2]["References"] == mails[0]["Message-ID"]
    assert "has waited past its review target" in hooks[2]["text"] and len(hooks) == 3


def documented_texts() -> dict[str, str]:
    """docs/QUEUE.md's table of notification kinds: kind -> the text, with its placeholders."""
    lines = (ROOT / "docs" / "QUEUE.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("| kind | written when | text |")
    texts = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        texts[cells[0].strip("`")] = cells[2].strip("`")
    return texts


@pytest.mark.django_db
def test_the_texts_sent_are_the_ones_docs_queue_md_shows(
    case, reviewer, notify_on, settings, django_capture_on_commit_callbacks
):
    """Each kind's webhook text and mail, as sent, is the text of QUEUE.md's table."""
    mails, hooks, _ = notify_on
    settings.TASKS = IMMEDIATE
    texts = documented_texts()
    assert sorted(texts) == sorted(NotificationKind.values)
    with django_capture_on_commit_callbacks(execute=True):
        pending = review_begin(case=case, actor=reviewer).pending_review
    for hours in (3.5, 5):  # at risk, then breached
        age(pending, hours)
        with django_capture_on_commit_callbacks(execute=True):
            sla_report()
    kinds = ["review_begun", "at_risk", "breached"]
    expected = [texts[kind].format(case=case.case_id, operation=pending.operation_id) for kind in kinds]
    assert [hook["text"] for hook in hooks] == expected
    assert [mail.get_payload().strip() for mail in mails] == expected
    assert [mail["Subject"] for mail in mails] == [text.split(" (operation", 1)[0] for text in expected]


@pytest.mark.django_db
def test_a_failed_send_is_retried_without_resending_the_accepted_channel_then_given_up(
    case, reviewer, notify_on, settings, django_capture_on_commit_callbacks
):
    mails, hooks, webhook_state = notify_on
    settings.TASKS = IMMEDIATE
    webhook_state["fail"] = 1
    with django_capture_on_commit_callbacks(execute=True):
        review_begin(case=case, actor=reviewer)
    row = Notification.objects.get()
    assert (row.state, row.attempts, row.accepted) == ("queued", 1, "email")
    assert "500" in row.last_error and row.next_attempt_at > timezone.now()
    assert len(mails) == 1 and hooks == []
    # Not due yet: the sweep leaves it; once due, one more try sends the webhook only.
    assert notifications.notify_sweep()["enqueued"] == 0
    notifications.notify_sweep(now=row.next_attempt_at)
    row.refresh_from_db()
    assert (row.state, row.attempts, row.last_error) == ("sent", 2, "")
    assert len(mails) == 1 and len(hooks) == 1
    # A webhook that keeps failing: Failed after DECISIONFLOW_NOTIFY_MAX_ATTEMPTS tries.
    settings.DECISIONFLOW_NOTIFY_MAX_ATTEMPTS = 2
    webhook_state["fail"] = 99
    failing = notifications.notify(case=case, operation_id=row.operation_id, kind=NotificationKind.BREACHED)
    assert failing is not None
    notifications.send_notification.call(failing.pk)
    notifications.notify_sweep(now=timezone.now() + timedelta(hours=2))
    failing.refresh_from_db()
    assert (failing.state, failing.attempts) == ("failed", 2)
    assert notifications.send_notification.call(failing.pk) == "not_claimed"
    # Each try left its append-only event (the audit chain covers the sends through them),
    # each following the one before.
    events = list(
        NotificationEvent.objects.order_by("id").values_list("notification_id", "outcome", "attempt", "accepted")
    )
    assert events == [
        (row.pk, "retry", 1, "email"),
        (row.pk, "sent", 2, "email,webhook"),
        (failing.pk, "retry", 1, "email"),
        (failing.pk, "failed", 2, "email"),
    ]
    first, second = NotificationEvent.objects.filter(notification=row).order_by("id")
    assert (first.prev_hash, second.prev_hash) == ("", first.row_hash)


@pytest.mark.django_db(transaction=True)
def test_two_workers_at_once_send_one_message(case, reviewer, notify_on):
    mails, hooks, _ = notify_on
    with transaction.atomic():
        row = notifications.notify(case=case, operation_id="op-v1-" + "a" * 64, kind=NotificationKind.BREACHED)
    assert row is not None
    # The commit enqueued it in the database backend (the default TASKS setting).
    assert DBTaskResult.objects.count() == 1
    barrier = threading.Barrier(2)
    results: list[str] = []

    def worker():
        try:
            barrier.wait()
            results.append(notifications.send_notification.call(row.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == ["not_claimed", "sent"]
    assert len(mails) == 1 and len(hooks) == 1
    assert Notification.objects.get().attempts == 1


@pytest.mark.django_db(transaction=True)
def test_crash_after_acceptance_leaves_unknown_then_exactly_one_resend(case, reviewer, notify_on, settings, manage):
    mails, hooks, _ = notify_on
    with transaction.atomic():
        row = notifications.notify(case=case, operation_id="op-v1-" + "b" * 64, kind=NotificationKind.AT_RISK)
    assert row is not None
    env = {
        "DECISIONFLOW_NOTIFY_EMAIL_TO": "leads@example.test",
        "DECISIONFLOW_NOTIFY_WEBHOOK_URL": settings.DECISIONFLOW_NOTIFY_WEBHOOK_URL,
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": str(settings.EMAIL_PORT),
    }
    # The worker dies (SIGKILL) right after the mail server accepted the message.
    crashed = manage("db_worker", "--batch", "--no-startup-delay", DECISIONFLOW_CRASH_AT="notify-after-accept", **env)
    assert crashed.returncode == -9, crashed.stderr
    row.refresh_from_db()
    assert (row.state, row.accepted, len(mails), len(hooks)) == ("sending", "", 1, 0)
    # Within the lease the sweep leaves it; past it, Unknown, visible, and enqueued again.
    assert notifications.notify_sweep()["unknown"] == 0
    assert notifications.notify_sweep(now=timezone.now() + timedelta(minutes=6)) == {"unknown": 1, "enqueued": 1}
    row.refresh_from_db()
    assert row.state == "unknown" and "may have been delivered" in row.last_error
    done = manage("db_worker", "--batch", "--no-startup-delay", **env)
    assert done.returncode == 0, done.stderr
    row.refresh_from_db()
    assert (row.state, row.attempts) == (NotificationState.SENT, 2)
    # Exactly one resend, with the same Message-ID so the client drops the repeat.
    assert [m["Message-ID"] for m in mails] == [notifications.message_id(row.operation_id, "at_risk")] * 2
    assert len(hooks) == 1
    # Nothing is left to run: another worker and a sweep send nothing more.
    notifications.notify_sweep(now=timezone.now() + timedelta(hours=1))
    assert manage("db_worker", "--batch", "--no-startup-delay", **env).returncode == 0
    assert len(mails) == 2 and len(hooks) == 1


@pytest.mark.django_db
def test_states_in_the_case_history_and_the_view_only_admin_list(
    case, reviewer, notify_on, settings, django_capture_on_commit_callbacks, admin_client
):
    from django.urls import reverse

    _, _, webhook_state = notify_on
    settings.TASKS = IMMEDIATE
    webhook_state["fail"] = 1
    with django_capture_on_commit_callbacks(execute=True):
        op = review_begin(case=case, actor=reviewer).operation_id
    page = admin_client.get(reverse("admin:cases_case_history", args=[case.pk])).content.decode()
    assert "df-ev-notification" in page
    assert 'Review begun by email,webhook: <strong class="df-notification-queued">Queued</strong> after 1 try' in page
    assert "WebhookNotAccepted: HTTP 500" in page
    listing = admin_client.get(reverse("admin:reviews_notification_changelist")).content.decode()
    assert op[:12] in listing and "Queued" in listing
    assert admin_client.get(reverse("admin:reviews_notification_add")).status_code == 403
    pk = Notification.objects.get().pk
    assert admin_client.get(reverse("admin:reviews_notification_delete", args=[pk])).status_code == 403
