"""The remote delivery of an approved reply to the customer's ticket (docs/DELIVERY.md).

The commit writes one ``Delivery`` per new approval, in its own transaction (effects.services).
From there on everything here is run by a task worker (effects.tasks) or by ``reconcile
--repair``:

- **claim**: one conditional UPDATE moves a due delivery from Queued or Unknown to Sending,
  with a lease and the worker's name, and counts the try. Two workers never both win it.
  The try count is the claim's fence: a worker writes its outcome only while the row is
  still Sending under its own name and count, so a worker whose lease ran out (the sweep
  turned it Unknown, another worker took it over) cannot overwrite the newer state.
- **lookup first** when the claim came from Unknown (an earlier send may have been stored):
  found -> Delivered. A 404 settles nothing by itself (a lookup may lag behind writes): the
  worker resends with the same key and lets the helpdesk's idempotency decide.
- **send**: ``POST {url}/replies`` with ``Idempotency-Key: <operation id>``, the same body on
  every try (canonical JSON of the write-once effect).
- **the answer** decides (``classify``, then ``delivery_next_state``): Delivered with the
  helpdesk's reference; Rejected on a permanent 4xx, but NeedsCheck when the delivery was
  Unknown before (an earlier request may be on the ticket: a person looks); back to Queued
  when the helpdesk provably stored nothing (503, 429, a refused connection, a bad token);
  Unknown when it may have (a timeout or a dropped connection after sending, another 5xx,
  an answer that is not JSON, too large, cut off at the try's deadline, or names another
  key). Every try appends a ``DeliveryTry`` row.
- **the deadline**: each request (a lookup, a send) has ``DECISIONFLOW_DELIVERY_DEADLINE``
  for the whole exchange, besides httpx's per-phase timeouts (core.outbound).
- **sweep**: Sending past its lease -> Unknown (the worker died, maybe after the helpdesk
  committed); deliveries due but not picked up (a lost enqueue) are handed back to be
  enqueued.

httpx is imported by ``_http_client`` only, in the process that sends: it takes about
0.2 s to import, and the commit path and cron's ``reconcile`` import this module.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Concat
from django.utils import timezone

from cases.models import Case
from core.durations import duration_setting
from core.faults import crash_point
from core.outbound import Deadline, DeadlinePassed, read_capped
from core.tracing import Attr, SpanName, annotate, carrier, outbound_headers, traced
from effects.models import Delivery, DeliveryState, DeliveryTry, EffectRecord

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

Outcome = DeliveryTry.Outcome

# Answers that prove the helpdesk stored nothing and that a later try may succeed: it is
# overloaded (503, 429), or the request never reached the reply store (a bad token, the
# wrong URL, the wrong method, the request timed out before it was read). Retried with the
# same key, forever, with backoff; the reason stays on the row for the operator (a wrong
# token is fixed in settings, then the next try goes through).
NOT_STORED_STATUSES = frozenset({401, 403, 404, 405, 408, 429, 503})
# Every other 4xx is a permanent refusal of this very request (400 bad input, 413 too
# large, 422 the key is already used with another body or the ticket is closed): Rejected,
# with the reason; NeedsCheck when an earlier request of the delivery may have been stored.


def delivery_configured() -> bool:
    """A helpdesk is configured: new approvals get a delivery. Unset: nothing changes."""
    return bool(getattr(settings, "DECISIONFLOW_DELIVERY_URL", ""))


def delivery_fields(effect: EffectRecord) -> dict:
    """The fields of a new delivery of ``effect``, as the commit and the repair write it."""
    now = timezone.now()
    return {
        "operation_id": effect.operation_id,
        "case_id": effect.case_id,
        "decision_id": effect.decision_id,
        "effect_id": effect.pk,
        "state": DeliveryState.QUEUED,
        "next_try_at": now,
        "updated_at": now,
        "traceparent": (carrier() or {}).get("traceparent", "")[:55] or None,
    }


def lease() -> timedelta:
    return duration_setting("DECISIONFLOW_DELIVERY_LEASE", "5m")


def backoff(tries: int, retry_after: float | None = None) -> timedelta:
    """The wait after ``tries`` failed tries: base * 2^(tries-1), at most the cap; at least
    what the helpdesk asked for with Retry-After (also capped)."""
    base = float(getattr(settings, "DECISIONFLOW_DELIVERY_BACKOFF", 5.0))
    cap = float(getattr(settings, "DECISIONFLOW_DELIVERY_BACKOFF_MAX", 600.0))
    wait = base * 2 ** max(0, min(tries - 1, 30))
    if retry_after is not None:
        wait = max(wait, retry_after)
    return timedelta(seconds=min(wait, cap))


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:200]


# -- the HTTP side ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """How one request to the helpdesk ended."""

    outcome: str  # a DeliveryTry.Outcome
    http_status: int | None = None
    error: str = ""
    reference: str = ""
    retry_after: float | None = None


def _settings_key() -> tuple:
    return (
        float(settings.DECISIONFLOW_DELIVERY_CONNECT_TIMEOUT),
        float(settings.DECISIONFLOW_DELIVERY_READ_TIMEOUT),
        float(settings.DECISIONFLOW_DELIVERY_WRITE_TIMEOUT),
        float(settings.DECISIONFLOW_DELIVERY_POOL_TIMEOUT),
    )


@cache
def _client_for(key: tuple) -> httpx.Client:
    import httpx  # noqa: PLC0415 (imported where it is used: see the module's docstring)

    connect, read, write, pool = key
    # One client per process (thread-safe, keeps connections alive between deliveries).
    # No redirects: a helpdesk that redirects a POST is misconfigured, and we say so.
    return httpx.Client(
        timeout=httpx.Timeout(connect=connect, read=read, write=write, pool=pool),
        follow_redirects=False,
        trust_env=False,
    )


def _http_client() -> httpx.Client:
    return _client_for(_settings_key())


def deadline() -> timedelta:
    """The most one request to the helpdesk may take, all phases and the whole answer."""
    return duration_setting("DECISIONFLOW_DELIVERY_DEADLINE", "20s")


def request_body(effect: EffectRecord, case_label: str) -> bytes:
    """The request body: the same bytes on every try, so the helpdesk's "same key, same
    body" is a replay and never a 422 (canonical JSON of the write-once effect)."""
    return json.dumps(
        {
            "case_id": case_label,
            "operation_id": effect.operation_id,
            "body": effect.body,
            "evidence_id": effect.evidence_id,
            "policy_id": effect.policy_id,
            "source_versions": {str(k): v for k, v in (effect.source_versions or {}).items()},
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


def _headers(operation_id: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {settings.DECISIONFLOW_DELIVERY_TOKEN}",
        "Idempotency-Key": operation_id,
        "Content-Type": "application/json",
        "Accept": "application/json",
    }


def _url(path: str) -> str:
    return settings.DECISIONFLOW_DELIVERY_URL.rstrip("/") + path


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "").strip()
    return float(value) if value.isdigit() else None


def _json(body: bytes) -> tuple[Any, str]:
    try:
        return json.loads(body), ""
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"the answer is not JSON ({exc.msg if hasattr(exc, 'msg') else exc}): {body[:80]!r}"


def _acknowledged(status: int, data: Any, operation_id: str) -> Answer:
    """A 200/201 is Delivered only when it names this key and a reference."""
    if not isinstance(data, dict):
        return Answer(Outcome.UNKNOWN, status, f"HTTP {status} with a JSON answer that is not an object")
    if data.get("operation_id") != operation_id:
        named = str(data.get("operation_id"))[:100]
        return Answer(Outcome.UNKNOWN, status, f"HTTP {status} names another key ({named!r}), not {operation_id}")
    reference = data.get("reference")
    if not isinstance(reference, str) or not reference.strip() or len(reference) > 200:
        return Answer(Outcome.UNKNOWN, status, f"HTTP {status} without a usable reference ({str(reference)[:100]!r})")
    return Answer(Outcome.DELIVERED, status, reference=reference)


def classify(status: int, body: bytes | None, operation_id: str, *, lookup: bool, retry_after=None) -> Answer:
    """What one answer of the helpdesk proves (the table in docs/DELIVERY.md)."""
    if body is None:
        cap = settings.DECISIONFLOW_DELIVERY_MAX_RESPONSE_BYTES
        # Too large to read: whatever it says, it is not a usable acknowledgement.
        return Answer(Outcome.UNKNOWN, status, f"HTTP {status}: the answer is larger than {cap} bytes")
    data, not_json = _json(body) if body else (None, "the answer is empty")
    if status in (200, 201):
        if not_json:
            return Answer(Outcome.UNKNOWN, status, f"HTTP {status}: {not_json}")
        return _acknowledged(status, data, operation_id)
    said = ""
    if isinstance(data, dict) and data.get("error") is not None:
        said = f": {str(data.get('error'))[:200]}"
    elif body:
        said = f": {body[:200].decode(errors='replace')}"
    if lookup:
        # Only a found reply settles anything; a 404 (or any other answer) is not evidence
        # that nothing was stored.
        outcome = Outcome.NOT_FOUND if status == 404 else Outcome.UNKNOWN
        return Answer(outcome, status, f"HTTP {status}{said}")
    if status in NOT_STORED_STATUSES:
        hint = " (check DECISIONFLOW_DELIVERY_TOKEN)" if status in (401, 403) else ""
        hint = " (check DECISIONFLOW_DELIVERY_URL)" if status in (404, 405) else hint
        return Answer(Outcome.NOT_STORED, status, f"HTTP {status}{said}{hint}", retry_after=retry_after)
    if 400 <= status < 500:
        return Answer(Outcome.REJECTED, status, f"HTTP {status}{said}")
    # 5xx other than 503 (a proxy's 502/504 included), 1xx, 3xx: the request may have been
    # stored, and this answer cannot say.
    return Answer(Outcome.UNKNOWN, status, f"HTTP {status}{said}")


def _exchange(method: str, url: str, operation_id: str, *, lookup: bool, body: bytes | None = None) -> Answer:
    import httpx  # noqa: PLC0415 (see the module's docstring; already loaded by _http_client)

    client = _http_client()
    until = Deadline.after(deadline())
    connect, read, write, pool = _settings_key()
    sent = False
    try:
        timeout = httpx.Timeout(**until.timeouts(connect=connect, read=read, write=write, pool=pool))
        headers = outbound_headers(_headers(operation_id))
        request = client.build_request(method, url, headers=headers, content=body, timeout=timeout)
        sent = True  # from here on, bytes may have reached the helpdesk
        response = client.send(request, stream=True)
        try:
            crash_point("deliver-before-read")
            data = read_capped(response, cap=int(settings.DECISIONFLOW_DELIVERY_MAX_RESPONSE_BYTES), deadline=until)
        finally:
            response.close()
    except (
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.PoolTimeout,
        httpx.UnsupportedProtocol,
        httpx.InvalidURL,
    ) as exc:
        # Nothing reached the helpdesk: provably not stored.
        return Answer(Outcome.NOT_STORED, None, f"{type(exc).__name__}: {exc}"[:2000])
    except (httpx.HTTPError, DeadlinePassed) as exc:
        # Sent (or partly) and no answer, or one cut off at the deadline: the helpdesk may
        # have committed.
        what = Outcome.UNKNOWN if sent else Outcome.NOT_STORED
        return Answer(what, None, f"{type(exc).__name__}: {exc or 'no detail'}"[:2000])
    except Exception as exc:  # noqa: BLE001 (any other failure of the exchange is a try that failed)
        what = Outcome.UNKNOWN if sent else Outcome.NOT_STORED
        return Answer(what, None, f"{type(exc).__name__}: {exc}"[:2000])
    return classify(response.status_code, data, operation_id, lookup=lookup, retry_after=_retry_after(response))


def _traced_exchange(name: SpanName, method: str, path: str, operation_id: str, **kwargs: Any) -> Answer:
    """One request as a client span, whose context the request carries (``traceparent``)."""
    url = _url(path)
    try:
        where = urlsplit(url)
        server = {Attr.SERVER: where.hostname, Attr.PORT: where.port}
    except ValueError:  # a malformed URL: the request itself says so, as a try not stored
        server = {}
    with traced(name, {Attr.HTTP_METHOD: method, **server}) as span:
        answer = _exchange(method, url, operation_id, **kwargs)
        span.set({Attr.HTTP_STATUS: answer.http_status, Attr.TRY_OUTCOME: answer.outcome})
        return answer


def helpdesk_send(*, operation_id: str, body: bytes) -> Answer:
    return _traced_exchange(SpanName.SEND, "POST", "/replies", operation_id, lookup=False, body=body)


def helpdesk_lookup(*, operation_id: str) -> Answer:
    answer = _traced_exchange(SpanName.LOOKUP, "GET", f"/replies/{operation_id}", operation_id, lookup=True)
    if answer.outcome == Outcome.NOT_STORED:
        # A lookup that never reached the helpdesk says nothing about the reply either way.
        return Answer(Outcome.UNKNOWN, answer.http_status, answer.error)
    return answer


# -- the state side --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Claim:
    delivery: Delivery
    from_unknown: bool
    worker: str
    tries: int  # the fence: this claim's count


def delivery_claim(*, operation_id: str, worker: str, now: datetime | None = None, due_only: bool = True):
    """Take one delivery for a try: Unknown or Queued (and due, unless ``due_only`` is off,
    as for ``reconcile --repair``) -> Sending, in one conditional UPDATE per source state.
    None when another worker holds it, it is settled, or it is not due yet."""
    now = now or timezone.now()
    # Read the state, then claim on exactly that state and try count: the UPDATE is the
    # atomic step (another worker's claim changes both, and this one then matches nothing).
    seen = Delivery.objects.filter(operation_id=operation_id).values_list("state", "tries", "next_try_at").first()
    if seen is None or seen[0] not in (DeliveryState.QUEUED, DeliveryState.UNKNOWN):
        return None
    source, tries, due_at = seen
    if due_only and due_at > now:
        return None
    claimed = Delivery.objects.filter(operation_id=operation_id, state=source, tries=tries).update(
        state=DeliveryState.SENDING,
        lease_owner=worker,
        lease_until=now + lease(),
        tries=tries + 1,
        updated_at=now,
    )
    if not claimed:
        return None
    delivery = Delivery.objects.get(operation_id=operation_id)
    return _Claim(delivery, source == DeliveryState.UNKNOWN, worker, tries + 1)


def _record(claim: _Claim, kind: str, answer: Answer, started: datetime, latency_ms: int) -> None:
    DeliveryTry.objects.create(
        delivery=claim.delivery,
        operation_id=claim.delivery.operation_id,
        kind=kind,
        outcome=answer.outcome,
        worker=claim.worker,
        http_status=answer.http_status,
        error=answer.error[:2000],
        latency_ms=latency_ms,
        started_at=started,
    )


def _timed(kind: str, claim: _Claim, call) -> tuple[Answer, Any]:
    """Make one request; returns its answer and the writer of its try row (called by the
    caller, in the transaction that also settles the state when the try settles it)."""
    started, began = timezone.now(), time.monotonic()
    answer = call()
    latency = round((time.monotonic() - began) * 1000)
    if kind == DeliveryTry.Kind.SEND:
        # The helpdesk answered (or did not); nothing local is written yet.
        crash_point("deliver-after-send")
    return answer, lambda: _record(claim, kind, answer, started, latency)


def delivery_next_state(*, from_unknown: bool, answer: Answer) -> DeliveryState:
    """The state one answer proves, given whether the delivery was Unknown before it.

    Once a delivery has been Unknown, an earlier request may be on the ticket, so only
    positive evidence settles it: Delivered (a lookup that finds it, or a resend answered
    as stored). A permanent refusal of the resend says nothing about that earlier request:
    NeedsCheck, a person looks at the ticket; never Rejected. Anything else leaves it
    Unknown. A delivery that was never Unknown is Rejected on a permanent refusal, Queued
    when the try provably stored nothing, Unknown when it may have.
    """
    if answer.outcome == Outcome.DELIVERED:
        return DeliveryState.DELIVERED
    if answer.outcome == Outcome.REJECTED:
        return DeliveryState.NEEDS_CHECK if from_unknown else DeliveryState.REJECTED
    if answer.outcome == Outcome.NOT_STORED and not from_unknown:
        return DeliveryState.QUEUED
    return DeliveryState.UNKNOWN


def _settle(claim: _Claim, answer: Answer) -> tuple[str, timedelta | None]:
    """Write the state that ``answer`` proves, fenced by the claim. Returns the new state
    and, when it is to be tried again, after how long."""
    now = timezone.now()
    delay = None
    changes: dict[str, Any] = {"updated_at": now, "lease_until": None}
    state = delivery_next_state(from_unknown=claim.from_unknown, answer=answer)
    if state == DeliveryState.DELIVERED:
        changes.update(reference=answer.reference, reason="", settled_at=now)
    elif state == DeliveryState.REJECTED:
        changes.update(reason=answer.error or f"HTTP {answer.http_status}", settled_at=now)
    elif state == DeliveryState.NEEDS_CHECK:
        # Not settled: nobody can say whether the ticket has the reply. No retry either:
        # the same resend would get the same refusal.
        changes.update(reason=answer.error or f"HTTP {answer.http_status}")
    else:
        delay = backoff(claim.tries, answer.retry_after)
        changes.update(reason=answer.error[:2000], next_try_at=now + delay)
    written = Delivery.objects.filter(
        pk=claim.delivery.pk, state=DeliveryState.SENDING, lease_owner=claim.worker, tries=claim.tries
    ).update(state=state, **changes)
    if not written:
        # The lease ran out and the sweep (or another worker) moved it on: that state stands.
        log.warning("delivery %s: lost the claim before writing %s", claim.delivery.operation_id, state)
        return "lost_claim", None
    return str(state), delay


def delivery_attempt(
    *, operation_id: str, worker: str | None = None, due_only: bool = True
) -> tuple[str, timedelta | None]:
    """One try of one delivery: claim, look up (after Unknown), send, settle.

    Returns what happened (``not_claimed``, ``lost_claim``, or the new state) and, when it
    is to be tried again, the delay. Never raises for what the helpdesk does; the state
    write is fenced by the claim.
    """
    worker = worker or worker_name()
    claim = delivery_claim(operation_id=operation_id, worker=worker, due_only=due_only)
    if claim is None:
        return "not_claimed", None
    case_label = Case.objects.filter(pk=claim.delivery.case_id).values_list("case_id", flat=True).get()
    annotate({Attr.CASE: case_label})  # the try's spans name the case
    if claim.from_unknown:
        found, record = _timed(DeliveryTry.Kind.LOOKUP, claim, lambda: helpdesk_lookup(operation_id=operation_id))
        if found.outcome == Outcome.DELIVERED:
            with transaction.atomic():
                record()
                return _settle(claim, found)
        record()  # the try happened; the send below decides the state
    effect = EffectRecord.objects.get(pk=claim.delivery.effect_id)
    body = request_body(effect, case_label)
    crash_point("deliver-before-send")
    answer, record = _timed(DeliveryTry.Kind.SEND, claim, lambda: helpdesk_send(operation_id=operation_id, body=body))
    # The try row and the state it proves commit together (one commit per try). The try row
    # stands even when the claim was lost: the request happened.
    with transaction.atomic():
        record()
        return _settle(claim, answer)


def delivery_traceparents(operation_ids: list[str]) -> dict[str, str]:
    """The approvals' trace contexts stored on these deliveries (those that have one)."""
    if not operation_ids:
        return {}
    found = Delivery.objects.filter(operation_id__in=operation_ids, traceparent__isnull=False)
    return {
        operation_id: traceparent
        for operation_id, traceparent in found.values_list("operation_id", "traceparent")
        if traceparent
    }


def delivery_sweep(*, now: datetime | None = None, grace: timedelta | None = None) -> tuple[int, list[str]]:
    """Sending past its lease -> Unknown (one conditional UPDATE); returns how many, and the
    deliveries to enqueue again: those just turned Unknown, and every Queued or Unknown one
    due for longer than ``grace`` (default: the sweep interval), whose enqueue was lost or
    whose task is gone. Their next_try_at is moved to now, so one sweep after another does
    not enqueue the same delivery again within ``grace``."""
    now = now or timezone.now()
    if grace is None:
        grace = timedelta(seconds=float(getattr(settings, "DECISIONFLOW_DELIVERY_SWEEP_INTERVAL", 30.0)))
    expired = list(
        Delivery.objects.filter(state=DeliveryState.SENDING, lease_until__lt=now).values_list("pk", flat=True)
    )
    turned = 0
    if expired:
        turned = Delivery.objects.filter(pk__in=expired, state=DeliveryState.SENDING, lease_until__lt=now).update(
            state=DeliveryState.UNKNOWN,
            next_try_at=now,
            updated_at=now,
            reason=Concat(
                Value("the lease of "),
                F("lease_owner"),
                Value(" ran out during a try: the helpdesk may have stored the reply"),
            ),
        )
    stale = Q(state__in=[DeliveryState.QUEUED, DeliveryState.UNKNOWN], next_try_at__lte=now - grace)
    with transaction.atomic():
        due = list(
            Delivery.objects.filter(stale | Q(pk__in=expired, state=DeliveryState.UNKNOWN))
            .order_by("next_try_at")
            .values_list("pk", "operation_id")
        )
        if due:
            Delivery.objects.filter(pk__in=[pk for pk, _ in due], next_try_at__lt=now).filter(stale).update(
                next_try_at=now, updated_at=now
            )
    return turned, [operation_id for _, operation_id in due]
