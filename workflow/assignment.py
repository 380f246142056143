"""Assignment and hand-over (docs/QUEUE.md, "Assignment"): who a pending review is waiting on.

- **At begin** a review is assigned to the groups its policy names (``reviewer_groups``), or
  to nobody when it names none. Nothing is written for that: it is the policy's, read from
  the proposal's snapshot, until a move says otherwise.
- **A move** puts it on a person or a group, and is a ``ReviewAssignment`` row (who, to whom,
  when, why), never updated: a support lead assigns (``reviews.assign_review``), a reviewer
  who may decide it hands it over to another, with a note; the SLA escalation reassigns.
  Whom it moved to is told (an ``assigned`` notification, in the move's transaction: once per
  move). A move to whom the review is already on is a replay: nothing is written, so a retry
  or two channels doing the same move at once make one move.
- **The channels** call ``review_assign`` or ``review_hand_over``: the review page with the
  review and the target it offered; ``POST /api/cases/{id}/assignment`` and ``/hand-over``
  and ``manage.py assign`` through ``review_move``, which finds them by operation and names.
- **Out of office**: a user away (``ReviewerAway``: until when, and a substitute) gets no new
  assignment; it goes to the substitute (followed while they are away too), and the move
  says for whom.
- **Who may decide**: a move never widens it. The target must be able to decide under the
  policy's groups. Under the default, *assignee first*, others may decide too, and the
  review page and the queue show whose it is. A policy with ``assignee_only`` lets only the
  assignee (the person, else a member of the group) decide: ``NotAssignee``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from cases.models import ASSIGNEE_ONLY, Case, reviewer_groups
from core import text
from core.errors import InvalidInput, NotAssignee, NotFound, PermissionRefused, StaleProposal
from core.identity import short
from effects.services import REVIEW_PERMISSION, reviewer_check
from reviews import notifications
from reviews.models import AssignmentKind, NotificationKind, PendingReview, ReviewAssignment, ReviewerAway
from workflow.reviewer_groups import may_decide, member_of

ASSIGN_PERMISSION = "reviews.assign_review"
NOTE_MAX = 2000
# How far a chain of substitutes is followed (each away, naming the next).
SUBSTITUTE_HOPS = 5


def can_assign(user) -> bool:
    """Whether ``user`` may assign reviews to anyone (support leads)."""
    return bool(getattr(user, "is_active", False) and user.has_perm(ASSIGN_PERMISSION))


def assign_refusal(user) -> PermissionRefused:
    """What anyone without the assign permission is told, by every channel."""
    return PermissionRefused(
        f"{text.shown(user.get_username())} does not have the assign permission (support leads); nothing was written"
    )


@dataclass(frozen=True)
class Assignee:
    """Whose a pending review is now. ``user`` or ``group`` when a move put it there; else
    ``policy_groups`` (as begun) or nobody."""

    user_pk: int | None
    username: str | None
    group: str | None
    policy_groups: tuple[str, ...]

    @property
    def label(self) -> str:
        if self.username is not None:
            return self.username
        if self.group is not None:
            return f"group {self.group}"
        if self.policy_groups:
            return (
                "the policy's "
                + ("group " if len(self.policy_groups) == 1 else "groups ")
                + ", ".join(self.policy_groups)
            )
        return "nobody"

    @property
    def anyone(self) -> bool:
        return self.username is None and self.group is None and not self.policy_groups


def assignee_of(pending: PendingReview, policy_snapshot: dict | None = None) -> Assignee:
    """Whose ``pending`` is (reads ``assigned_to`` and ``assigned_group``: select them related)."""
    snapshot = policy_snapshot if policy_snapshot is not None else pending.proposal.policy_snapshot
    user = pending.assigned_to if pending.assigned_to_id is not None else None
    group = pending.assigned_group if pending.assigned_group_id is not None else None
    return Assignee(
        user_pk=user.pk if user else None,
        username=user.get_username() if user else None,
        group=group.name if group else None,
        policy_groups=reviewer_groups(snapshot.get("parameters")),
    )


def is_assignee(*, pending: PendingReview, user, member_names: set[str] | None = None) -> bool | None:
    """Whether ``user`` is whom ``pending`` was moved to; None when no move names anyone."""
    if pending.assigned_to_id is not None:
        return pending.assigned_to_id == getattr(user, "pk", None)
    if pending.assigned_group_id is not None:
        names = member_of(user) if member_names is None else member_names
        name = Group.objects.filter(pk=pending.assigned_group_id).values_list("name", flat=True).first()
        return name in names
    return None


def assignee_refusal(*, pending: PendingReview, policy_snapshot: dict | None, reviewer) -> NotAssignee | None:
    """The refusal a decision by ``reviewer`` gets when the policy lets only the assignee
    decide (``assignee_only``) and ``reviewer`` is not the assignee; None otherwise (the
    default, assignee first: anyone the groups allow may decide)."""
    snapshot = policy_snapshot or {}
    if snapshot.get("parameters", {}).get(ASSIGNEE_ONLY) is not True or getattr(reviewer, "is_superuser", False):
        return None
    if is_assignee(pending=pending, user=reviewer) is not False:
        return None
    assignee = assignee_of(pending, snapshot)
    return NotAssignee.of(
        username=text.shown(reviewer.get_username()),
        assignee=assignee.label,
        policy=f"{text.shown(snapshot.get('name', ''))} {text.shown(snapshot.get('label', ''))}",
        operation_id=pending.operation_id,
    )


def assignee_check(*, pending: PendingReview, policy_snapshot: dict | None, reviewer) -> None:
    refusal = assignee_refusal(pending=pending, policy_snapshot=policy_snapshot, reviewer=reviewer)
    if refusal is not None:
        raise refusal


# --- out of office ------------------------------------------------------------------------


def away_set(*, user, until: datetime, substitute, now: datetime | None = None) -> ReviewerAway:
    """``user`` is away until ``until``, and ``substitute`` takes their new assignments. One row
    per user, replaced by the next call. Refused (``InvalidInput``, nothing written): a time
    not in the future, no substitute, the user themself, a substitute who cannot review."""
    now = now or timezone.now()
    if until <= now:
        raise InvalidInput(f"away until {text.when(until)} is not in the future; nothing was written")
    if substitute is None:
        raise InvalidInput("out of office needs a substitute, who gets the new assignments; nothing was written")
    if substitute.pk == user.pk:
        raise InvalidInput("you cannot be your own substitute; nothing was written")
    if not (substitute.is_active and substitute.has_perm(REVIEW_PERMISSION)):
        raise InvalidInput(
            f"{text.shown(substitute.get_username())} cannot be a substitute: they do not have the review "
            "permission; nothing was written"
        )
    away, _ = ReviewerAway.objects.update_or_create(user=user, defaults={"until": until, "substitute": substitute})
    return away


def away_clear(*, user) -> bool:
    """Back in the office: whether there was an absence to end."""
    return ReviewerAway.objects.filter(user=user).delete()[0] > 0


def away_of(user, now: datetime | None = None) -> ReviewerAway | None:
    """``user``'s absence if it has not ended."""
    now = now or timezone.now()
    return ReviewerAway.objects.select_related("substitute").filter(user=user, until__gt=now).first()


