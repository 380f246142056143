"""Detail pages support leads open from the history, and Approve clicked at the same time."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from django.test import Client
from django.urls import reverse

from effects.models import CommitAttempt, EffectRecord
from engine.graph import WORKFLOW_VERSION
from reviews.models import PendingReview, ReviewDecision, WorkflowCheckpoint


@pytest.mark.django_db
def test_detail_pages_render_read_only_for_a_lead(lead_client, reviewer_client, begun, case):
    proposal = case.current_proposal
    reviewer_client.post(
        reverse("admin:reviews_proposal_decide", args=[proposal.pk]),
        {"operation_id": proposal.operation_id, "decision": "approve"},
    )
    effect = EffectRecord.objects.get()
    pages = {
        reverse("admin:cases_case_change", args=[case.pk]): [
            "Thank you for the details.",
            reverse("admin:cases_case_history", args=[case.pk]),
        ],
        reverse("admin:effects_effectrecord_change", args=[effect.pk]): [
            proposal.operation_id,
            "System &gt; Support &gt; Diagnostic export",
        ],
        reverse("admin:effects_commitattempt_change", args=[CommitAttempt.objects.get().pk]): ["admin"],
        reverse("admin:reviews_reviewdecision_change", args=[ReviewDecision.objects.get().pk]): ["reviewer"],
        reverse("admin:reviews_pendingreview_change", args=[PendingReview.objects.get().pk]): [WORKFLOW_VERSION],
        reverse("admin:reviews_workflowcheckpoint_change", args=[WorkflowCheckpoint.objects.first().pk]): [
            "Payload (JSON)"
        ],
    }
    for url, expected in pages.items():
        response = lead_client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        for text in expected:
            assert text in html, (url, text)
        assert 'name="_save"' not in html, url  # view only: no save button
    # The proposal's own admin page is its review page.
    redirect = lead_client.get(reverse("admin:reviews_proposal_change", args=[proposal.pk]))
    assert redirect.status_code == 302
    assert redirect["Location"] == reverse("admin:reviews_proposal_review", args=[proposal.pk])


@pytest.mark.django_db(transaction=True)
def test_approve_clicked_in_many_tabs_at_once_writes_one_effect(make_user, settings):
    """Eight reviewers' clicks race through the workflow; the operation's key admits one effect."""
    from cases.services import case_import
    from tests.conftest import load_fixture
    from workflow.begin import review_begin

    case = case_import(data=load_fixture("t1042.json")).case
    review_begin(case=case)
    case.refresh_from_db()
    proposal = case.current_proposal
    users = [make_user(f"reviewer{i}") for i in range(8)]
    url = reverse("admin:reviews_proposal_decide", args=[proposal.pk])
    barrier = threading.Barrier(len(users))
    statuses, errors = [], []

    def click(user):
        try:
            client = Client()
            client.force_login(user)
            barrier.wait()
            statuses.append(
                client.post(url, {"operation_id": proposal.operation_id, "decision": "approve"}).status_code
            )
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=click, args=(user,)) for user in users]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert statuses == [302] * len(users)
    assert EffectRecord.objects.filter(operation_id=proposal.operation_id).count() == 1
    assert ReviewDecision.objects.filter(operation_id=proposal.operation_id).count() == 1
    outcomes = sorted(CommitAttempt.objects.values_list("outcome", flat=True))
    assert outcomes == ["committed"] + ["replay"] * (len(users) - 1)
    assert set(CommitAttempt.objects.values_list("channel", flat=True)) == {"admin"}
