"""Publishing a policy version: every undecided case under an older version moves onto it.

The one service behind the admin's publish page, ``POST /api/policies/publish`` and
``manage.py publish_policy``. First a plan (what would be superseded: a dry run writes
nothing), then, when told to apply, the cases one at a time:

- each case under its case lock, in one transaction: the new proposal (origin
  ``policy_change``, the old one as parent, no author), the pointer moved by
  compare-and-swap, the case's other pending reviews superseded, and the review of the new
  proposal begun (its pause checkpoint and pending review). A crash anywhere in a case
  leaves that case untouched.
- the cases are read in bounded batches, by primary key, from the database's own answer to
  "which undecided cases are still under another version of this policy": so a second run
  with the same file finds nothing (idempotent), and a run killed part-way is finished by
  the next (resumable), with nothing done twice and nothing left out.
- a concurrent approval takes the same case row lock in its commit: it either commits
  first (the case is then decided and left alone) or waits and is refused as stale.

Decided proposals are never touched: history does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from cases.models import Case, Policy
from cases.services import can_publish, policy_version_get_or_create, validate_policy_data
from core import faults, identity
from core.errors import CaseBusy, DecisionflowError, PermissionRefused
from core.locks import case_lock
from reviews.models import Channel, PendingReview, Proposal, ReviewDecision
from reviews.services import proposal_policy_change
from workflow.begin import begin_under_lock

SAMPLE = 50  # rows of the plan shown before acting


def batch_size() -> int:
    return int(getattr(settings, "DECISIONFLOW_PUBLISH_BATCH", 100))


@dataclass(frozen=True)
class PlanRow:
    case_id: str
    operation_id: str | None  # the current proposal's; None: no proposal yet (only the pointer moves)
    from_label: str


@dataclass(frozen=True)
class PublishPlan:
    name: str
    label: str
    parameters: dict
    policy_id: str
    to_supersede: int  # undecided current proposals under another version
    to_move: int  # cases without a proposal yet: prepared under the new version when begun
    sample: list[PlanRow]

    @property
    def total(self) -> int:
        return self.to_supersede + self.to_move


@dataclass
class PublishResult:
    plan: PublishPlan
    applied: bool
    policy_created: bool = False
    superseded: int = 0
    moved: int = 0
    failed: list[tuple[str, DecisionflowError]] = field(default_factory=list)

    def summary(self) -> dict:
        return {
            "policy": self.plan.name,
            "label": self.plan.label,
            "policy_id": self.plan.policy_id,
            "applied": self.applied,
            "to_supersede": self.plan.to_supersede,
            "to_move": self.plan.to_move,
            "superseded": self.superseded,
            "moved": self.moved,
            "failed": len(self.failed),
            "policy_created": self.policy_created,
        }


def _affected(name: str, policy_id: str) -> QuerySet[Case]:
    """Cases under another version of policy ``name`` whose current proposal is undecided
    (or who have none yet). Decided cases never match: history does not change."""
    decided = Exists(ReviewDecision.objects.filter(proposal_id=OuterRef("current_proposal_id")))
    return (
        Case.objects.filter(policy__name=name)
        .exclude(policy__policy_id=policy_id)
        .filter(Q(current_proposal__isnull=True) | ~decided)
    )


def publish_plan(*, data: dict) -> PublishPlan:
    """What publishing ``data`` would do now; reads only."""
    validate_policy_data(data, "policy")
    new_id = identity.policy_id(data["name"], data["parameters"])
    affected = _affected(data["name"], new_id)
    to_move = affected.filter(current_proposal__isnull=True).count()
    to_supersede = affected.filter(current_proposal__isnull=False).count()
    rows = affected.order_by("pk").values_list("case_id", "current_proposal__operation_id", "policy__label")[:SAMPLE]
    return PublishPlan(
        name=data["name"],
        label=data["label"],
        parameters=dict(data["parameters"]),
        policy_id=new_id,
        to_supersede=to_supersede,
        to_move=to_move,
        sample=[PlanRow(case_id, op, label) for case_id, op, label in rows],
    )


def _publish_case(case: Case, policy: Policy, publisher, channel: str) -> Proposal | None:
    """One case, all or nothing: one transaction that holds the case lock."""
    with case_lock(case.case_id):
        proposal = proposal_policy_change(case=case, policy=policy)
        if proposal is None:
            return None
        # update() skips auto_now; checkpoint retention counts its window from this time.
        PendingReview.objects.filter(case=case, status=PendingReview.Status.PENDING).exclude(
            operation_id=proposal.operation_id
        ).update(status=PendingReview.Status.SUPERSEDED, updated_at=timezone.now())
        # Begun by the publisher (recorded as who began it, not as an author of the text).
        begin_under_lock(case, publisher, channel)
        return proposal


def policy_publish(
    *,
    data: dict,
    publisher,
    channel: str = Channel.SERVICE,
    apply: bool = False,
    progress: Callable[[int, int], None] | None = None,
    batch: int | None = None,
) -> PublishResult:
    """Publish policy version ``data`` (name, label, parameters) as ``publisher``.

    Needs the "publish policy" permission (``PermissionRefused``); bad input is
    ``InvalidInput`` and writes nothing. Without ``apply``: the plan only, nothing written.
    With it: the version is recorded (found if it exists) and every undecided case under
    another version of this policy is moved onto it, one transaction per case under its
    case lock, read in batches of ``batch`` (``DECISIONFLOW_PUBLISH_BATCH``). A case that
    is busy or whose review cannot be begun is left as it was and listed in ``failed``;
    running again finishes it. ``progress(done, total)`` is called after each case.

    Idempotent (the same data again finds nothing to do and writes nothing) and resumable
    (a run killed part-way is finished by the next, with nothing duplicated).
    """
    if not can_publish(publisher):
        raise PermissionRefused(
            f"{getattr(publisher, 'get_username', lambda: 'nobody')()} does not have the publish policy permission"
        )
    plan = publish_plan(data=data)
    result = PublishResult(plan=plan, applied=apply)
    if not apply:
        return result
    if plan.total == 0 and Policy.objects.filter(policy_id=plan.policy_id, label=plan.label).exists():
        return result  # the same publish again: nothing to do, nothing written
    policy, result.policy_created = policy_version_get_or_create(data=data)
    if policy.published_at is None:
        Policy.objects.filter(pk=policy.pk, published_at__isnull=True).update(
            published_at=timezone.now(), published_by=publisher
        )
    size = max(1, batch or batch_size())
    done, last_pk, total = 0, 0, plan.total
    while True:
        # Bounded: one batch of cases at a time, by primary key, still matching now.
        chunk = list(_affected(plan.name, plan.policy_id).filter(pk__gt=last_pk).order_by("pk")[:size])
        if not chunk:
            break
        for case in chunk:
            last_pk = case.pk
            had_proposal = case.current_proposal_id is not None
            try:
                proposal = _publish_case(case, policy, publisher, channel)
            except (CaseBusy, DecisionflowError) as exc:
                result.failed.append((case.case_id, exc))
            else:
                if proposal is not None:
                    result.superseded += 1
                elif not had_proposal:
                    result.moved += 1
            faults.crash_point("publish-after-case")
            done += 1
            if progress is not None:
                progress(done, max(total, done))
    return result
