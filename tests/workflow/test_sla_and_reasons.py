"""Escalation and decline reasons through the CLI: the SLA report's exit
codes, expiry under the fail-closed policy (SQLite and PostgreSQL alike), the database's
rule that only the system actor declines as expired, and `resume --decline --reason`."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction
from django.utils import timezone

from cases.services import case_import
from effects.models import CommitAttempt, EffectRecord
from reviews.models import PendingReview, ReviewDecision
from tests.conftest import commit_lost, load_fixture
from workflow import queue
from workflow.begin import review_begin

pytestmark = pytest.mark.django_db


def run(*argv) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command(*argv, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), err.getvalue() or str(exc)
    return 0, out.getvalue(), err.getvalue()


@pytest.fixture
def begun(case, reviewer):
    return review_begin(case=case, actor=reviewer).pending_review


def age(pending: PendingReview, hours: float) -> None:
    PendingReview.objects.filter(pk=pending.pk).update(created_at=timezone.now() - timedelta(hours=hours))


def test_no_breach_exits_0_and_a_breach_exits_10(begun, settings):
    settings.DECISIONFLOW_REVIEW_SLA = "4h"
    assert run("sla_report") == (0, "sla_report: summary: 1 pending review(s): within 1, at_risk 0, breached 0\n", "")
    age(begun, 5)
    code, out, err = run("sla_report")
    assert code == 10, err
    assert out.startswith("breached: case=T-1042 op=op-v1-") and "action=reported" in out
    assert err.strip() == "sla_report: 1 review(s) past their SLA target"
    code, out, _ = run("sla_report", "--json")
    row, summary = map(json.loads, out.splitlines())
    assert summary["summary"] == "sla_report"
    assert (code, row["case"], row["target_seconds"], row["on_breach"], row["action"]) == (
        10,
        "T-1042",
        4 * 3600,
        "stay_pending",
        "reported",
    )
    assert row["age_seconds"] >= 5 * 3600
    # Stays pending: nothing was decided.
    assert not ReviewDecision.objects.exists()
    begun.refresh_from_db()
    assert begun.status == "pending"


def test_fail_closed_declines_as_expired_by_the_system_actor(begun, settings, client, reviewer):
    settings.DECISIONFLOW_REVIEW_SLA = "4h"
    settings.DECISIONFLOW_REVIEW_ON_BREACH = "decline"
    age(begun, 5)
    # A dry run unless told to act.
    code, out, _ = run("sla_report")
    assert code == 10 and "action=would_expire" in out
    assert not ReviewDecision.objects.exists()

    code, out, _ = run("sla_report", "--expire")
    assert code == 10 and "action=expired" in out
    decision = ReviewDecision.objects.get()
    assert (decision.approved, decision.decline_reason, decision.system_actor) == (False, "expired", "sla-expiry")
    assert decision.reviewer.get_username() == queue.SYSTEM_USERNAME
    assert not decision.reviewer.is_active and not decision.reviewer.has_usable_password()
    assert not EffectRecord.objects.exists()
    begun.refresh_from_db()
    assert begun.status == "completed"
    attempt = CommitAttempt.objects.get()
    assert (attempt.outcome, attempt.channel, attempt.decline_reason) == ("declined", "system", "expired")
    # Nothing is left past its target: the next cron run exits 0, with its summary only.
    assert run("sla_report", "--expire") == (
        0,
        "sla_report: summary: 0 pending review(s): within 0, at_risk 0, breached 0\n",
        "",
    )
    # The history says the system declined it, not a person.
    client.force_login(reviewer)
    history = client.get(f"/admin/cases/case/{begun.case_id}/history/").content.decode()
    assert "the system (SLA expiry (fail closed))</strong>, not a person" in history
    # A reviewer's approval afterwards is a conflict, never an update.
    from core.errors import ConflictingDecision
    from workflow.decide import decision_record

    with pytest.raises(ConflictingDecision):
        decision_record(
            case=begun.case, operation_id=begun.operation_id, approved=True, reviewer=reviewer, channel="admin"
        )


def test_a_person_who_decided_first_wins_over_the_expiry(begun, settings, reviewer):
    settings.DECISIONFLOW_REVIEW_ON_BREACH = "decline"
    from effects.services import effect_commit

    effect_commit(operation_id=begun.operation_id, approved=True, reviewer=reviewer)
    # Decided reviews are not pending any more, so nothing is listed; and the expiry itself,
    # called on the same review, is a conflict that writes no decision.
    begun.refresh_from_db()
    result = queue.review_expire(pending=begun)
    assert result.status == "ConflictingDecision"
    assert ReviewDecision.objects.get().approved is True


def test_policy_setting_per_policy(begun, settings):
    settings.DECISIONFLOW_REVIEW_SLA = "4h"
    settings.DECISIONFLOW_REVIEW_ON_BREACH = "stay_pending"
    settings.DECISIONFLOW_REVIEW_ON_BREACH_BY_POLICY = {begun.case.policy.name: "decline"}
    settings.DECISIONFLOW_REVIEW_SLA_BY_POLICY = {begun.case.policy.name: "30m"}
    age(begun, 1)
    code, out, _ = run("sla_report", "--expire")
    assert code == 10 and "target=1800s" in out and "action=expired" in out


def test_the_database_allows_no_other_automatic_decision(proposal, reviewer):
    base = {"operation_id": proposal.operation_id, "proposal": proposal, "reviewer": reviewer}
    refused = [
        {"approved": False, "decline_reason": "expired"},  # a person declining as expired
        {"approved": True, "system_actor": "sla-expiry", "decline_reason": "expired"},  # an automatic approval
        {"approved": False, "system_actor": "sla-expiry", "decline_reason": "tone"},  # the system, another reason
        {"approved": False, "system_actor": "sla-expiry"},  # the system, no reason
        {"approved": True, "decline_reason": "tone"},  # a reason on an approval
        {"approved": False, "decline_reason": "bored"},  # not a reason at all
        {"approved": False, "system_actor": "someone", "decline_reason": "expired"},  # not a system actor
        {"approved": False, "decline_reason": "withdrawn"},  # a person withdrawing
        {"approved": False, "system_actor": "pipeline-withdraw", "decline_reason": "expired"},  # another's reason
        {"approved": False, "system_actor": "sla-expiry", "decline_reason": "withdrawn"},  # likewise
        {"approved": True, "system_actor": "pipeline-withdraw", "decline_reason": "withdrawn"},  # an approval
    ]
    for fields in refused:
        with pytest.raises(IntegrityError), transaction.atomic():
            ReviewDecision.objects.create(**base, **fields)
    ReviewDecision.objects.create(**base, approved=False, system_actor="sla-expiry", decline_reason="expired")


def test_the_service_refuses_a_system_reason_from_a_person(begun, reviewer):
    from core.errors import InvalidInput
    from workflow.decide import decision_record

    for fields in ({"decline_reason": "expired"}, {"decline_reason": "withdrawn"}, {"decline_reason": "nope"}):
        with pytest.raises(InvalidInput):
            decision_record(
                case=begun.case,
                operation_id=begun.operation_id,
                approved=False,
                reviewer=reviewer,
                channel="command",
                **fields,
            )
    with pytest.raises(InvalidInput, match="decline only"):
        decision_record(
            case=begun.case,
            operation_id=begun.operation_id,
            approved=True,
            reviewer=reviewer,
            channel="command",
            decline_reason="tone",
        )
    assert not ReviewDecision.objects.exists()
    assert CommitAttempt.objects.filter(outcome="refused", reason="bad_input").count() == 4


def test_resume_decline_takes_a_reason_and_reconcile_json_returns_it(begun, reviewer):
    op = begun.operation_id
    decline = ["resume", "T-1042", "--operation-id", op, "--decline", "--reviewer", "reviewer"]
    code, out, err = run(*decline, "--reason", "wrong_facts", "--note", "the hold is 7 days")
    assert code == 0, err
    assert '"Status":"Declined","Replay":false' in out
    code, out, err = run(*decline, "--reason", "policy")
    assert code == 0 and '"Replay":true' in out, err
    decision = ReviewDecision.objects.get()
    assert (decision.decline_reason, decision.decline_note) == ("wrong_facts", "the hold is 7 days")
    assert list(CommitAttempt.objects.order_by("id").values_list("outcome", "decline_reason")) == [
        ("declined", "wrong_facts"),
        ("replay", "policy"),
    ]
    code, out, _ = run("reconcile", "T-1042", "--json")
    assert json.loads(out) == {
        "case": "T-1042",
        "operation_id": op,
        "state": "Declined",
        "effects": 0,
        "decline_reason": "wrong_facts",
    }
    # An unknown reason is a usage error: nothing runs.
    code, _, err = run(*decline, "--reason", "expired")
    assert code == 1 and "invalid choice" in err
    assert ReviewDecision.objects.count() == 1 and CommitAttempt.objects.count() == 2


def test_sla_report_prints_one_summary_line_on_every_run(case, reviewer, settings):
    """Within, at risk and breached counted on each run, nothing breached included; with
    --json the summary is one more JSON object, told apart by its "summary" key."""
    settings.DECISIONFLOW_REVIEW_SLA = "4h"
    assert run("sla_report") == (0, "sla_report: summary: 0 pending review(s): within 0, at_risk 0, breached 0\n", "")
    code, out, err = run("sla_report", "--json")
    assert (code, err) == (0, "")
    assert [json.loads(line) for line in out.splitlines()] == [
        {"summary": "sla_report", "pending": 0, "states": {"within": 0, "at_risk": 0, "breached": 0}, "actions": {}}
    ]
    others = [case_import(data=load_fixture(name)).case for name in ("t1077.json", "t1103.json")]
    pendings = [review_begin(case=c, actor=reviewer).pending_review for c in (case, *others)]
    for pending, hours in zip(pendings, (1, 3.5, 5), strict=True):  # within, at risk, breached
        age(pending, hours)
    code, out, _ = run("sla_report")
    assert code == 10
    assert (
        out.splitlines()[-1] == "sla_report: summary: 3 pending review(s): within 1, at_risk 1, breached 1; reported 1"
    )
    code, out, _ = run("sla_report", "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line.get("summary") for line in lines] == [None, "sla_report"]
    assert lines[-1] == {
        "summary": "sla_report",
        "pending": 3,
        "states": {"within": 1, "at_risk": 1, "breached": 1},
        "actions": {"reported": 1},
    }
    # Fail closed, with --expire: the counts are those the run found; the action says what it did.
    settings.DECISIONFLOW_REVIEW_ON_BREACH = "decline"
    code, out, _ = run("sla_report", "--expire")
    assert (
        out.splitlines()[-1] == "sla_report: summary: 3 pending review(s): within 1, at_risk 1, breached 1; expired 1"
    )
    assert run("sla_report")[1] == "sla_report: summary: 2 pending review(s): within 1, at_risk 1, breached 0\n"


def test_sla_report_help():
    with pytest.raises(SystemExit) as exc:
        call_command("sla_report", "--help")
    assert exc.value.code == 0


@pytest.mark.django_db(transaction=True)
def test_an_expiry_whose_commit_fails_is_reported_uncertain(case, reviewer, settings, monkeypatch):
    """Neither "expired" nor "not expired": the commit may have been applied."""
    settings.DECISIONFLOW_REVIEW_SLA = "4h"
    settings.DECISIONFLOW_REVIEW_ON_BREACH = "decline"
    pending = review_begin(case=case, actor=reviewer).pending_review
    age(pending, 5)
    queue.system_actor_user()  # its get_or_create commits too: made here, before the fault
    with commit_lost(times=1) as failures:  # the expiry's commit; every later one goes through
        code, out, _ = run("sla_report", "--expire")
    assert failures, "the expiry never reached its commit"
    assert code == 10 and "action=uncertain (outcome_uncertain: run `manage.py reconcile`)" in out
    assert "action=expired" not in out and "not_expired" not in out
    # Here nothing was applied: still pending, and the next run expires it.
    code, out, _ = run("sla_report", "--expire")
    assert code == 10 and "action=expired" in out
    assert ReviewDecision.objects.get().decline_reason == "expired"
