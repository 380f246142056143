"""Every refused edit is audited: one commit attempt row, with its reason and channel, through
every channel that edits (the admin's form, ``POST /api/cases/{id}/edits``, ``manage.py
edit``), as every refused decision is. A row that cannot be written leaves the refusal
standing, counted and logged at ERROR, for edits and decisions alike (``refusal_record``).
"""

from __future__ import annotations

import logging

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError
from django.test import Client
from django.urls import reverse

from core.errors import DecisionflowError, StaleProposal
from effects.models import CommitAttempt
from reviews.models import Channel
from tests.api.conftest import Api
from tests.conftest import case_held_elsewhere, snapshot
from tests.decisionflow.test_observability import delta, metrics

pytestmark = pytest.mark.django_db(transaction=True)

UNKNOWN_OP = "op-v1-" + "0" * 64
REFUSALS = {
    # kind: (the refusal's outcome, its reason, the command's exit code, the API's status)
    "stale": ("stale", "stale_proposal", "stale", 4, 409),
    "no_permission": ("refused", "forbidden", "no_permission", 1, 403),
    "bad_input": ("refused", "invalid_request", "bad_input", 1, 400),
    "busy": ("refused", "case_busy", "busy", 6, 409),
}


def _admin(user, proposal, *, expected, body):
    client = Client()
    client.force_login(user)
    versions = {p["source_id"]: p["version"] for p in proposal.passages}
    data = {
        "expected_operation_id": expected,
        "body": body,
        "source_0": str(versions["HOLD-7"]),
        "source_1": str(versions["KB-311"]),
    }
    return client.post(reverse("admin:reviews_proposal_edit", args=[proposal.pk]), data).status_code


def _api(user, proposal, *, expected, body):
    from api.services import token_create

    api = Api(Client(), token_create(user=user, name="tests")[1])
    return api.post("/api/cases/T-1042/edits", {"expected_operation_id": expected, "body": body}).status_code


def _command(user, proposal, *, expected, body, tmp_path):
    path = tmp_path / "body.txt"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(CommandError) as refused:
        call_command(
            "edit", "T-1042", "--expected-operation-id", expected, "--body-file", str(path), "--editor", user.username
        )
    return refused.value.returncode


CHANNELS = {"admin": (_admin, Channel.ADMIN), "api": (_api, Channel.API), "command": (_command, Channel.COMMAND)}


@pytest.fixture
def begun(case, reviewer):
    from workflow.begin import review_begin

    review_begin(case=case, actor=None)
    case.refresh_from_db()
    return case.current_proposal


@pytest.mark.parametrize("kind", REFUSALS)
@pytest.mark.parametrize("channel", CHANNELS)
def test_each_refused_edit_writes_one_attempt_row(channel, kind, begun, reviewer, lead, settings, tmp_path):
    outcome, code, reason, exit_code, status = REFUSALS[kind]
    send, channel_label = CHANNELS[channel]
    user = lead if kind == "no_permission" else reviewer
    expected = UNKNOWN_OP if kind == "stale" else begun.operation_id
    body = begun.body + ("\nHidden \u202e text." if kind == "bad_input" else "\nSigned, the team.")
    kwargs = {"tmp_path": tmp_path} if channel == "command" else {}
    before, attempts = snapshot(), list(CommitAttempt.objects.values_list("pk", flat=True))
    if kind == "busy":
        settings.DECISIONFLOW_DECISION_LOCK_TIMEOUT = 0.2
        with case_held_elsewhere("T-1042"):
            answered = send(user, begun, expected=expected, body=body, **kwargs)
    else:
        answered = send(user, begun, expected=expected, body=body, **kwargs)

    if channel == "command":
        assert answered == exit_code
    elif channel == "api":
        assert answered == status
    else:
        # The admin answers a refusal on its form page (200), or 403 without the permission.
        assert answered == (403 if kind == "no_permission" else 200)
    assert snapshot() == before  # nothing written but the audit
    (row,) = CommitAttempt.objects.exclude(pk__in=attempts)
    assert (row.outcome, row.reason, row.channel, row.approved) == (outcome, reason, channel_label, None)
    assert row.refused_edit and row.reviewer_id == user.pk and row.case_id == begun.case_id
    assert row.operation_id == expected
    # The refusal's own words once, after the edit marker: no code in front of them.
    assert row.detail.startswith(CommitAttempt.EDIT_DETAIL) and code not in row.detail


def test_the_case_history_calls_a_refused_edit_an_edit(begun, reviewer):
    client = Client()
    client.force_login(reviewer)
    _admin(reviewer, begun, expected=UNKNOWN_OP, body=begun.body + "\nLate.")
    html = client.get(reverse("admin:cases_case_history", args=[begun.case_id])).content.decode()
    assert '<span class="df-kind">edit attempt</span>' in html
    assert '<span class="df-edit-refused">edit</span>' in html
    assert "edit refused, stale: case T-1042 is now at" in html and "stale_proposal" not in html


def _attempt_write_fails(monkeypatch):
    from workflow import decide

    def fails(**_kwargs):
        raise DatabaseError("the attempt table is unavailable")

    monkeypatch.setattr(decide, "attempt_record", fails)


def test_an_edit_refusal_whose_row_cannot_be_written_still_refuses_counts_and_logs(
    begun, reviewer, monkeypatch, caplog
):
    from workflow.edit import review_edit

    _attempt_write_fails(monkeypatch)
    before = metrics()
    with caplog.at_level(logging.WARNING, logger="workflow.decide"), pytest.raises(StaleProposal) as refused:
        review_edit(case=begun.case, expected_operation_id=UNKNOWN_OP, body="New.", editor=reviewer, channel="api")
    assert refused.value.code == "stale_proposal"
    assert delta(before, metrics(), "decisionflow_refusal_unrecorded_total", code="stale_proposal") == 1
    (record,) = [r for r in caplog.records if "has no attempt row" in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert "refused edit" in record.getMessage() and "the attempt table is unavailable" in record.getMessage()
    assert not CommitAttempt.objects.exists()


def test_a_decision_refusal_whose_row_cannot_be_written_still_refuses_counts_and_logs(
    begun, reviewer, monkeypatch, caplog
):
    from workflow.decide import decision_record

    _attempt_write_fails(monkeypatch)
    before = metrics()
    with caplog.at_level(logging.WARNING, logger="workflow.decide"), pytest.raises(DecisionflowError) as refused:
        decision_record(case=begun.case, operation_id=UNKNOWN_OP, approved=True, reviewer=reviewer, channel="api")
    code = refused.value.code
    assert code != DecisionflowError.code  # a refusal, not a failure of ours
    assert delta(before, metrics(), "decisionflow_refusal_unrecorded_total", code=code) == 1
    (record,) = [r for r in caplog.records if "has no attempt row" in r.getMessage()]
    assert record.levelno == logging.ERROR and "refused decision" in record.getMessage()
    assert not CommitAttempt.objects.exists()
