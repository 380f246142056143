"""The review page, Approve/Decline through the workflow, and what the reviewer is told."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from core.identity import short
from effects.models import CommitAttempt, EffectRecord
from reviews.models import PendingReview, Proposal, ReviewDecision, WorkflowCheckpoint
from tests.admin.conftest import counts, messages_of

pytestmark = pytest.mark.django_db(transaction=False)

T1042_OP = "op-v1-e3976ac9e004f816de8a7695aa8b5bf99b16b3f893063045153b2a114922fbfc"


def review(pk):
    return reverse("admin:reviews_proposal_review", args=[pk])


def with_fault(monkeypatch, settings, fault):
    """The admin's decisions carry a test fault (the API takes it from a header; the admin has none)."""
    import functools

    from workplace import review as workplace

    settings.DECISIONFLOW_FAULT_INJECTION = True
    monkeypatch.setattr(workplace, "decision_record", functools.partial(workplace.decision_record, fault=fault))


def decide(client, proposal, decision, operation_id=None):
    return client.post(
        reverse("admin:reviews_proposal_decide", args=[proposal.pk]),
        {"operation_id": operation_id or proposal.operation_id, "decision": decision},
        follow=True,
    )


def test_review_page_shows_exactly_what_is_approved(reviewer_client, begun, case):
    proposal = case.current_proposal
    assert proposal.operation_id == T1042_OP  # the protocol's vector for the demo case
    response = reviewer_client.get(review(proposal.pk))
    assert response.status_code == 200
    html = response.content.decode()
    # The body exactly as hashed, line breaks preserved inside a <pre>.
    body = re.search(r'<pre class="df-body" id="df-body">(.*?)</pre>', html, re.S).group(1)
    assert body == proposal.body.replace(">", "&gt;")  # "System > Support" is escaped, nothing else changes
    assert "\n\nTo confirm that your units are affected" in body
    # Identity short and full; case and customer's message.
    assert short(T1042_OP) in html and T1042_OP in html
    assert "Should we roll back to 4.1.3?" in html
    # Each passage with a link to that source version's full text.
    from cases.models import SourceVersion

    hold2 = SourceVersion.objects.get(source__source_id="HOLD-7", version=2)
    assert reverse("admin:cases_sourceversion_change", args=[hold2.pk]) in html
    assert "Engineering needs a diagnostic export from affected units before advising any change." in html
    # Findings with their licensed clauses; the policy with name, label and every parameter.
    assert "The reboot loop is a known issue of firmware 4.2.0 under engineering hold HOLD-7." in html
    assert "Known issue: GW-300 units on firmware 4.2.0 with more than 40 VPN tunnels" in html
    for text in (
        "support-reply",
        "v3",
        "int:9",
        "str:forbidden",
        "bool:true",
        "allowance_units",
        "rollback_advice",
        "requires_human_review",
    ):
        assert text in html
    assert "Prepared" in html
    # The buttons post the identity shown.
    assert f'name="operation_id" value="{T1042_OP}"' in html
    assert 'value="approve"' in html and 'value="decline"' in html


def test_source_version_link_shows_the_full_text(reviewer_client, begun):
    from cases.models import SourceVersion

    hold4 = SourceVersion.objects.get(source__source_id="HOLD-7", version=4)
    response = reviewer_client.get(reverse("admin:cases_sourceversion_change", args=[hold4.pk]))
    assert response.status_code == 200
    assert "A fix is planned for 4.2.1; no date is committed." in response.content.decode()


def test_approve_shows_receipt_then_replay_with_one_effect(reviewer_client, reviewer, begun, case):
    proposal = case.current_proposal
    first = decide(reviewer_client, proposal, "approve")
    assert first.status_code == 200
    text = " ".join(messages_of(first))
    # Words first, the receipt one click away (the CLI and the API print it as it is).
    said, receipt = text.split(' <details class="df-receipt"><summary>Receipt</summary>', 1)
    assert re.sub(r"<[^>]+>", "", said) == (
        "Approved: the support review record was written; no helpdesk is configured, so nothing is sent."
    )
    assert 'receipt=<code>{"Status":"Committed","Replay":false,"EffectCount":1}</code>' in receipt
    assert short(proposal.operation_id) in receipt and "receipt=" not in said
    effect = EffectRecord.objects.get(operation_id=proposal.operation_id)
    assert f'href="{reverse("admin:effects_effectrecord_change", args=[effect.pk])}"' in said
    assert ReviewDecision.objects.get().reviewer == reviewer
    # It went through the workflow: the attempt is recorded with the admin channel and the
    # pending review is completed.
    assert CommitAttempt.objects.get().channel == "admin"
    assert PendingReview.objects.get().status == PendingReview.Status.COMPLETED

    second = decide(reviewer_client, proposal, "approve")
    text = " ".join(messages_of(second))
    decision = ReviewDecision.objects.get()
    from workplace.display import when

    assert text.startswith(
        f"Already approved: nothing new was written (approved by reviewer at {when(decision.decided_at)})."
    )
    assert '{"Status":"Committed","Replay":true,"EffectCount":1}' in text.split("<details", 1)[1]
    assert EffectRecord.objects.count() == 1
    assert list(CommitAttempt.objects.order_by("id").values_list("outcome", flat=True)) == ["committed", "replay"]