def substitute_for(user, now: datetime | None = None):
    """Who gets an assignment meant for ``user`` now: ``user``, or their substitute (and theirs,
    while each is away, at most ``SUBSTITUTE_HOPS`` and never in a circle). Returns the person
    and the one it was meant for when that was not them (None otherwise)."""
    now = now or timezone.now()
    seen, current = {user.pk}, user
    for _ in range(SUBSTITUTE_HOPS):
        away = away_of(current, now)
        if away is None or away.substitute_id in seen:
            break
        seen.add(away.substitute_id)
        current = away.substitute
    return current, (user if current.pk != user.pk else None)


# --- moves --------------------------------------------------------------------------------


def _note(note: str | None, *, required: bool) -> str:
    note = (note or "").strip()
    if required and not note:
        raise InvalidInput("a hand-over needs a note: say why, for whoever takes it; nothing was written")
    if len(note) > NOTE_MAX:
        raise InvalidInput(f"the note is {len(note)} characters; at most {NOTE_MAX}; nothing was written")
    return text.check_text(note, field="note")


def target_check(*, snapshot: dict, to_user, to_group: Group | None) -> None:
    """A move never widens who may decide: its target can decide under the policy's groups."""
    groups = reviewer_groups(snapshot.get("parameters"))
    if to_user is not None:
        if not (to_user.is_active and to_user.has_perm(REVIEW_PERMISSION)):
            raise InvalidInput(
                f"{text.shown(to_user.get_username())} cannot review (no review permission, or inactive); "
                "nothing was written"
            )
        if not may_decide(groups=groups, user=to_user):
            raise InvalidInput(
                f"{text.shown(to_user.get_username())} is not in {', '.join(groups)}, the group(s) that decide this "
                "policy, so they could not decide it; nothing was written"
            )
    elif to_group is not None and groups and to_group.name not in groups:
        raise InvalidInput(
            f"the policy is decided by {', '.join(groups)} only, so it cannot be assigned to "
            f"{text.shown(to_group.name)}; nothing was written"
        )


