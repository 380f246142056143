"""Publishing a policy version: every undecided case under an older version moves onto it.

The one service behind the admin's publish page, ``POST /api/policies/publish`` and
``manage.py publish_policy``. First a plan (what would be superseded: a dry run writes
nothing), then, when told to apply, two steps:

1. **The switch** (``_switch``), one transaction under the policy's exclusive lock: the
   version is recorded, every undecided case under another version of the policy points at
   it, and it becomes the current version (the last published). This is the publish's
   commit point. From then on no decision on a proposal prepared under an older version
   commits (the commit reads the case's policy, and its guard holds it as read), and no
   case is imported under an older version. A concurrent approval either committed before
   the switch reached its case (the case is then decided and left alone) or is refused as
   stale, naming the new version.
2. **Preparing again**, each case under its case lock, in one transaction: the new
   proposal (origin ``policy_change``, the old one as parent, no author), the pointer moved
   by compare-and-swap, the case's other pending reviews superseded, and the review of the
   new proposal begun (its pause checkpoint and pending review). A crash anywhere in a case
   leaves that case switched but not yet prepared again: refused as stale until it is.

Both steps read the cases in bounded batches, by primary key, from the database's own
answer to "which undecided cases are still under (or prepared under) another version of
this policy": so a second run with the same file finds nothing (idempotent), and a run
killed part-way is finished by the next (resumable), with nothing done twice and nothing
left out.

Decided proposals are never touched: history does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django.db.models import CharField, Exists, OuterRef, Q, QuerySet
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce
from django.utils import timezone

from cases.models import Case, Policy
from cases.selectors import current_policy
from cases.services import (
    can_publish,
    policy_version_get_or_create,
    reviewer_groups_exist_check,
    validate_policy_data,
)
from core import faults, identity
from core.errors import CaseBusy, DecisionflowError, PermissionRefused
from core.locks import case_lock, policy_lock
from reviews.models import Channel, Proposal, ReviewDecision
from reviews.services import proposal_policy_change
from workflow.batches import batch_size, cases_in_batches
from workflow.begin import begin_under_lock, pending_supersede_others

SAMPLE = 50  # rows of the plan shown before acting


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
    # False when the count stopped at the plan's ``count_limit``: there are more than that.
    to_supersede_exact: bool = True
    to_move_exact: bool = True

    @property
    def total(self) -> int:
        return self.to_supersede + self.to_move

    @property
    def exact(self) -> bool:
        return self.to_supersede_exact and self.to_move_exact


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


def _decided():
    return Exists(ReviewDecision.objects.filter(proposal_id=OuterRef("current_proposal_id")))


def _unswitched(name: str, policy_id: str) -> QuerySet[Case]:
    """Cases of policy ``name`` still under another version whose current proposal is
    undecided (or who have none yet): the cases the switch moves onto the new version.
    Decided cases never match: history does not change."""
    return (
        Case.objects.filter(policy__name=name)
        .exclude(policy__policy_id=policy_id)
        .filter(Q(current_proposal__isnull=True) | ~_decided())
    )


def _unprepared(name: str, policy_id: str) -> QuerySet[Case]:
    """Cases of policy ``name`` whose current proposal is undecided and prepared under
    another version: the cases to prepare again, one at a time (switched or not yet)."""
    return (
        Case.objects.filter(policy__name=name, current_proposal__isnull=False)
        .exclude(current_proposal__policy_id=policy_id)
        .filter(~_decided())
    )


def _count(queryset: QuerySet, limit: int | None) -> tuple[int, bool]:
    """The rows of ``queryset``, and whether that is all of them: with a ``limit``, counting
    stops past it (a LIMIT under the COUNT), so that a page's cost does not grow with them."""
    if limit is None:
        return queryset.count(), True
    found = queryset.order_by()[: limit + 1].count()
    return min(found, limit), found <= limit


