"""API token writes, and the test-only fault header. Decisions and edits call the workflow's services."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from decisionflow.core import faults
from decisionflow.core.errors import InvalidInput, NotFound, PermissionRefused
from effects.services import REVIEW_PERMISSION

from .models import ApiToken

TOKEN_PREFIX = "dft_"
# last_used_at is advisory: writing it at most once a minute keeps busy clients (and the
# concurrency tests) from queueing on one token row.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def token_hash(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8", "surrogatepass")).hexdigest()


def token_create(*, user, name: str) -> tuple[ApiToken, str]:
    """Issue a token for ``user``; returns the row and the plaintext, which is never stored.

    The caller shows the plaintext once. Losing it means revoking and issuing another.
    """
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, name=name, token_hash=token_hash(plaintext), prefix=plaintext[: len(TOKEN_PREFIX) + 6]
    )
    return token, plaintext


def token_revoke(*, token: ApiToken) -> bool:
    """Revoke a token from now on; False if it was already revoked (revoking twice is harmless)."""
    now = timezone.now()
    revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now)
    if revoked:
        token.revoked_at = now
    return bool(revoked)


# Self-service: a reviewer's own tokens ---------------------------------------------------

# Who may hold and manage their own tokens: whoever may decide through the API.
SELF_SERVICE_PERMISSION = REVIEW_PERMISSION
TOKEN_NAME_MAX = ApiToken._meta.get_field("name").max_length or 100


def can_self_serve(user) -> bool:
    return bool(user.is_active and user.has_perm(SELF_SERVICE_PERMISSION))


def _self_service_check(user) -> None:
    if not can_self_serve(user):
        raise PermissionRefused(
            f"{user.get_username()} does not have the review permission (group Reviewers); "
            "an administrator can issue a token instead"
        )


def token_self_create(*, user, name: str) -> tuple[ApiToken, str]:
    """``user`` issues a token for themselves; returns the row and the plaintext (shown once).

    Needs the review permission. The name says what the token is for: not blank, at most
    100 characters. Refused input writes nothing.
    """
    _self_service_check(user)
    name = (name or "").strip()
    if not name:
        raise InvalidInput("give the token a name that says what it is for, e.g. 'retry loop on host X'")
    if len(name) > TOKEN_NAME_MAX:
        raise InvalidInput(f"the token's name is {len(name)} characters long; at most {TOKEN_NAME_MAX}")
    return token_create(user=user, name=name)


def token_self_revoke(*, user, token_id: int) -> tuple[ApiToken, bool]:
    """``user`` revokes one of their own tokens; the row and whether this call revoked it.

    Someone else's token is NotFound, exactly as a token that does not exist: the page does
    not tell anyone which token IDs are taken. Revoking twice is harmless (False).
    """
    _self_service_check(user)
    token = ApiToken.objects.filter(pk=token_id, user=user).first()
    if token is None:
        raise NotFound(f"you have no API token {token_id}")
    return token, token_revoke(token=token)


def token_authenticate(plaintext: str):
    """The active user holding this unrevoked token, or None."""
    if not plaintext or len(plaintext) > 200:
        return None
    token = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=token_hash(plaintext), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if token is None:
        return None
    now = timezone.now()
    stale = now - LAST_USED_RESOLUTION
    # Only a stale stamp is written: an UPDATE, even one that matches nothing, takes SQLite's
    # write lock and would make every request wait behind any writer. The filter repeats the
    # check so that concurrent requests still write it once.
    if token.last_used_at is None or token.last_used_at < stale:
        ApiToken.objects.filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=stale), pk=token.pk).update(
            last_used_at=now
        )
    return token.user


# Decisions and edits --------------------------------------------------------------------

FAULT_HEADER = "X-Decisionflow-Fault"


def fault_requested(request) -> str | None:
    """The test-only fault a request asks for, honoured only with DECISIONFLOW_FAULT_INJECTION on.

    With fault injection off (production) the header is ignored entirely, so no client can
    make a real server fail on purpose. An unknown fault is refused by the decision service.
    """
    value = request.headers.get(FAULT_HEADER)
    if not value or not faults.enabled():
        return None
    return value[:50]
