"""Honest attribution, four eyes, and an attempt row for every refusal.

Four eyes is tested through the service, the admin (review page, forged click, bulk), the
API and the CLI; every refusal reason of ``RefusalReason`` has its attempt row here or in
the channel tests named beside it.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from core.errors import (
    DecisionOmitted,
    FourEyesRefused,
    NotFound,
    PermissionRefused,
    RefusalReason,
    StaleProposal,
    WorkflowIncompatible,
)
from core.outcomes import DecisionOutcome as Outcome
from effects.models import CommitAttempt, EffectRecord
from reviews.models import Channel, PendingReview, Proposal, ReviewDecision, WorkflowCheckpoint
from tests.conftest import snapshot
from workflow.begin import review_begin
from workflow.decide import decision_record
from workflow.edit import review_edit

pytestmark = pytest.mark.django_db


@pytest.fixture
def begun(case, reviewer):
    result = review_begin(case=case, actor=reviewer, channel=Channel.ADMIN)
    case.refresh_from_db()
    return result


@pytest.fixture
def edited(case, begun, editor):
    """The prepared draft edited by ``editor`` (a human edit), its review begun."""
    result = review_edit(
        case=case,
        expected_operation_id=begun.operation_id,
        body=case.current_proposal.body + "\nWe will call you on Monday.",
        editor=editor,
        channel=Channel.API,
    )
    case.refresh_from_db()
    return result.revision.proposal


def decide(case, operation_id, user, *, approved=True, channel="command", **kw):
    return decision_record(
        case=case, operation_id=operation_id, approved=approved, reviewer=user, channel=channel, **kw
    )


def last_attempt() -> CommitAttempt:
    return CommitAttempt.objects.order_by("-id").first()


# --- attribution ------------------------------------------------------------------------


def test_a_prepared_proposal_has_no_human_author_and_begin_is_recorded_on_the_pending_review(
    case, begun, edited, editor, reviewer, client, lead
):
    prepared = Proposal.objects.get(operation_id=begun.operation_id)
    assert prepared.author is None and prepared.human_author is None
    assert (begun.pending_review.begun_by, begun.pending_review.begun_channel) == (reviewer, "admin")
    assert edited.human_author == editor
    second = PendingReview.objects.get(operation_id=edited.operation_id)
    assert (second.begun_by, second.begun_channel) == (editor, "api")

    # The API says so: the current proposal is the edit (author editor); the prepared one is null.
    from api.selectors import pending_data, proposal_data

    assert proposal_data(prepared)["author"] is None
    assert proposal_data(edited)["author"] == "editor"
    assert pending_data(edited.operation_id) | {"created_at": None} == {
        "status": "pending",
        "workflow_version": second.workflow_version,
        "created_at": None,
        "begun_by": "editor",
        "begun_channel": "api",
    }

    # The history page: "prepared by the pipeline", and who began each review, and how.
    client.force_login(lead)
    page = client.get(reverse("admin:cases_case_history", args=[case.pk])).content.decode()
    assert "Prepared by the pipeline" in page and "Prepared by <strong>reviewer" not in page
    assert "by <strong>reviewer</strong> via admin" in page
    assert "by <strong>editor</strong> via API" in page
    review = client.get(reverse("admin:reviews_proposal_review", args=[prepared.pk])).content.decode()
    assert "Prepared by the pipeline" in review and " by reviewer" not in review


def test_an_older_prepared_row_that_names_whoever_began_it_still_shows_the_pipeline(case, reviewer, client, lead):
    """Rows written before this rule credit whoever began the review; they cannot be updated
    (append-only), so every reader goes through ``human_author``."""
    from reviews.services import proposal_create

    old = proposal_create(case=case, author=reviewer)
    assert old.author == reviewer and old.human_author is None
    from api.selectors import proposal_data

    assert proposal_data(old)["author"] is None
    client.force_login(lead)
    page = client.get(reverse("admin:reviews_proposal_review", args=[old.pk])).content.decode()
    assert "Prepared by the pipeline" in page and "by reviewer" not in page


def test_begin_from_the_cli_records_the_channel_and_no_user(case):
    from io import StringIO

    from django.core.management import call_command

    call_command("begin", "T-1042", stdout=StringIO())
    pending = PendingReview.objects.get()
    assert (pending.begun_by, pending.begun_channel, pending.proposal.author) == (None, "command", None)


# --- four eyes: the service -------------------------------------------------------------


def test_the_editor_cannot_approve_their_edit_but_may_decline_it(case, edited, editor, reviewer):
    before = snapshot()
    for _ in range(2):  # refused every time, one attempt row each
        with pytest.raises(FourEyesRefused) as refused:
            decide(case, edited.operation_id, editor, channel="api")
        assert refused.value.http_status == 403 and refused.value.exit_code == 8
        assert "editor made the human edit" in refused.value.message
    assert snapshot() == before
    rows = list(CommitAttempt.objects.values_list("reason", "outcome", "approved", "reviewer__username", "channel"))
    assert rows == [("four_eyes", "refused", True, "editor", "api")] * 2

    # Declining is allowed.
    assert decide(case, edited.operation_id, editor, approved=False).outcome == Outcome.DECLINED


def test_another_reviewer_approves_the_edit(case, edited, reviewer):
    assert decide(case, edited.operation_id, reviewer).outcome == Outcome.COMMITTED
    assert EffectRecord.objects.get().reviewer == reviewer


def test_an_evidence_change_counts_as_a_human_change(case, begun, editor, reviewer):
    moved = review_edit(
        case=case, expected_operation_id=begun.operation_id, source_versions={"HOLD-7": 4}, editor=editor
    ).revision.proposal
    assert moved.origin == "evidence_change"
    with pytest.raises(FourEyesRefused, match="evidence change"):
        decide(case, moved.operation_id, editor)
    assert decide(case, moved.operation_id, reviewer).outcome == Outcome.COMMITTED


def test_everyone_in_a_chain_of_edits_is_excluded(case, edited, editor, reviewer, make_user):
    """An edit of an edit still carries the first editor's sentences."""
    second = review_edit(
        case=case, expected_operation_id=edited.operation_id, body=edited.body + "\nAnd on Tuesday.", editor=reviewer
    ).revision.proposal
    for person in (editor, reviewer):
        with pytest.raises(FourEyesRefused):
            decide(case, second.operation_id, person)
    third = make_user("third")
    assert decide(case, second.operation_id, third).outcome == Outcome.COMMITTED


