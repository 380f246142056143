"""Changelists: case status, search and filters, bulk actions, and constant query counts."""

from __future__ import annotations

import html

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from cases.models import Case, Policy, Source, SourceVersion
from effects.models import CommitAttempt, EffectRecord
from effects.services import effect_commit
from engine.graph import WORKFLOW_VERSION
from reviews.models import PendingReview, Proposal, ReviewDecision, WorkflowCheckpoint
from reviews.services import proposal_create
from tests.admin.conftest import counts, messages_of
from tests.conftest import load_fixture
from workflow.selectors import cases_with_status

pytestmark = pytest.mark.django_db

CHANGELISTS = [
    "cases_case",
    "cases_source",
    "cases_sourceversion",
    "cases_policy",
    "reviews_proposal",
    "reviews_reviewdecision",
    "reviews_pendingreview",
    "reviews_workflowcheckpoint",
    "effects_effectrecord",
    "effects_commitattempt",
]
# Filters and a search on the cases list cost the same as the plain list.
CASE_QUERIES = [
    "?status=committed",
    "?status=pending_review",
    "?q=T-5001",
    "?reviewer={reviewer}",
    "?created_at__gte=2000-01-01+00%3A00%3A00%2B00%3A00",
]


def make_cases(start: int, n: int, reviewer, *, all_approved: bool = False):
    """n cases in the four states (or all approved), with every row type a changelist shows.

    Built with bulk inserts from one imported template case: the rows are the ones the
    services would write (identities computed by the protocol), only faster to make.
    """
    from cases.services import case_import
    from core import identity
    from effects.services import _effect_fields

    template = Case.objects.filter(case_id="T-4999").first()
    if template is None:
        template = case_import(data={**load_fixture("t1042.json"), "case_id": "T-4999"}).case
        proposal_create(case=template)
    base = template.proposals.get()
    cases = Case.objects.bulk_create(
        Case(
            case_id=f"T-{5000 + i}",
            subject=f"Reboots #{i}",
            customer_message=template.customer_message,
            action=template.action,
            policy=template.policy,
            draft=template.draft,
            import_digest=str(i),
        )
        for i in range(start, start + n)
    )
    cases = list(Case.objects.filter(case_id__in=[c.case_id for c in cases]).order_by("id"))
    proposals = Proposal.objects.bulk_create(
        Proposal(
            case=c,
            action=base.action,
            body=base.body,
            passages=base.passages,
            findings=base.findings,
            policy_snapshot=base.policy_snapshot,
            evidence_id=base.evidence_id,
            policy_id=base.policy_id,
            operation_id=identity.operation_id(c.case_id, base.action, base.body, base.evidence_id, base.policy_id),
            origin="prepared",
        )
        for c in cases
    )
    proposals = {p.case_id: p for p in Proposal.objects.filter(case__in=cases)}
    for c in cases:
        c.current_proposal = proposals[c.pk]
    Case.objects.bulk_update(cases, ["current_proposal"])
    PendingReview.objects.bulk_create(
        PendingReview(
            case=c,
            proposal=proposals[c.pk],
            operation_id=proposals[c.pk].operation_id,
            workflow_session_id=f"ws-{c.case_id}",
            checkpoint_id=f"ck-{c.case_id}",
            workflow_version=WORKFLOW_VERSION,
        )
        for c in cases
    )
    WorkflowCheckpoint.objects.bulk_create(
        WorkflowCheckpoint(
            checkpoint_id=f"ck-{c.case_id}",
            workflow_name="decisionflow-review",
            graph_signature_hash="0" * 64,
            payload="{}" * 500,
            digest="0" * 64,
        )
        for c in cases
    )
    sources = Source.objects.bulk_create(Source(source_id=f"SRC-{c.case_id}", title="Source") for c in cases)
    SourceVersion.objects.bulk_create(
        SourceVersion(source=src, version=1, text="text " * 200)
        for src in Source.objects.filter(source_id__in=[s.source_id for s in sources])
    )
    Policy.objects.bulk_create(
        Policy(
            name="support-reply",
            label=f"v-{c.case_id}",
            parameters={"allowance_units": 9},
            policy_id=template.policy.policy_id,
        )
        for c in cases
    )
    kinds = {c.pk: 1 if all_approved else int(c.case_id[2:]) % 4 for c in cases}
    ReviewDecision.objects.bulk_create(
        ReviewDecision(
            operation_id=proposals[c.pk].operation_id,
            proposal=proposals[c.pk],
            approved=kinds[c.pk] != 2,
            reviewer=reviewer,
        )
        for c in cases
        if kinds[c.pk]
    )
    decisions = {d.proposal_id: d for d in ReviewDecision.objects.filter(proposal__case__in=cases)}
    # kind 1: committed; kind 2: declined; kind 3: approved without its effect
    # (reconcile's NoLocalEffectRecorded); kind 0: pending.
    EffectRecord.objects.bulk_create(
        EffectRecord(**_effect_fields(proposals[c.pk], decisions[proposals[c.pk].pk]))
        for c in cases
        if kinds[c.pk] == 1
    )
    CommitAttempt.objects.bulk_create(
        CommitAttempt(
            operation_id=proposals[c.pk].operation_id,
            case=c,
            approved=kinds[c.pk] != 2,
            reviewer=reviewer,
            outcome="declined" if kinds[c.pk] == 2 else "committed",
            channel="admin",
        )
        for c in cases
        if kinds[c.pk] in (1, 2)
    )


