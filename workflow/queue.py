"""The review queue (docs/QUEUE.md): pending reviews oldest first, their SLA state, advisory
claims, and what happens when a review waits too long.

- **SLA.** Each pending review has a target: ``DECISIONFLOW_REVIEW_SLA_BY_POLICY[policy name]``
  or the global ``DECISIONFLOW_REVIEW_SLA`` (``"4h"``). Its age is counted from when the
  review was begun. It is *within* its target for the first 75% of it, *at risk* in the last
  25% (``DECISIONFLOW_REVIEW_AT_RISK``, the fraction after which it is at risk), and
  *breached* once the target has passed. The state is computed from the clock, never stored,
  and filtering by it is a range on ``created_at``, which the queue's partial index serves.
- **Claims** are advisory. A reviewer claims a pending review; it then shows "being
  reviewed by X since T" until the lease lapses (``DECISIONFLOW_REVIEW_CLAIM_LEASE``, 15
  minutes), renewed while the review page is open. A claim never decides what may be
  approved: the operation identity does. Claims and releases are ``ReviewClaimEvent`` rows.
- **On breach** (``DECISIONFLOW_REVIEW_ON_BREACH``, per policy ``..._BY_POLICY``):
  ``stay_pending`` (the default) or ``decline`` (fail closed: ``manage.py sla_report
  --expire`` declines each breached review with reason ``expired``, as the system actor
  ``sla-expiry``). Nothing ever approves automatically; the database allows no automatic
  decision but the system actors' declines (``decision_system_reason_iff_system_actor``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.db import models, transaction
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from core import identity
from core.durations import duration_parse, duration_setting
from core.errors import ClaimHeld, InvalidInput
from effects.services import CommitResult, effect_commit, reviewer_check
from reviews import notifications
from reviews.models import (
    DeclineReason,
    Notification,
    NotificationKind,
    PendingReview,
    ReviewClaimEvent,
    SystemActor,
)


class SlaState(models.TextChoices):
    WITHIN = "within", "Within target"
    AT_RISK = "at_risk", "At risk"
    BREACHED = "breached", "Breached"


class OnBreach(models.TextChoices):
    """What happens to a review past its target. Never an approval."""

    STAY_PENDING = "stay_pending", "Stay pending (reported)"
    DECLINE = "decline", "Decline as expired (fail closed)"


def sla_default() -> timedelta:
    return duration_setting("DECISIONFLOW_REVIEW_SLA", "4h")


def sla_by_policy() -> dict[str, timedelta]:
    targets = getattr(settings, "DECISIONFLOW_REVIEW_SLA_BY_POLICY", {}) or {}
    return {
        str(name): duration_parse(value, setting=f"DECISIONFLOW_REVIEW_SLA_BY_POLICY[{name!r}]")
        for name, value in targets.items()
    }


def at_risk_fraction() -> float:
    fraction = float(getattr(settings, "DECISIONFLOW_REVIEW_AT_RISK", 0.75))
    if not 0 < fraction < 1:
        raise ImproperlyConfigured(f"DECISIONFLOW_REVIEW_AT_RISK: {fraction} must be between 0 and 1")
    return fraction


def sla_target(policy_name: str | None) -> timedelta:
    return sla_by_policy().get(policy_name or "", sla_default())


def claim_lease() -> timedelta:
    return duration_setting("DECISIONFLOW_REVIEW_CLAIM_LEASE", "15m")


def on_breach(policy_name: str | None) -> OnBreach:
    by_policy = getattr(settings, "DECISIONFLOW_REVIEW_ON_BREACH_BY_POLICY", {}) or {}
    value = by_policy.get(policy_name or "", getattr(settings, "DECISIONFLOW_REVIEW_ON_BREACH", OnBreach.STAY_PENDING))
    if value not in OnBreach.values:
        # "approve" in particular: never.
        raise ImproperlyConfigured(
            f"DECISIONFLOW_REVIEW_ON_BREACH: {value!r} is not one of {', '.join(OnBreach.values)} "
            "(a breached review is never approved automatically)"
        )
    return OnBreach(value)


def sla_state(*, age: timedelta, target: timedelta) -> SlaState:
    if age >= target:
        return SlaState.BREACHED
    if age >= target * at_risk_fraction():
        return SlaState.AT_RISK
    return SlaState.WITHIN


# --- the queue --------------------------------------------------------------------------


def review_queue() -> QuerySet[PendingReview]:
    """Pending reviews, oldest first: the order of the partial index ``pending_review_queue``."""
    return PendingReview.objects.filter(status=PendingReview.Status.PENDING).order_by("created_at", "id")


def _age_range(state: str, target: timedelta, now: datetime) -> Q:
    breach_at = now - target  # begun at or before this: breached
    risk_at = now - target * at_risk_fraction()  # begun at or before this: at risk (or breached)
    if state == SlaState.BREACHED:
        return Q(created_at__lte=breach_at)
    if state == SlaState.AT_RISK:
        return Q(created_at__gt=breach_at, created_at__lte=risk_at)
    if state == SlaState.WITHIN:
        return Q(created_at__gt=risk_at)
    raise InvalidInput(f"unknown SLA state {state!r}; the states are {', '.join(SlaState.values)}")


def sla_q(state: str, now: datetime) -> Q:
    """The pending reviews in ``state`` at ``now``: a range on ``created_at`` per target."""
    targets = sla_by_policy()
    if not targets:
        # One target for all: a plain range on the queue's index, no join.
        return _age_range(state, sla_default(), now)
    condition = ~Q(case__policy__name__in=list(targets)) & _age_range(state, sla_default(), now)
    for name, target in targets.items():
        condition |= Q(case__policy__name=name) & _age_range(state, target, now)
    # The union of the per-policy ranges lies within one range of the shortest and longest
    # targets: said as well, so the index scan starts and stops there instead of filtering
    # every pending row through the join.
    every = [sla_default(), *targets.values()]
    shortest, longest = min(every), max(every)
    if state == SlaState.BREACHED:
        bound = Q(created_at__lte=now - shortest)
    elif state == SlaState.AT_RISK:
        bound = Q(created_at__gt=now - longest, created_at__lte=now - shortest * at_risk_fraction())
    else:
        bound = Q(created_at__gt=now - longest * at_risk_fraction())
    return bound & condition


@dataclass(frozen=True)
class Claim:
    """A live claim: who, since when, until when (unless renewed)."""

    user_pk: int
    username: str
    since: datetime
    until: datetime


def live_claim(pending: PendingReview, now: datetime | None = None) -> Claim | None:
    """The review's claim if it has not lapsed (reads ``claimed_by``: select it related)."""
    now = now or timezone.now()
    holder = pending.claimed_by if pending.claimed_by_id is not None else None
    if holder is None or pending.claim_expires_at is None or pending.claim_expires_at <= now:
        return None
    assert pending.claimed_at is not None
    return Claim(holder.pk, holder.get_username(), pending.claimed_at, pending.claim_expires_at)


