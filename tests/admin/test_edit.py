"""Edits in the admin: new proposals, begun reviews, stale refusals, "no change"."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from core.identity import short
from reviews.models import Origin, PendingReview, Proposal
from tests.admin.conftest import counts, messages_of

pytestmark = pytest.mark.django_db


def edit_url(proposal):
    return reverse("admin:reviews_proposal_edit", args=[proposal.pk])


def form_data(proposal, *, body=None, hold7=None, kb311=None, expected=None):
    """What the edit form posts: body, one select per selected source, the identity seen."""
    versions = {p["source_id"]: p["version"] for p in proposal.passages}
    return {
        "expected_operation_id": expected or proposal.operation_id,
        "body": proposal.body if body is None else body,
        "source_0": str(hold7 or versions["HOLD-7"]),
        "source_1": str(kb311 or versions["KB-311"]),
    }


def test_edit_form_has_body_and_a_version_select_per_source(reviewer_client, begun, case):
    proposal = case.current_proposal
    html = reviewer_client.get(edit_url(proposal)).content.decode()
    assert f'name="expected_operation_id" value="{proposal.operation_id}"' in html
    assert "Thank you for the details." in html and "<textarea" in html
    assert 'name="source_0"' in html and 'name="source_1"' in html
    assert "version 2 (in this proposal)" in html and "version 4" in html


def test_saved_edit_makes_a_new_proposal_begins_it_and_redirects(reviewer_client, reviewer, begun, case):
    old = case.current_proposal
    new_body = old.body.replace("Kind regards,", "We can also arrange a call.\n\nKind regards,")
    response = reviewer_client.post(edit_url(old), form_data(old, body=new_body.replace("\n", "\r\n")), follow=True)
    case.refresh_from_db()
    new = case.current_proposal
    assert new.pk != old.pk and new.parent_id == old.pk
    assert new.origin == Origin.HUMAN_EDIT and new.author == reviewer
    assert new.body == new_body  # CRLF from the browser is canonical LF
    assert response.redirect_chain[-1][0] == reverse("admin:reviews_proposal_review", args=[new.pk])
    assert "Saved as a new proposal" in " ".join(messages_of(response))
    # Its review has begun; the old one is superseded.
    assert PendingReview.objects.get(operation_id=new.operation_id).status == PendingReview.Status.PENDING
    assert PendingReview.objects.get(operation_id=old.operation_id).status == PendingReview.Status.SUPERSEDED
    # The new page: warning, the person's sentence marked, diff against the parent.
    html = response.content.decode()
    assert 'id="df-human-edit-warning"' in html
    assert '<mark class="df-unchecked"' in html and "We can also arrange a call.</mark>" in html
    assert "+We can also arrange a call." in html and 'id="df-diff"' in html
    assert "Human edit" in html and short(old.operation_id) in html


def test_line_endings_only_is_no_change(reviewer_client, begun, case):
    old = case.current_proposal
    before = counts()
    response = reviewer_client.post(edit_url(old), form_data(old, body=old.body.replace("\n", "\r\n")), follow=True)
    assert "no change" in " ".join(messages_of(response))
    assert counts() == before
    case.refresh_from_db()
    assert case.current_proposal_id == old.pk


def test_stale_edit_is_refused_with_a_link_and_writes_only_its_attempt(reviewer_client, reviewer, begun, case):
    from workflow.edit import review_edit

    old = case.current_proposal
    first = review_edit(
        case=case, expected_operation_id=old.operation_id, body=old.body + "\nFirst.", editor=reviewer
    ).revision
    before = counts()
    response = reviewer_client.post(edit_url(old), form_data(old, body=old.body + "\nSecond."))
    assert response.status_code == 200  # the form comes back with the editor's text kept
    text = " ".join(messages_of(response))
    # The refusal's own words, then the link to the proposal to edit instead.
    assert text.startswith(f"stale: case T-1042 is now at {short(first.proposal.operation_id)}, not ")
    assert reverse("admin:reviews_proposal_review", args=[first.proposal.pk]) in text
    assert "Second." in response.content.decode()
    # Nothing was written but the refused edit's attempt row.
    assert counts() == {**before, "attempts": before["attempts"] + 1}


def test_evidence_only_change_with_identical_quotation(reviewer_client, begun, case):
    old = case.current_proposal
    response = reviewer_client.post(edit_url(old), form_data(old, hold7=4), follow=True)
    case.refresh_from_db()
    new = case.current_proposal
    assert new.origin == Origin.EVIDENCE_CHANGE and new.body == old.body
    assert new.operation_id != old.operation_id
    html = response.content.decode()
    assert 'id="df-moves"' in html and "version 2" in html and "version 4" in html
    assert "identical: the visible text did not change, the cited version did" in html
    # The old tab is refused as stale.
    stale = reviewer_client.post(
        reverse("admin:reviews_proposal_decide", args=[old.pk]),
        {"operation_id": old.operation_id, "decision": "approve"},
        follow=True,
    )
    assert "stale:" in " ".join(messages_of(stale))


def test_edit_of_a_decided_proposal_is_refused(reviewer_client, begun, case):
    old = case.current_proposal
    reviewer_client.post(
        reverse("admin:reviews_proposal_decide", args=[old.pk]),
        {"operation_id": old.operation_id, "decision": "decline"},
    )
    assert (
        'id="df-edit"'
        not in reviewer_client.get(reverse("admin:reviews_proposal_review", args=[old.pk])).content.decode()
    )
    before = counts()
    response = reviewer_client.post(edit_url(old), form_data(old, body=old.body + "\nMore."))
    assert "already decided" in " ".join(messages_of(response))
    assert counts() == {**before, "attempts": before["attempts"] + 1}  # the refused edit's row
    assert Proposal.objects.count() == 1


def test_empty_body_is_refused(reviewer_client, begun, case):
    old = case.current_proposal
    before = counts()
    response = reviewer_client.post(edit_url(old), form_data(old, body="   \r\n "))
    assert response.status_code == 200
    # The service's refusal, under the body field of the form the editor sent.
    assert "body must not be empty" in response.content.decode()
    assert counts() == {**before, "attempts": before["attempts"] + 1}  # the refused edit's row


def test_edit_whose_review_cannot_be_begun_is_saved_and_says_so(reviewer_client, editor, begun, case, monkeypatch):
    """The revision commits before begin runs: a failed begin leaves the edit saved and current."""
    from django.db import DatabaseError

    from engine.checkpoints import DatabaseCheckpointStorage
    from reviews.models import WorkflowCheckpoint

    def disk_full(self, checkpoint, payload=None):
        raise DatabaseError("could not extend file: No space left on device")

    monkeypatch.setattr(DatabaseCheckpointStorage, "write", disk_full)
    old = case.current_proposal
    checkpoints = WorkflowCheckpoint.objects.count()
    response = reviewer_client.post(edit_url(old), form_data(old, body=old.body + "\nEdited."), follow=True)
    case.refresh_from_db()
    new = case.current_proposal
    assert new.pk != old.pk and new.body == old.body + "\nEdited."
    assert response.redirect_chain[-1][0] == reverse("admin:reviews_proposal_review", args=[new.pk])
    text = " ".join(messages_of(response))
    assert text.startswith("Saved as a new proposal ") and short(new.operation_id) in text
    assert "but beginning its review failed" in text and "No space left on device" in text
    assert "its review has begun" not in text
    assert not PendingReview.objects.filter(operation_id=new.operation_id).exists()
    assert PendingReview.objects.get(operation_id=old.operation_id).status == PendingReview.Status.SUPERSEDED
    assert WorkflowCheckpoint.objects.count() == checkpoints

    # The first Approve on it (by another reviewer: four eyes) begins the review, then decides it.
    monkeypatch.undo()
    other = Client()
    other.force_login(editor)
    decided = other.post(
        reverse("admin:reviews_proposal_decide", args=[new.pk]),
        {"operation_id": new.operation_id, "decision": "approve"},
        follow=True,
    )
    assert "Approved:" in " ".join(messages_of(decided))
    assert PendingReview.objects.get(operation_id=new.operation_id).status == PendingReview.Status.COMPLETED
