"""The delivery panel in a browser (docs/DELIVERY.md), end to end: a reviewer
approves T-1042 on its review page while the reference helpdesk (its own process) is set to
store the reply and drop the answer. The worker's try leaves the delivery Unknown, and the
page says so plainly; the lookup that ``reconcile --repair`` runs finds it, and the page
says Delivered with the helpdesk's reference, one reply on the helpdesk. axe-core checks
both states in both colour schemes; the screenshots go to docs/screenshots/ under
``make screenshots``."""

from __future__ import annotations

import pytest
from django_tasks import default_task_backend
from playwright.sync_api import expect

from effects.delivery import delivery_attempt
from effects.models import Delivery, DeliveryState
from helpdesk.testing import running_helpdesk
from tests.browser.conftest import REVIEWER, in_thread
from tests.browser.test_accessibility import axe_violations

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def helpdesk(tmp_path, settings):
    with running_helpdesk(tmp_path / "helpdesk", faults=True, token="browser-test") as running:
        settings.DECISIONFLOW_DELIVERY_URL = running.url
        settings.DECISIONFLOW_DELIVERY_TOKEN = running.token
        settings.DECISIONFLOW_DELIVERY_READ_TIMEOUT = 5.0
        # The enqueue is recorded, not run: the test makes the worker's tries itself.
        settings.TASKS = {"default": {"BACKEND": "django_tasks.backends.dummy.DummyBackend"}}
        default_task_backend.clear()
        yield running
        default_task_backend.clear()


def test_unknown_then_delivered_on_the_review_and_history_pages(demo, helpdesk, login, live_server, screenshot_dir):
    url = live_server.url
    _context, page = login(*REVIEWER)
    review = f"{url}/admin/reviews/proposal/{demo.current_proposal_id}/review/"
    page.goto(review)
    # Before the decision: what an approval will do.
    expect(page.locator("#df-delivery")).to_contain_text("an approval queues the reply for the helpdesk")

    helpdesk.set_faults(reset=True, drop_after_commit=1)
    page.click("#df-approve")
    page.wait_for_selector("#df-decision")
    operation_id = demo.current_proposal.operation_id
    delivery = Delivery.objects.get(operation_id=operation_id)
    assert delivery.state == DeliveryState.QUEUED
    expect(page.locator("#df-delivery .df-delivery-badge")).to_have_text("Queued")

    # The worker's try: the helpdesk stores the reply and closes the connection unanswered.
    done, _delay = in_thread(delivery_attempt, operation_id=operation_id, worker="host-a:4121", due_only=False)
    assert done == DeliveryState.UNKNOWN
    assert helpdesk.stats()["replies"] == 1
    page.goto(review)
    panel = page.locator("#df-delivery")
    expect(panel.locator(".df-delivery-badge")).to_have_text("Unknown")
    expect(panel).to_contain_text("The helpdesk may have received it; reconcile is checking.")
    expect(panel).to_contain_text("manage.py reconcile --repair")
    expect(panel.locator(".df-try")).to_have_count(1)
    expect(panel.locator(".df-try").first).to_contain_text("host-a:4121")
    expect(panel).not_to_contain_text("HD-")
    panel.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_dir / "delivery-unknown.png"), full_page=False)
    found = {"review page, Unknown": axe_violations(page)}

    # reconcile --repair's try: the lookup by the key finds the reply.
    done, _delay = in_thread(delivery_attempt, operation_id=operation_id, worker="reconcile:77", due_only=False)
    assert done == DeliveryState.DELIVERED
    reference = Delivery.objects.get(operation_id=operation_id).reference
    assert reference.startswith("HD-")
    stats = helpdesk.stats()
    assert stats["replies"] == 1 and stats["duplicate_replies"] == 0
    page.goto(review)
    panel = page.locator("#df-delivery")
    expect(panel.locator(".df-delivery-badge")).to_have_text("Delivered")
    expect(panel.locator(".df-delivery-reference")).to_have_text(reference)
    # Newest first: the lookup that found it, then the send that lost its answer.
    tries = panel.locator(".df-try")
    expect(tries).to_have_count(2)
    expect(tries.nth(0)).to_contain_text("Lookup (GET)")
    expect(tries.nth(0)).to_contain_text("HTTP 200")
    expect(tries.nth(1)).to_contain_text("Send (POST)")
    expect(panel).not_to_contain_text("may have received it")
    panel.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_dir / "delivery-delivered.png"), full_page=False)
    found["review page, Delivered"] = axe_violations(page)

    page.goto(f"{url}/admin/cases/case/{demo.pk}/history/")
    expect(page.locator("#df-delivery .df-delivery-reference")).to_have_text(reference)
    found["history page, Delivered"] = axe_violations(page)
    page.goto(f"{url}/admin/effects/delivery/")
    expect(page.locator("#result_list")).to_contain_text(reference)
    page.screenshot(path=str(screenshot_dir / "deliveries.png"), full_page=False)
    found["deliveries list"] = axe_violations(page)
    page.goto(f"{url}/admin/effects/delivery/{Delivery.objects.get(operation_id=operation_id).pk}/change/")
    expect(page.locator("body")).to_contain_text("reconcile:77")
    found["delivery page"] = axe_violations(page)

    # The dark scheme: the same pages, the same check.
    page.emulate_media(color_scheme="dark")
    for name, path in (
        ("review page, Delivered (dark)", review),
        ("deliveries list (dark)", f"{url}/admin/effects/delivery/"),
    ):
        page.goto(path)
        found[name] = axe_violations(page)
    report = [f"{name}: {v['id']} ({v['impact']}) {v['help']}: {v['nodes']}" for name, vs in found.items() for v in vs]
    assert not report, "\n".join(report)


