"""The lists tell the truth: commit attempts, times, pending reviews, the sort indicator,
long lines, 403 pages, and one log line per event."""

from __future__ import annotations

import io
import logging
import re
from unittest import mock

import pytest
from django.urls import reverse
from django.utils.log import configure_logging

from core.errors import StaleProposal
from effects.models import CommitAttempt, EffectRecord
from reviews.models import PendingReview
from tests.admin.conftest import stylesheets
from workflow.begin import review_begin
from workflow.decide import decision_record
from workflow.edit import review_edit

pytestmark = pytest.mark.django_db(transaction=False)

SECONDS_AND_ZONE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def result_rows(html: str) -> list[str]:
    body = html.split('id="result_list"', 1)[1].split("</table>", 1)[0]
    return [text_of(row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body.split("<tbody>", 1)[1], re.S)]


@pytest.fixture
def stale_approval_then_commit(case, reviewer, editor):
    """T-1042: an approval refused as stale (after an edit), then the edited proposal committed."""
    old = review_begin(case=case).operation_id
    case.refresh_from_db()
    edited = review_edit(
        case=case, expected_operation_id=old, body=case.current_proposal.body + "\nEdited.", editor=editor
    )
    new = edited.revision.proposal.operation_id
    with pytest.raises(StaleProposal):
        decision_record(case=case, operation_id=old, approved=True, reviewer=reviewer, channel="admin")
    decision_record(case=case, operation_id=new, approved=True, reviewer=reviewer, channel="api")
    return old, new


def test_commit_attempts_show_the_decision_asked_apart_from_the_outcome(admin_client, stale_approval_then_commit):
    html = admin_client.get(reverse("admin:effects_commitattempt_changelist")).content.decode()
    rows = result_rows(html)
    assert len(rows) == CommitAttempt.objects.count() == 2
    committed, stale = rows  # newest first
    assert " approve " in stale and " Stale " in stale and "df-outcome-bad" in html
    assert " approve " in committed and " Committed " in committed
    # No boolean icon anywhere: "approved" is what was asked, never a verdict.
    assert "icon-yes.svg" not in html and "icon-no.svg" not in html
    # Seconds and the zone, on every row.
    assert all(SECONDS_AND_ZONE.search(row) for row in rows)
    # The detail is on the page and wraps inside its column (no side scrolling at 1280 px).
    assert f"stale: {stale_approval_then_commit[0][:18]}" in text_of(html) and "field-detail_text" in html
    assert (
        "max-width: 28rem" in stylesheets(html)
        and " via api " in stale + committed
        and 'class="nav-sidebar"' not in html
    )


def test_commit_attempts_filter_by_the_decision_asked(admin_client, stale_approval_then_commit, case, reviewer):
    from core.errors import InvalidInput

    with pytest.raises(InvalidInput):  # not a boolean: recorded as asking neither
        decision_record(
            case=case, operation_id=stale_approval_then_commit[1], approved="yes", reviewer=reviewer, channel="api"
        )
    url = reverse("admin:effects_commitattempt_changelist")
    counts = {}
    for asked in ("approve", "decline", "neither"):
        counts[asked] = (
            len(result_rows(admin_client.get(f"{url}?asked={asked}").content.decode())) if asked != "decline" else None
        )
    assert (
        counts["approve"] == 2 and counts["neither"] == CommitAttempt.objects.filter(approved__isnull=True).count() == 1
    )
    assert "0 commit attempts" in text_of(admin_client.get(f"{url}?asked=decline").content.decode())
    assert "By decision asked" in text_of(admin_client.get(url).content.decode())


def test_commit_attempts_filter_by_channel_from_the_vocabulary(admin_client, stale_approval_then_commit):
    """The channel filter lists the channels of the vocabulary (and reconcile's repair)
    without reading the attempts, and filters by the one chosen."""
    from reviews.models import Channel

    url = reverse("admin:effects_commitattempt_changelist")
    html = admin_client.get(url).content.decode()
    for value in [*Channel.values, "repair"]:
        assert f"?channel={value}" in html, value
    assert [" via admin " in row for row in result_rows(admin_client.get(f"{url}?channel=admin").content.decode())] == [
        True
    ]
    assert len(result_rows(admin_client.get(f"{url}?channel=api").content.decode())) == 1
    assert "0 commit attempts" in text_of(admin_client.get(f"{url}?channel=repair").content.decode())


