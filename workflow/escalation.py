"""Escalation on breach (docs/QUEUE.md, "Escalation"): what happens to a pending review when it
is at risk and when it is breached, per policy, once per review and step.

The steps are set per policy name in ``DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY``, outside
the policy's identity (they are operational: who to tell, not what is approved):

    {"billing-reply": {"at_risk": "notify:Billing reviewers", "breached": "reassign:Escalations"}}

- ``notify:GROUP``: the step's notification (at risk, breached) goes to the group's members'
  email addresses (and the webhook), through the task workers as every notification does;
- ``reassign:GROUP``: the review moves to the group (an ``escalated`` assignment, by the
  system); a group that could not decide it under the policy's groups is refused, and the
  refusal is what the step records;
- ``expire`` (breached only): the fail-closed expiry of ``sla_report --expire``, declined as
  the system actor ``sla-expiry``.

``sla_report`` (cron) and every task worker (``manage.py db_worker``, ``escalation_sweep``)
run the due steps. Each step is written once per review: a
``ReviewEscalation`` row, unique on (operation, step), inserted in the same transaction as
what the step does (the move, the notification row), so of two runs at once exactly one
escalates and the other finds the row and does nothing. The expiry is a decision, once per
operation by its own key; its row is written after it, and only once too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from core.errors import DecisionflowError, OutcomeUncertain
from effects.services import CONFLICTING
from reviews import notifications
from reviews.models import (
    AssignmentKind,
    EscalationAction,
    EscalationStep,
    NotificationKind,
    PendingReview,
    ReviewEscalation,
)
from workflow import queue
from workflow.assignment import assignment_move, target_check

SETTING = "DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY"
_KIND: dict[str, NotificationKind] = {
    EscalationStep.AT_RISK: NotificationKind.AT_RISK,
    EscalationStep.BREACHED: NotificationKind.BREACHED,
}


@dataclass(frozen=True)
class Escalation:
    action: EscalationAction
    group: str  # "" for expire

    @property
    def label(self) -> str:
        return f"{self.action}:{self.group}" if self.group else str(self.action)


def _parse(name: str, step: str, value: object) -> Escalation:
    where = f"{SETTING}[{name!r}][{step!r}]"
    if not isinstance(value, str):
        raise ImproperlyConfigured(f"{where}: {value!r} must be a string: notify:GROUP, reassign:GROUP or expire")
    action, _, group = value.partition(":")
    if action == EscalationAction.EXPIRE and not group:
        if step != EscalationStep.BREACHED:
            raise ImproperlyConfigured(f"{where}: expire is a step of breached only (an at-risk review still has time)")
        return Escalation(EscalationAction.EXPIRE, "")
    if action in (EscalationAction.NOTIFY, EscalationAction.REASSIGN) and group.strip() == group and group:
        return Escalation(EscalationAction(action), group)
    raise ImproperlyConfigured(f"{where}: {value!r} is not notify:GROUP, reassign:GROUP or expire")


def escalation_plan() -> dict[str, dict[str, Escalation]]:
    """Policy name -> step -> what it does; ``ImproperlyConfigured`` names a wrong entry."""
    raw = getattr(settings, SETTING, {}) or {}
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"{SETTING}: must be a JSON object of policy name -> steps")
    plan: dict[str, dict[str, Escalation]] = {}
    for name, steps in raw.items():
        if not isinstance(steps, dict) or not steps or set(steps) - set(EscalationStep.values):
            raise ImproperlyConfigured(
                f"{SETTING}[{name!r}]: must be an object with at_risk and/or breached, not {steps!r}"
            )
        plan[str(name)] = {step: _parse(str(name), step, value) for step, value in steps.items()}
    return plan


def _due(name: str, step: str, now: datetime):
    """The pending reviews of policy ``name`` past ``step`` and not yet escalated for it. At
    risk is due from the at-risk point on (a review that went straight past it to breached,
    between two runs, still gets it, first)."""
    done = ReviewEscalation.objects.filter(operation_id=OuterRef("operation_id"), step=step)
    reached = queue.sla_q(queue.SlaState.BREACHED, now)
    if step == EscalationStep.AT_RISK:
        reached |= queue.sla_q(queue.SlaState.AT_RISK, now)
    return (
        queue.review_queue()
        .filter(case__policy__name=name)
        .filter(reached)
        .filter(~Exists(done))
        .select_related("case", "proposal")
        .defer("proposal__body", "proposal__passages", "proposal__findings")
    )


@dataclass(frozen=True)
class Escalated:
    case_id: str
    operation_id: str
    step: str
    escalation: Escalation
    outcome: str  # ReviewEscalation.Outcome, or "already" when another run wrote it first
    detail: str

    def as_dict(self) -> dict:
        return {
            "case": self.case_id,
            "operation_id": self.operation_id,
            "step": self.step,
            "escalation": self.escalation.label,
            "outcome": self.outcome,
            "detail": self.detail,
        }


def review_escalate(*, pending: PendingReview, step: str, escalation: Escalation, now=None) -> Escalated:
    """Do ``escalation`` for ``pending`` at ``step``, once: the ``ReviewEscalation`` row's key
    (operation, step) is the atomic step. Returns what happened; ``outcome`` "already" when
    another run (or worker) escalated this review at this step first, and then nothing is
    written. One transaction for notify and reassign (the row and the move or notification);
    the expiry is the review core's commit, then its row."""
    now = now or timezone.now()
    if escalation.action == EscalationAction.EXPIRE:
        return _expire(pending, step, escalation, now)
    outcome, detail = ReviewEscalation.Outcome.DONE, ""
    group = Group.objects.filter(name=escalation.group).first()
    if group is None:
        outcome, detail = ReviewEscalation.Outcome.REFUSED, f"no such group: {escalation.group}"
    elif escalation.action == EscalationAction.REASSIGN:
        try:
            target_check(snapshot=pending.proposal.policy_snapshot, to_user=None, to_group=group)
        except DecisionflowError as exc:
            outcome, detail = ReviewEscalation.Outcome.REFUSED, exc.message
    notifying = outcome == ReviewEscalation.Outcome.DONE and escalation.action == EscalationAction.NOTIFY
    if notifying and not notifications.channels():
        detail = "no notification channel is configured: nothing was sent"
    try:
        with transaction.atomic():
            # The key first: of two runs at once, the second waits here and then writes nothing.
            row = _row(pending, step, escalation, outcome, detail, now)
            if outcome == ReviewEscalation.Outcome.DONE:
                if escalation.action == EscalationAction.REASSIGN:
                    assignment_move(
                        pending=pending,
                        kind=AssignmentKind.ESCALATED,
                        by=None,
                        to_user=None,
                        to_group=group,
                        note=f"{step.replace('_', ' ')}: escalated to {escalation.group}",
                        now=now,
                    )
                else:
                    notifications.notify(
                        case=pending.case, operation_id=pending.operation_id, kind=_KIND[step], group=escalation.group
                    )
    except IntegrityError:
        return _already(pending, step, escalation)
    except DecisionflowError as exc:
        # The review was decided or superseded in between: nothing was written; the next
        # run does not find it pending.
        return Escalated(pending.case.case_id, pending.operation_id, step, escalation, "not_pending", exc.message)
    return Escalated(pending.case.case_id, pending.operation_id, step, escalation, row.outcome, row.detail)


