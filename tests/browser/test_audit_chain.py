"""The history page's audit chain line, as a support lead sees it: verified up to the latest
seal after `manage.py audit_seal`, then the break once a sealed decision is changed with the
triggers off (docs/AUDIT.md)."""

from __future__ import annotations

import pytest
from django.db import connection
from playwright.sync_api import expect

from tests.browser.conftest import LEAD, REVIEWER, in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def test_the_history_page_shows_the_seal_then_the_break(demo, login, live_server, screenshot_dir):
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from reviews.models import ReviewDecision
    from workflow.decide import decision_record

    reviewer = get_user_model().objects.get(username=REVIEWER[0])
    proposal = demo.current_proposal
    in_thread(
        lambda: decision_record(
            case=demo, operation_id=proposal.operation_id, approved=True, reviewer=reviewer, channel="command"
        )
    )
    call_command("audit_seal")
    context, page = login(*LEAD)
    page.goto(f"{live_server.url}/admin/cases/case/{demo.pk}/history/")
    line = page.locator("#df-chain td")
    expect(line).to_contain_text("Chain verified up to seal 1 at ")
    expect(line).to_have_class("df-chain-verified")
    page.screenshot(path=str(screenshot_dir / "history-chain-verified.png"), full_page=False)

    decision = ReviewDecision.objects.get(operation_id=proposal.operation_id)
    with connection.cursor() as cursor:
        # What a superuser can do: no trigger fires for this session, its change commits.
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(
            "UPDATE reviews_reviewdecision SET decided_at = decided_at + interval '1 second' WHERE id = %s",
            [decision.pk],
        )
        cursor.execute("SET session_replication_role = origin")
    page.reload()
    expect(line).to_contain_text(f"Chain broken: reviews.reviewdecision {decision.pk} does not match its hash")
    expect(line).to_have_class("df-chain-broken")
    page.screenshot(path=str(screenshot_dir / "history-chain-broken.png"), full_page=False)