def test_case_status_is_computed_in_one_query(reviewer, case):
    make_cases(0, 4, reviewer)
    from effects.services import operations_reconcile

    with CaptureQueriesContext(connection) as ctx:
        statuses = dict(cases_with_status().values_list("case_id", "review_status"))
    assert len(ctx.captured_queries) == 1
    assert statuses == {
        "T-1042": "not_started",
        "T-4999": "pending_review",
        "T-5000": "pending_review",
        "T-5001": "committed",
        "T-5002": "declined",
        "T-5003": "needs_attention",
    }
    # The same answer as reconcile, which reads the effect store.
    states = {row.case_id: row.state for row in operations_reconcile()}
    assert states == {
        "T-4999": "Pending",
        "T-5000": "Pending",
        "T-5001": "Committed",
        "T-5002": "Declined",
        "T-5003": "NoLocalEffectRecorded",
    }


def test_failed_last_attempt_needs_attention(reviewer, case):
    proposal = proposal_create(case=case)
    CommitAttempt.objects.create(
        operation_id=proposal.operation_id,
        case=case,
        approved=True,
        reviewer=reviewer,
        outcome=CommitAttempt.Outcome.FAILED,
        channel="admin",
        detail="RuntimeError",
    )
    assert cases_with_status().get(pk=case.pk).review_status == "needs_attention"


def test_search_and_filters(reviewer_client, reviewer, make_user):
    make_cases(0, 8, reviewer)
    other = make_user("other")
    op = Case.objects.get(case_id="T-5004").current_proposal.operation_id  # pending until now
    effect_commit(operation_id=op, approved=True, reviewer=other)
    url = reverse("admin:cases_case_changelist")

    def listed(query):
        page = reviewer_client.get(url + query)
        assert page.status_code == 200
        return sorted(c.case_id for c in page.context["cl"].result_list)

    assert listed("?status=committed") == ["T-5001", "T-5004", "T-5005"]
    assert listed("?status=declined") == ["T-5002", "T-5006"]
    assert listed("?status=needs_attention") == ["T-5003", "T-5007"]
    assert listed("?status=pending_review") == ["T-4999", "T-5000"]
    assert listed(f"?reviewer={other.pk}") == ["T-5004"]
    assert listed("?q=T-5002") == ["T-5002"]
    assert listed("?q=Reboots+%233") == ["T-5003"]
    assert listed("?created_at__gte=2999-01-01+00%3A00%3A00%2B00%3A00") == []
    page = reviewer_client.get(url).content.decode()
    assert "Needs attention" in page and "Committed" in page and ">history</a>" in page


