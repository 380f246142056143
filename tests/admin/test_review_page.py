"""The review page, Approve/Decline through the workflow, and what the reviewer is told."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from decisionflow.core.identity import short
from effects.models import CommitAttempt, EffectRecord
from reviews.models import PendingReview, Proposal, ReviewDecision

from .conftest import counts, messages_of

pytestmark = pytest.mark.django_db(transaction=False)

T1042_OP = "op-v1-e3976ac9e004f816de8a7695aa8b5bf99b16b3f893063045153b2a114922fbfc"


def review(pk):
    return reverse("admin:reviews_proposal_review", args=[pk])


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
    assert "Committed" in text and 'receipt={"Status":"Committed","Replay":false,"EffectCount":1}' in text
    effect = EffectRecord.objects.get(operation_id=proposal.operation_id)
    assert reverse("admin:effects_effectrecord_change", args=[effect.pk]) in text
    assert ReviewDecision.objects.get().reviewer == reviewer
    # It went through the workflow: the attempt is recorded with the admin channel and the
    # pending review is completed.
    assert CommitAttempt.objects.get().channel == "admin"
    assert PendingReview.objects.get().status == PendingReview.Status.COMPLETED

    second = decide(reviewer_client, proposal, "approve")
    text = " ".join(messages_of(second))
    decision = ReviewDecision.objects.get()
    from decisionflow.core.admin_base import when

    assert f"already approved by reviewer at {when(decision.decided_at)}, no new record" in text
    assert EffectRecord.objects.count() == 1
    assert list(CommitAttempt.objects.order_by("id").values_list("outcome", flat=True)) == ["committed", "replay"]


def test_decline_then_approve_is_a_conflict_and_writes_nothing(reviewer_client, begun, case):
    proposal = case.current_proposal
    declined = decide(reviewer_client, proposal, "decline")
    assert "Declined" in " ".join(messages_of(declined))
    assert EffectRecord.objects.count() == 0
    before = counts()
    conflict = decide(reviewer_client, proposal, "approve")
    text = " ".join(messages_of(conflict))
    assert "conflict:" in text and "already declined by reviewer" in text and "nothing was written" in text
    after = counts()
    assert after == {**before, "attempts": before["attempts"] + 1}  # only the attempt is logged
    assert ReviewDecision.objects.get().approved is False


def test_stale_approve_names_the_current_proposal_and_writes_nothing(reviewer_client, reviewer, begun, case):
    from decisionflow.workflow.services import review_edit

    old = case.current_proposal
    revision, _ = review_edit(
        case=case,
        expected_operation_id=old.operation_id,
        body=old.body + "\n\nP.S. A fix is planned for 4.2.1.",
        editor=reviewer,
    )
    new = revision.proposal
    before = counts()
    response = decide(reviewer_client, old, "approve")
    text = " ".join(messages_of(response))
    assert "stale:" in text and "Nothing was written" in text
    assert short(new.operation_id) in text and review(new.pk) in text
    assert ReviewDecision.objects.count() == 0 and EffectRecord.objects.count() == 0
    after = counts()
    assert {k: v for k, v in after.items() if k != "attempts"} == {k: v for k, v in before.items() if k != "attempts"}
    # The superseded page now says it is not current and offers no buttons.
    page = reviewer_client.get(review(old.pk)).content.decode()
    assert 'id="df-superseded"' in page and 'id="df-approve"' not in page


def test_forged_operation_of_another_case_is_refused(reviewer_client, begun, case, load_case):
    from reviews.services import proposal_create

    other = proposal_create(case=load_case("t1077.json"))
    before = counts()
    response = decide(reviewer_client, case.current_proposal, "approve", operation_id=other.operation_id)
    text = " ".join(messages_of(response))
    assert "refused:" in text or "stale:" in text
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
    assert counts() == before


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


def test_lost_receipt_is_reported_uncertain_then_reconciled(reviewer_client, begun, case, monkeypatch, settings):
    """The commit step writes, then the receipt is lost: never success, never failure."""
    from decisionflow.workflow import services as workflow

    settings.DECISIONFLOW_FAULT_INJECTION = True
    real = workflow.review_resume
    monkeypatch.setattr(workflow, "review_resume", lambda **kw: real(**kw, fault="lose-receipt"))
    response = decide(reviewer_client, case.current_proposal, "approve")
    text = messages_of(response)
    assert text[0].startswith("outcome uncertain: reconciling")
    assert "state=Committed effects=1" in text[1]
    assert "Committed:" not in " ".join(text)
    assert EffectRecord.objects.count() == 1


def test_unexpected_failure_is_reported_uncertain(reviewer_client, begun, case, monkeypatch):
    from decisionflow.workflow import services as workflow

    def boom(**kwargs):
        raise RuntimeError("connection reset")

    monkeypatch.setattr(workflow, "review_resume", boom)
    text = messages_of(decide(reviewer_client, case.current_proposal, "approve"))
    assert text[0].startswith("outcome uncertain: reconciling") and "connection reset" in text[0]
    assert "state=Pending effects=0" in text[1]


def test_html_in_draft_and_quotation_is_escaped(reviewer_client, load_case):
    from decisionflow.workflow.services import review_begin

    case = load_case("t1150.json")
    review_begin(case=case)
    case.refresh_from_db()
    html = reviewer_client.get(review(case.current_proposal_id)).content.decode()
    assert "<notes>" not in html
    assert "such as &lt;notes&gt;" in html
    assert "Export to CSV drops the &lt;notes&gt; column" in html
    assert "audits &amp; reports" in html


def test_reconcile_failing_too_is_said_plainly(reviewer_client, begun, case, monkeypatch):
    from decisionflow.workflow import services as workflow
    from decisionflow.workflow import workplace

    def boom(**kwargs):
        raise RuntimeError("server closed the connection")

    def reconcile_down(operation_id):
        raise RuntimeError("database unavailable")

    monkeypatch.setattr(workflow, "review_resume", boom)
    monkeypatch.setattr(workplace, "operation_reconcile", reconcile_down)
    text = messages_of(decide(reviewer_client, case.current_proposal, "approve"))
    assert text[0].startswith("outcome uncertain: reconciling")
    assert "could not be read either (RuntimeError: database unavailable)" in text[1]
    assert "manage.py reconcile" in text[1]


def test_stale_from_the_workflow_check_still_links_the_current_proposal(reviewer_client, begun, case, monkeypatch):
    from decisionflow.core.errors import StaleProposal
    from decisionflow.workflow import services as workflow

    def reemitted_other(**kwargs):
        raise StaleProposal("stale: the request re-emitted from checkpoint ck carries another operation")

    monkeypatch.setattr(workflow, "review_resume", reemitted_other)
    text = " ".join(messages_of(decide(reviewer_client, case.current_proposal, "approve")))
    assert "stale:" in text and review(case.current_proposal_id) in text
