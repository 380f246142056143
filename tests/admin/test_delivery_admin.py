"""What people see of the reply's delivery to the helpdesk (docs/DELIVERY.md): the
panel on the review and history pages, and the view-only list of deliveries with their tries.

The delivery rows are made here directly and moved through the states the database allows
(effects migration 0006): what writes them in production (the commit statement, the workers,
reconcile --repair) is not these tests' subject; what a reviewer reads of each state is."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from effects.models import Delivery, DeliveryState
from effects.services import effect_commit
from tests.delivery_rows import approved, delivery_in

pytestmark = pytest.mark.django_db

HELPDESK = override_settings(DECISIONFLOW_DELIVERY_URL="http://127.0.0.1:9/", DECISIONFLOW_DELIVERY_TOKEN="t")
UNKNOWN_SENTENCE = "The helpdesk may have received it; reconcile is checking"


def page(client, url) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return html.unescape(response.content.decode())


def review_page(client, proposal) -> str:
    return page(client, reverse("admin:reviews_proposal_review", args=[proposal.pk]))


def history_page(client, case) -> str:
    return page(client, reverse("admin:cases_case_history", args=[case.pk]))


def panel(text: str) -> str:
    match = re.search(r'<div class="df-section" id="df-delivery">(.*?)\n</div>\n', text, re.S)
    assert match, "no delivery panel on the page"
    return match.group(1)


def test_no_helpdesk_and_no_delivery_means_no_panel(reviewer_client, reviewer, proposal, case):
    approved(proposal, reviewer)
    assert 'id="df-delivery"' not in review_page(reviewer_client, proposal)
    assert 'id="df-delivery"' not in history_page(reviewer_client, case)
    assert "<th>Delivery</th>" not in history_page(reviewer_client, case)


@HELPDESK
def test_a_decline_says_nothing_is_sent(reviewer_client, reviewer, proposal, case):
    effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=reviewer)
    for text in (review_page(reviewer_client, proposal), history_page(reviewer_client, case)):
        assert "Declined: nothing is sent for a decline." in panel(text)
        assert "df-delivery-badge" not in panel(text)


@HELPDESK
def test_an_undecided_proposal_says_what_an_approval_will_do(reviewer_client, proposal):
    assert "an approval queues the reply for the helpdesk" in panel(review_page(reviewer_client, proposal))


def test_an_approval_from_before_the_helpdesk_says_nothing_was_sent(reviewer_client, reviewer, proposal):
    approved(proposal, reviewer)  # no helpdesk configured yet: no delivery is written
    with HELPDESK:
        assert "Approved while no helpdesk was configured" in panel(review_page(reviewer_client, proposal))


def test_delivered_shows_the_reference_and_the_tries_newest_first(reviewer_client, reviewer, proposal, case):
    delivery = delivery_in(approved(proposal, reviewer), DeliveryState.DELIVERED, tries=3)
    # Shown whether or not a helpdesk is configured now: the row is what happened.
    for text in (review_page(reviewer_client, proposal), history_page(reviewer_client, case)):
        shown = panel(text)
        assert '<span class="df-delivery-badge df-delivery-delivered">Delivered</span>' in shown
        assert '<code class="df-delivery-reference">HD-REPLY-77</code>' in shown
        assert "3 tries so far" in shown
        rows = re.findall(r'<tr class="df-try df-try-(\w+)">.*?<td>(host-a:\d+)</td>.*?<td>(\d+) ms</td>', shown, re.S)
        assert rows == [
            ("delivered", "host-a:102", "12"),
            ("not_stored", "host-a:101", "11"),
            ("not_stored", "host-a:100", "10"),
        ]
        assert "HTTP 201" in shown and "HTTP 503" in shown and "Send (POST)" in shown
        assert reverse("admin:effects_delivery_change", args=[delivery.pk]) in shown
        assert UNKNOWN_SENTENCE not in shown
    # The history's reconcile table says what reconcile says.
    reconcile_table = re.search(
        r'<table class="df-table" id="df-reconcile">(.*?)</table>', history_page(reviewer_client, case), re.S
    )
    assert (
        reconcile_table
        and "<th>Delivery</th>" in reconcile_table.group(1)
        and "<td>Delivered</td>" in reconcile_table.group(1)
    )


def test_unknown_says_plainly_it_may_have_arrived_and_points_to_reconcile(reviewer_client, reviewer, proposal, case):
    delivery_in(approved(proposal, reviewer), DeliveryState.UNKNOWN, tries=1)
    for text in (review_page(reviewer_client, proposal), history_page(reviewer_client, case)):
        shown = panel(text)
        assert '<span class="df-delivery-badge df-delivery-unknown">Unknown</span>' in shown
        assert UNKNOWN_SENTENCE in shown
        assert "manage.py reconcile --repair" in shown and "manage.py reconcile T-1042" in shown
        assert "do not post the reply yourself" in shown
        assert "ReadTimeout: no answer within 5 s" in shown
        assert "Delivered" not in shown.replace("marks it Delivered", "")


def test_rejected_shows_the_reason(reviewer_client, reviewer, proposal):
    delivery_in(approved(proposal, reviewer), DeliveryState.REJECTED, tries=1)
    shown = panel(review_page(reviewer_client, proposal))
    assert '<span class="df-delivery-badge df-delivery-rejected">Rejected</span>' in shown
    assert "422: the ticket T-1042 is closed" in shown and "HTTP 422" in shown


def test_needs_check_says_the_reply_may_be_on_the_ticket_and_to_look_first(reviewer_client, reviewer, proposal, case):
    from effects.selectors import NEEDS_CHECK_ADVICE, STATE_SENTENCES

    delivery_in(approved(proposal, reviewer), DeliveryState.NEEDS_CHECK, tries=1)
    for text in (review_page(reviewer_client, proposal), history_page(reviewer_client, case)):
        shown = panel(text)
        assert '<span class="df-delivery-badge df-delivery-needs_check">NeedsCheck</span>' in shown
        assert "Needs a person: the reply may already be on the ticket." in shown
        assert STATE_SENTENCES[DeliveryState.NEEDS_CHECK] in shown
        assert NEEDS_CHECK_ADVICE in shown and "Look at the customer's ticket first" in shown
        assert "HTTP 422: ticket_closed" in shown
        # Never the words of Rejected: nobody can say that it is not on the ticket.
        assert "not on the ticket" not in shown and "refused the reply for good" not in shown
        # The resend's own try says the helpdesk refused that request; the delivery is not Rejected.
        assert "df-delivery-rejected" not in shown and "Rejected" not in shown.split("df-delivery-tries")[0]
    listed = page(reviewer_client, reverse("admin:effects_delivery_changelist") + "?state=needs_check")
    assert "T-1042" in listed and NEEDS_CHECK_ADVICE in listed and "HTTP 422: ticket_closed" in listed
    assert "not on the ticket" not in listed


def test_queued_and_sending(reviewer_client, reviewer, proposal):
    delivery = delivery_in(approved(proposal, reviewer), DeliveryState.QUEUED)
    shown = panel(review_page(reviewer_client, proposal))
    assert "df-delivery-queued" in shown and "No try yet." in shown
    # Due five minutes ago and still queued: the panel asks whether a worker runs.
    assert "is a task worker running?" in shown and "manage.py db_worker" in shown
    Delivery.objects.filter(pk=delivery.pk).update(next_try_at=timezone.now() + timedelta(seconds=30))
    assert "is a task worker running?" not in panel(review_page(reviewer_client, proposal))
    delivery.refresh_from_db()
    delivery.state, delivery.lease_owner = DeliveryState.SENDING, "host-b:7"
    delivery.lease_until = timezone.now() + timedelta(minutes=2)
    delivery.save()
    shown = panel(review_page(reviewer_client, proposal))
    assert "df-delivery-sending" in shown and "host-b:7" in shown


def test_the_panel_shows_the_latest_tries_and_counts_the_rest(reviewer_client, reviewer, proposal):
    delivery_in(approved(proposal, reviewer), DeliveryState.QUEUED, tries=13)
    shown = panel(review_page(reviewer_client, proposal))
    assert shown.count('<tr class="df-try ') == 10
    assert "the latest 10; 3 older on the" in shown
    assert "host-a:112" in shown and "host-a:102" not in shown


def test_the_deliveries_list_filters_searches_and_stays_view_only(
    reviewer_client, lead_client, reviewer, proposal, case, load_case
):
    from reviews.services import proposal_create

    delivery_in(approved(proposal, reviewer), DeliveryState.UNKNOWN, tries=1)
    other = proposal_create(case=load_case("t1077.json"))
    delivery_in(approved(other, reviewer), DeliveryState.DELIVERED, tries=1)
    url = reverse("admin:effects_delivery_changelist")
    for client in (reviewer_client, lead_client):  # both groups may read it
        text = page(client, url)
        assert "T-1042" in text and "T-1077" in text and "2 deliveries" in text
    unknown = page(reviewer_client, url + "?state=unknown")
    assert "T-1042" in unknown and "T-1077" not in unknown
    assert "may have been received: reconcile --repair settles it" in unknown
    by_case = page(reviewer_client, url + "?q=T-1077")
    assert "T-1077" in by_case and ">T-1042<" not in by_case and "HD-REPLY-77" in by_case
    by_op = page(reviewer_client, url + "?q=" + proposal.operation_id)
    assert "T-1042" in by_op and ">T-1077<" not in by_op
    # View-only: no add, no change, no delete; the only actions are the exports, which read.
    assert reviewer_client.get(reverse("admin:effects_delivery_add")).status_code == 403
    delivery = Delivery.objects.get(operation_id=proposal.operation_id)
    change = reverse("admin:effects_delivery_change", args=[delivery.pk])
    before = Delivery.objects.values().get(pk=delivery.pk)
    response = reviewer_client.post(change, {"state": "delivered", "reference": "forged"})
    assert response.status_code == 403
    assert Delivery.objects.values().get(pk=delivery.pk) == before
    assert reviewer_client.get(reverse("admin:effects_delivery_delete", args=[delivery.pk])).status_code == 403
    listed = page(reviewer_client, url)
    actions = re.findall(r'<option value="(\w+)"', listed.split('name="action"', 1)[1].split("</select>", 1)[0])
    assert actions == ["export_csv", "export_jsonl"]


def test_a_delivery_page_lists_every_try(reviewer_client, reviewer, proposal):
    delivery = delivery_in(approved(proposal, reviewer), DeliveryState.DELIVERED, tries=13)
    text = page(reviewer_client, reverse("admin:effects_delivery_change", args=[delivery.pk]))
    assert "HD-REPLY-77" in text and "The helpdesk stored the reply" in text
    # All thirteen tries, newest first.
    assert [int(w) for w in re.findall(r"host-a:(\d+)", text)] == list(range(112, 99, -1))
    assert 'name="_save"' not in text


def test_the_deliveries_list_costs_the_same_at_30_rows(admin_client, reviewer, load_case):
    from reviews.services import proposal_create

    def make(n: int, start: int):
        for i in range(start, start + n):
            case = load_case("t1042.json", case_id=f"T-{7000 + i}")
            delivery_in(approved(proposal_create(case=case), reviewer), DeliveryState.DELIVERED, tries=2)

    url = reverse("admin:effects_delivery_changelist")

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert admin_client.get(url).status_code == 200
        return len(ctx)

    make(3, 0)
    small = queries()
    make(27, 3)
    assert queries() == small
