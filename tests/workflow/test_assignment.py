"""Assignment and hand-over: whose a pending review is, every move in the history, out of
office with a substitute, and the policy's "assignee only" (the default: assignee first).

T-1077's billing-reply names "Billing reviewers"; T-1042's support-reply names no group.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from cases.models import ASSIGNEE_ONLY, Case
from cases.services import case_import, validate_policy_data
from core.errors import InvalidInput, NotAssignee, PermissionRefused
from effects.models import CommitAttempt
from reviews.models import AssignmentKind, PendingReview, ReviewAssignment
from tests.conftest import load_fixture, snapshot
from workflow.assignment import (
    assignee_of,
    away_clear,
    away_set,
    review_assign,
    review_hand_over,
    substitute_for,
)
from workflow.begin import review_begin
from workflow.decide import decision_record

BILLING = "Billing reviewers"


def begun(name: str = "t1077.json", *, assignee_only: bool = False) -> PendingReview:
    data = load_fixture(name)
    if assignee_only:
        data["policy"]["parameters"][ASSIGNEE_ONLY] = True
    case = case_import(data=data).case
    return review_begin(case=case).pending_review


def decide(pending: PendingReview, reviewer, approved: bool = True):
    case = Case.objects.get(pk=pending.case_id)
    return decision_record(
        case=case, operation_id=pending.operation_id, approved=approved, reviewer=reviewer, channel="test"
    )


def fresh(pending: PendingReview) -> PendingReview:
    return PendingReview.objects.select_related("proposal", "assigned_to", "assigned_group").get(pk=pending.pk)


@pytest.fixture
def people(make_user):
    return {
        "lead": make_user("lead", group="leads"),
        "anna": make_user("anna"),
        "bo": make_user("bo"),
        "cy": make_user("cy"),
        "outsider": make_user("outsider", billing_reviewer=False),
    }


# --- at begin, and the moves ----------------------------------------------------------------


@pytest.mark.django_db
def test_at_begin_a_review_is_the_policys_groups_or_nobodys(people):
    billing, support = begun(), begun("t1042.json")
    assert assignee_of(fresh(billing)).label == "the policy's group Billing reviewers"
    assert assignee_of(fresh(support)).label == "nobody"
    assert not ReviewAssignment.objects.exists()  # nothing is written for the policy's own


@pytest.mark.django_db
def test_a_lead_assigns_to_a_person_then_a_group_and_each_move_is_a_row(people):
    pending = begun()
    first = review_assign(pending=pending, by=people["lead"], to_user=people["anna"], note="she knows the account").row
    assert assignee_of(fresh(pending)).label == "anna"
    billing = Group.objects.get(name=BILLING)
    review_assign(pending=pending, by=people["lead"], to_group=billing)
    assert assignee_of(fresh(pending)).label == "group Billing reviewers"
    rows = list(
        ReviewAssignment.objects.order_by("id").values_list(
            "kind", "by__username", "to_user__username", "to_group", "note"
        )
    )
    assert rows == [
        ("assigned", "lead", "anna", "", "she knows the account"),
        ("assigned", "lead", None, BILLING, ""),
    ]
    assert first.at <= timezone.now()


@pytest.mark.django_db
def test_who_may_not_assign_or_take_it_is_refused_and_nothing_is_written(people):
    pending = begun()
    before, moves = snapshot(), ReviewAssignment.objects.count()
    with pytest.raises(PermissionRefused, match="assign permission"):
        review_assign(pending=pending, by=people["anna"], to_user=people["bo"])
    # A move never widens who may decide: the outsider is in no billing group.
    with pytest.raises(InvalidInput, match="is not in Billing reviewers"):
        review_assign(pending=pending, by=people["lead"], to_user=people["outsider"])
    with pytest.raises(InvalidInput, match="cannot review"):
        review_assign(pending=pending, by=people["lead"], to_user=people["lead"])
    other, _ = Group.objects.get_or_create(name="Escalations")
    with pytest.raises(InvalidInput, match="decided by Billing reviewers only"):
        review_assign(pending=pending, by=people["lead"], to_group=other)
    with pytest.raises(InvalidInput, match="one person or one group"):
        review_assign(pending=pending, by=people["lead"])
    assert snapshot() == before and ReviewAssignment.objects.count() == moves
    assert fresh(pending).assigned_to_id is None and fresh(pending).assigned_group_id is None


@pytest.mark.django_db
def test_a_decided_review_cannot_be_moved(people):
    pending = begun()
    decide(pending, people["anna"])
    with pytest.raises(InvalidInput, match="no longer pending"):
        review_assign(pending=pending, by=people["lead"], to_user=people["bo"])
    assert not ReviewAssignment.objects.exists()


@pytest.mark.django_db
def test_a_reviewer_hands_over_with_a_note(people):
    pending = begun()
    with pytest.raises(InvalidInput, match="needs a note"):
        review_hand_over(pending=pending, by=people["anna"], to_user=people["bo"], note="  ")
    with pytest.raises(PermissionRefused, match="may not decide this review"):
        review_hand_over(pending=pending, by=people["outsider"], to_user=people["bo"], note="not mine")
    with pytest.raises(InvalidInput, match="somebody else"):
        review_hand_over(pending=pending, by=people["anna"], to_user=people["anna"], note="me")
    move = review_hand_over(pending=pending, by=people["anna"], to_user=people["bo"], note="on leave tomorrow").row
    assert (move.kind, move.by, move.to_user, move.note) == (
        AssignmentKind.HANDED_OVER,
        people["anna"],
        people["bo"],
        "on leave tomorrow",
    )


# --- out of office ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_assignment_to_someone_away_goes_to_their_substitute(people):
    pending = begun()
    soon = timezone.now() + timedelta(days=3)
    away_set(user=people["anna"], until=soon, substitute=people["bo"])
    move = review_assign(pending=pending, by=people["lead"], to_user=people["anna"]).row
    assert (move.to_user, move.meant_for) == (people["bo"], people["anna"])
    assert assignee_of(fresh(pending)).label == "bo"
    # A chain is followed while each is away, and a circle ends it.
    away_set(user=people["bo"], until=soon, substitute=people["cy"])
    assert substitute_for(people["anna"]) == (people["cy"], people["anna"])
    away_set(user=people["cy"], until=soon, substitute=people["anna"])
    assert substitute_for(people["anna"])[0] == people["cy"]
    # Back: assignments come to anna again.
    assert away_clear(user=people["anna"]) is True
    assert substitute_for(people["anna"]) == (people["anna"], None)


@pytest.mark.django_db
def test_an_absence_that_ended_does_not_redirect(people):
    away = away_set(user=people["anna"], until=timezone.now() + timedelta(hours=1), substitute=people["bo"])
    later = away.until + timedelta(seconds=1)
    assert substitute_for(people["anna"], now=later) == (people["anna"], None)


@pytest.mark.django_db
def test_out_of_office_refuses_what_cannot_work(people):
    now = timezone.now()
    with pytest.raises(InvalidInput, match="not in the future"):
        away_set(user=people["anna"], until=now - timedelta(minutes=1), substitute=people["bo"])
    with pytest.raises(InvalidInput, match="your own substitute"):
        away_set(user=people["anna"], until=now + timedelta(days=1), substitute=people["anna"])
    with pytest.raises(InvalidInput, match="cannot be a substitute"):
        away_set(user=people["anna"], until=now + timedelta(days=1), substitute=people["lead"])
    with pytest.raises(InvalidInput, match="needs a substitute"):
        away_set(user=people["anna"], until=now + timedelta(days=1), substitute=None)


# --- who may decide: assignee first (the default), or assignee only ----------------------------


@pytest.mark.django_db
def test_assignee_first_lets_others_decide(people):
    pending = begun()
    review_assign(pending=pending, by=people["lead"], to_user=people["anna"])
    assert decide(pending, people["bo"]).commit.status == "Committed"


@pytest.mark.django_db
def test_assignee_only_refuses_others_audited_and_lets_the_assignee_decide(people):
    pending = begun("t1042.json", assignee_only=True)
    # Not moved yet, and support-reply names no group: anyone.
    review_assign(pending=pending, by=people["lead"], to_user=people["anna"])
    before, attempts = snapshot(), CommitAttempt.objects.count()
    with pytest.raises(NotAssignee) as refused:
        decide(pending, people["bo"], approved=False)
    assert refused.value.message.startswith("not the assignee: ")
    assert "is assigned to anna" in refused.value.message
    assert (refused.value.code, refused.value.http_status, refused.value.exit_code) == ("not_assignee", 403, 14)
    assert snapshot() == before and CommitAttempt.objects.count() == attempts + 1
    assert CommitAttempt.objects.latest("id").reason == "not_assignee"
    # Handed over by the assignee: now bo decides.
    review_hand_over(pending=pending, by=people["anna"], to_user=people["bo"], note="yours")
    assert decide(pending, people["bo"]).commit.status == "Committed"


@pytest.mark.django_db
def test_assignee_only_with_a_group_lets_its_members_decide(people, make_user):
    pending = begun("t1042.json", assignee_only=True)
    team, _ = Group.objects.get_or_create(name="Tier 2")
    people["cy"].groups.add(team)
    review_assign(pending=pending, by=people["lead"], to_group=team)
    with pytest.raises(NotAssignee, match="is assigned to group Tier 2"):
        decide(pending, people["anna"])
    assert decide(pending, people["cy"]).commit.status == "Committed"


def test_assignee_only_has_one_spelling():
    base = {"name": "support-reply", "label": "v9", "parameters": {ASSIGNEE_ONLY: True}}
    validate_policy_data(base)
    with pytest.raises(InvalidInput, match="must be true; a policy where others may decide too"):
        validate_policy_data({**base, "parameters": {ASSIGNEE_ONLY: False}})


# --- the admin: the review page, the history, the queue, out of office -------------------------


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_review_page_assigns_and_hands_over_and_the_history_lists_every_move(people):
    pending = begun()
    page_url = reverse("admin:reviews_proposal_review", args=[pending.proposal_id])
    lead, anna = client_of(people["lead"]), client_of(people["anna"])
    page = lead.get(page_url).content.decode()
    assert "Assigned to <strong>the policy&#x27;s group Billing reviewers</strong> (at begin)" in page
    assert 'id="df-assign-form"' in page and 'id="df-handover-form"' not in page
    assert '<option value="{}">outsider</option>'.format(people["outsider"].pk) not in page  # could not decide it
    lead.post(
        reverse("admin:reviews_reviewqueueitem_assign", args=[pending.pk]),
        {"to_user": people["anna"].pk, "note": "billing dispute"},
    )
    page = anna.get(page_url).content.decode()
    assert "Assigned to <strong>anna</strong> (assigned by lead at" in page and "billing dispute" in page
    assert "Assignee first: it is yours." in page and 'id="df-handover-form"' in page
    said = anna.post(
        reverse("admin:reviews_reviewqueueitem_handover", args=[pending.pk]),
        {"to_user": people["bo"].pk, "note": "I am out tomorrow"},
        follow=True,
    )
    assert "T-1077 is now assigned to bo." in said.content.decode()
    refused = anna.post(
        reverse("admin:reviews_reviewqueueitem_handover", args=[pending.pk]),
        {"to_user": people["outsider"].pk, "note": "x"},
        follow=True,
    ).content.decode()
    assert "that person or group cannot take this review; nothing was written" in refused
    # A reviewer may not assign (the lead's act): 403.
    assert anna.post(reverse("admin:reviews_reviewqueueitem_assign", args=[pending.pk]), {}).status_code == 403
    history = lead.get(reverse("admin:cases_case_history", args=[pending.case_id])).content.decode()
    assert "assigned to the policy's group Billing reviewers</span>" in history
    assert history.index("billing dispute") < history.index("I am out tomorrow")
    assert '<span class="df-kind">handed over</span>' in history and "by <strong>anna</strong>" in history


@pytest.mark.django_db
def test_the_queue_shows_the_assignee_and_filters_me_and_my_groups(people):
    billing, support = begun(), begun("t1042.json")
    url = reverse("admin:reviews_reviewqueueitem_changelist")
    review_assign(pending=support, by=people["lead"], to_user=people["anna"])
    anna = client_of(people["anna"])
    assert '<span class="df-assignee">anna</span>' in anna.get(url).content.decode()
    mine = anna.get(url + "?groups=me").content.decode()
    assert "T-1042" in mine and "T-1077" not in mine
    groups = anna.get(url + "?groups=mine").content.decode()
    assert "T-1077" in groups and "T-1042" not in groups
    # Moved to a person: no longer the group's.
    review_assign(pending=billing, by=people["lead"], to_user=people["bo"])
    assert "T-1077" not in anna.get(url + "?groups=mine").content.decode()
    assert "T-1077" in client_of(people["bo"]).get(url + "?groups=me").content.decode()


@pytest.mark.django_db
def test_the_out_of_office_page_sets_and_ends_an_absence(people):
    anna = client_of(people["anna"])
    url = reverse("admin:reviews_reviewqueueitem_away")
    assert "You are in the office" in anna.get(url).content.decode()
    until = (timezone.localtime() + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
    said = anna.post(url, {"until": until, "substitute": people["bo"].pk}, follow=True).content.decode()
    assert "new assignments go to bo." in said and 'id="df-away-now"' in said
    said = anna.post(url, {"until": until, "substitute": ""}, follow=True).content.decode()
    assert "needs a substitute" in said
    said = anna.post(url, {"back": "1"}, follow=True).content.decode()
    assert "Welcome back" in said and "You are in the office" in said
    assert client_of(people["lead"]).get(url).status_code == 403  # no review permission
