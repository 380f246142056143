"""Idempotency-Keys for the pipeline's requests (docs/INTAKE.md), with Stripe's semantics.

A key names one request of one user. The first request with it claims the key (a row,
committed before the work starts); its answer, once it has one, is stored with the row:

- the same key with the same request answers that first answer again, marked as a replay;
- the same key with another request (another endpoint or another body) is refused
  (``IdempotencyMismatch``), and nothing is written;
- while the first request runs, the same key answers ``RequestInProgress`` (409 with
  ``Retry-After``). A claim older than ``DECISIONFLOW_IDEMPOTENCY_LEASE`` whose request
  never answered (its process stopped) is taken over by the next retry, which runs the
  request again: the services behind it are idempotent by content, so that run finds what
  the first one wrote;
- a request that is refused or fails leaves no answer behind: the claim is let go and a
  retry runs it again (the refusal writes nothing, so running it again is safe).

Keys and their answers are kept for ``DECISIONFLOW_IDEMPOTENCY_KEEP`` (24 hours by default)
and deleted by ``manage.py prune_checkpoints``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from cases.models import IntakeRequest
from core import text
from core.durations import duration_setting
from core.errors import IdempotencyMismatch, InvalidInput, RequestInProgress

HEADER = "Idempotency-Key"
KEY_MAX = IntakeRequest._meta.get_field("key").max_length
# Visible ASCII only: a key is shown in messages and logs, and compared byte for byte.
_KEY_RE = re.compile(rf"[\x21-\x7e]{{1,{KEY_MAX}}}")


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict
    replayed: bool


def keep():
    return duration_setting("DECISIONFLOW_IDEMPOTENCY_KEEP", "24h")


def lease():
    return duration_setting("DECISIONFLOW_IDEMPOTENCY_LEASE", "60s")


def request_digest(endpoint: str, body: Any) -> str:
    """The request a key names: its endpoint and its body as canonical JSON (keys sorted), so
    the same JSON sent with other spacing or key order is the same request."""
    canonical = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(f"{endpoint}\n{canonical}".encode()).hexdigest()


def key_check(key: object) -> str:
    if not isinstance(key, str) or _KEY_RE.fullmatch(key) is None:
        raise InvalidInput(
            f"{HEADER}: must be 1 to {KEY_MAX} visible ASCII characters (a UUID, say); nothing was written",
            field=HEADER,
        )
    return key


def _claim(user, key: str, endpoint: str, digest: str) -> IntakeRequest | Answer:
    """The key's row, claimed now for this request; or the stored answer of the first one."""
    for _ in range(2):
        now = timezone.now()
        try:
            with transaction.atomic():
                return IntakeRequest.objects.create(
                    user=user, key=key, endpoint=endpoint, digest=digest, created_at=now
                )
        except IntegrityError:
            row = IntakeRequest.objects.filter(user=user, key=key).first()
        if row is None:
            continue  # pruned in between: claim it afresh
        if row.digest != digest:
            raise IdempotencyMismatch(
                f"{HEADER} {text.shown(key)} was first sent at {text.when(row.created_at)} with another request "
                f"({row.endpoint}); a key names one request: send a new key for a new request; nothing was written",
                key=key,
            )
        if row.status is not None:
            return Answer(row.status, dict(row.response or {}), replayed=True)
        # Still running, unless its process stopped: a claim past the lease is taken over,
        # by one retry only (compare-and-swap on the time it was claimed).
        taken = row.created_at <= now - lease() and IntakeRequest.objects.filter(
            pk=row.pk, status__isnull=True, created_at=row.created_at
        ).update(created_at=now)
        if taken:
            row.created_at = now
            return row
        raise RequestInProgress(
            f"the first request with {HEADER} {text.shown(key)} is still running (since "
            f"{text.when(row.created_at)}); send it again in a moment",
            key=key,
        )
    raise RuntimeError(f"{HEADER} {key}: neither claimable nor readable")


def idempotent(*, user, key: str | None, endpoint: str, body: Any, run: Callable[[], tuple[int, dict]]) -> Answer:
    """Run ``run`` (which answers a status and a JSON body) once per key: see the module."""
    if key is None:
        status, answer = run()
        return Answer(status, answer, replayed=False)
    claimed = _claim(user, key_check(key), endpoint, request_digest(endpoint, body))
    if isinstance(claimed, Answer):
        return claimed
    try:
        status, answer = run()
    except BaseException:
        IntakeRequest.objects.filter(pk=claimed.pk, status__isnull=True).delete()
        raise
    IntakeRequest.objects.filter(pk=claimed.pk).update(status=status, response=answer, completed_at=timezone.now())
    return Answer(status, answer, replayed=False)


def keys_prune(*, apply: bool = True, now=None) -> tuple[int, datetime]:
    """Delete the keys claimed more than ``keep()`` ago; how many (would) go, and the cutoff.
    A retry after that is a new request: the case file's own import is then the no-op."""
    cutoff = (now or timezone.now()) - keep()
    old = IntakeRequest.objects.filter(created_at__lt=cutoff)
    if not apply:
        return old.count(), cutoff
    deleted, _ = old.delete()
    return deleted, cutoff
