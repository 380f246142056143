"""The bulk confirmation tells the truth: per row what will happen, and a button that
counts only the rows that will act, in correct English."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from tests.admin.conftest import counts
from workflow.begin import review_begin
from workflow.decide import decision_record
from workflow.edit import review_edit

pytestmark = pytest.mark.django_db(transaction=False)


def confirm(client, action, cases):
    response = client.post(
        reverse("admin:cases_case_changelist"), {"action": action, "_selected_action": [c.pk for c in cases]}
    )
    assert response.status_code == 200
    return response.content.decode()


def row_of(page, case_id) -> str:
    match = re.search(rf'<tr class="df-row-(act|skip)" data-case="{case_id}">(.*?)</tr>', page, re.S)
    assert match, page
    return match.group(1) + " " + re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", match.group(2)))


def button(page) -> str | None:
    match = re.search(r'id="df-confirm">([^<]*)</button>', page)
    return match.group(1) if match else None


@pytest.fixture
def four(case, reviewer, editor, load_case):
    """T-1042 pending, T-1150 edited by another person and pending, T-1077 approved, T-1103 never begun."""
    review_begin(case=case)
    edited = load_case("t1150.json")
    review_begin(case=edited)
    edited.refresh_from_db()
    review_edit(
        case=edited,
        expected_operation_id=edited.current_proposal.operation_id,
        body=edited.current_proposal.body + "\nWe will call you.",
        editor=editor,
    )
    approved = load_case("t1077.json")
    op = review_begin(case=approved).operation_id
    decision_record(case=approved, operation_id=op, approved=True, reviewer=reviewer, channel="test")
    never = load_case("t1103.json")
    for c in (case, edited, approved, never):
        c.refresh_from_db()
    return case, edited, approved, never


def test_each_row_says_what_will_happen_and_the_button_counts_the_acting_rows(reviewer_client, four):
    case, edited, approved, never = four
    before = counts()
    page = confirm(reviewer_client, "approve_selected", four)
    assert counts() == before  # the confirmation writes nothing
    assert button(page) == "Approve 2 proposals"
    t1042 = row_of(page, "T-1042")
    assert t1042.startswith("act") and case.current_proposal.operation_id in t1042 and " approve " in t1042
    assert re.search(r'class="df-human-edit">no<', page.split('data-case="T-1042"', 1)[1])
    t1150 = row_of(page, "T-1150")
    assert t1150.startswith("act") and "yes: edited by a person" in t1150
    assert "“We will call you.”" in t1150  # the person-written sentence, to be read here
    t1077 = row_of(page, "T-1077")
    assert t1077.startswith("skip") and re.search(r"skip: already approved by reviewer at \S+ \S+ UTC", t1077)
    t1103 = row_of(page, "T-1103")
    assert t1103.startswith("skip") and "skip: no review begun" in t1103
    # The full identity: monospace, one line, scrollable; a spot for warnings on every row.
    assert page.count('class="df-op-scroll"') == 3 and page.count('class="df-warnings"') == 4
    # Only the acting rows are sent when confirmed.
    posted = re.findall(r'name="operation_id_(\d+)"', page)
    assert sorted(map(int, posted)) == sorted([case.pk, edited.pk])


def test_one_row_is_singular_and_a_decline_says_decline(reviewer_client, four):
    case, edited, approved, never = four
    page = confirm(reviewer_client, "decline_selected", [case, approved])
    assert button(page) == "Decline 1 proposal"
    assert "a decline now would be refused as a conflict" in row_of(page, "T-1077")


def test_nothing_to_do_offers_no_button(reviewer_client, four):
    case, edited, approved, never = four
    page = confirm(reviewer_client, "approve_selected", [approved, never])
    assert button(page) is None and 'id="df-nothing-to-do"' in page


def test_confirming_acts_on_the_counted_rows_only(reviewer_client, four):
    from effects.models import EffectRecord

    case, edited, approved, never = four
    page = confirm(reviewer_client, "approve_selected", four)
    data = {
        "action": "approve_selected",
        "post": "yes",
        "_selected_action": re.findall(r'name="_selected_action" value="(\d+)"', page),
    }
    data.update(dict(re.findall(r'name="(operation_id_\d+)" value="([^"]+)"', page)))
    response = reviewer_client.post(reverse("admin:cases_case_changelist"), data, follow=True)
    said = " ".join(str(m) for m in response.context["messages"])
    assert "approve selected: 2 done, 0 skipped or refused." in said
    assert sorted(EffectRecord.objects.values_list("case__case_id", flat=True)) == ["T-1042", "T-1077", "T-1150"]


def test_the_editor_is_not_offered_their_own_edit(editor, four):
    """Four eyes: the person who edited T-1150 sees it skipped with the reason, and the
    button does not count it; their decline is still offered."""
    from django.test import Client

    case, edited, approved, never = four
    client = Client()
    client.force_login(editor)
    page = confirm(client, "approve_selected", four)
    assert button(page) == "Approve 1 proposal"
    t1150 = row_of(page, "T-1150")
    assert t1150.startswith("skip") and "skip: four eyes: You made the human edit" in t1150
    assert sorted(map(int, re.findall(r'name="operation_id_(\d+)"', page))) == [case.pk]
    page = confirm(client, "decline_selected", four)
    assert row_of(page, "T-1150").startswith("act") and button(page) == "Decline 2 proposals"
