"""Reviewer groups: a policy that names groups is decided by their members only.

The groups are a parameter of the policy (``reviewer_groups``, cases/models.py), so they are
part of its identity and of every operation prepared under it: the groups that govern a
decision are those of the operation's own policy snapshot, whatever was published since.
A policy without groups is decided by every reviewer, as before groups existed.
"""

from __future__ import annotations

from cases.models import reviewer_groups
from core import text
from core.errors import NotInGroup
from effects.services import reviewer_check


def member_of(user) -> set[str]:
    """The names of the groups ``user`` is in (one query)."""
    if user is None or getattr(user, "pk", None) is None:
        return set()
    return set(user.groups.values_list("name", flat=True))


def may_decide(*, groups: tuple[str, ...], user, member_names: set[str] | None = None) -> bool:
    """Whether ``user`` may decide under a policy naming ``groups``: any reviewer when it names
    none; otherwise a member of one of them. A superuser holds every permission, and may.
    ``member_names``: ``user``'s groups when already read (a list of many rows)."""
    if not groups or getattr(user, "is_superuser", False):
        return True
    return bool((member_of(user) if member_names is None else member_names) & set(groups))


def group_refusal(
    *, policy_snapshot: dict | None, reviewer, operation_id: str, member_names: set[str] | None = None
) -> NotInGroup | None:
    """The refusal a decision on ``operation_id`` by ``reviewer`` would get from the groups of
    the policy it was prepared under (``policy_snapshot``: name, label, parameters), or None."""
    snapshot = policy_snapshot or {}
    groups = reviewer_groups(snapshot.get("parameters"))
    if may_decide(groups=groups, user=reviewer, member_names=member_names):
        return None
    policy = f"{text.shown(snapshot.get('name', ''))} {text.shown(snapshot.get('label', ''))}"
    return NotInGroup.of(
        username=text.shown(reviewer.get_username()), groups=groups, policy=policy, operation_id=operation_id
    )


def group_check(*, policy_snapshot: dict | None, reviewer, operation_id: str) -> None:
    """Raise the groups' refusal, if any. Who lacks the review permission is told that first."""
    if not reviewer_groups((policy_snapshot or {}).get("parameters")):
        return
    reviewer_check(reviewer)
    refusal = group_refusal(policy_snapshot=policy_snapshot, reviewer=reviewer, operation_id=operation_id)
    if refusal is not None:
        raise refusal