def _row(pending, step, escalation, outcome, detail, now) -> ReviewEscalation:
    return ReviewEscalation.objects.create(
        pending_review_id=pending.pk,
        case_id=pending.case_id,
        operation_id=pending.operation_id,
        step=step,
        action=escalation.action,
        group=escalation.group,
        outcome=outcome,
        detail=detail,
        at=now,
    )


def _already(pending, step, escalation) -> Escalated:
    return Escalated(pending.case.case_id, pending.operation_id, step, escalation, "already", "")


def _expire(pending, step, escalation, now) -> Escalated:
    try:
        result = queue.review_expire(pending=pending)
    except OutcomeUncertain as exc:
        # Neither expired nor not: no row, so the next run tries again (a replay if it had).
        return Escalated(pending.case.case_id, pending.operation_id, step, escalation, "uncertain", exc.message)
    except DecisionflowError as exc:
        outcome, detail = ReviewEscalation.Outcome.REFUSED, exc.message
    else:
        if result.status == CONFLICTING:
            outcome, detail = ReviewEscalation.Outcome.REFUSED, "already approved: the approval stands"
        else:
            outcome, detail = (
                ReviewEscalation.Outcome.DONE,
                "declined as expired" + (" (a replay)" if result.replay else ""),
            )
    try:
        with transaction.atomic():
            row = _row(pending, step, escalation, outcome, detail, now)
    except IntegrityError:
        return _already(pending, step, escalation)
    return Escalated(pending.case.case_id, pending.operation_id, step, escalation, row.outcome, row.detail)


def escalate_due(now: datetime | None = None):
    """Every due step of every configured policy, at risk before breached: yields what each
    did. Run by ``sla_report`` and, through ``escalation_sweep``, by the task workers."""
    now = now or timezone.now()
    plan = escalation_plan()
    for step in (EscalationStep.AT_RISK, EscalationStep.BREACHED):
        for name, steps in plan.items():
            escalation = steps.get(step)
            if escalation is None:
                continue
            for pending in _due(name, step, now).iterator(chunk_size=500):
                yield review_escalate(pending=pending, step=step, escalation=escalation, now=now)


def escalation_sweep(now: datetime | None = None) -> dict[str, int]:
    """The task workers' round (``manage.py db_worker``): every due step, as ``sla_report``
    takes them, counted by outcome (done, refused, already, not_pending, uncertain). No lock:
    a worker and cron, or two workers, at once escalate each review and step once."""
    counts: dict[str, int] = {}
    for done in escalate_due(now):
        counts[done.outcome] = counts.get(done.outcome, 0) + 1
    return counts
