"""axe-core finds no serious or critical violation on any page of ours.

axe-core is the pinned copy in tests/browser/vendor/ (see its README there), run in each page
after it loaded through Playwright's evaluate, which the page's Content-Security-Policy does
not govern (a <script> tag of it would be refused as inline); nothing is fetched from a network. Every page is checked in the
light and the dark colour scheme (Chromium's ``prefers-color-scheme``, which Django's admin
follows while its theme toggle is on "auto").

One Chromium, one live server and one set of demo data per scheme: a test visits every
page and reports every violation it found at once, page by page.

Then the keyboard: Approve, Decline and Edit are reached in that order with Tab, and each
shows a focus outline of our own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import LEAD, REVIEWER, in_thread, sign_in
from tests.browser.test_publish_policy import V4

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.any_database]  # the markup, not the data

AXE = Path(__file__).parent / "vendor" / "axe.min.js"
BLOCKING = {"serious", "critical"}


def axe_violations(page) -> list[dict]:
    page.evaluate(AXE.read_text(encoding="utf-8"))
    result = page.evaluate(
        """async () => {
            const r = await axe.run(document, {resultTypes: ["violations"]});
            return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                nodes: v.nodes.map(n => n.target.join(" ") + " :: " + n.failureSummary.replace(/\\s+/g, " ")).slice(0, 4)}));
        }"""
    )
    return [v for v in result if v["impact"] in BLOCKING]


def data():
    """A paused case with an edited proposal, a committed case with its effect, and a queue
    with a review in each SLA state (breached, at risk, within), one of them claimed."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from cases.models import Case
    from effects.models import EffectRecord
    from reviews.models import PendingReview
    from workflow.begin import review_begin
    from workflow.decide import decision_record
    from workflow.edit import review_edit
    from workflow.queue import review_claim

    reviewer = get_user_model().objects.get(username="reviewer")
    paused = Case.objects.get(case_id="T-1042")
    first = paused.current_proposal
    edited = in_thread(
        review_edit,
        case=paused,
        expected_operation_id=first.operation_id,
        body=first.body.replace("Kind regards,", "We will call you on Monday.\n\nKind regards,"),
        editor=reviewer,
    )
    committed = Case.objects.get(case_id="T-1077")
    begun = in_thread(review_begin, case=committed)
    in_thread(
        decision_record,
        case=committed,
        operation_id=begun.operation_id,
        approved=True,
        reviewer=reviewer,
        channel="admin",
    )
    for case_id in ("T-1103", "T-1150"):
        in_thread(review_begin, case=Case.objects.get(case_id=case_id))
    now = timezone.now()
    for case_id, age in (("T-1042", timedelta(hours=5)), ("T-1103", timedelta(hours=3, minutes=30))):
        PendingReview.objects.filter(case__case_id=case_id, status=PendingReview.Status.PENDING).update(
            created_at=now - age
        )
    claimed = PendingReview.objects.get(case__case_id="T-1103", status=PendingReview.Status.PENDING)
    in_thread(review_claim, pending=claimed, user=get_user_model().objects.get(username="reviewer2"))
    return {
        "paused": paused,
        "current": edited.revision.proposal,
        "committed": committed,
        "committed_proposal": Case.objects.get(pk=committed.pk).current_proposal,
        "effect": EffectRecord.objects.get(operation_id=begun.operation_id),
    }


