"""POST /api/cases/{id}/withdraw: the pipeline withdraws a pending review because its ticket
was closed elsewhere (docs/INTAKE.md, "Withdrawals"). Once, twice and, on PostgreSQL,
concurrently with an approval."""

from __future__ import annotations

import json
import threading

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.urls import reverse

from core.identity import short
from effects.models import CommitAttempt, EffectRecord
from reviews.models import PendingReview, ReviewDecision
from tests.api.conftest import Api, assert_error
from tests.conftest import load_fixture, snapshot
from tests.reliability.conftest import command

REASON = "ticket closed in the helpdesk"


def withdraw(api, case, body=None, *, key=None, **fields):
    body = body if body is not None else {"operation_id": case.current_proposal.operation_id, **fields}
    headers = {"Idempotency-Key": key} if key else None
    return api.post(f"/api/cases/{case.case_id}/withdraw", body, headers=headers)


def approve(api, case):
    op = case.current_proposal.operation_id
    return api.post(f"/api/cases/{case.case_id}/decision", {"operation_id": op, "approved": True})


def test_a_withdrawal_declines_the_review_as_withdrawn_by_the_pipeline(pipeline_api, demo_case):
    op = demo_case.current_proposal.operation_id
    response = withdraw(pipeline_api, demo_case, reason=REASON)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["replay"], body["operation_id"], body["decline_reason"]) == (
        "Declined",
        False,
        op,
        "withdrawn",
    )
    assert body["decision"]["system_actor"] == "pipeline-withdraw" and body["decision"]["reviewer"] == "pipeline"
    assert body["decision"]["decline_note"] == REASON and body["decision"]["approved"] is False
    decision = ReviewDecision.objects.get()
    assert (decision.approved, decision.decline_reason, decision.system_actor, decision.reviewer.username) == (
        False,
        "withdrawn",
        "pipeline-withdraw",
        "pipeline",
    )
    assert PendingReview.objects.get().status == PendingReview.Status.COMPLETED
    assert not EffectRecord.objects.exists()
    attempt = CommitAttempt.objects.get()
    assert (attempt.outcome, attempt.channel, attempt.decline_reason, attempt.decline_note) == (
        "declined",
        "api",
        "withdrawn",
        REASON,
    )
    # The operation's own read says so too.
    looked_up = pipeline_api.get(f"/api/operations/{op}").json()
    assert looked_up["state"] == "Declined" and looked_up["decision"]["decline_reason"] == "withdrawn"


def test_the_same_withdrawal_again_is_a_replay_and_writes_no_decision(pipeline_api, demo_case):
    first = withdraw(pipeline_api, demo_case, reason=REASON).json()
    before = snapshot()
    again = withdraw(pipeline_api, demo_case, reason="another note")
    assert again.status_code == 200
    body = again.json()
    assert body["replay"] is True and body["status"] == "Declined"
    # The first withdrawal stands, its note with it.
    assert body["decision"] == first["decision"]
    assert snapshot() == before
    assert list(CommitAttempt.objects.order_by("id").values_list("outcome", flat=True)) == ["declined", "replay"]


def test_an_approval_after_a_withdrawal_is_409_withdrawn_naming_when_and_why(pipeline_api, api, demo_case):
    withdraw(pipeline_api, demo_case, reason=REASON)
    before = snapshot()
    body = assert_error(approve(api, demo_case), 409, "withdrawn")
    decision = ReviewDecision.objects.get()
    assert body["message"].startswith("withdrawn: ") and "withdrawn by the pipeline (pipeline) at " in body["message"]
    assert f"{decision.decided_at:%Y-%m-%d %H:%M:%S} UTC: {REASON}" in body["message"]
    assert "no decision or effect was written" in body["message"]
    assert body["operation_id"] == demo_case.current_proposal.operation_id
    assert snapshot() == before and not EffectRecord.objects.exists()
    assert CommitAttempt.objects.order_by("id").last().outcome == "conflict"
    # A person's decline after it is a replay, as after any decline: the withdrawal stands.
    op = demo_case.current_proposal.operation_id
    declined = api.post(f"/api/cases/{demo_case.case_id}/decision", {"operation_id": op, "approved": False})
    assert declined.status_code == 200 and declined.json()["replay"] is True
    assert declined.json()["decline_reason"] == "withdrawn"
    # The command line says the same, with its own exit code.
    code, out, err = command("resume", demo_case.case_id, "--operation-id", op, "--approve", "--reviewer", "reviewer")
    assert code == 9 and err.startswith("withdrawn: ") and '"Status":"ConflictingDecision"' in out