def test_the_rule_can_be_turned_off(case, edited, editor, settings):
    settings.DECISIONFLOW_FOUR_EYES = False
    assert decide(case, edited.operation_id, editor).outcome == Outcome.COMMITTED


def test_the_prepared_proposal_is_approved_by_whoever_began_it(case, begun, reviewer):
    """Beginning is not authorship: four eyes is about human changes only."""
    assert decide(case, begun.operation_id, reviewer).outcome == Outcome.COMMITTED


# --- four eyes: the admin, the API, the CLI --------------------------------------------


def test_admin_review_page_shows_why_instead_of_approve_and_a_forged_click_is_refused(case, edited, editor, reviewer):
    client = Client()
    client.force_login(editor)
    url = reverse("admin:reviews_proposal_review", args=[edited.pk])
    page = client.get(url).content.decode()
    assert 'id="df-four-eyes"' in page and "You made the human edit op-v1-" in page
    assert "another reviewer must approve it. You may decline it." in page
    assert 'id="df-approve"' not in page and 'id="df-decline"' in page

    response = client.post(
        reverse("admin:reviews_proposal_decide", args=[edited.pk]),
        {"operation_id": edited.operation_id, "decision": "approve"},
        follow=True,
    )
    text = " ".join(str(m) for m in response.context["messages"])
    assert text.startswith("four eyes: editor made the human edit")
    assert ReviewDecision.objects.count() == 0
    assert (last_attempt().reason, last_attempt().channel) == ("four_eyes", "admin")

    other = Client()
    other.force_login(reviewer)
    page = other.get(url).content.decode()
    assert 'id="df-approve"' in page and 'id="df-four-eyes"' not in page


