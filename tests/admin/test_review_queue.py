"""The review queue: order, ages and SLA states with a frozen clock; filters; the
query budget; the admin index's count; claims; decline reasons through the admin."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from cases.models import Case
from core.errors import ClaimHeld
from reviews.models import PendingReview, ReviewClaimEvent, ReviewDecision
from tests.admin.test_changelists import make_cases
from workflow import queue

pytestmark = pytest.mark.django_db

URL = "/admin/reviews/reviewqueueitem/"
NOW = timezone.now().replace(microsecond=0)


@pytest.fixture
def frozen():
    """Every timezone.now() (the page's clock and auto_now fields alike) answers NOW."""
    with mock.patch("django.utils.timezone.now", return_value=NOW):
        yield NOW


def pending_made(n: int, reviewer, ages: list[timedelta]) -> list[PendingReview]:
    """n pending reviews (bulk-made, as the case list's tests make them), begun ``ages`` ago;
    the ages are given out in an order unlike the rows' ids, so that order is tested."""
    make_cases(0, n, reviewer)
    # make_cases decides some of its cases: those reviews are completed, not pending.
    PendingReview.objects.filter(proposal__decisions__isnull=False).update(status="completed")
    PendingReview.objects.exclude(proposal__decisions__isnull=False).update(status="pending")
    rows = list(PendingReview.objects.filter(status="pending").order_by("id"))
    assert len(rows) >= len(ages)
    for row, age in zip(reversed(rows[: len(ages)]), ages, strict=True):
        PendingReview.objects.filter(pk=row.pk).update(created_at=NOW - age)
    PendingReview.objects.filter(pk__in=[r.pk for r in rows[len(ages) :]]).update(status="completed")
    return list(PendingReview.objects.filter(status="pending").order_by("created_at", "id"))


def listed(response) -> list[tuple[str, str]]:
    cl = response.context["cl"]
    admin = cl.model_admin
    return [(row.case.case_id, admin.age(row), admin.sla(row)) for row in cl.result_list]


AGES = [timedelta(minutes=10), timedelta(hours=5), timedelta(hours=1), timedelta(hours=3, minutes=30)]


def test_oldest_first_with_ages_and_sla_states(admin_client, reviewer, frozen, settings):
    settings.DECISIONFLOW_REVIEW_SLA = "4h"
    pending_made(16, reviewer, AGES)
    response = admin_client.get(URL)
    assert response.status_code == 200
    rows = listed(response)
    # Oldest first: 5h, 3h30, 1h, 10m.
    assert ["5h 00m" in age for _, age, _ in rows] == [True, False, False, False]
    assert ["3h 30m" in age for _, age, _ in rows] == [False, True, False, False]
    assert ["1h 00m" in age for _, age, _ in rows] == [False, False, True, False]
    assert [">10m<" in age for _, age, _ in rows] == [False, False, False, True]
    # At risk is the last 25% of the target: from 3h of 4h.
    states = [sla.split('"')[1] for _, _, sla in rows]
    assert states == ["df-sla df-sla-breached", "df-sla df-sla-at_risk", "df-sla df-sla-within", "df-sla df-sla-within"]

    def filtered(query):
        return [row.created_at for row in admin_client.get(f"{URL}?{query}").context["cl"].result_list]

    assert filtered("sla=breached") == [NOW - timedelta(hours=5)]
    assert filtered("sla=at_risk") == [NOW - timedelta(hours=3, minutes=30)]
    assert filtered("sla=within") == [NOW - timedelta(hours=1), NOW - timedelta(minutes=10)]


def test_a_policy_target_overrides_the_default(admin_client, reviewer, frozen, settings):
    settings.DECISIONFLOW_REVIEW_SLA = "4h"
    pending_made(16, reviewer, AGES)
    policy = Case.objects.filter(case_id="T-5000").values_list("policy__name", flat=True).get()
    settings.DECISIONFLOW_REVIEW_SLA_BY_POLICY = {policy: "1h"}
    breached = [row.created_at for row in admin_client.get(f"{URL}?sla=breached").context["cl"].result_list]
    # Exactly at the target is breached.
    assert breached == [NOW - timedelta(hours=5), NOW - timedelta(hours=3, minutes=30), NOW - timedelta(hours=1)]
    assert len(admin_client.get(f"{URL}?policy={policy}").context["cl"].result_list) == 4
    assert len(admin_client.get(f"{URL}?policy=no-such-policy").context["cl"].result_list) == 0


def test_a_target_under_a_minute_is_shown_in_seconds(admin_client, reviewer, frozen, settings):
    settings.DECISIONFLOW_REVIEW_SLA = "20s"
    pending_made(16, reviewer, [timedelta(seconds=12)])
    response = admin_client.get(URL)
    html = response.content.decode()
    [(_case, age, sla)] = listed(response)
    assert ">12s<" in age and "of 20s" in sla and "of 0m" not in sla
    assert "The SLA target is 20s" in html


@pytest.mark.parametrize(
    "value, shown",
    [
        (timedelta(seconds=20), "20s"),
        (timedelta(seconds=90), "90s"),
        (timedelta(minutes=15), "15m"),
        (timedelta(hours=4), "4h"),
        (timedelta(days=2), "2d"),
        (timedelta(minutes=1, seconds=30, milliseconds=500), "90s"),
    ],
)
def test_target_labels(value, shown):
    from workplace.queue import target_label

    assert target_label(value) == shown


@pytest.mark.parametrize(
    "age, shown",
    [
        (timedelta(0), "0s"),
        (timedelta(seconds=59), "59s"),
        (timedelta(seconds=61), "1m"),
        (timedelta(hours=2), "2h 00m"),
    ],
)
def test_age_labels(age, shown):
    from workplace.queue import age_label

    assert age_label(age) == shown


def test_an_empty_queue_says_why_and_what_to_do(admin_client):
    html = admin_client.get(URL).content.decode()
    empty = html.split('id="df-queue-empty">', 1)[1].split("</p>", 1)[0]
    assert empty.startswith("No pending reviews. A case's review starts when the pipeline sends it")
    assert f'href="{reverse("admin:cases_case_changelist")}"' in empty and "Start review" in empty
    assert 'id="result_list"' not in html


def test_an_empty_filter_says_so_and_leads_back_to_the_whole_queue(admin_client, reviewer):
    pending_made(16, reviewer, [timedelta(minutes=5)])
    html = admin_client.get(f"{URL}?sla=breached").content.decode()
    assert "No pending review matches these filters." in html and f'href="{URL}">Show the whole queue' in html
    assert "No pending reviews. A case" not in admin_client.get(URL).content.decode()


def test_the_sla_state_boundaries():
    target = timedelta(hours=4)
    assert queue.sla_state(age=timedelta(hours=3) - timedelta(seconds=1), target=target) == "within"
    assert queue.sla_state(age=timedelta(hours=3), target=target) == "at_risk"
    assert queue.sla_state(age=target - timedelta(seconds=1), target=target) == "at_risk"
    assert queue.sla_state(age=target, target=target) == "breached"


@pytest.mark.parametrize("value", ["4x", "", "-1h", "0"])
def test_a_bad_sla_setting_is_refused_loudly(value, settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.DECISIONFLOW_REVIEW_SLA = value
    with pytest.raises(ImproperlyConfigured, match="DECISIONFLOW_REVIEW_SLA"):
        queue.sla_default()


def test_approve_on_breach_is_not_a_setting(settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.DECISIONFLOW_REVIEW_ON_BREACH = "approve"
    with pytest.raises(ImproperlyConfigured, match="never approved automatically"):
        queue.on_breach("anything")


def test_queries_are_the_same_at_5_and_at_50_pending(admin_client, reviewer):
    make_cases(0, 5, reviewer)
    urls = [URL, f"{URL}?sla=breached", f"{URL}?claimant=none", f"{URL}?p=1"]

    def count(url):
        with CaptureQueriesContext(connection) as ctx:
            assert admin_client.get(url).status_code == 200
        return len(ctx.captured_queries), ctx

    at_5 = {url: count(url)[0] for url in urls}
    make_cases(5, 45, reviewer)
    for url in urls:
        assert count(url)[0] == at_5[url], url
    # No COUNT over the whole table: the pending rows are counted up to a cap, on the index.
    _, ctx = count(URL)
    counts = [q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"].upper() and "pendingreview" in q["sql"]]
    assert len(counts) == 1 and "LIMIT" in counts[0].upper(), counts


def test_the_admin_index_links_the_queue_with_its_count(admin_client, reviewer, frozen):
    pending_made(16, reviewer, AGES)
    page = admin_client.get("/admin/").content.decode()
    assert 'id="df-queue-link">4 pending reviews</a>' in page
    assert 'id="df-queue-breached">1 past SLA</a>' in page
    assert reverse("admin:reviews_reviewqueueitem_changelist") in page


def test_a_support_lead_sees_the_queue_but_cannot_claim(client, lead, reviewer, frozen):
    rows = pending_made(16, reviewer, AGES)
    client.force_login(lead)
    assert client.get(URL).status_code == 200
    assert client.post(reverse("admin:reviews_reviewqueueitem_claim", args=[rows[0].pk])).status_code == 403
    assert not ReviewClaimEvent.objects.exists()


# --- claims -------------------------------------------------------------------------------


def test_claim_renew_lapse_take_over_and_release(reviewer, editor, settings):
    settings.DECISIONFLOW_REVIEW_CLAIM_LEASE = "15m"
    rows = pending_made(4, reviewer, AGES[:1])
    pending = rows[0]
    first = queue.review_claim(pending=pending, user=reviewer, now=NOW)
    assert (first.new, first.claim.username, first.claim.until) == (True, "reviewer", NOW + timedelta(minutes=15))
    # Another reviewer is told who holds it, never silently given it.
    with pytest.raises(ClaimHeld, match="being reviewed by reviewer since"):
        queue.review_claim(pending=pending, user=editor, now=NOW + timedelta(minutes=5))
    # The holder's page renews it: no new event, a later lapse.
    renewed = queue.review_claim(pending=pending, user=reviewer, now=NOW + timedelta(minutes=10))
    assert (renewed.new, renewed.claim.since, renewed.claim.until) == (False, NOW, NOW + timedelta(minutes=25))
    pending.refresh_from_db()
    assert queue.live_claim(pending, NOW + timedelta(minutes=24)).username == "reviewer"
    # Lapsed: anyone may take it over.
    assert queue.live_claim(pending, NOW + timedelta(minutes=25)) is None
    taken = queue.review_claim(pending=pending, user=editor, now=NOW + timedelta(minutes=26))
    assert (taken.new, taken.claim.username) == (True, "editor")
    with pytest.raises(ClaimHeld, match="being reviewed by editor"):
        queue.review_claim(pending=pending, user=reviewer, now=NOW + timedelta(minutes=27))
    assert queue.review_claim_release(pending=pending, user=reviewer, now=NOW + timedelta(minutes=28)) is False
    assert queue.review_claim_release(pending=pending, user=editor, now=NOW + timedelta(minutes=29)) is True
    assert list(ReviewClaimEvent.objects.order_by("at").values_list("kind", "user__username")) == [
        ("claimed", "reviewer"),
        ("claimed", "editor"),
        ("released", "editor"),
    ]


def test_claims_show_in_the_history(admin_client, reviewer):
    rows = pending_made(4, reviewer, AGES[:1])
    queue.review_claim(pending=rows[0], user=reviewer)
    queue.review_claim_release(pending=rows[0], user=reviewer)
    page = admin_client.get(reverse("admin:cases_case_history", args=[rows[0].case_id])).content.decode()
    assert "claimed by <strong>reviewer</strong>" in page
    assert "released by <strong>reviewer</strong>" in page


def test_a_claim_is_advisory_the_other_reviewer_sees_it_and_may_still_decide(client, reviewer, editor):
    rows = pending_made(4, reviewer, AGES[:1])
    pending = rows[0]
    client.force_login(reviewer)
    claim_url = reverse("admin:reviews_reviewqueueitem_claim", args=[pending.pk])
    assert client.post(claim_url).status_code == 302
    page = client.get(reverse("admin:reviews_proposal_review", args=[pending.proposal_id])).content.decode()
    assert 'id="df-claim-mine"' in page and 'id="df-release"' in page
    renew = client.post(reverse("admin:reviews_reviewqueueitem_renew", args=[pending.pk]))
    assert renew.status_code == 200 and renew.json()["claimed_by"] == "reviewer"

    client.force_login(editor)
    page = client.get(reverse("admin:reviews_proposal_review", args=[pending.proposal_id])).content.decode()
    assert "Being reviewed by reviewer since" in page
    assert 'id="df-claim-warning"' in page
    # The editor's renew ping (a page opened before) is refused, with who holds it.
    refused = client.post(reverse("admin:reviews_reviewqueueitem_renew", args=[pending.pk]))
    assert refused.status_code == 409 and refused.json()["code"] == "claim_held"
    # The claim button says the refusal in the same words as the ping's answer.
    said = [str(m) for m in client.post(claim_url, follow=True).context["messages"]]
    assert said == [refused.json()["message"]] and said[0].startswith("not claimed: being reviewed by reviewer since")
    listed_claim = client.get(f"{URL}?claimant={reviewer.pk}").context["cl"].result_list
    assert [row.pk for row in listed_claim] == [pending.pk]
    assert list(client.get(f"{URL}?claimant=me").context["cl"].result_list) == []


# --- decline reasons through the admin ----------------------------------------------------


def test_the_admin_decline_carries_its_reason_and_a_second_keeps_the_first(admin_client, proposal, reviewer, client):
    client.force_login(reviewer)
    url = reverse("admin:reviews_proposal_decide", args=[proposal.pk])
    page = client.get(reverse("admin:reviews_proposal_review", args=[proposal.pk])).content.decode()
    assert '<select name="reason" id="df-reason">' in page and 'value="expired"' not in page
    data = {"operation_id": proposal.operation_id, "decision": "decline", "reason": "evidence", "note": "KB-311 v2"}
    assert client.post(url, data).status_code == 302
    decision = ReviewDecision.objects.get(operation_id=proposal.operation_id)
    assert (decision.decline_reason, decision.decline_note) == ("evidence", "KB-311 v2")
    client.post(url, {**data, "reason": "tone", "note": ""})
    decision.refresh_from_db()
    assert decision.decline_reason == "evidence"
    page = client.get(reverse("admin:reviews_proposal_review", args=[proposal.pk])).content.decode()
    assert 'id="df-decline-reason-shown">Evidence does not support it</strong>' in page
    history = client.get(reverse("admin:cases_case_history", args=[proposal.case_id])).content.decode()
    assert 'reason: <strong class="df-decline-reason">Evidence does not support it</strong>' in history
    assert 'reason asked: <span class="df-decline-reason">Tone</span>' in history


def test_the_admin_refuses_an_unknown_or_system_reason_and_writes_no_decision(client, proposal, reviewer):
    client.force_login(reviewer)
    url = reverse("admin:reviews_proposal_decide", args=[proposal.pk])
    for reason in ("expired", "bored"):
        response = client.post(url, {"operation_id": proposal.operation_id, "decision": "decline", "reason": reason})
        assert response.status_code == 302
        assert not ReviewDecision.objects.exists()