def test_needs_check_says_look_at_the_ticket_and_never_rejected(demo, helpdesk, login, live_server, screenshot_dir):
    """Stored but its answer lost, the lookup lagging (404), the resend refused (422
    ``ticket_closed``): the page says a person must look, the reply may already be on the
    ticket, and never "Rejected" or "not on the ticket"."""
    url = live_server.url
    _context, page = login(*REVIEWER)
    review = f"{url}/admin/reviews/proposal/{demo.current_proposal_id}/review/"
    page.goto(review)
    helpdesk.set_faults(reset=True, drop_after_commit=1, lookup_lag_s=600)
    page.click("#df-approve")
    page.wait_for_selector("#df-decision")
    operation_id = demo.current_proposal.operation_id
    done, _delay = in_thread(delivery_attempt, operation_id=operation_id, worker="host-a:4121", due_only=False)
    assert done == DeliveryState.UNKNOWN
    helpdesk.set_faults(ticket_closed_count=1)
    done, _delay = in_thread(delivery_attempt, operation_id=operation_id, worker="host-a:4121", due_only=False)
    assert done == DeliveryState.NEEDS_CHECK
    assert helpdesk.stats()["replies"] == 1

    page.goto(review)
    panel = page.locator("#df-delivery")
    expect(panel.locator(".df-delivery-badge")).to_have_text("NeedsCheck")
    expect(panel).to_contain_text("the reply may already be on the ticket")
    expect(panel).to_contain_text("Look at the customer's ticket first")
    expect(panel).not_to_contain_text("not on the ticket")
    expect(panel).not_to_contain_text("Rejected:")
    # The try's error already names its status: said once.
    expect(panel.locator(".df-try").first).to_contain_text("HTTP 422: ticket_closed")
    expect(panel).not_to_contain_text("HTTP 422: HTTP 422")
    panel.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_dir / "delivery-needs-check.png"), full_page=False)
    found = {"review page, NeedsCheck": axe_violations(page)}
    page.goto(f"{url}/admin/effects/delivery/")
    expect(page.locator("#result_list")).to_contain_text("NeedsCheck")
    found["deliveries list, NeedsCheck"] = axe_violations(page)
    page.emulate_media(color_scheme="dark")
    page.goto(review)
    found["review page, NeedsCheck (dark)"] = axe_violations(page)
    report = [f"{name}: {v['id']} ({v['impact']}) {v['help']}: {v['nodes']}" for name, vs in found.items() for v in vs]
    assert not report, "\n".join(report)
