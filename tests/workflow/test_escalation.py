"""Escalation on breach: per policy, at risk and breached notify a group, reassign to a group,
or expire (fail closed); written once per review and step, run twice and concurrently.

T-1077's billing-reply names "Billing reviewers"; T-1042's support-reply names no group.
"""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse
from django.utils import timezone

from cases.services import case_import
from reviews.models import (
    Notification,
    PendingReview,
    ReviewAssignment,
    ReviewDecision,
    ReviewEscalation,
)
from tests.conftest import load_fixture, race
from workflow.begin import review_begin
from workflow.escalation import Escalation, escalate_due, escalation_plan, review_escalate

BILLING = "Billing reviewers"


def begun(name: str = "t1042.json", *, hours: float = 0, case_id: str | None = None) -> PendingReview:
    data = load_fixture(name)
    if case_id:
        data["case_id"] = case_id
    pending = review_begin(case=case_import(data=data).case).pending_review
    PendingReview.objects.filter(pk=pending.pk).update(created_at=timezone.now() - timedelta(hours=hours))
    return PendingReview.objects.select_related("case", "proposal").get(pk=pending.pk)


@pytest.fixture
def escalating(settings, make_user):
    settings.DECISIONFLOW_REVIEW_SLA = "4h"
    Group.objects.get_or_create(name="Escalations")
    settings.DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY = {
        "support-reply": {"at_risk": "notify:Escalations", "breached": "reassign:Escalations"},
        "billing-reply": {"breached": "expire"},
    }
    return settings


def sla_report(*args) -> tuple[int, list[str]]:
    out = io.StringIO()
    try:
        call_command("sla_report", *args, stdout=out, stderr=io.StringIO())
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return code, out.getvalue().splitlines()


# --- the settings ---------------------------------------------------------------------------


def test_the_plan_is_read_and_a_wrong_entry_is_named(settings):
    settings.DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY = {"p": {"at_risk": "notify:Team A", "breached": "expire"}}
    plan = escalation_plan()
    assert plan["p"]["at_risk"] == Escalation("notify", "Team A") and plan["p"]["breached"].label == "expire"
    for bad, said in (
        ({"p": {"at_risk": "expire"}}, "expire is a step of breached only"),
        ({"p": {"breached": "approve"}}, "is not notify:GROUP, reassign:GROUP or expire"),
        ({"p": {"breached": "notify:"}}, "is not notify:GROUP"),
        ({"p": {"soon": "notify:A"}}, "must be an object with at_risk and/or breached"),
        ({"p": {"breached": 3}}, "must be a string"),
    ):
        settings.DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY = bad
        with pytest.raises(ImproperlyConfigured, match=said):
            escalation_plan()


# --- each action --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_at_risk_notifies_the_group_and_breached_reassigns_to_it(escalating, make_user):
    member = make_user("esc", billing_reviewer=False)
    member.email = "esc@example.test"
    member.save()
    member.groups.add(Group.objects.get(name="Escalations"))
    escalating.DECISIONFLOW_NOTIFY_EMAIL_TO = ["leads@example.test"]
    at_risk = begun(hours=3.5)
    done = list(escalate_due())
    assert [(d.step, d.escalation.label, d.outcome) for d in done] == [("at_risk", "notify:Escalations", "done")]
    notification = Notification.objects.exclude(kind="review_begun").get(operation_id=at_risk.operation_id)
    assert (notification.kind, notification.group) == ("at_risk", "Escalations")
    from reviews.notifications import recipients

    assert recipients(notification.operation_id, notification.group) == ["esc@example.test"]
    # Later, breached: reassigned to the group (by the system), once.
    PendingReview.objects.filter(pk=at_risk.pk).update(created_at=timezone.now() - timedelta(hours=5))
    done = list(escalate_due())
    assert [(d.step, d.outcome) for d in done] == [("breached", "done")]
    move = ReviewAssignment.objects.get()
    assert (move.kind, move.by, move.to_group, move.note) == (
        "escalated",
        None,
        "Escalations",
        "breached: escalated to Escalations",
    )
    assert list(escalate_due()) == []  # nothing is due twice


@pytest.mark.django_db
def test_a_review_past_both_points_gets_at_risk_first_then_breached(escalating):
    begun(hours=9)
    assert [d.step for d in escalate_due()] == ["at_risk", "breached"]


@pytest.mark.django_db
def test_expire_declines_as_the_system_and_a_reassign_outside_the_groups_is_refused(escalating):
    escalating.DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY = {
        "billing-reply": {"at_risk": "reassign:Escalations", "breached": "expire"}
    }
    pending = begun("t1077.json", hours=5)
    done = {d.step: d for d in escalate_due()}
    # billing-reply is decided by Billing reviewers only: a move never widens that.
    assert done["at_risk"].outcome == "refused" and "decided by Billing reviewers only" in done["at_risk"].detail
    assert done["breached"].outcome == "done" and done["breached"].detail == "declined as expired"
    decision = ReviewDecision.objects.get(operation_id=pending.operation_id)
    assert (decision.approved, decision.system_actor, decision.decline_reason) == (False, "sla-expiry", "expired")
    assert not ReviewAssignment.objects.exists()


