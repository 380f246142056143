"""Who may do what: 403 on every state-changing view without the review permission."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from tests.admin.conftest import counts

pytestmark = pytest.mark.django_db


def state_changing_requests(case, proposal):
    """Every state-changing view of the workplace, as a forged POST would hit it."""
    op = proposal.operation_id
    return [
        (
            "decide approve",
            reverse("admin:reviews_proposal_decide", args=[proposal.pk]),
            {"operation_id": op, "decision": "approve"},
        ),
        (
            "decide decline",
            reverse("admin:reviews_proposal_decide", args=[proposal.pk]),
            {"operation_id": op, "decision": "decline"},
        ),
        (
            "edit",
            reverse("admin:reviews_proposal_edit", args=[proposal.pk]),
            {"expected_operation_id": op, "body": proposal.body + "\nForged.", "source_0": "2", "source_1": "3"},
        ),
        ("begin", reverse("admin:cases_case_begin", args=[case.pk]), {}),
        (
            "approve selected",
            reverse("admin:cases_case_changelist"),
            {"action": "approve_selected", "_selected_action": [case.pk], "post": "yes", f"operation_id_{case.pk}": op},
        ),
        (
            "decline selected (confirmation)",
            reverse("admin:cases_case_changelist"),
            {"action": "decline_selected", "_selected_action": [case.pk]},
        ),
    ]


@pytest.mark.parametrize("who", ["lead", "staff_without_groups"])
def test_forged_posts_get_403_and_write_nothing(who, lead_client, make_user, begun, case):
    if who == "lead":
        client = lead_client
    else:
        client = Client()
        client.force_login(make_user("nobody", group=None))
    from effects.models import CommitAttempt

    before = counts()
    for name, url, data in state_changing_requests(case, case.current_proposal):
        response = client.post(url, data)
        assert response.status_code == 403, name
    # Nothing is written but the audit: each refused decision (two clicks, one bulk row) and
    # the refused edit.
    assert counts() == before | {"attempts": 4}
    user = get_user_model().objects.get(username="lead" if who == "lead" else "nobody")
    rows = CommitAttempt.objects.order_by("id")
    assert list(rows.values_list("reason", "approved", "reviewer", "operation_id")) == [
        ("no_permission", True, user.pk, case.current_proposal.operation_id),
        ("no_permission", False, user.pk, case.current_proposal.operation_id),
        ("no_permission", None, user.pk, case.current_proposal.operation_id),
        ("no_permission", True, user.pk, case.current_proposal.operation_id),
    ]
    assert [row.refused_edit for row in rows] == [False, False, True, False]


def test_lead_reads_the_review_page_without_buttons(lead_client, begun, case):
    response = lead_client.get(reverse("admin:reviews_proposal_review", args=[case.current_proposal_id]))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Thank you for the details." in html
    for button in ('id="df-approve"', 'id="df-decline"', 'id="df-edit"', 'name="decision"'):
        assert button not in html
    assert "need the review permission" in html
    assert lead_client.get(reverse("admin:reviews_proposal_edit", args=[case.current_proposal_id])).status_code == 403


def test_lead_changelist_offers_no_decision_actions(lead_client, reviewer_client, begun):
    url = reverse("admin:cases_case_changelist")
    lead_html = lead_client.get(url).content.decode()
    assert "approve_selected" not in lead_html and "decline_selected" not in lead_html
    reviewer_html = reviewer_client.get(url).content.decode()
    assert "approve_selected" in reviewer_html and "decline_selected" in reviewer_html


def test_staff_without_view_permission_cannot_read(make_user, begun, case):
    client = Client()
    client.force_login(make_user("nobody", group=None))
    for url in (
        reverse("admin:reviews_proposal_review", args=[case.current_proposal_id]),
        reverse("admin:cases_case_history", args=[case.pk]),
        reverse("admin:cases_case_review", args=[case.pk]),
    ):
        assert client.get(url).status_code == 403, url


def test_anonymous_is_sent_to_login(client, begun, case):
    response = client.post(
        reverse("admin:reviews_proposal_decide", args=[case.current_proposal_id]),
        {"operation_id": case.current_proposal.operation_id, "decision": "approve"},
    )
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert counts()["decisions"] == 0


def test_csrf_stays_on(reviewer, begun, case):
    client = Client(enforce_csrf_checks=True)
    client.force_login(reviewer)
    before = counts()
    response = client.post(
        reverse("admin:reviews_proposal_decide", args=[case.current_proposal_id]),
        {"operation_id": case.current_proposal.operation_id, "decision": "approve"},
    )
    assert response.status_code == 403
    assert counts() == before


def test_view_only_admins_refuse_add_change_delete(admin_client, begun, case, reviewer_client):
    from django.contrib import admin

    from effects.models import CommitAttempt, EffectRecord
    from reviews.models import PendingReview, Proposal, ReviewDecision, WorkflowCheckpoint

    reviewer_client.post(
        reverse("admin:reviews_proposal_decide", args=[case.current_proposal_id]),
        {"operation_id": case.current_proposal.operation_id, "decision": "approve"},
    )
    from workplace.exports import EXPORT_ACTIONS

    exporting = {ReviewDecision, CommitAttempt, Proposal}
    for model in (ReviewDecision, EffectRecord, CommitAttempt, PendingReview, WorkflowCheckpoint, Proposal):
        model_admin = admin.site._registry[model]
        # The only actions a view-only list has are the exports, which read (view permission);
        # never Django's delete_selected.
        assert model_admin.actions == (EXPORT_ACTIONS if model in exporting else None)
        opts = model._meta
        obj = model.objects.first()
        assert obj is not None, opts.model_name
        # Even a superuser gets no add, change or delete.
        assert admin_client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_add")).status_code == 403
        assert (
            admin_client.post(
                reverse(f"admin:{opts.app_label}_{opts.model_name}_delete", args=[obj.pk]), {"post": "yes"}
            ).status_code
            == 403
        )
        page = admin_client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
        assert page.status_code == 200
        html = page.content.decode()
        assert "delete_selected" not in html
        assert ('name="action"' in html) == (model in exporting)
    assert counts()["effects"] == 1
