"""The review page after the pipeline withdrew the review: what a reviewer sees."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import REVIEWER, in_thread

pytestmark = pytest.mark.django_db(transaction=True)

REASON = "ticket closed in the helpdesk"


def test_the_review_page_says_withdrawn_by_the_pipeline_with_the_reason(demo, login, live_server, screenshot_dir):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from reviews.groups import PIPELINE
    from workflow.withdraw import case_withdraw

    pipeline = get_user_model().objects.create_user(username="pipeline-svc")
    pipeline.groups.add(Group.objects.get(name=PIPELINE))
    in_thread(
        case_withdraw,
        case=demo,
        operation_id=demo.current_proposal.operation_id,
        actor=get_user_model().objects.get(pk=pipeline.pk),
        reason=REASON,
    )
    _context, page = login(*REVIEWER)
    page.goto(f"{live_server.url}/admin/reviews/proposal/{demo.current_proposal.pk}/review/")
    banner = page.locator("#df-decision")
    expect(banner).to_contain_text("Withdrawn by the pipeline (pipeline-svc) at")
    expect(banner).to_contain_text(f"Reason: Withdrawn by the pipeline ({REASON}).")
    expect(page.locator("#df-withdrawn")).to_contain_text("an approval is refused")
    # Decided means decided: nothing to approve or decline.
    expect(page.locator("#df-approve")).to_have_count(0)
    expect(page.locator("#df-decided")).to_contain_text("Withdrawn by the pipeline (pipeline-svc) at")
    # The picture marks it declined (the commit step's decline, no effect), withdrawn by the pipeline.
    expect(page.locator(".df-workflow-svg.df-at-declined")).to_have_count(1)
    expect(page.get_by_text("declined (withdrawn by the pipeline (pipeline-svc))")).to_have_count(1)
    page.screenshot(path=str(screenshot_dir / "review-withdrawn.png"), full_page=True)
