"""API token writes, and the decision path the API takes into the review workflow."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from decisionflow.core import faults
from decisionflow.core.errors import ConflictingDecision, InvalidInput
from decisionflow.workflow import services as workflow
from effects.services import CONFLICTING
from reviews.models import PendingReview

from .models import ApiToken
from .selectors import decidable_operation_id

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
    ApiToken.objects.filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_RESOLUTION), pk=token.pk
    ).update(last_used_at=now)
    return token.user


# Decisions and edits --------------------------------------------------------------------

FAULT_HEADER = "X-Decisionflow-Fault"
KNOWN_FAULTS = set(workflow.FAULTS)


def fault_requested(request) -> str | None:
    """The test-only fault a request asks for, honoured only with DECISIONFLOW_FAULT_INJECTION on.

    With fault injection off (production) the header is ignored entirely, so no client can
    make a real server fail on purpose.
    """
    value = request.headers.get(FAULT_HEADER)
    if not value or not faults.enabled():
        return None
    if value not in KNOWN_FAULTS:
        raise InvalidInput(f"{FAULT_HEADER}: unknown fault {value[:50]!r}; known: {', '.join(sorted(KNOWN_FAULTS))}")
    return value


def decision_submit(*, case, operation_id: str, approved: bool, reviewer, fault: str | None = None):
    """Approve or decline ``operation_id`` through the review workflow, as `manage.py resume` does.

    If the request names the case's current proposal and its review was never begun, it is
    begun first (``review_begin``): automation that imports a case and approves it needs no
    second round trip, and beginning is idempotent per operation. A request naming any other
    operation begins nothing, so a stale or unknown identity is refused with nothing written.
    Returns the commit result; ``ConflictingDecision`` is raised as an error here because
    over HTTP it is a refusal (409), not a success.
    """
    if (
        operation_id == decidable_operation_id(case)
        and not PendingReview.objects.filter(operation_id=operation_id).exists()
    ):
        workflow.review_begin(case=case, actor=reviewer)
    outcome = workflow.review_resume(
        case=case, operation_id=operation_id, approved=approved, reviewer=reviewer, channel="api", fault=fault
    )
    result = outcome.result
    if result.status == CONFLICTING:
        decision = result.decision
        if decision is not None:
            what = f"already {'approved' if decision.approved else 'declined'} by {decision.reviewer.get_username()}"
        else:
            what = "the opposite decision is already recorded"
        raise ConflictingDecision(
            f"conflicting decision: {operation_id} was {what}; no decision or effect was written",
            operation_id=operation_id,
        )
    return result


def edit_submit(*, case, expected_operation_id: str, body=None, source_versions=None, editor):
    """Revise the case's current proposal through the workflow; returns the RevisionResult."""
    revision, _begun = workflow.review_edit(
        case=case,
        expected_operation_id=expected_operation_id,
        body=body,
        source_versions=source_versions,
        editor=editor,
    )
    return revision