def test_a_stale_operation_is_409_naming_the_current_one(pipeline_api, demo_case, reviewer):
    from workflow.edit import review_edit

    old = demo_case.current_proposal
    review_edit(case=demo_case, expected_operation_id=old.operation_id, body=old.body + "\n\nP.S.", editor=reviewer)
    demo_case.refresh_from_db()
    before = snapshot()
    body = assert_error(withdraw(pipeline_api, demo_case, {"operation_id": old.operation_id}), 409, "stale_proposal")
    assert body["current_operation_id"] == demo_case.current_proposal.operation_id
    assert snapshot() == before
    assert CommitAttempt.objects.order_by("id").last().outcome == "stale"


def test_an_approved_case_is_409_conflicting_decision_and_a_declined_one_a_replay(pipeline_api, api, demo_case):
    assert approve(api, demo_case).status_code == 200
    before = snapshot()
    body = assert_error(withdraw(pipeline_api, demo_case, reason=REASON), 409, "conflicting_decision")
    assert "already approved by reviewer" in body["message"]
    assert snapshot() == before and ReviewDecision.objects.get().approved is True


def test_a_case_a_person_declined_answers_their_decline_as_a_replay(pipeline_api, api, demo_case):
    op = demo_case.current_proposal.operation_id
    api.post(f"/api/cases/{demo_case.case_id}/decision", {"operation_id": op, "approved": False, "reason": "tone"})
    before = snapshot()
    body = withdraw(pipeline_api, demo_case).json()
    assert (body["replay"], body["decline_reason"], body["decision"]["system_actor"]) == (True, "tone", None)
    assert snapshot() == before


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "operation_id"),
        ({"operation_id": "op-v1-123"}, "operation_id"),
        ({"operation_id": None}, "operation_id"),
        ({"reason": REASON}, "operation_id"),
        ({"reason": "x" * 501}, "reason"),
        ({"reason": ""}, "reason"),
        ({"reason": 5}, "reason"),
        ({"reason": "closed \u202e elsewhere"}, "reason"),
        ({"reason": "closed\nelsewhere"}, "reason"),
        ({"reason": "   "}, "reason"),
        ({"approved": True}, "approved"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_writes_nothing(pipeline_api, demo_case, body, field):
    if "operation_id" not in body and field != "operation_id":
        body = {"operation_id": demo_case.current_proposal.operation_id, **body}
    before = snapshot()
    answer = assert_error(withdraw(pipeline_api, demo_case, body), 400, "invalid_request")
    assert field in answer["message"]
    assert snapshot() == before


def test_another_cases_operation_or_an_unknown_case_is_404(pipeline_api, demo_case):
    from cases.services import case_import

    other = case_import(data={**load_fixture("t1042.json"), "case_id": "T-2001"}).case
    before = snapshot()
    assert_error(
        withdraw(pipeline_api, other, {"operation_id": demo_case.current_proposal.operation_id}), 404, "not_found"
    )
    body = {"operation_id": demo_case.current_proposal.operation_id}
    assert_error(pipeline_api.post("/api/cases/T-404/withdraw", body), 404, "not_found")
    assert snapshot() == before


def test_a_reviewer_token_is_403_and_a_pipeline_token_still_cannot_approve(api, pipeline_api, demo_case):
    before = snapshot()
    body = assert_error(withdraw(api, demo_case, reason=REASON), 403, "forbidden")
    assert "withdraw permission" in body["message"]
    assert snapshot() == before
    refused = CommitAttempt.objects.get()
    assert (refused.outcome, refused.reason, refused.approved) == ("refused", "no_permission", False)
    assert_error(approve(pipeline_api, demo_case), 403, "forbidden")
    assert withdraw(pipeline_api, demo_case).status_code == 200


def test_an_idempotency_key_answers_the_first_answer_again(pipeline_api, demo_case):
    first = withdraw(pipeline_api, demo_case, key="w-1", reason=REASON)
    again = withdraw(pipeline_api, demo_case, key="w-1", reason=REASON)
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert again.json()["replay"] is False  # the first answer, exactly
    assert_error(withdraw(pipeline_api, demo_case, key="w-1", reason="other"), 422, "idempotency_mismatch")
    # Without a key, the withdrawal's own replay.
    assert withdraw(pipeline_api, demo_case).json()["replay"] is True


def test_the_admin_refuses_an_approval_with_the_withdrawal_and_shows_it(pipeline_api, demo_case, reviewer):
    from tests.admin.conftest import messages_of

    withdraw(pipeline_api, demo_case, reason=REASON)
    client = Client()
    client.force_login(reviewer)
    proposal = demo_case.current_proposal
    before = snapshot()
    answered = client.post(
        reverse("admin:reviews_proposal_decide", args=[proposal.pk]),
        {"operation_id": proposal.operation_id, "decision": "approve"},
        follow=True,
    )
    text = " ".join(messages_of(answered))
    assert text.startswith("withdrawn: ") and "withdrawn by the pipeline (pipeline)" in text and REASON in text
    assert snapshot() == before
    page = answered.content.decode()
    assert 'id="df-withdrawn"' in page and "Withdrawn by <strong>the pipeline (pipeline)</strong>" in page
    assert f'Reason: <strong id="df-decline-reason-shown">Withdrawn by the pipeline</strong> ({REASON})' in page
    assert "withdrawn by the pipeline (pipeline)" in page  # the picture's caption
    history = client.get(reverse("admin:cases_case_history", args=[demo_case.pk])).content.decode()
    assert "<strong>withdrawn</strong> by" in history and "the pipeline (pipeline)</strong>, not a person" in history
    assert "Withdrawn by the pipeline" in history


def test_reconcile_shows_it_declined_for_the_reason_withdrawn(pipeline_api, demo_case, capsys):
    withdraw(pipeline_api, demo_case, reason=REASON)
    call_command("reconcile", demo_case.case_id, "--json")
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert (row["state"], row["decline_reason"], row["effects"]) == ("Declined", "withdrawn", 0)


def test_the_command_withdraws_and_says_so_with_its_exit_codes(pipeline, demo_case, api):
    op = demo_case.current_proposal.operation_id
    code, out, err = command(
        "withdraw", demo_case.case_id, "--operation-id", op, "--user", "pipeline", "--reason", REASON
    )
    assert code == 0, err
    assert out.splitlines() == [
        f"withdraw: T-1042 op={short(op)} status=Declined replay=False reason=withdrawn",
        'result={"Status":"Declined","Replay":false,"EffectCount":0}',
    ]
    assert ReviewDecision.objects.get().decline_note == REASON
    code, out, _ = command("withdraw", demo_case.case_id, "--operation-id", op, "--user", "pipeline")
    assert code == 0 and "replay=True" in out
    code, _, err = command("withdraw", demo_case.case_id, "--operation-id", op, "--user", "reviewer")
    assert code == 1 and "withdraw permission" in err
    code, _, err = command("withdraw", demo_case.case_id, "--operation-id", "op-v1-" + "0" * 64, "--user", "pipeline")
    assert code == 1 and "no pending review" in err


def test_the_command_refuses_an_approved_case_with_exit_3(pipeline, demo_case, api):
    approve(api, demo_case)
    op = demo_case.current_proposal.operation_id
    code, _, err = command("withdraw", demo_case.case_id, "--operation-id", op, "--user", "pipeline")
    assert code == 3 and err.startswith("conflicting decision: ")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_withdrawal_and_an_approval_at_once_one_wins_on_every_case(pipeline, reviewer):
    from api.services import token_create
    from cases.services import case_import
    from workflow.begin import review_begin

    pipeline_token = token_create(user=pipeline, name="withdraw")[1]
    reviewer_token = token_create(user=reviewer, name="approve")[1]
    cases = []
    for n in range(12):
        case = case_import(data={**load_fixture("t1042.json"), "case_id": f"T-30{n:02d}"}).case
        review_begin(case=case)
        case.refresh_from_db()
        cases.append(case)
    outcomes = []
    for case in cases:
        barrier = threading.Barrier(2)
        answers: dict[str, tuple[int, dict]] = {}

        def send(name, token, act, case=case, barrier=barrier, answers=answers):
            try:
                barrier.wait(10)
                response = act(Api(Client(), token), case)
                answers[name] = (response.status_code, response.json())
            finally:
                connections.close_all()

        threads = [
            threading.Thread(target=send, args=("withdraw", pipeline_token, withdraw)),
            threading.Thread(target=send, args=("approve", reviewer_token, approve)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        decision = ReviewDecision.objects.get(proposal__case=case)
        effects = EffectRecord.objects.filter(case=case).count()
        (w_status, w_body), (a_status, a_body) = answers["withdraw"], answers["approve"]
        if decision.approved:
            assert (a_status, w_status, w_body["code"], effects) == (200, 409, "conflicting_decision", 1), answers
            outcomes.append("approved")
        else:
            assert (w_status, w_body["replay"], a_status, a_body["code"], effects) == (200, False, 409, "withdrawn", 0)
            assert decision.system_actor == "pipeline-withdraw"
            outcomes.append("withdrawn")
        assert PendingReview.objects.get(case=case).status == PendingReview.Status.COMPLETED
    assert len(outcomes) == 12 and ReviewDecision.objects.count() == 12
