"""Every page works under the Content-Security-Policy: Chromium reports no violation.

Each browser context listens for ``securitypolicyviolation`` (an init script, which the policy
does not govern) and for Chromium's "Refused to ..." console lines, on every page it opens.
The pages run their scripts as a person would use them: the claim's renewal ping, the token
field that selects itself, the admin's action bar, the publish form and its confirmation,
Swagger UI loading the OpenAPI document and opening an operation.
"""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import LEAD, REVIEWER, in_thread, sign_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.any_database]  # the markup, not the data

LISTEN = """
document.addEventListener("securitypolicyviolation", (e) => {
    window.dfCspViolation(JSON.stringify({
        page: document.location.pathname, directive: e.effectiveDirective, blocked: e.blockedURI,
        source: e.sourceFile + ":" + e.lineNumber, sample: e.sample,
    }));
});
"""


@pytest.fixture
def csp_browser(browser, live_server):
    """``open(user)`` gives a page whose every CSP violation lands in ``violations``."""
    violations: list[str] = []
    contexts = []

    def open_page(user: tuple[str, str] | None):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        contexts.append(context)
        context.expose_function("dfCspViolation", lambda report: violations.append(report))
        context.add_init_script(LISTEN)
        page = context.new_page()
        page.on(
            "console",
            lambda msg: violations.append(f"console: {msg.text}") if "Content Security Policy" in msg.text else None,
        )
        if user is not None:
            sign_in(page, live_server, *user)
        return page

    open_page.violations = violations  # type: ignore[attr-defined]
    yield open_page
    for context in contexts:
        context.close()


def visit(page, url: str) -> None:
    response = page.goto(url)
    assert response is not None and response.ok, f"{url} answered {response and response.status}"
    assert "content-security-policy" in response.headers, f"{url} has no Content-Security-Policy"
    page.wait_for_load_state("load")


def test_no_page_of_ours_violates_the_policy(demo, csp_browser, live_server, settings, screenshot_dir):
    from django.contrib.auth import get_user_model

    from cases.models import Case
    from effects.models import EffectRecord
    from workflow.begin import review_begin
    from workflow.decide import decision_record

    # Renewed every second, so the page's ping runs while the test looks.
    settings.DECISIONFLOW_REVIEW_CLAIM_LEASE = "3s"
    committed_case = Case.objects.get(case_id="T-1077")
    begun = in_thread(review_begin, case=committed_case)
    reviewer = get_user_model().objects.get(username="reviewer")
    in_thread(
        decision_record,
        case=committed_case,
        operation_id=begun.operation_id,
        approved=True,
        reviewer=reviewer,
        channel="admin",
    )
    effect = EffectRecord.objects.get(operation_id=begun.operation_id)
    url = live_server.url

    anonymous = csp_browser(None)
    visit(anonymous, f"{url}/admin/login/")

    page = csp_browser(REVIEWER)
    for path in (
        "/admin/",
        "/admin/cases/case/",
        f"/admin/cases/case/{demo.pk}/change/",
        f"/admin/cases/case/{demo.pk}/history/",
        f"/admin/reviews/proposal/{demo.current_proposal_id}/edit/",
        f"/admin/effects/effectrecord/{effect.pk}/change/",
        "/admin/effects/commitattempt/",
        "/admin/effects/delivery/",
        f"/admin/reviews/proposal/{effect.proposal_id}/review/",
    ):
        visit(page, url + path)

    # The review queue, then the review page with its workflow picture and a claim of our own,
    # whose page pings to renew it.
    visit(page, f"{url}/admin/reviews/reviewqueueitem/")
    expect(page.locator("#result_list tbody tr").first).to_contain_text("T-1042")
    page.locator("#result_list tbody tr").first.locator("a.df-queue-case").click()
    expect(page.locator("#df-workflow svg.df-workflow-svg")).to_be_visible()
    page.screenshot(path=str(screenshot_dir / "review-under-csp.png"), full_page=False)
    page.click("#df-claim-button")
    expect(page.locator("#df-claim-mine")).to_be_visible()
    shown = page.locator("#df-claim-until").text_content()
    expect(page.locator("#df-claim-until")).not_to_have_text(shown or "", timeout=5000)

    # The bulk confirmation, through the admin's action bar.
    visit(page, f"{url}/admin/cases/case/")
    page.locator("#result_list tr", has_text="T-1150").locator("input.action-select").check()
    page.select_option("select[name=action]", "decline_selected")
    page.click("button[name=index]")
    page.wait_for_selector("body.df-decide-selected")

    # A token: the field selects itself when clicked.
    visit(page, f"{url}/admin/api/apitoken/mine/")
    page.fill("#df-token-name", "csp test")
    page.click("#df-token-submit")
    # Clicked once the new page's scripts have run (on a busy machine the click could come
    # first), and the selection awaited rather than read once.
    page.wait_for_load_state("load")
    page.click("#df-token-secret")
    page.wait_for_function(
        "(() => { const f = document.getElementById('df-token-secret');"
        " return f.selectionStart === 0 && f.selectionEnd === f.value.length && f.value.length > 0; })()",
        timeout=5000,
    )

    # The API's docs: Swagger UI from our own static files, the document loaded, one operation open.
    visit(page, f"{url}/api/docs")
    operation = page.locator(".opblock-summary").first
    operation.wait_for()
    operation.click()
    body = page.locator(".opblock-body").first
    body.locator("button.try-out__btn").click()
    body.locator("input[placeholder=case_id]").fill("T-1042")
    body.locator("button.execute").click()
    expect(body.locator(".live-responses-table tbody .response-col_status").first).to_have_text("200")
    page.screenshot(path=str(screenshot_dir / "api-docs-under-csp.png"), full_page=False)

    # The policy publish page and its confirmation, as a support lead.
    lead = csp_browser(LEAD)
    visit(lead, f"{url}/admin/cases/policy/")
    lead.click("#df-publish-link")
    lead.fill(
        "#df-policy-json",
        json.dumps({"name": "support-reply", "label": "v4", "parameters": {"allowance_units": 10}}),
    )
    lead.click("#df-publish-preview")
    expect(lead.locator("#df-publish-summary")).to_contain_text("support-reply v4")

    assert not csp_browser.violations, "CSP violations:\n" + "\n".join(csp_browser.violations)