def test_admin_bulk_approve_says_which_rows_four_eyes_refuses_and_skips_them(case, edited, editor):
    from cases.models import Case
    from cases.services import case_import
    from tests.conftest import load_fixture

    other_case = case_import(data=load_fixture("t1077.json")).case
    other = review_begin(case=other_case, actor=None)
    client = Client()
    client.force_login(editor)
    url = reverse("admin:cases_case_changelist")
    selected = {"action": "approve_selected", "_selected_action": [case.pk, other_case.pk]}
    confirmation = client.post(url, selected).content.decode()
    # The editor's own row is not offered: skipped with the reason, and not counted or sent.
    assert confirmation.count("skip: four eyes: You made the human edit") == 1
    assert 'id="df-confirm">Approve 1 proposal</button>' in confirmation
    assert f'name="operation_id_{case.pk}"' not in confirmation

    # A confirmation posted anyway (an old page, a hand-made request) is refused by the service.

    data = {
        **selected,
        "post": "yes",
        f"operation_id_{case.pk}": edited.operation_id,
        f"operation_id_{other_case.pk}": other.operation_id,
    }
    text = " ".join(str(m) for m in client.post(url, data, follow=True).context["messages"])
    assert "T-1042: four eyes: editor made the human edit" in text
    assert "T-1077: Approved: the " in text and "1 done, 1 skipped or refused" in text
    assert list(EffectRecord.objects.values_list("case__case_id", flat=True)) == ["T-1077"]
    refused = CommitAttempt.objects.get(reason="four_eyes")
    assert refused.case == Case.objects.get(case_id="T-1042") and refused.channel == "admin"

    # A decline needs no warning.
    declining = client.post(url, {**selected, "action": "decline_selected"}).content.decode()
    assert "skip: four eyes" not in declining, declining
    assert "Decline 1 proposal<" in declining  # T-1077 was approved above: skipped