def sla_counts(now: datetime) -> dict[str, int]:
    """How many pending reviews are in each SLA state at ``now``, by ``SlaState`` value, in
    one query (the states' ranges are the queue filter's own, ``sla_q``)."""
    counted = (
        review_queue()
        .order_by()
        .aggregate(**{state: Count("pk", filter=sla_q(state, now)) for state in SlaState.values})
    )
    return {state: counted[state] for state in SlaState.values}


# --- claims -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    new: bool  # False: the reviewer's own live claim was renewed


def review_claim(*, pending: PendingReview, user, now: datetime | None = None) -> ClaimResult:
    """Claim ``pending`` for ``user``, or renew the claim they hold (no event for a renewal).

    Invariant: at most one live claim per review. Each step is one conditional UPDATE, so of
    two reviewers claiming at once exactly one wins and the other is refused with
    ``ClaimHeld`` naming the winner (never silently). A lapsed claim may be taken by anyone.
    A claim is advisory: it refuses other claims, never a decision. One transaction.
    """
    reviewer_check(user)
    now = now or timezone.now()
    until = now + claim_lease()
    with transaction.atomic():
        live = Q(claimed_by=user, claim_expires_at__gt=now)
        rows = PendingReview.objects.filter(pk=pending.pk, status=PendingReview.Status.PENDING)
        if rows.filter(live).update(claim_expires_at=until):
            pending.refresh_from_db(fields=["claimed_by", "claimed_at", "claim_expires_at"])
            assert pending.claimed_at is not None
            return ClaimResult(Claim(user.pk, user.get_username(), pending.claimed_at, until), new=False)
        free = Q(claimed_by__isnull=True) | Q(claim_expires_at__isnull=True) | Q(claim_expires_at__lte=now)
        if rows.filter(free).update(claimed_by=user, claimed_at=now, claim_expires_at=until):
            ReviewClaimEvent.objects.create(
                pending_review_id=pending.pk,
                case_id=pending.case_id,
                operation_id=pending.operation_id,
                user=user,
                kind=ReviewClaimEvent.Kind.CLAIMED,
                at=now,
                expires_at=until,
            )
            pending.claimed_by, pending.claimed_at, pending.claim_expires_at = user, now, until
            return ClaimResult(Claim(user.pk, user.get_username(), now, until), new=True)
        current = PendingReview.objects.select_related("claimed_by").get(pk=pending.pk)
    if current.status != PendingReview.Status.PENDING:
        raise InvalidInput(
            f"the review of {identity.short(current.operation_id)} is {current.get_status_display().lower()}, "
            "not pending: there is nothing to claim"
        )
    held = live_claim(current, now)
    assert held is not None  # neither renewable nor free: someone else holds it
    raise ClaimHeld(
        f"not claimed: being reviewed by {held.username} since {timezone.localtime(held.since):%H:%M} "
        f"(claim until {timezone.localtime(held.until):%H:%M} unless renewed); a claim is advisory: "
        "you may still decide, but tell them first",
        claimed_by=held.username,
    )