@dataclass(frozen=True)
class Moved:
    """What a move did: ``row`` is the move (on a replay, the standing one that put the
    review where it was asked to go), ``replay`` that nothing new was written."""

    row: ReviewAssignment
    replay: bool

    @property
    def to_label(self) -> str:
        return notifications.assigned_to(self.row)

    def as_dict(self, case_id: str) -> dict:
        """What the API answers and ``manage.py assign`` prints as its ``result=`` line."""
        row = self.row
        return {
            "case": case_id,
            "operation_id": row.operation_id,
            "replay": self.replay,
            "kind": row.kind,
            "by": row.by.get_username() if row.by is not None else None,
            "to_user": row.to_user.get_username() if row.to_user is not None else None,
            "to_group": row.to_group or None,
            "meant_for": row.meant_for.get_username() if row.meant_for is not None else None,
            "note": row.note,
            "at": row.at.isoformat(),
            "said": self.said(case_id),
        }

    def said(self, case_id: str) -> str:
        """The one line every channel shows."""
        if self.replay:
            return f"{text.shown(case_id)} is already assigned to {self.to_label}; nothing was written."
        return f"{text.shown(case_id)} is now assigned to {self.to_label}."


def _already_there(to_user, to_group: Group | None) -> Q:
    user = Q(assigned_to=to_user) if to_user is not None else Q(assigned_to__isnull=True)
    group = Q(assigned_group=to_group) if to_group is not None else Q(assigned_group__isnull=True)
    return user & group


def assignment_move(
    *, pending: PendingReview, kind: AssignmentKind, by, to_user, to_group: Group | None, note: str, now
) -> Moved:
    if (to_user is None) == (to_group is None):
        raise InvalidInput("assign to one person or one group; nothing was written")
    snapshot = pending.proposal.policy_snapshot
    meant_for = None
    if to_user is not None:
        to_user, meant_for = substitute_for(to_user, now)
    target_check(snapshot=snapshot, to_user=to_user, to_group=to_group)
    with transaction.atomic():
        # One conditional UPDATE decides: of two identical moves at once, the second waits
        # for the first's row lock, finds the review already there, and writes nothing.
        still_pending = PendingReview.objects.filter(pk=pending.pk, status=PendingReview.Status.PENDING)
        moved = still_pending.exclude(_already_there(to_user, to_group)).update(
            assigned_to=to_user, assigned_group=to_group
        )
        if not moved:
            standing = ReviewAssignment.objects.filter(pending_review_id=pending.pk).order_by("-at", "-id").first()
            if standing is None or not still_pending.exists():
                raise InvalidInput(
                    f"the review of {pending.operation_id[:19]}… is no longer pending: there is nothing to assign; "
                    "nothing was written"
                )
            pending.assigned_to, pending.assigned_group = to_user, to_group
            return Moved(standing, replay=True)
        row = ReviewAssignment.objects.create(
            pending_review_id=pending.pk,
            case_id=pending.case_id,
            operation_id=pending.operation_id,
            kind=kind,
            by=by,
            to_user=to_user,
            to_group=to_group.name if to_group is not None else "",
            meant_for=meant_for,
            note=note,
            at=now,
        )
        notifications.notify(
            case=pending.case, operation_id=pending.operation_id, kind=NotificationKind.ASSIGNED, assignment=row
        )
    pending.assigned_to, pending.assigned_group = to_user, to_group
    return Moved(row, replay=False)


def review_assign(
    *, pending: PendingReview, by, to_user=None, to_group: Group | None = None, note: str = "", now=None
) -> Moved:
    """A support lead assigns ``pending`` to one person or one group (``reviews.assign_review``,
    else ``PermissionRefused``), with an optional note. A person away gets it through their
    substitute. Refused (``InvalidInput``, nothing written): a target who could not decide it,
    a review no longer pending. One transaction: the pending review's assignment, its row and
    the ``assigned`` notification; a move to whom it is already on is a replay (``Moved``)."""
    if not can_assign(by):
        raise assign_refusal(by)
    return assignment_move(
        pending=pending,
        kind=AssignmentKind.ASSIGNED,
        by=by,
        to_user=to_user,
        to_group=to_group,
        note=_note(note, required=False),
        now=now or timezone.now(),
    )