def test_with_a_helpdesk_the_approval_says_the_reply_is_queued(reviewer_client, begun, case, settings):
    settings.DECISIONFLOW_DELIVERY_URL = "http://127.0.0.1:9/"
    settings.DECISIONFLOW_DELIVERY_TOKEN = "t"
    text = " ".join(messages_of(decide(reviewer_client, case.current_proposal, "approve")))
    said = re.sub(r"<[^>]+>", "", text.split("<details", 1)[0])
    assert said == "Approved: the support review record was written; the reply is queued for the helpdesk. "


def test_a_decline_says_what_it_wrote_with_its_reason_and_its_receipt_one_click_away(reviewer_client, begun, case):
    proposal = case.current_proposal
    data = {"operation_id": proposal.operation_id, "decision": "decline", "reason": "tone"}
    url = reverse("admin:reviews_proposal_decide", args=[proposal.pk])
    text = " ".join(messages_of(reviewer_client.post(url, data, follow=True)))
    said, receipt = text.split(' <details class="df-receipt">', 1)
    assert said == (
        "Declined: the decision was recorded (reason: Tone); a decline writes no support review record and sends nothing."
    )
    assert '{"Status":"Declined","Replay":false,"EffectCount":0}' in receipt
    again = " ".join(messages_of(reviewer_client.post(url, data, follow=True)))
    assert again.startswith("Already declined: nothing new was written (declined by reviewer at ")
    assert "; the reason that stands: Tone)." in again.split("<details", 1)[0]


def test_decline_then_approve_is_a_conflict_and_writes_nothing(reviewer_client, begun, case, raised):
    proposal = case.current_proposal
    declined = decide(reviewer_client, proposal, "decline")
    assert "Declined" in " ".join(messages_of(declined))
    assert EffectRecord.objects.count() == 0
    before = counts()
    conflict = decide(reviewer_client, proposal, "approve")
    text = " ".join(messages_of(conflict))
    assert text.startswith("conflicting decision: ") and "already declined by reviewer" in text
    after = counts()
    assert after == {**before, "attempts": before["attempts"] + 1}  # only the attempt is logged
    assert text == raised[-1].message
    assert ReviewDecision.objects.get().approved is False


def test_stale_approve_names_the_current_proposal_and_writes_nothing(reviewer_client, reviewer, begun, case, raised):
    from workflow.edit import review_edit

    old = case.current_proposal
    edited = review_edit(
        case=case,
        expected_operation_id=old.operation_id,
        body=old.body + "\n\nP.S. A fix is planned for 4.2.1.",
        editor=reviewer,
    )
    new = edited.revision.proposal
    before = counts()
    response = decide(reviewer_client, old, "approve")
    text = " ".join(messages_of(response))
    assert text.startswith(raised[-1].message)
    assert text.startswith("stale:") and short(new.operation_id) in text and review(new.pk) in text
    assert ReviewDecision.objects.count() == 0 and EffectRecord.objects.count() == 0
    after = counts()
    assert {k: v for k, v in after.items() if k != "attempts"} == {k: v for k, v in before.items() if k != "attempts"}
    # The superseded page now says it is not current and offers no buttons.
    page = reviewer_client.get(review(old.pk)).content.decode()
    assert 'id="df-superseded"' in page and 'id="df-approve"' not in page


def test_forged_operation_of_another_case_is_refused(reviewer_client, begun, case, load_case, raised):
    from reviews.services import proposal_create

    other = proposal_create(case=load_case("t1077.json"))
    before = counts()
    response = decide(reviewer_client, case.current_proposal, "approve", operation_id=other.operation_id)
    text = " ".join(messages_of(response))
    assert text == raised[-1].message and text.startswith("no pending review for case T-1042")
    assert ReviewDecision.objects.count() == 0 and EffectRecord.objects.count() == 0
    assert counts()["pending"] == before["pending"]


def test_missing_decision_is_not_consent(reviewer_client, begun, case):
    before = counts()
    response = reviewer_client.post(
        reverse("admin:reviews_proposal_decide", args=[case.current_proposal.pk]),
        {"operation_id": case.current_proposal.operation_id},
        follow=True,
    )
    assert "an omitted decision is not consent" in " ".join(messages_of(response))
    # Nothing written but the attempt row, with its reason and no decision.
    assert counts() == before | {"attempts": before["attempts"] + 1}
    attempt = CommitAttempt.objects.get()
    assert (attempt.reason, attempt.approved, attempt.outcome, attempt.operation_id) == (
        "omitted_decision",
        None,
        "refused",
        case.current_proposal.operation_id,
    )


