"""Notifications sent by the task workers: a review begun, at risk, breached, assigned
(docs/QUEUE.md).

One ``Notification`` row per (operation, kind), and one per move for ``assigned`` (a review
moves many times): its person, or their substitute, or its group's members get the email.
``notify`` writes it (get-or-create on the
key, so a retry never makes a second row) and enqueues ``send_notification`` after commit.
The task claims the row with one conditional UPDATE (Queued or Unknown -> Sending), so a
second worker never starts a second send, sends by email and/or a Slack incoming webhook,
then marks it Sent. A failed try goes back to Queued (retried after a backoff) or, after
``DECISIONFLOW_NOTIFY_MAX_ATTEMPTS``, to Failed. A worker that dies after a mail server or
webhook accepted the message leaves the row Sending: ``notify_sweep`` turns it Unknown after
the lease and sends it once more. The promise is at-least-once, with Unknown visible, and a
Message-ID derived from the key so that mail clients thread and drop the repeat.

The webhook is one httpx request: no redirects, an overall deadline
(``DECISIONFLOW_NOTIFY_WEBHOOK_DEADLINE``) besides the per-phase timeouts, and an answer
read no further than a cap (core.outbound). Only a whole 2xx answer is an acceptance.
httpx is imported by ``_webhook_client`` only, in the worker that sends: cron's
``sla_report`` and ``notify_sweep`` import this module and never send.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import timedelta
from functools import cache
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from django_tasks import task, task_backends

from cases.models import Case, reviewer_groups
from core.durations import duration_setting
from core.faults import crash_point
from core.outbound import Deadline, read_capped
from core.text import one_line, shown
from reviews.models import (
    Notification,
    NotificationEvent,
    NotificationKind,
    NotificationState,
    Proposal,
    ReviewAssignment,
)

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

EMAIL = "email"
WEBHOOK = "webhook"
WEBHOOK_TIMEOUT = 10  # seconds, each phase (connecting, each read and write); the deadline caps them
# The longest webhook answer read (Slack's is "ok"); a longer one is not read to the end.
WEBHOOK_MAX_ANSWER_BYTES = 16 * 1024
# The wait before try n+1 after n failed tries: 30 s, 1 min, 2 min, ... at most an hour.
BACKOFF_BASE = timedelta(seconds=30)
BACKOFF_MAX = timedelta(hours=1)


def channels() -> list[str]:
    """The configured channels; empty when notifications are off (the default)."""
    found = []
    if getattr(settings, "DECISIONFLOW_NOTIFY_EMAIL_TO", None):
        found.append(EMAIL)
    if getattr(settings, "DECISIONFLOW_NOTIFY_WEBHOOK_URL", ""):
        found.append(WEBHOOK)
    return found


def lease() -> timedelta:
    return duration_setting("DECISIONFLOW_NOTIFY_LEASE", "5m")


def message_id(operation_id: str, kind: str, assignment_id: int | None = None) -> str:
    """The same for every send of one (operation, kind), or of one move: a resend threads and
    can be dropped."""
    key = f"{operation_id}|{kind}" + (f"|{assignment_id}" if assignment_id is not None else "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"<notify-{digest}@decisionflow>"


def notify(
    *,
    case,
    operation_id: str,
    kind: NotificationKind | str,
    group: str = "",
    assignment: ReviewAssignment | None = None,
) -> Notification | None:
    """Record the notification (once per key) and enqueue its send after commit.

    Call it inside the transaction that makes the event durable: the row commits with it,
    and the task is only enqueued once it did. With no channel configured: nothing at all.
    ``group``: the email goes to that group's members (an escalation's ``notify:GROUP``).
    ``assignment``: the move an ``assigned`` notification tells of, and its key.
    """
    wanted = channels()
    if not wanted:
        return None
    defaults = {"case": case, "channels": ",".join(wanted), "group": group}
    if assignment is not None:
        notification, created = Notification.objects.get_or_create(
            assignment=assignment, defaults={**defaults, "operation_id": operation_id, "kind": str(kind)}
        )
    else:
        notification, created = Notification.objects.get_or_create(
            operation_id=operation_id, kind=str(kind), assignment=None, defaults=defaults
        )
    if created:
        pk = notification.pk
        transaction.on_commit(lambda: enqueue(pk))
    return notification


def enqueue(pk: int, *, delay: timedelta | None = None) -> None:
    """Enqueue one send. A later duplicate is harmless: the claim lets one through. Never
    raises: it runs after a commit (a broker that does not answer must not turn a decision
    that committed into an error), and a lost enqueue is found by ``notify_sweep``."""
    try:
        if delay is not None and task_backends[send_notification.backend].supports_defer:
            send_notification.using(run_after=timezone.now() + delay).enqueue(pk)
        elif delay is None:
            send_notification.enqueue(pk)
        # A backend that cannot defer (the immediate one): the sweep re-enqueues it when due.
    except Exception:
        log.exception("could not enqueue notification %s; notify_sweep will", pk)


def assigned_to(move: ReviewAssignment) -> str:
    """Whom a move put the review on, as a notification says it: ``anna``, ``bo (for anna,
    who is away)``, ``group Billing reviewers``."""
    # One line whatever the names hold: the text goes to a webhook and a mail subject.
    if move.to_user is None:
        return f"group {one_line(move.to_group)}"
    said = one_line(move.to_user.get_username())
    if move.meant_for is not None:
        said += f" (for {one_line(move.meant_for.get_username())}, who is away)"
    return said


def _move(notification: Notification) -> ReviewAssignment | None:
    if notification.assignment_id is None:
        return None
    return ReviewAssignment.objects.select_related("to_user", "meant_for").get(pk=notification.assignment_id)


def _text(notification: Notification) -> str:
    case_id = Case.objects.filter(pk=notification.case_id).values_list("case_id", flat=True).first()
    kind = NotificationKind(notification.kind)
    move = _move(notification)
    if kind == NotificationKind.ASSIGNED and move is not None:
        what = f"was assigned to {assigned_to(move)}"
    else:
        what = {
            NotificationKind.REVIEW_BEGUN: "is waiting for a review",
            NotificationKind.AT_RISK: "is at risk of missing its review target",
            NotificationKind.BREACHED: "has waited past its review target",
        }[kind]
    # A case ID with hidden characters is shown quoted with escapes (docs/TEXT.md).
    return f"decisionflow: case {shown(case_id)} {what} (operation {notification.operation_id})."


def recipients(operation_id: str, group: str = "", move: ReviewAssignment | None = None) -> list[str]:
    """Where the email of an operation's notification goes: for a move to a person, their
    address (the substitute's, when the move went to one); for a move to a group or an
    escalation naming ``group``, the email addresses of that group's active members; else
    of the groups its policy names (``reviewer_groups``), sorted; the configured
    ``DECISIONFLOW_NOTIFY_EMAIL_TO`` when there are none, or when nobody has an address (so
    a notification never goes nowhere)."""
    if move is not None and move.to_user is not None:
        person = move.to_user
        return [person.email] if person.is_active and person.email else list(settings.DECISIONFLOW_NOTIFY_EMAIL_TO)
    if move is not None:
        groups: tuple[str, ...] = (move.to_group,)
    elif group:
        groups = (group,)
    else:
        snapshot = Proposal.objects.filter(operation_id=operation_id).values_list("policy_snapshot", flat=True).first()
        groups = reviewer_groups((snapshot or {}).get("parameters"))
    if groups:
        members = (
            get_user_model()
            .objects.filter(is_active=True, groups__name__in=groups)
            .exclude(email="")
            .values_list("email", flat=True)
            .distinct()
        )
        found = sorted(set(members))
        if found:
            return found
    return list(settings.DECISIONFLOW_NOTIFY_EMAIL_TO)


def _send_email(notification: Notification, text: str) -> None:
    headers = {"Message-ID": message_id(notification.operation_id, notification.kind, notification.assignment_id)}
    if notification.kind != NotificationKind.REVIEW_BEGUN:
        # One thread per operation: the others refer to its "review begun" message.
        headers["References"] = message_id(notification.operation_id, NotificationKind.REVIEW_BEGUN)
    EmailMessage(
        subject=text.split(" (operation", 1)[0],
        body=text,
        to=recipients(notification.operation_id, notification.group, _move(notification)),
        headers=headers,
    ).send(fail_silently=False)


class WebhookNotAccepted(Exception):
    """The webhook answered, but not with a whole 2xx: nothing says it took the message."""


def webhook_deadline() -> timedelta:
    """The most one webhook call may take, connecting and the whole answer included."""
    return duration_setting("DECISIONFLOW_NOTIFY_WEBHOOK_DEADLINE", "10s")


@cache
def _webhook_client() -> httpx.Client:
    import httpx  # noqa: PLC0415 (imported where it is used: see the module's docstring)

    # One client per process (thread-safe, keeps the connection alive). No redirects: a 3xx
    # is not an acceptance, and following it would send the worker to an address nobody
    # configured. The environment's proxy settings apply, as they do to the mail's.
    return httpx.Client(timeout=WEBHOOK_TIMEOUT, follow_redirects=False)


def _send_webhook(text: str) -> None:
    """POST the text; returns when the webhook took it, raises otherwise (a failed try)."""
    import httpx  # noqa: PLC0415 (see the module's docstring; already loaded by _webhook_client)

    client = _webhook_client()
    until = Deadline.after(webhook_deadline())
    phases = until.timeouts(connect=WEBHOOK_TIMEOUT, read=WEBHOOK_TIMEOUT, write=WEBHOOK_TIMEOUT, pool=WEBHOOK_TIMEOUT)
    # Slack reads &, < and > as its own markup: escaped as its docs ask.
    body = json.dumps({"text": text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")}).encode()
    with client.stream(
        "POST",
        settings.DECISIONFLOW_NOTIFY_WEBHOOK_URL,
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=httpx.Timeout(**phases),
    ) as response:
        answer = read_capped(response, cap=WEBHOOK_MAX_ANSWER_BYTES, deadline=until)
    status = response.status_code
    if 300 <= status < 400:
        where = shown(response.headers.get("location", "")[:200])
        raise WebhookNotAccepted(
            f"HTTP {status}, a redirect to {where}, not followed: set DECISIONFLOW_NOTIFY_WEBHOOK_URL "
            "to the address that takes the POST"
        )
    if not 200 <= status < 300:
        said = f": {shown(answer[:200].decode(errors='replace'))}" if answer else ""
        raise WebhookNotAccepted(f"HTTP {status}{said}")
    if answer is None:
        raise WebhookNotAccepted(f"HTTP {status}: the answer is longer than {WEBHOOK_MAX_ANSWER_BYTES} bytes")


@task()
def send_notification(notification_id: int) -> str:
    """Claim, send, mark Sent. Returns what it did (the task result keeps it)."""
    now = timezone.now()
    claimed = Notification.objects.filter(
        pk=notification_id, state__in=[NotificationState.QUEUED, NotificationState.UNKNOWN]
    ).update(state=NotificationState.SENDING, sending_since=now, attempts=F("attempts") + 1, updated_at=now)
    if not claimed:
        # Another worker has it, or it is sent or failed already: never a second send.
        return "not_claimed"
    notification = Notification.objects.get(pk=notification_id)
    text = _text(notification)
    accepted = [c for c in notification.accepted.split(",") if c]
    try:
        for channel in notification.channels.split(","):
            if channel in accepted:
                continue
            if channel == EMAIL:
                _send_email(notification, text)
            elif channel == WEBHOOK:
                _send_webhook(text)
            accepted.append(channel)
            crash_point("notify-after-accept")
            Notification.objects.filter(pk=notification_id).update(accepted=",".join(accepted))
    except Exception as exc:  # noqa: BLE001 (any failure of a send is a failed try, recorded)
        return _failed(notification, accepted, exc)
    with transaction.atomic():
        moved = Notification.objects.filter(pk=notification_id, state=NotificationState.SENDING).update(
            state=NotificationState.SENT, sent_at=timezone.now(), updated_at=timezone.now(), last_error=""
        )
        if moved:
            _event(notification, NotificationEvent.Outcome.SENT, accepted)
    return "sent"


def _event(notification: Notification, outcome: str, accepted: list[str], error: str = "") -> None:
    """The try's append-only row, in the transaction that moves the notification's state."""
    NotificationEvent.objects.create(
        notification_id=notification.pk,
        case_id=notification.case_id,
        operation_id=notification.operation_id,
        kind=notification.kind,
        outcome=outcome,
        attempt=notification.attempts,
        accepted=",".join(accepted),
        error=error,
    )


def _failed(notification: Notification, accepted: list[str], exc: Exception) -> str:
    error = f"{type(exc).__name__}: {exc}"[:2000]
    now = timezone.now()
    attempts = notification.attempts
    if attempts >= int(getattr(settings, "DECISIONFLOW_NOTIFY_MAX_ATTEMPTS", 5)):
        with transaction.atomic():
            moved = Notification.objects.filter(pk=notification.pk, state=NotificationState.SENDING).update(
                state=NotificationState.FAILED, last_error=error, accepted=",".join(accepted), updated_at=now
            )
            if moved:
                _event(notification, NotificationEvent.Outcome.FAILED, accepted, error)
        return "failed"
    delay = min(BACKOFF_BASE * 2 ** (attempts - 1), BACKOFF_MAX)
    with transaction.atomic():
        moved = Notification.objects.filter(pk=notification.pk, state=NotificationState.SENDING).update(
            state=NotificationState.QUEUED,
            last_error=error,
            accepted=",".join(accepted),
            next_attempt_at=now + delay,
            updated_at=now,
        )
        if moved:
            _event(notification, NotificationEvent.Outcome.RETRY, accepted, error)
    enqueue(notification.pk, delay=delay)
    return "retry"


def notify_sweep(now=None) -> dict[str, int]:
    """Sending past the lease -> Unknown (a worker died mid-send), and every Unknown row and
    every Queued row due for a retry is enqueued again. Run by ``sla_report`` and
    ``manage.py notify_sweep``; enqueueing twice is harmless (the claim lets one through)."""
    now = now or timezone.now()
    unknown = Notification.objects.filter(state=NotificationState.SENDING, sending_since__lt=now - lease()).update(
        state=NotificationState.UNKNOWN, last_error="the worker stopped during the send: it may have been delivered"
    )
    # Queued and never tried for a lease: its enqueue after commit was lost (the process
    # stopped between the commit and the enqueue).
    never_tried = Q(next_attempt_at__isnull=True, created_at__lt=now - lease())
    due = list(
        Notification.objects.filter(
            Q(state=NotificationState.UNKNOWN)
            | Q(state=NotificationState.QUEUED) & (Q(next_attempt_at__lte=now) | never_tried)
        ).values_list("pk", flat=True)
    )
    for pk in due:
        enqueue(pk)
    return {"unknown": unknown, "enqueued": len(due)}