def review_claim_release(*, pending: PendingReview, user, now: datetime | None = None) -> bool:
    """Give up ``user``'s claim on ``pending``; False (nothing written) when they hold none."""
    now = now or timezone.now()
    with transaction.atomic():
        released = PendingReview.objects.filter(pk=pending.pk, claimed_by=user).update(
            claimed_by=None, claimed_at=None, claim_expires_at=None
        )
        if not released:
            return False
        ReviewClaimEvent.objects.create(
            pending_review_id=pending.pk,
            case_id=pending.case_id,
            operation_id=pending.operation_id,
            user=user,
            kind=ReviewClaimEvent.Kind.RELEASED,
            at=now,
        )
    pending.claimed_by, pending.claimed_at, pending.claim_expires_at = None, None, None
    return True


# --- escalation -------------------------------------------------------------------------


@dataclass(frozen=True)
class BreachedReview:
    case_id: str
    operation_id: str
    policy: str
    begun_at: datetime
    age: timedelta
    target: timedelta
    claimed_by: str | None
    on_breach: OnBreach

    def as_dict(self) -> dict:
        return {
            "case": self.case_id,
            "operation_id": self.operation_id,
            "policy": self.policy,
            "begun_at": self.begun_at.isoformat(),
            "age_seconds": int(self.age.total_seconds()),
            "target_seconds": int(self.target.total_seconds()),
            "claimed_by": self.claimed_by,
            "on_breach": self.on_breach.value,
        }


def breached_reviews(now: datetime | None = None):
    """Every pending review past its SLA target, oldest first (streamed in chunks)."""
    now = now or timezone.now()
    rows = (
        review_queue()
        .filter(sla_q(SlaState.BREACHED, now))
        .select_related("case__policy", "claimed_by")
        .only(
            "id",
            "case_id",
            "operation_id",
            "created_at",
            "proposal_id",
            "claimed_by",
            "claimed_at",
            "claim_expires_at",
            "case__case_id",
            "case__policy__name",
            "claimed_by__username",
        )
    )
    for pending in rows.iterator(chunk_size=2000):
        policy = pending.case.policy.name
        claim = live_claim(pending, now)
        yield (
            pending,
            BreachedReview(
                case_id=pending.case.case_id,
                operation_id=pending.operation_id,
                policy=policy,
                begun_at=pending.created_at,
                age=now - pending.created_at,
                target=sla_target(policy),
                claimed_by=claim.username if claim else None,
                on_breach=on_breach(policy),
            ),
        )


SYSTEM_USERNAME = "decisionflow-system-sla-expiry"


def system_actor_user():
    """The dedicated user row of the ``sla-expiry`` system actor: inactive, no password, no
    permission, so nobody can log in as it; it exists so that the decision names it."""
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(
        **{user_model.USERNAME_FIELD: SYSTEM_USERNAME}, defaults={"is_active": False}
    )
    if user.has_usable_password():
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def review_expire(*, pending: PendingReview) -> CommitResult:
    """Decline one breached review as expired, as the system actor ``sla-expiry``.

    Goes through the review core like every decision (one commit statement: decision,
    attempt row, pending review completed). A person's decision that got there first
    stands: the expiry is then a conflict or a replay, and is reported, never forced.
    """
    return effect_commit(
        operation_id=pending.operation_id,
        approved=False,
        reviewer=system_actor_user(),
        channel="system",
        decline_reason=DeclineReason.EXPIRED,
        system_actor=SystemActor.SLA_EXPIRY,
    )


# --- notifications (reviews/notifications.py) -------------------------------------------


def sla_notifications(now: datetime | None = None) -> dict[str, int]:
    """One notification per (operation, kind) for each pending review at risk or breached.

    Run by ``sla_report``. A review already notified for that kind is skipped in the query
    (NOT EXISTS on the key), and ``notify`` is a get-or-create on it, so two runs at once
    still write one row. Nothing at all when no notification channel is configured.
    """
    if not notifications.channels():
        return {}
    now = now or timezone.now()
    made: dict[str, int] = {}
    for state in (SlaState.AT_RISK, SlaState.BREACHED):
        kind = NotificationKind.AT_RISK if state == SlaState.AT_RISK else NotificationKind.BREACHED
        already = Notification.objects.filter(operation_id=OuterRef("operation_id"), kind=kind)
        rows = (
            review_queue()
            .filter(sla_q(state, now))
            .filter(~Exists(already))
            .select_related("case")
            .only("id", "operation_id", "created_at", "case")
        )
        for pending in rows.iterator(chunk_size=2000):
            with transaction.atomic():
                notifications.notify(case=pending.case, operation_id=pending.operation_id, kind=kind)
            made[str(kind)] = made.get(str(kind), 0) + 1
    return made