def test_get_on_decide_is_not_allowed(reviewer_client, begun, case):
    response = reviewer_client.get(reverse("admin:reviews_proposal_decide", args=[case.current_proposal.pk]))
    assert response.status_code == 405


def test_first_decision_begins_a_review_never_begun(reviewer_client, proposal):
    # proposal_create without begin: no pending review yet.
    assert PendingReview.objects.count() == 0
    page = reviewer_client.get(review(proposal.pk)).content.decode()
    assert "has not been begun yet" in page
    response = decide(reviewer_client, proposal, "approve")
    assert '"Status":"Committed"' in " ".join(messages_of(response))
    assert PendingReview.objects.get().operation_id == proposal.operation_id
    assert EffectRecord.objects.count() == 1


def test_case_never_begun_offers_start_review(reviewer_client, case):
    page = reviewer_client.get(reverse("admin:cases_case_review", args=[case.pk]))
    assert page.status_code == 200 and 'id="df-begin"' in page.content.decode()
    assert Proposal.objects.count() == 0  # GET wrote nothing
    started = reviewer_client.post(reverse("admin:cases_case_begin", args=[case.pk]), follow=True)
    case.refresh_from_db()
    assert case.current_proposal.operation_id == T1042_OP
    assert started.redirect_chain[-1][0] == review(case.current_proposal.pk)
    assert "Review begun for T-1042" in " ".join(messages_of(started))
    # Starting again finds the same pending review.
    reviewer_client.post(reverse("admin:cases_case_begin", args=[case.pk]))
    assert PendingReview.objects.count() == 1 and Proposal.objects.count() == 1


# After an uncertain outcome the admin reads the effect store on a usable connection, closing
# the one it has if it is unusable or not in autocommit: as in a real request, these tests
# run in autocommit (a test transaction would be closed under them).
uncertain = pytest.mark.django_db(transaction=True)


@uncertain
def test_lost_receipt_is_reported_uncertain_then_reconciled(reviewer_client, begun, case, monkeypatch, settings):
    """The commit step writes, then the receipt is lost: never success, never failure."""
    proposal = case.current_proposal
    with_fault(monkeypatch, settings, "lose-receipt")
    response = decide(reviewer_client, proposal, "approve")
    text = messages_of(response)
    assert text[0].startswith("outcome uncertain: the commit step failed after it may have written (LostReceipt)")
    assert "manage.py reconcile" in text[0]
    assert text[1] == f"reconciled from the effect store: op {short(proposal.operation_id)} state=Committed effects=1"
    assert "Approved:" not in " ".join(text)
    assert EffectRecord.objects.count() == 1
    # Clicking Approve again is safe: a replay, never a second effect.
    monkeypatch.undo()
    again = " ".join(messages_of(decide(reviewer_client, proposal, "approve")))
    assert again.startswith("Already approved: nothing new was written (approved by reviewer at ")
    assert EffectRecord.objects.count() == 1 and ReviewDecision.objects.count() == 1


@uncertain
def test_lost_connection_after_the_commit_is_reconciled_on_a_fresh_connection(
    reviewer_client, begun, case, monkeypatch, settings
):
    """The connection dies right after COMMIT: the admin reads the truth on a new one."""
    proposal = case.current_proposal
    with_fault(monkeypatch, settings, "lose-connection")
    text = messages_of(decide(reviewer_client, proposal, "approve"))
    assert text[0].startswith("outcome uncertain: the commit step failed after it may have written (OperationalError)")
    assert text[1] == f"reconciled from the effect store: op {short(proposal.operation_id)} state=Committed effects=1"
    assert EffectRecord.objects.filter(operation_id=proposal.operation_id).count() == 1


@uncertain
def test_unexpected_failure_is_reported_uncertain(reviewer_client, begun, case, monkeypatch):
    """Anything but a refusal (here a bug in the service) is uncertain, and the effect store decides."""
    from workplace import review as workplace

    def boom(**kwargs):
        raise RuntimeError("connection reset")

    monkeypatch.setattr(workplace, "decision_record", boom)
    text = messages_of(decide(reviewer_client, case.current_proposal, "approve"))
    assert text[0] == "outcome uncertain: reconciling (RuntimeError: connection reset)"
    assert "state=Pending effects=0" in text[1]


def test_html_in_draft_and_quotation_is_escaped(reviewer_client, load_case):
    from workflow.begin import review_begin

    case = load_case("t1150.json")
    review_begin(case=case)
    case.refresh_from_db()
    html = reviewer_client.get(review(case.current_proposal_id)).content.decode()
    assert "<notes>" not in html
    assert "such as &lt;notes&gt;" in html
    assert "Export to CSV drops the &lt;notes&gt; column" in html
    assert "audits &amp; reports" in html