def new_page(browser, live_server, scheme: str, user: tuple[str, str] | None):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
    page = context.new_page()
    if user is not None:
        sign_in(page, live_server, *user)
    return context, page


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_no_serious_or_critical_violation_on_our_pages(demo, browser, live_server, scheme, screenshot_dir, settings):
    settings.DECISIONFLOW_REVIEW_SLA = "4h"  # the queue's ages above make one breached, one at risk
    made = data()
    url = live_server.url
    found: dict[str, list[dict]] = {}

    anonymous, page = new_page(browser, live_server, scheme, None)
    page.goto(f"{url}/admin/login/")
    found["login"] = axe_violations(page)
    anonymous.close()

    context, page = new_page(browser, live_server, scheme, REVIEWER)
    pages = {
        "admin index": "/admin/",
        "case list": "/admin/cases/case/",
        "review page (current, paused)": f"/admin/reviews/proposal/{made['current'].pk}/review/",
        "review page (superseded)": f"/admin/reviews/proposal/{made['paused'].current_proposal.parent_id}/review/",
        "review page (committed)": f"/admin/reviews/proposal/{made['committed_proposal'].pk}/review/",
        "history page": f"/admin/cases/case/{made['paused'].pk}/history/",
        "edit page": f"/admin/reviews/proposal/{made['current'].pk}/edit/",
        "effect record": f"/admin/effects/effectrecord/{made['effect'].pk}/change/",
        "commit attempts list": "/admin/effects/commitattempt/",
        "signed exports list": "/admin/audit/signedexport/",
        "pending reviews list": "/admin/reviews/pendingreview/",
        "your API tokens": "/admin/api/apitoken/mine/",
        "case list, searched": "/admin/cases/case/?q=1042",
        "review queue": "/admin/reviews/reviewqueueitem/",
    }
    for name, path in pages.items():
        response = page.goto(url + path)
        assert response is not None and response.ok, f"{name}: {path} answered {response and response.status}"
        found[name] = axe_violations(page)
        if name == "review page (committed)" and scheme == "dark":
            page.screenshot(path=str(screenshot_dir / "review-dark.png"), full_page=False)

    # The bulk confirmation: two cases selected, "Approve selected".
    page.goto(f"{url}/admin/cases/case/")
    for case_id in ("T-1042", "T-1150"):
        page.locator("#result_list tr", has_text=case_id).locator("input.action-select").check()
    page.select_option("select[name=action]", "approve_selected")
    page.click("button[name=index]")
    page.wait_for_selector("body.df-decide-selected")
    found["bulk confirmation"] = axe_violations(page)
    context.close()

    # A support lead's review page (no decision buttons, the read-only note).
    context, page = new_page(browser, live_server, scheme, LEAD)
    page.goto(f"{url}/admin/reviews/proposal/{made['current'].pk}/review/")
    found["review page (support lead)"] = axe_violations(page)

    # The lead's policy publish page, and its confirmation of what would be superseded.
    page.goto(f"{url}/admin/cases/policy/publish/")
    found["policy publish page"] = axe_violations(page)
    page.fill("#df-policy-json", json.dumps(V4, indent=2))
    page.click("#df-publish-preview")
    page.wait_for_selector("#df-publish-summary")
    found["policy publish confirmation"] = axe_violations(page)
    context.close()

    report = [
        f"{name}: {v['id']} ({v['impact']}) {v['help']}\n      " + "\n      ".join(v["nodes"])
        for name, violations in found.items()
        for v in violations
    ]
    assert not report, f"axe-core, {scheme} scheme:\n" + "\n".join(report)


def test_keyboard_reaches_approve_decline_edit_in_order_with_a_visible_focus(demo, login, live_server):
    _context, page = login(*REVIEWER)
    page.goto(f"{live_server.url}/admin/reviews/proposal/{demo.current_proposal_id}/review/")
    page.wait_for_selector("#df-approve")
    # Start just before the decision form, as a reader who got there by Tab would.
    page.evaluate("document.querySelector('#df-actions h2').setAttribute('tabindex', '-1')")
    page.focus("#df-actions h2")
    order = []
    for _ in range(3):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.id"))
        # Our own focus style: a solid outline at least 2px wide that the button does not have unfocused.
        style = page.evaluate(
            "(() => { const s = getComputedStyle(document.activeElement);"
            " return [s.outlineStyle, parseFloat(s.outlineWidth), s.outlineOffset]; })()"
        )
        assert style[0] == "solid" and style[1] >= 2, f"{order[-1]} focus outline {style}"
    assert order == ["df-approve", "df-decline", "df-edit"]
    page.keyboard.press("Shift+Tab")
    expect(page.locator("#df-decline")).to_be_focused()