def review_hand_over(*, pending: PendingReview, by, to_user, note: str, now=None) -> Moved:
    """A reviewer who may decide ``pending`` hands it over to another reviewer, saying why
    (the note is required). The same rules and transaction as ``review_assign``."""
    reviewer_check(by)
    snapshot = pending.proposal.policy_snapshot
    if not may_decide(groups=reviewer_groups(snapshot.get("parameters")), user=by) or assignee_refusal(
        pending=pending, policy_snapshot=snapshot, reviewer=by
    ):
        raise PermissionRefused(
            f"{text.shown(by.get_username())} may not decide this review, so cannot hand it over; nothing was written"
        )
    if to_user is not None and to_user.pk == by.pk:
        raise InvalidInput("a hand-over goes to somebody else; nothing was written")
    return assignment_move(
        pending=pending,
        kind=AssignmentKind.HANDED_OVER,
        by=by,
        to_user=to_user,
        to_group=None,
        note=_note(note, required=True),
        now=now or timezone.now(),
    )


def assignable_people(snapshot: dict):
    """Who a review under this policy may be assigned or handed to: active users with the
    review permission (through a group or their own) who may decide it, by username."""
    app, codename = REVIEW_PERMISSION.split(".")
    reviewing = Q(groups__permissions__codename=codename, groups__permissions__content_type__app_label=app) | Q(
        user_permissions__codename=codename, user_permissions__content_type__app_label=app
    )
    people = get_user_model().objects.filter(reviewing, is_active=True)
    groups = reviewer_groups(snapshot.get("parameters"))
    if groups:
        people = people.filter(pk__in=get_user_model().objects.filter(groups__name__in=groups).values("pk"))
    return people.distinct().order_by("username")


def assignable_groups(snapshot: dict):
    """The groups a review under this policy may be assigned to: the policy's, or any."""
    groups = reviewer_groups(snapshot.get("parameters"))
    found = Group.objects.order_by("name")
    return found.filter(name__in=groups) if groups else found


# --- what the channels name ----------------------------------------------------------------


def pending_for_move(*, case: Case, operation_id: str) -> PendingReview:
    """The pending review of ``operation_id`` on ``case``, for a channel that names the
    operation it saw (the API, ``manage.py assign``). ``StaleProposal`` when it is not the
    case's current proposal; ``NotFound`` when the case's review was never begun; a review that is
    no longer pending is the move's own refusal."""
    pending = (
        PendingReview.objects.select_related("case", "proposal")
        .filter(case=case, operation_id=str(operation_id))
        .first()
    )
    if pending is not None:
        return pending
    current = case.current_proposal.operation_id if case.current_proposal is not None else None
    if current is not None and current != operation_id:
        raise StaleProposal.superseded(
            operation_id=str(operation_id), case_id=case.case_id, current_operation_id=current
        )
    raise NotFound(
        f"no pending review of {short(operation_id)} on case {case.case_id}: begin it first "
        "(`manage.py begin`, or its first decision); nothing was written"
    )


def move_target(*, to_user: str | None, to_group: str | None):
    """The person and the group a channel names by username and group name; ``InvalidInput``
    (nothing written) for both, neither, or a name that names nobody. Whether the target may
    take the review is the move's own check."""
    if bool(to_user) == bool(to_group):
        raise InvalidInput("name one person or one group to move it to, not both; nothing was written")
    if to_user:
        user = get_user_model().objects.filter(username=to_user).first()
        if user is None:
            raise InvalidInput(f"no user named {text.shown(to_user)}; nothing was written", field="to_user")
        return user, None
    group = Group.objects.filter(name=to_group).first()
    if group is None:
        raise InvalidInput(f"no group named {text.shown(to_group or '')}; nothing was written", field="to_group")
    return None, group


def review_move(
    *, case: Case, operation_id: str, by, to_user: str | None, to_group: str | None, note: str, hand_over: bool
) -> Moved:
    """A move a channel names by operation, username and group name (the API, ``manage.py
    assign``): the review of ``operation_id`` (``pending_for_move``), the target
    (``move_target``), then ``review_hand_over`` or ``review_assign`` with their rules and
    their transaction. A hand-over goes to a person only."""
    pending = pending_for_move(case=case, operation_id=operation_id)
    if hand_over:
        if to_group:
            raise InvalidInput("a hand-over goes to a person, not a group; nothing was written", field="to_group")
        person, _group = move_target(to_user=to_user, to_group=None)
        return review_hand_over(pending=pending, by=by, to_user=person, note=note)
    person, group = move_target(to_user=to_user, to_group=to_group)
    return review_assign(pending=pending, by=by, to_user=person, to_group=group, note=note)