@uncertain
def test_reconcile_failing_too_is_said_plainly(reviewer_client, begun, case, monkeypatch):
    from workplace import review as workplace

    def boom(**kwargs):
        raise RuntimeError("server closed the connection")

    def reconcile_down(operation_id):
        raise RuntimeError("database unavailable")

    monkeypatch.setattr(workplace, "decision_record", boom)
    monkeypatch.setattr(workplace, "operation_reconcile", reconcile_down)
    text = messages_of(decide(reviewer_client, case.current_proposal, "approve"))
    assert text[0].startswith("outcome uncertain: reconciling")
    assert "could not be read either (RuntimeError: database unavailable)" in text[1]
    assert "manage.py reconcile" in text[1]


def test_stale_without_a_named_current_operation_still_links_the_current_proposal(
    reviewer_client, begun, case, monkeypatch
):
    """A stale refusal that does not name the current operation: the admin looks it up for the link."""
    from core.errors import StaleProposal
    from workplace import review as workplace

    def stale(**kwargs):
        raise StaleProposal("stale: the case moved on")

    monkeypatch.setattr(workplace, "decision_record", stale)
    text = " ".join(messages_of(decide(reviewer_client, case.current_proposal, "approve")))
    assert "stale:" in text and review(case.current_proposal_id) in text


def _rewrite_pause(begun, old: str, new: str):
    """Rewrite the pause checkpoint and sign it again with the server's key (a valid HMAC)."""
    from engine.checkpoints import payload_digest

    row = WorkflowCheckpoint.objects.get(checkpoint_id=begun.pending_review.checkpoint_id)
    assert old in row.payload
    payload = row.payload.replace(old, new)
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(payload=payload, digest=payload_digest(payload))


def _another_operation(begun):
    # Signed correctly, but its request is for another operation: the binding check refuses
    # it before anything runs.
    _rewrite_pause(begun, begun.operation_id, "op-v1-" + "a" * 64)
    return "does not belong to case T-1042"


def _tampered(begun):
    row = WorkflowCheckpoint.objects.get(checkpoint_id=begun.pending_review.checkpoint_id)
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(payload=row.payload.replace("T-1042", "T-1043"))
    return "corrupt or was modified"


def _old_version(begun):
    PendingReview.objects.filter(pk=begun.pending_review.pk).update(workflow_version="review-v1")
    return "incompatible workflow version"


@pytest.mark.parametrize("breakage", [_another_operation, _tampered, _old_version], ids=lambda f: f.__name__[1:])
def test_a_pause_that_fails_its_binding_check_is_refused_and_nothing_runs(
    reviewer_client, begun, case, breakage, raised
):
    why = breakage(begun)
    before, checkpoints = counts(), WorkflowCheckpoint.objects.count()
    text = " ".join(messages_of(decide(reviewer_client, case.current_proposal, "approve")))
    assert why in text
    assert counts() == {**before, "attempts": before["attempts"] + 1}  # one attempt row, nothing else
    attempt = CommitAttempt.objects.get()
    assert (attempt.outcome, attempt.channel) == ("refused", "admin")
    assert attempt.reason == "checkpoint" and attempt.detail == text == raised[-1].message
    assert WorkflowCheckpoint.objects.count() == checkpoints
    assert PendingReview.objects.get().status == PendingReview.Status.PENDING


def test_a_busy_case_answers_at_once_and_writes_nothing(reviewer_client, proposal, settings):
    """Another action holds the case longer than a decision waits: "try again", nothing written.

    The proposal was never begun, so the first decision must begin it, under the case lock
    that another action (a begin, an edit) is holding here.
    """
    import time

    from tests.conftest import case_held_elsewhere

    settings.DECISIONFLOW_DECISION_LOCK_TIMEOUT = 0.2
    with case_held_elsewhere(proposal.case.case_id):
        before = counts()
        started = time.monotonic()
        text = messages_of(decide(reviewer_client, proposal, "approve"))
        assert time.monotonic() - started < 3
    assert text == [f"another action on case {proposal.case.case_id} is in progress; try again"]
    after = counts()
    assert {k: v for k, v in after.items() if k != "attempts"} == {k: v for k, v in before.items() if k != "attempts"}
    assert after["attempts"] == before["attempts"] + 1
    attempt = CommitAttempt.objects.get()
    assert (attempt.outcome, attempt.channel, attempt.reason) == ("refused", "admin", "busy")
    assert [attempt.detail] == text
    # Once the other action is done, the same click goes through.
    assert "Approved:" in " ".join(messages_of(decide(reviewer_client, proposal, "approve")))
