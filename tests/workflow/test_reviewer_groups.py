"""Reviewer groups: a policy names the groups whose members may decide its proposals.

The demo's billing-reply (T-1077) names "Billing reviewers"; support-reply (T-1042) names
none, so every reviewer decides it. The three channels' refusal is in the one table of
tests/workflow/test_decision_service.py; this file covers the rule, the parameter, the
identity, the publish, the audit, the review page, the queue and the notifications.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from cases.models import REVIEWER_GROUPS, Case, reviewer_groups, reviewer_groups_value
from cases.services import case_import, validate_policy_data
from core import identity
from core.errors import InvalidInput, NotInGroup, PermissionRefused
from effects.models import CommitAttempt
from reviews import notifications
from reviews.models import Notification, NotificationKind, PendingReview
from tests.conftest import load_fixture, snapshot
from workflow.begin import review_begin
from workflow.decide import decision_record
from workflow.publishing import policy_publish

BILLING = "Billing reviewers"


def begun(name: str = "t1077.json", **overrides) -> Case:
    case = case_import(data={**load_fixture(name), **overrides}).case
    review_begin(case=case)
    case.refresh_from_db()
    return case


def decide(case: Case, reviewer, approved: bool = True):
    return decision_record(
        case=case, operation_id=case.current_proposal.operation_id, approved=approved, reviewer=reviewer, channel="test"
    )


@pytest.fixture
def outsider(make_user):
    """A reviewer (the review permission) in no group but Reviewers."""
    return make_user("outsider", billing_reviewer=False)


# --- the parameter and the identity -------------------------------------------------------


def test_a_policy_without_groups_keeps_its_identity_and_the_groups_change_it():
    t1042 = load_fixture("t1042.json")["policy"]
    # The published vector (docs/PROTOCOL.md) is a policy without groups.
    assert (
        identity.policy_id(t1042["name"], t1042["parameters"])
        == "pol-v1-7df3c55cc3b2a9c77010eba24d6ca49777e5626e98dc79e789209c7ba090cd7f"
    )
    grouped = {**t1042["parameters"], REVIEWER_GROUPS: "Support leads"}
    assert identity.policy_id(t1042["name"], grouped) != identity.policy_id(t1042["name"], t1042["parameters"])
    # One typed str: parameter, framed like any other (a vector of our own for the pipeline).
    assert identity.typed_value(grouped[REVIEWER_GROUPS]) == "str:Support leads"


def test_the_billing_vector_of_docs_protocol():
    """Framed by hand here (four-byte big-endian lengths, SHA-256), not by core/identity.py."""
    import hashlib

    fields = ["decisionflow.policy.v1", "billing-reply", "max_refund_eur", "int:2000", "promise_dates", "bool:false"]
    fields += ["reviewer_groups", "str:Billing reviewers"]
    framed = b"".join(len(f.encode()).to_bytes(4, "big") + f.encode() for f in fields)
    vector = "pol-v1-" + hashlib.sha256(framed).hexdigest()
    assert vector == "pol-v1-0432d1d6e0dc626af47bac3c9c16412ac57ce7adc734c2c1d60aa745499a2181"
    policy = load_fixture("t1077.json")["policy"]
    assert identity.policy_id(policy["name"], policy["parameters"]) == vector


def test_the_groups_have_one_spelling():
    assert reviewer_groups_value(["b", "A", "b"]) == "A,b"
    assert reviewer_groups({REVIEWER_GROUPS: "A,b"}) == ("A", "b")
    assert reviewer_groups({}) == ()
    base = {"name": "billing-reply", "label": "v9", "parameters": {}}
    validate_policy_data({**base, "parameters": {REVIEWER_GROUPS: "A,Billing reviewers"}})
    for bad, said in (
        ("Billing reviewers,A", 'must list each group once, sorted: "A,Billing reviewers"'),
        ("A,A", "must list each group once, sorted: A"),
        ("", "leaves reviewer_groups out"),
        ("A, B", "a space around a comma"),
        ("A,,B", "an empty name"),
        (7, "must be a string"),
    ):
        with pytest.raises(InvalidInput, match=said):
            validate_policy_data({**base, "parameters": {REVIEWER_GROUPS: bad}})


@pytest.mark.django_db
def test_publishing_a_group_that_does_not_exist_is_refused_and_writes_nothing(make_user):
    lead = make_user("publisher", group="leads")
    before = snapshot()
    data = {"name": "support-reply", "label": "v4", "parameters": {REVIEWER_GROUPS: "No such team"}}
    with pytest.raises(InvalidInput, match='names no such group: "No such team"'):
        policy_publish(data=data, publisher=lead, apply=True)
    assert snapshot() == before


@pytest.mark.django_db
def test_publishing_groups_moves_the_undecided_cases_under_them(make_user, outsider, reviewer):
    lead = make_user("publisher", group="leads")
    case = begun("t1042.json")
    decide_before = case.current_proposal.operation_id
    params = {**load_fixture("t1042.json")["policy"]["parameters"], REVIEWER_GROUPS: BILLING}
    result = policy_publish(
        data={"name": "support-reply", "label": "v4", "parameters": params}, publisher=lead, apply=True
    )
    assert result.superseded == 1
    case.refresh_from_db()
    assert case.current_proposal.operation_id != decide_before  # another policy: another operation
    with pytest.raises(NotInGroup):
        decide(case, outsider)
    assert decide(case, reviewer).commit.status == "Committed"


# --- the rule -----------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("approved", [True, False])
def test_a_reviewer_outside_the_group_is_refused_audited_and_nothing_is_written(outsider, approved):
    case = begun()
    before, attempts = snapshot(), CommitAttempt.objects.count()
    with pytest.raises(NotInGroup) as refused:
        decide(case, outsider, approved)
    message = refused.value.message
    assert message.startswith('not in group: outsider is not a member of "Billing reviewers"')
    assert "billing-reply v1" in message and message.endswith("nothing was written")
    assert (refused.value.code, refused.value.http_status, refused.value.exit_code) == ("not_in_group", 403, 11)
    assert snapshot() == before
    assert CommitAttempt.objects.count() == attempts + 1
    row = CommitAttempt.objects.latest("id")
    assert (row.outcome, row.reason, row.detail, row.reviewer) == ("refused", "not_in_group", message, outsider)
    assert PendingReview.objects.get(case=case).status == "pending"


@pytest.mark.django_db
def test_a_member_of_any_named_group_decides_and_no_group_means_every_reviewer(outsider, make_user):
    Group.objects.get_or_create(name="Escalations")
    escalations = make_user("escalation", billing_reviewer=False)
    escalations.groups.add(Group.objects.get(name="Escalations"))
    data = load_fixture("t1077.json")
    data["policy"]["parameters"][REVIEWER_GROUPS] = "Billing reviewers,Escalations"
    case = begun(**{"policy": data["policy"]})
    assert decide(case, escalations).commit.status == "Committed"
    # support-reply names no group: any reviewer.
    assert decide(begun("t1042.json"), outsider).commit.status == "Committed"


@pytest.mark.django_db
def test_who_lacks_the_review_permission_is_told_that_first(make_user):
    lead = make_user("lead", group="leads")
    lead.groups.add(Group.objects.get(name=BILLING))  # in the group, but no review permission
    with pytest.raises(PermissionRefused, match="does not have the review permission"):
        decide(begun(), lead)


@pytest.mark.django_db
def test_a_superuser_holds_every_permission_and_may_decide(django_user_model):
    admin = django_user_model.objects.create_superuser("root", password="pw-T1042-root")
    assert decide(begun(), admin).commit.status == "Committed"


@pytest.mark.django_db
def test_a_never_begun_review_is_begun_then_refused(outsider):
    from reviews.services import proposal_create

    case = case_import(data=load_fixture("t1077.json")).case
    proposal = proposal_create(case=case)
    with pytest.raises(NotInGroup):
        decision_record(case=case, operation_id=proposal.operation_id, approved=True, reviewer=outsider, channel="test")
    assert PendingReview.objects.get(case=case).status == "pending"  # begun, not decided


# --- the admin: the reason in place of the buttons, the bulk plan, the queue ---------------


def _page(user, case: Case) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.get(reverse("admin:reviews_proposal_review", args=[case.current_proposal_id])).content.decode()


@pytest.mark.django_db
def test_the_review_page_says_why_instead_of_approve_and_decline(outsider, reviewer):
    case = begun()
    page = _page(outsider, case)
    assert 'id="df-not-in-group"' in page and "<strong>Billing reviewers</strong>" in page
    assert 'id="df-approve"' not in page and 'id="df-decline"' not in page
    member = _page(reviewer, case)
    assert 'id="df-approve"' in member and 'id="df-not-in-group"' not in member


@pytest.mark.django_db
def test_the_bulk_plan_skips_the_rows_of_other_groups(outsider):
    from django.contrib.admin import helpers
    from django.test import Client

    billing, support = begun(), begun("t1042.json")
    client = Client()
    client.force_login(outsider)
    page = client.post(
        reverse("admin:cases_case_changelist"),
        {"action": "approve_selected", helpers.ACTION_CHECKBOX_NAME: [billing.pk, support.pk]},
    ).content.decode()
    assert "not in group: outsider is not a member of" in page
    assert "Approve 1 proposal<" in page


@pytest.mark.django_db
def test_the_queue_shows_who_decides_and_filters_my_groups(outsider, reviewer):
    from django.test import Client

    begun(), begun("t1042.json")
    url = reverse("admin:reviews_reviewqueueitem_changelist")
    client = Client()
    client.force_login(reviewer)
    everything = client.get(url).content.decode()
    assert '<span class="df-group">Billing reviewers</span>' in everything and "any reviewer" in everything
    mine = client.get(url + "?groups=mine").content.decode()
    assert "T-1077" in mine and "T-1042" not in mine
    anyone = client.get(url + "?groups=anyone").content.decode()
    assert "T-1042" in anyone and "T-1077" not in anyone
    client.force_login(outsider)
    assert "T-1077" not in client.get(url + "?groups=mine").content.decode()


# --- notifications ------------------------------------------------------------------------


@pytest.mark.django_db
def test_notifications_go_to_the_members_addresses(settings, make_user, outsider, mailoutbox):
    settings.DECISIONFLOW_NOTIFY_EMAIL_TO = ["leads@example.test"]
    a, b = make_user("anna"), make_user("bo")
    a.email, b.email, outsider.email = "anna@example.test", "bo@example.test", "out@example.test"
    for user in (a, b, outsider):
        user.save()
    make_user("nomail")  # a member without an address: left out
    gone = make_user("gone")
    gone.email, gone.is_active = "gone@example.test", False
    gone.save()
    billing, support = begun(), begun("t1042.json")
    assert notifications.recipients(billing.current_proposal.operation_id) == ["anna@example.test", "bo@example.test"]
    assert notifications.recipients(support.current_proposal.operation_id) == ["leads@example.test"]
    row = Notification.objects.create(
        operation_id=billing.current_proposal.operation_id,
        kind=NotificationKind.AT_RISK,
        case=billing,
        channels="email",
    )
    notifications._send_email(row, "decisionflow: case T-1077 is at risk (operation x).")
    assert mailoutbox[-1].to == ["anna@example.test", "bo@example.test"]


@pytest.mark.django_db
def test_a_group_whose_members_have_no_address_falls_back_to_the_configured_list(settings):
    settings.DECISIONFLOW_NOTIFY_EMAIL_TO = ["leads@example.test"]
    Group.objects.get_or_create(name=BILLING)
    case = begun()
    assert notifications.recipients(case.current_proposal.operation_id) == ["leads@example.test"]
