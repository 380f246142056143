"""The text policy's markers on the admin pages (docs/TEXT.md): the review page, the bulk
confirmation, the effect record, the history diff and the evidence's full text."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from effects.models import EffectRecord
from effects.services import effect_commit
from tests.admin.conftest import stylesheets
from workflow.begin import review_begin
from workflow.edit import review_edit

pytestmark = pytest.mark.django_db

ZWSP, RLM, SHY = "\u200b", "\u200f", "\u00ad"
MIXED = "p\u0430ypal"  # a Cyrillic "а"


@pytest.fixture
def marked_case(load_case):
    """T-1042 with a draft holding each kind of marked character, its review begun."""
    from tests.conftest import load_fixture

    data = load_fixture("t1042.json")
    draft = (
        data["draft"]
        .replace("Hello,", f"Hello{ZWSP},")
        .replace("Kind regards,", f"Pay via {MIXED}.{RLM}\n\nKind{SHY} regards,")
    )
    case = load_case("t1042.json", draft=draft, subject=data["subject"] + f" {RLM}")
    review_begin(case=case)
    case.refresh_from_db()
    return case


def badges(html: str) -> list[str]:
    return re.findall(r'class="df-tm df-tm-[a-z]+"[^>]*data-label="([^"]+)"', html)


def test_review_page_marks_each_character_where_it_stands_and_counts_them(reviewer_client, marked_case):
    proposal = marked_case.current_proposal
    html = reviewer_client.get(reverse("admin:reviews_proposal_review", args=[proposal.pk])).content.decode()
    body = html.split('id="df-body">', 1)[1].split("</pre>", 1)[0]
    # In the body, in reading order; the characters themselves are still there.
    assert badges(body) == ["ZWSP U+200B", "Latin+Cyrillic", "RLM U+200F", "SHY U+00AD"]
    assert ZWSP in body and RLM in body and SHY in body and MIXED in body
    # The subject's RLM is marked too, and the banner counts all five.
    assert 'data-count="5"' in html and "5 marked places on this page" in html
    assert "4 invisible or format characters and 1 word mixing scripts" in html
    assert "body: U+200B ZERO WIDTH SPACE at line 1, column 6" in html


def test_a_page_without_markers_has_no_banner(reviewer_client, begun, case):
    html = reviewer_client.get(
        reverse("admin:reviews_proposal_review", args=[case.current_proposal.pk])
    ).content.decode()
    assert 'id="df-text-markers"' not in html and badges(html) == []


def test_person_written_sentences_keep_their_markers(reviewer_client, reviewer, marked_case):
    proposal = marked_case.current_proposal
    edited = review_edit(
        case=marked_case,
        expected_operation_id=proposal.operation_id,
        body=proposal.body + f"\nWe add{ZWSP} this.",
        editor=reviewer,
    ).revision.proposal
    html = reviewer_client.get(reverse("admin:reviews_proposal_review", args=[edited.pk])).content.decode()
    body = html.split('id="df-body">', 1)[1].split("</pre>", 1)[0]
    assert re.search(
        r'<mark class="df-unchecked"[^>]*>We add<span class="df-tm df-tm-invisible"[^>]*>\u200b</span> this\.</mark>',
        body,
    )
    # The diff against the parent marks it as well, and so does the history.
    diff = html.split('id="df-diff">', 1)[1].split("</pre>", 1)[0]
    assert "ZWSP U+200B" in diff
    history = reviewer_client.get(reverse("admin:cases_case_history", args=[marked_case.pk])).content.decode()
    assert 'id="df-text-markers"' in history and "in this history's changes" in history
    assert "ZWSP U+200B" in history.split('id="df-timeline"', 1)[1]


def test_bulk_confirmation_has_a_markers_cell_per_row(reviewer_client, marked_case, load_case):
    other = load_case("t1150.json")
    review_begin(case=other)
    response = reviewer_client.post(
        reverse("admin:cases_case_changelist"),
        {"action": "approve_selected", "_selected_action": [marked_case.pk, other.pk]},
    )
    cells = re.findall(r'<div class="df-text-markers">(.*?)</div>\s*</td>', response.content.decode(), re.S)
    assert len(cells) == 2
    marked, plain = cells  # ordered by case id: T-1042, T-1150
    assert 'data-count="5"' in marked and "5 marked" in marked and "ZWSP U+200B" in marked
    assert 'data-count="0"' in plain and "none" in plain


def test_effect_record_page_marks_the_reviewed_body(admin_client, reviewer, marked_case):
    proposal = marked_case.current_proposal
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    effect = EffectRecord.objects.get(operation_id=proposal.operation_id)
    html = admin_client.get(reverse("admin:effects_effectrecord_change", args=[effect.pk])).content.decode()
    body = html.split('id="df-effect-body">', 1)[1].split("</pre>", 1)[0]
    assert badges(body) == ["ZWSP U+200B", "Latin+Cyrillic", "RLM U+200F", "SHY U+00AD"]
    assert 'data-count="4"' in html and "4 marked places in this body" in html
    assert ".df-tm::after" in stylesheets(html)  # the styles are on the page