def publish_plan(*, data: dict, count_limit: int | None = None) -> PublishPlan:
    """What publishing ``data`` would do now; reads only. A group the policy names must exist.
    ``count_limit``: count each kind of case at most that far (a page then says "more than");
    None counts them all, as publishing does."""
    validate_policy_data(data, "policy")
    reviewer_groups_exist_check(data["parameters"])
    new_id = identity.policy_id(data["name"], data["parameters"])
    to_move = _unswitched(data["name"], new_id).filter(current_proposal__isnull=True)
    to_supersede = _unprepared(data["name"], new_id)
    # The version each case's proposal was prepared under; the case's own without one.
    label = Coalesce(
        KeyTextTransform("label", "current_proposal__policy_snapshot"), "policy__label", output_field=CharField()
    )
    # The first cases of each kind in id order, merged: two scans that stop after SAMPLE rows
    # each. One query over either kind (pk IN (...) OR pk IN (...)) read every affected case
    # first: 2.2 s at 600,000 (docs/PERFORMANCE.md, 9).
    rows = [
        row[1:]
        for row in sorted(
            found
            for kind in (to_move, to_supersede)
            for found in kind.order_by("pk").values_list("pk", "case_id", "current_proposal__operation_id", label)[
                :SAMPLE
            ]
        )[:SAMPLE]
    ]
    supersede, supersede_exact = _count(to_supersede, count_limit)
    move, move_exact = _count(to_move, count_limit)
    return PublishPlan(
        name=data["name"],
        label=data["label"],
        parameters=dict(data["parameters"]),
        policy_id=new_id,
        to_supersede=supersede,
        to_move=move,
        sample=[PlanRow(case_id, op, label) for case_id, op, label in rows],
        to_supersede_exact=supersede_exact,
        to_move_exact=move_exact,
    )


def _publish_case(case: Case, policy: Policy, publisher, channel: str) -> Proposal | None:
    """One case, all or nothing: one transaction that holds the case lock."""
    with case_lock(case.case_id):
        proposal = proposal_policy_change(case=case, policy=policy)
        if proposal is None:
            return None
        pending_supersede_others(case, proposal.operation_id)
        # Begun by the publisher (recorded as who began it, not as an author of the text).
        begin_under_lock(case, publisher, channel)
        return proposal


def _switch(plan: PublishPlan, data: dict, publisher, size: int) -> tuple[Policy, bool, int]:
    """Record the version (found if it exists), switch every undecided case of the policy
    onto it and make it the current version, in one transaction under the policy's
    exclusive lock. Returns the version, whether it was created, and how many of the
    switched cases had no proposal yet (those are done: begin prepares them under it).

    From its commit on, no decision on a proposal prepared under another version commits:
    the commit reads the case's policy and its guard holds it as read (effects/store.py),
    and no case is imported under another version (``policy_current_check``). The cases'
    proposals are prepared again afterwards, one at a time.
    """
    switched = 0
    with policy_lock(plan.name, shared=False):
        policy, created = policy_version_get_or_create(data=data)
        last_pk = 0
        while True:
            # A batch is locked first and switched by a statement of its own, whose snapshot
            # is taken once the locks are held: a decision that committed while a lock was
            # waited for is seen, and its case left alone.
            ids = list(
                _unswitched(plan.name, plan.policy_id)
                .filter(pk__gt=last_pk)
                .order_by("pk")
                .select_for_update(no_key=True, of=("self",))
                .values_list("pk", flat=True)[:size]
            )
            if not ids:
                break
            last_pk = ids[-1]
            locked = _unswitched(plan.name, plan.policy_id).filter(pk__in=ids)
            switched += locked.filter(current_proposal__isnull=True).update(policy=policy)
            locked.update(policy=policy)
        current = current_policy(plan.name)
        if current is None or current.pk != policy.pk:
            # Last, once the cases are switched: "published" means they are.
            Policy.objects.filter(pk=policy.pk).update(published_at=timezone.now(), published_by=publisher)
    return policy, created, switched


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
    With it: the switch (the version recorded and made current, every undecided case of
    the policy switched onto it, in one transaction; ``LockBusy`` if it cannot have its
    locks in time, and then nothing was written), then each switched case's proposal
    prepared again under it, one transaction per case under its case lock, read in batches
    of ``batch`` (``DECISIONFLOW_PUBLISH_BATCH``). A case that is busy or whose review
    cannot be begun stays switched, is listed in ``failed``, and is refused as stale until
    a run again finishes it. ``progress(done, total)`` is called after each case.

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
    current = current_policy(plan.name)
    if plan.total == 0 and current is not None and (current.policy_id, current.label) == (plan.policy_id, plan.label):
        return result  # the same publish again: nothing to do, nothing written
    size = batch_size(batch)
    policy, result.policy_created, result.moved = _switch(plan, data, publisher, size)
    faults.crash_point("publish-after-switch")
    done, total = result.moved, plan.total
    for case in cases_in_batches(lambda: _unprepared(plan.name, plan.policy_id), size=size):
        try:
            proposal = _publish_case(case, policy, publisher, channel)
        except (CaseBusy, DecisionflowError) as exc:
            result.failed.append((case.case_id, exc))
        else:
            if proposal is not None:
                result.superseded += 1
        faults.crash_point("publish-after-case")
        done += 1
        if progress is not None:
            progress(done, max(total, done))
    return result