@pytest.mark.parametrize(
    "url_name",
    [
        "admin:effects_commitattempt_changelist",
        "admin:effects_effectrecord_changelist",
        "admin:reviews_reviewdecision_changelist",
        "admin:reviews_pendingreview_changelist",
        "admin:reviews_proposal_changelist",
        "admin:cases_case_changelist",
        "admin:api_apitoken_changelist",
    ],
)
def test_every_list_shows_times_with_seconds_and_the_zone(admin_client, stale_approval_then_commit, reviewer, url_name):
    from api.services import token_create

    token_create(user=reviewer, name="t")
    query = "?status=all" if url_name == "admin:reviews_pendingreview_changelist" else ""
    html = admin_client.get(reverse(url_name) + query).content.decode()
    rows = result_rows(html)
    assert rows and all(SECONDS_AND_ZONE.search(row) for row in rows), rows
    assert not re.search(r"\b(a\.m\.|p\.m\.|midnight|noon)", text_of(html))


def test_the_effect_record_page_shows_times_and_wraps_long_lines(admin_client, case, reviewer, editor):
    op = review_begin(case=case).operation_id
    case.refresh_from_db()
    long_line = "x" * 600
    edited = review_edit(
        case=case, expected_operation_id=op, body=case.current_proposal.body + "\n" + long_line, editor=editor
    )
    new = edited.revision.proposal.operation_id
    decision_record(case=case, operation_id=new, approved=True, reviewer=reviewer, channel="test")
    effect = EffectRecord.objects.get()
    html = admin_client.get(reverse("admin:effects_effectrecord_change", args=[effect.pk])).content.decode()
    assert long_line in html and 'class="df-pre"' in html
    assert re.search(r"\.df-pre[^{]*\{[^}]*white-space: pre-wrap; overflow-wrap: anywhere", stylesheets(html))
    assert SECONDS_AND_ZONE.search(text_of(html))


def object_tools(html: str) -> str:
    found = re.search(r'<ul class="object-tools">(.*?)</ul>', html, re.S)
    return found.group(1) if found else ""


def test_detail_pages_link_the_case_history_not_an_empty_change_history(admin_client, case, reviewer):
    """These rows are never changed through the admin: Django's History would always say
    "This object doesn't have a change history". Their tools link the case's timeline."""
    from cases.models import SourceVersion
    from reviews.models import ReviewDecision

    op = review_begin(case=case).operation_id
    decision_record(case=case, operation_id=op, approved=True, reviewer=reviewer, channel="test")
    effect, decision = EffectRecord.objects.get(), ReviewDecision.objects.get()
    timeline = reverse("admin:cases_case_history", args=[case.pk])
    for name, obj in (
        ("effects_effectrecord", effect),
        ("reviews_reviewdecision", decision),
        ("reviews_pendingreview", PendingReview.objects.get()),
        ("effects_commitattempt", CommitAttempt.objects.get()),
        ("cases_case", case),
    ):
        tools = object_tools(admin_client.get(reverse(f"admin:{name}_change", args=[obj.pk])).content.decode())
        assert tools.count(f'href="{timeline}"') == 1, (name, tools)
        assert "Case history" in tools, name
        if name != "cases_case":  # the case's own History is its timeline
            assert reverse(f"admin:{name}_history", args=[obj.pk]) not in tools, name
    # A row of no one case has no history button at all.
    version = SourceVersion.objects.first()
    tools = object_tools(
        admin_client.get(reverse("admin:cases_sourceversion_change", args=[version.pk])).content.decode()
    )
    assert "historylink" not in tools
    # Django's own models keep Django's History: it is real there.
    user_page = admin_client.get(reverse("admin:auth_user_change", args=[reviewer.pk])).content.decode()
    assert reverse("admin:auth_user_history", args=[reviewer.pk]) in object_tools(user_page)


def test_no_view_site_link_back_to_the_admin_and_the_top_bar_links_the_queue(admin_client, lead_client):
    queue = reverse("admin:reviews_reviewqueueitem_changelist")
    for who in (admin_client, lead_client):
        html = who.get(reverse("admin:index")).content.decode()
        userlinks = html.split('id="user-tools"', 1)[1].split("</div>", 1)[0]
        assert "View site" not in userlinks
        assert f'<a href="{queue}" id="df-queue-top-link">Review queue</a>' in userlinks