def test_every_changelist_costs_the_same_at_100_rows(admin_client, reviewer, django_assert_max_num_queries):
    make_cases(0, 5, reviewer)
    small = {}
    for name in CHANGELISTS:
        with CaptureQueriesContext(connection) as ctx:
            assert admin_client.get(reverse(f"admin:{name}_changelist")).status_code == 200
        small[name] = len(ctx.captured_queries)
    # 100 more, all approved: every list (decisions, effects, attempts too) has 100+ rows.
    make_cases(5, 100, reviewer, all_approved=True)
    for name in CHANGELISTS:
        url = reverse(f"admin:{name}_changelist")
        with django_assert_max_num_queries(small[name]):
            page = admin_client.get(url)
        assert len(page.context["cl"].result_list) >= 100, name
    for query in CASE_QUERIES:
        url = reverse("admin:cases_case_changelist") + query.format(reviewer=reviewer.pk)
        with django_assert_max_num_queries(small["cases_case"] + 1):
            assert admin_client.get(url).status_code == 200


def test_the_history_shows_a_prepared_proposals_text_as_the_review_page_does(lead_client, reviewer, begun, case):
    """Shown text is hashed text: the prepared proposal, which has no parent to diff against,
    is shown whole in the timeline with the review page's own rendering; an edit keeps its diff."""
    import re

    from workflow.edit import review_edit

    prepared = case.current_proposal
    body = prepared.body.replace("Kind regards,", "We will call you on Monday.\n\nKind regards,")
    edited = review_edit(case=case, expected_operation_id=prepared.operation_id, body=body, editor=reviewer)
    new = edited.revision.proposal

    def body_on_review_page(proposal):
        page = lead_client.get(reverse("admin:reviews_proposal_review", args=[proposal.pk])).content.decode()
        return re.search(r'<pre class="df-body" id="df-body">(.*?)</pre>', page, re.S).group(1)

    history = lead_client.get(reverse("admin:cases_case_history", args=[case.pk])).content.decode()
    shown = re.findall(r'<pre class="df-body df-history-body" data-operation="([^"]+)">(.*?)</pre>', history, re.S)
    assert shown == [(prepared.operation_id, body_on_review_page(prepared))]
    assert "To confirm that your units are affected" in shown[0][1]
    # The edit is shown as its diff, not whole.
    assert f"+++ {new.short_operation_id}" in html.unescape(history) and new.operation_id not in dict(shown)


def test_history_costs_the_same_whatever_its_length(lead_client, reviewer_client, reviewer, begun, case):
    from workflow.edit import review_edit

    url = reverse("admin:cases_case_history", args=[case.pk])
    with CaptureQueriesContext(connection) as ctx:
        lead_client.get(url)
    short_history = len(ctx.captured_queries)
    current = case.current_proposal
    for n in range(3):
        edited = review_edit(
            case=case, expected_operation_id=current.operation_id, body=current.body + f"\nLine {n}.", editor=reviewer
        )
        current = edited.revision.proposal
    reviewer_client.post(
        reverse("admin:reviews_proposal_decide", args=[current.pk]),
        {"operation_id": current.operation_id, "decision": "approve"},
    )
    with CaptureQueriesContext(connection) as ctx:
        lead_client.get(url)
    assert len(ctx.captured_queries) == short_history


# --- bulk actions ------------------------------------------------------------------------