def test_api_answers_403_four_eyes(case, edited, editor, client):
    from api.services import token_create

    token = token_create(user=editor, name="tests")[1]
    response = client.post(
        "/api/cases/T-1042/decision",
        json.dumps({"operation_id": edited.operation_id, "approved": True}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 403
    assert response.json()["code"] == "four_eyes" and "another reviewer" in response.json()["message"]
    assert ReviewDecision.objects.count() == 0
    assert (last_attempt().reason, last_attempt().channel) == ("four_eyes", "api")


# --- an attempt row for every refusal ----------------------------------------------------


def test_omitted_decision_through_the_service(case, begun, reviewer):
    for approved in (None, "yes", 1):
        with pytest.raises(DecisionOmitted):
            decide(case, begun.operation_id, reviewer, approved=approved)
    assert list(CommitAttempt.objects.values_list("reason", "approved")) == [("omitted_decision", None)] * 3


def test_no_permission_through_the_service(case, begun, lead):
    with pytest.raises(PermissionRefused):
        decide(case, begun.operation_id, lead)
    assert (last_attempt().reason, last_attempt().reviewer) == ("no_permission", lead)


def test_no_permission_before_the_review_was_begun(case, lead):
    from workflow.selectors import decidable_operation_id

    with pytest.raises(PermissionRefused):
        decide(case, decidable_operation_id(case), lead)
    assert last_attempt().reason == "no_permission" and PendingReview.objects.count() == 0


def test_stale(case, begun, edited, reviewer):
    with pytest.raises(StaleProposal):
        decide(case, begun.operation_id, reviewer)
    assert last_attempt().reason == "stale" and last_attempt().outcome == "stale"


def test_not_found(case, begun, reviewer):
    with pytest.raises(NotFound):
        decide(case, "op-v1-" + "b" * 64, reviewer)
    assert last_attempt().reason == "not_found"


def test_bad_input_an_admin_click_with_a_malformed_operation(case, begun, reviewer):
    client = Client()
    client.force_login(reviewer)
    client.post(
        reverse("admin:reviews_proposal_decide", args=[case.current_proposal_id]),
        {"operation_id": "x" * 81, "decision": "approve"},
    )
    attempt = last_attempt()
    assert (attempt.reason, attempt.approved, attempt.operation_id) == ("bad_input", True, begun.operation_id)


def _rewrite_pause(begun, old, new, *, sign=True):
    from engine.checkpoints import payload_digest

    row = WorkflowCheckpoint.objects.get(checkpoint_id=begun.pending_review.checkpoint_id)
    payload = row.payload.replace(old, new)
    fields = {"payload": payload, "digest": payload_digest(payload)} if sign else {"payload": payload}
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(**fields)


@pytest.mark.parametrize(
    "breakage",
    [
        # The re-emitted request names another operation (signed correctly).
        lambda begun: _rewrite_pause(begun, begun.operation_id, "op-v1-" + "a" * 64),
        # Corrupt: the HMAC no longer matches.
        lambda begun: _rewrite_pause(begun, "T-1042", "T-1043", sign=False),
        # Incompatible: another workflow version.
        lambda begun: PendingReview.objects.filter(pk=begun.pending_review.pk).update(workflow_version="review-v1"),
    ],
    ids=["reemitted-operation-mismatch", "corrupt", "incompatible-version"],
)
def test_checkpoint_refusals(case, begun, reviewer, breakage):
    breakage(begun)
    with pytest.raises(WorkflowIncompatible):
        decide(case, begun.operation_id, reviewer)
    attempt = last_attempt()
    assert (attempt.reason, attempt.outcome, attempt.case) == ("checkpoint", "refused", case)
    assert ReviewDecision.objects.count() == 0


def test_busy(case, reviewer, settings):
    from core.errors import CaseBusy
    from reviews.services import proposal_create
    from tests.conftest import case_held_elsewhere
    from workflow.selectors import decidable_operation_id

    settings.DECISIONFLOW_DECISION_LOCK_TIMEOUT = 0.2
    # A proposal never begun: the decision must begin its review, under the case lock.
    proposal_create(case=case)
    op = decidable_operation_id(case)
    with case_held_elsewhere(case.case_id), pytest.raises(CaseBusy):
        decide(case, op, reviewer)
    assert last_attempt().reason == "busy"


def test_support_leads_see_every_refusal_with_its_reason_in_the_history(case, begun, edited, editor, reviewer, lead):
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "ADMIN.md").read_text()
    for reason in RefusalReason:
        assert f"`{reason.value}`" in docs, reason
    with pytest.raises(FourEyesRefused):
        decide(case, edited.operation_id, editor)
    with pytest.raises(StaleProposal):
        decide(case, begun.operation_id, reviewer)
    with pytest.raises(DecisionOmitted):
        decide(case, edited.operation_id, reviewer, approved=None)
    with pytest.raises(PermissionRefused):
        decide(case, edited.operation_id, lead)
    client = Client()
    client.force_login(lead)
    page = client.get(reverse("admin:cases_case_history", args=[case.pk])).content.decode()
    for label in ("four eyes", "stale proposal", "omitted decision", "no permission"):
        assert f"({label})" in page, label


def test_a_refusal_is_worded_once_in_its_row_the_history_and_the_attempts_list(case, edited, editor, lead):
    with pytest.raises(FourEyesRefused) as refused:
        decide(case, edited.operation_id, editor)
    said = refused.value.message
    assert said.startswith("four eyes: editor made the human edit")
    # The row keeps the error's own words; its reason column says which refusal it was.
    assert (last_attempt().reason, last_attempt().detail) == ("four_eyes", said)
    client = Client()
    client.force_login(lead)
    for url in (reverse("admin:cases_case_history", args=[case.pk]), reverse("admin:effects_commitattempt_changelist")):
        page = client.get(url).content.decode()
        assert page.count("four eyes: editor made the human edit") == 1, url
        assert "four_eyes: " not in page, url


def test_cli_exit_8_for_four_eyes_and_the_setting_turns_it_off(manage, committed_case, editor, tmp_path):
    op = review_begin(case=committed_case).operation_id
    body = tmp_path / "body.txt"
    body.write_text(committed_case.draft + "\nWe will call you on Monday.")
    edit = manage("edit", "T-1042", "--expected-operation-id", op, "--body-file", str(body), "--editor", "editor")
    assert edit.returncode == 0, edit.stderr
    new_op = edit.stdout.split()[1].removeprefix("op=")
    assert PendingReview.objects.get(operation_id=new_op).begun_channel == "command"

    refused = manage("resume", "T-1042", "--operation-id", new_op, "--approve", "--reviewer", "editor")
    assert refused.returncode == 8, (refused.stdout, refused.stderr)
    assert refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        f"four eyes: editor made the human edit {new_op[:18]}… in this proposal, so another reviewer must "
        "approve it (you may decline it); nothing was written"
    ]
    assert (last_attempt().reason, last_attempt().channel) == ("four_eyes", "command")
    assert ReviewDecision.objects.count() == 0

    allowed = manage(
        "resume", "T-1042", "--operation-id", new_op, "--approve", "--reviewer", "editor", DECISIONFLOW_FOUR_EYES="0"
    )
    assert allowed.returncode == 0, allowed.stderr
    assert ReviewDecision.objects.get().reviewer == editor