# --- once: twice, then concurrently ----------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("step,action", [("at_risk", "notify:Escalations"), ("breached", "reassign:Escalations")])
def test_the_same_step_twice_is_written_once(escalating, step, action):
    escalating.DECISIONFLOW_NOTIFY_EMAIL_TO = ["leads@example.test"]
    pending = begun(hours=5)
    escalation = Escalation(*action.split(":"))
    first = review_escalate(pending=pending, step=step, escalation=escalation)
    again = review_escalate(pending=pending, step=step, escalation=escalation)
    assert (first.outcome, again.outcome) == ("done", "already")
    assert ReviewEscalation.objects.count() == 1
    assert ReviewAssignment.objects.count() == (1 if action.startswith("reassign") else 0)
    # (its begin's own "review begun" aside): the step's, or the move's to the group's members
    told = list(Notification.objects.exclude(kind="review_begun").values_list("kind", flat=True))
    assert told == {"notify": [step], "reassign": ["assigned"]}.get(action.split(":")[0], []), told


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
@pytest.mark.parametrize("action", ["notify:Escalations", "reassign:Escalations", "expire"])
def test_sixteen_workers_at_once_escalate_once(escalating, action):
    escalating.DECISIONFLOW_NOTIFY_EMAIL_TO = ["leads@example.test"]
    pending = begun(hours=5)
    escalation = Escalation(*action.split(":")) if ":" in action else Escalation("expire", "")

    def worker():
        mine = PendingReview.objects.select_related("case", "proposal").get(pk=pending.pk)
        return review_escalate(pending=mine, step="breached", escalation=escalation).outcome

    step = "breached"
    results, errors = race([worker] * 16)
    assert not errors, errors
    assert sorted(results).count("done") == 1 and set(results) <= {"done", "already"}, results
    assert ReviewEscalation.objects.count() == 1
    assert ReviewAssignment.objects.count() == (1 if action.startswith("reassign") else 0)
    # (its begin's own "review begun" aside): the step's, or the move's to the group's members
    told = list(Notification.objects.exclude(kind="review_begun").values_list("kind", flat=True))
    assert told == {"notify": [step], "reassign": ["assigned"]}.get(action.split(":")[0], []), told
    assert ReviewDecision.objects.count() == (1 if action == "expire" else 0)


# --- the report, the queue, the history -------------------------------------------------------


@pytest.mark.django_db
def test_sla_report_says_each_escalation_and_a_second_run_none(escalating):
    begun(hours=3.5, case_id="E-RISK")
    begun(hours=5, case_id="E-LATE")
    code, lines = sla_report()
    escalated = [line for line in lines if line.startswith("escalated:")]
    assert len(escalated) == 3, lines  # E-RISK at risk; E-LATE at risk, then breached
    assert any(
        "case=E-LATE" in line and "step=breached escalation=reassign:Escalations outcome=done" in line
        for line in escalated
    )
    assert any("no notification channel is configured" in line for line in escalated)
    assert lines[-1].endswith("; escalations done 3") and code == 10
    code, lines = sla_report("--json")
    assert not [line for line in lines if '"escalation"' in line]
    assert "escalations" not in json.loads(lines[-1])


@pytest.mark.django_db
def test_the_queue_and_the_history_show_each_escalation(escalating, make_user):
    pending = begun(hours=5)
    list(escalate_due())
    from django.test import Client

    client = Client()
    client.force_login(make_user("lead", group="leads"))
    queue = client.get(reverse("admin:reviews_reviewqueueitem_changelist")).content.decode()
    assert '<span class="df-escalated df-escalated-done">breached: reassigned to Escalations</span>' in queue
    history = client.get(reverse("admin:cases_case_history", args=[pending.case_id])).content.decode()
    assert history.count('<li class="df-ev-escalation">') == 2
    assert "at risk: <strong>notify a group</strong> (Escalations)" in history
    assert '<span class="df-kind">escalated</span>' in history  # the move itself


# --- the task workers run it too -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_task_workers_at_once_escalate_each_review_and_step_once(escalating):
    """Two real ``manage.py db_worker --batch`` processes, started together, each take the due
    steps once at start: one row per (review, step), one move, whoever got there first."""
    import subprocess

    from tests.workflow.conftest import child_env, manage_argv

    late = begun(hours=5, case_id="W-LATE")
    env = child_env(
        DECISIONFLOW_REVIEW_SLA="4h",
        DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY=json.dumps(escalating.DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY),
    )
    argv = manage_argv("db_worker", "--batch", "--no-startup-delay", "--no-reload", "-v0")
    workers = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    for worker in workers:
        _out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err.decode()
    steps = sorted(ReviewEscalation.objects.filter(operation_id=late.operation_id).values_list("step", "outcome"))
    assert steps == [("at_risk", "done"), ("breached", "done")]
    assert list(ReviewAssignment.objects.values_list("kind", "to_group")) == [("escalated", "Escalations")]
    # Then cron finds nothing left to do.
    code, lines = sla_report()
    assert not [line for line in lines if line.startswith("escalated:")]


def test_a_worker_without_escalations_configured_takes_none(settings):
    from workflow.workers import _sweeps

    settings.DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY = {}
    assert "escalation" not in [name for name, _interval, _sweep in _sweeps()]
    settings.DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY = {"support-reply": {"breached": "expire"}}
    settings.DECISIONFLOW_ESCALATION_SWEEP_INTERVAL = 7
    assert ("escalation", 7.0) in [(name, interval) for name, interval, _sweep in _sweeps()]