def test_approve_selected_confirms_then_acts_row_by_row(reviewer_client, reviewer, begun, case, load_case):
    from workflow.begin import review_begin
    from workflow.edit import review_edit

    other = load_case("t1150.json")
    review_begin(case=other)
    never = load_case("t1077.json")  # not begun: skipped
    url = reverse("admin:cases_case_changelist")
    selected = [case.pk, other.pk, never.pk]
    before = counts()
    confirm = reviewer_client.post(url, {"action": "approve_selected", "_selected_action": selected})
    assert confirm.status_code == 200
    page = confirm.content.decode()
    case.refresh_from_db()
    other.refresh_from_db()
    # Each case, its full operation identity, and what will happen to it.
    assert case.current_proposal.operation_id in page and other.current_proposal.operation_id in page
    assert "skip: no review begun" in page
    assert ">Approve 2 proposals</button>" in page
    assert counts() == before  # the confirmation page writes nothing

    # Meanwhile someone edits T-1150: its row is now stale and must be skipped.
    data = {
        "action": "approve_selected",
        "_selected_action": selected,
        "post": "yes",
        f"operation_id_{case.pk}": case.current_proposal.operation_id,
        f"operation_id_{other.pk}": other.current_proposal.operation_id,
    }
    review_edit(
        case=other,
        expected_operation_id=other.current_proposal.operation_id,
        body=other.current_proposal.body + "\nEdited.",
        editor=reviewer,
    )
    done = reviewer_client.post(url, data, follow=True)
    text = " ".join(messages_of(done))
    assert "T-1042: Approved: the " in text
    assert "T-1150: stale:" in text
    assert "T-1077: skipped" in text
    assert "1 done, 2 skipped or refused" in text
    assert list(EffectRecord.objects.values_list("case__case_id", flat=True)) == ["T-1042"]
    assert ReviewDecision.objects.count() == 1


def test_decline_selected_declines_and_replays(reviewer_client, begun, case):
    url = reverse("admin:cases_case_changelist")
    data = {
        "action": "decline_selected",
        "_selected_action": [case.pk],
        "post": "yes",
        f"operation_id_{case.pk}": case.current_proposal.operation_id,
    }
    first = " ".join(messages_of(reviewer_client.post(url, data, follow=True)))
    assert "T-1042: Declined: the decision was recorded; a decline writes no support review record" in first
    second = " ".join(messages_of(reviewer_client.post(url, data, follow=True)))
    assert "T-1042: Already declined: nothing new was written (declined by reviewer at " in second
    assert ReviewDecision.objects.count() == 1 and EffectRecord.objects.count() == 0


def test_history_for_support_leads(lead_client, reviewer_client, reviewer, editor, begun, case):
    from workflow.edit import review_edit

    old = case.current_proposal
    edited = review_edit(
        case=case,
        expected_operation_id=old.operation_id,
        body=old.body + "\nWe will call you <today>.",
        editor=editor,
    )
    new = edited.revision.proposal
    decide = reverse("admin:reviews_proposal_decide", args=[new.pk])
    reviewer_client.post(
        reverse("admin:reviews_proposal_decide", args=[old.pk]),
        {"operation_id": old.operation_id, "decision": "approve"},
    )  # stale
    reviewer_client.post(decide, {"operation_id": new.operation_id, "decision": "approve"})  # committed
    reviewer_client.post(decide, {"operation_id": new.operation_id, "decision": "approve"})  # replay
    reviewer_client.post(decide, {"operation_id": new.operation_id, "decision": "decline"})  # conflict
    response = lead_client.get(reverse("admin:cases_case_history", args=[case.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    text = html.unescape(page)
    # Proposals with origins and authors, the diff, pending reviews.
    assert "Prepared" in text and "by the pipeline" in text
    assert "Human edit" in text and "by <strong>editor</strong>" in text
    assert "+We will call you &lt;today&gt;." in page  # the diff, escaped
    assert "review begun" in text and "now superseded" in text and "now completed" in text
    # Every attempt with its outcome, decisions, effects, the reconcile state.
    for outcome in ("Stale", "Committed", "Replay", "Conflicting decision"):
        assert f"<strong>{outcome}</strong>" in text, outcome
    assert "approved</strong> by <strong>reviewer</strong>" in text
    assert "effect record" in text
    assert "<strong>Committed</strong></td><td>1</td>" in text
    # Leads read; they cannot approve.
    assert 'name="decision"' not in page and "Open the review page" not in page