def test_pending_reviews_are_filtered_to_pending_by_default_with_a_way_to_see_all(
    admin_client, stale_approval_then_commit
):
    url = reverse("admin:reviews_pendingreview_changelist")
    statuses = dict(PendingReview.objects.values_list("operation_id", "status"))
    assert sorted(statuses.values()) == ["completed", "superseded"]
    default = admin_client.get(url).content.decode()
    assert 'id="result_list"' not in default and "0 pending reviews" in text_of(default)  # nothing waits
    everything = admin_client.get(url + "?status=all").content.decode()
    assert len(result_rows(everything)) == 2
    # The filter shows "Pending" selected by default, and offers "All".
    assert re.search(r'<li class="selected">\s*<a href="\?status=pending"', default)
    assert 'href="?status=all"' in default


def test_a_pending_review_is_listed_by_default(admin_client, case):
    review_begin(case=case)
    html = admin_client.get(reverse("admin:reviews_pendingreview_changelist")).content.decode()
    assert len(result_rows(html)) == 1 and " pending " in result_rows(html)[0].lower()


def test_the_case_list_sort_indicator_matches_the_order(admin_client, case, load_case):
    load_case("t1077.json")  # created later: listed first
    html = admin_client.get(reverse("admin:cases_case_changelist")).content.decode()
    rows = result_rows(html)
    assert rows[0].split()[0] == "T-1077" and rows[1].split()[0] == "T-1042"
    created = re.search(r'<th scope="col" class="([^"]*column-created[^"]*)"', html)
    assert created and "sorted descending" in created.group(1)
    headers = re.findall(r'<th scope="col" class="([^"]*sorted[^"]*)".*?</th>', html, re.S)
    assert headers[0] != "" and any("column-created" in h for h in headers)
    priorities = dict(re.findall(r'column-(\w+) sorted \w+".*?Sorting priority: (\d)', html, re.S))
    assert priorities.get("created") == "1", priorities


def test_a_403_has_the_admin_look_and_a_way_back(lead_client, case):
    review_begin(case=case)
    case.refresh_from_db()
    edit = reverse("admin:reviews_proposal_edit", args=[case.current_proposal_id])
    response = lead_client.get(edit)
    assert response.status_code == 403
    html = response.content.decode()
    assert 'id="df-403"' in html and "decisionflow review" in html and 'id="user-tools"' in html
    back = re.search(r'<a href="([^"]+)" class="button" id="df-403-back">Back to the review page</a>', html)
    assert back and back.group(1) == reverse("admin:reviews_proposal_review", args=[case.current_proposal_id])
    assert "signed in as <strong>lead</strong>" in html


def test_a_403_elsewhere_links_back_to_the_previous_page(lead_client):
    mine = "/admin/api/apitoken/mine/"
    response = lead_client.get(mine, headers={"Referer": "http://testserver/admin/cases/case/"})
    assert response.status_code == 403
    assert 'href="http://testserver/admin/cases/case/" class="button" id="df-403-back"' in response.content.decode()
    foreign = lead_client.get(mine, headers={"Referer": "https://evil.example/"}).content.decode()
    assert "evil.example" not in foreign and 'id="df-403-home"' in foreign


@pytest.fixture
def configured_logging(settings):
    """The project's LOGGING applied as a server applies it (after Django's defaults), writing
    to a buffer; the loggers are put back as they were afterwards."""
    names = ["", "django", "django.request", "django.server", "py.warnings"]
    saved = {
        name: (logging.getLogger(name).handlers[:], logging.getLogger(name).level, logging.getLogger(name).propagate)
        for name in names
    }
    settings.DEBUG = True  # Django's extra console handler only printed under DEBUG
    stream = io.StringIO()
    # Every console handler made now writes where this test reads, whichever logger holds it.
    with mock.patch("sys.stderr", stream):
        configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)
    yield stream
    logging.captureWarnings(False)
    for name, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


def test_one_log_line_per_403(configured_logging, lead_client, case):
    review_begin(case=case)
    case.refresh_from_db()
    edit = reverse("admin:reviews_proposal_edit", args=[case.current_proposal_id])
    assert lead_client.get(edit).status_code == 403
    lines = configured_logging.getvalue().splitlines()
    assert lines == [f"WARNING django.request: Forbidden (Permission denied): {edit}"], lines


def test_a_server_error_still_logs_its_traceback(configured_logging):
    logger = logging.getLogger("django.request")
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        logger.error("Internal Server Error: /x", exc_info=exc, extra={"status_code": 500})
    out = configured_logging.getvalue()
    assert out.count("Internal Server Error: /x") == 1 and "Traceback" in out and "RuntimeError: boom" in out


def test_logging_settings_have_one_handler_for_django(settings):
    assert settings.LOGGING["loggers"]["django"]["handlers"] == []
    assert settings.LOGGING["loggers"]["django"]["propagate"] is True
