"""Edits over HTTP: a new proposal (201), line endings only (200, changed: false), refusals (409)."""

from __future__ import annotations

import pytest

from tests.api.conftest import DEMO_OP, Api, assert_error
from tests.conftest import snapshot

EDITS = "/api/cases/T-1042/edits"


def test_edit_body_makes_a_new_current_proposal(api, proposal):
    body = proposal.body + "\n\nWe are sorry for the trouble."
    response = api.post(EDITS, {"expected_operation_id": DEMO_OP, "body": body})
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["changed"] is True
    new = data["proposal"]
    assert new["operation_id"] != DEMO_OP
    assert new["origin"] == "human_edit"
    assert new["parent_operation_id"] == DEMO_OP
    assert new["author"] == "reviewer"
    assert new["unchecked_sentences"] == ["We are sorry for the trouble."]
    assert data["pending"]["status"] == "pending"  # the workflow was begun for the new proposal
    assert (data["review_begun"], data["review_error"]) == (True, None)

    case = api.get("/api/cases/T-1042").json()
    assert case["operation_id"] == new["operation_id"] == case["proposal"]["operation_id"]

    # The same edit again, from the old identity, is stale and writes nothing.
    before = snapshot()
    stale = assert_error(
        api.post(EDITS, {"expected_operation_id": DEMO_OP, "body": body + " Again."}), 409, "stale_proposal"
    )
    assert stale["current_operation_id"] == new["operation_id"]
    assert snapshot() == before


def test_line_endings_only_is_no_change(api, proposal):
    before = snapshot()
    response = api.post(EDITS, {"expected_operation_id": DEMO_OP, "body": proposal.body.replace("\n", "\r\n")})
    assert response.status_code == 200, response.content
    assert response.json()["changed"] is False
    assert response.json()["proposal"]["operation_id"] == DEMO_OP
    # Nothing new to review: nothing was begun, and nothing failed.
    assert (response.json()["review_begun"], response.json()["review_error"]) == (False, None)
    assert snapshot() == before


def test_move_evidence_version(api, proposal):
    response = api.post(EDITS, {"expected_operation_id": DEMO_OP, "source_versions": {"HOLD-7": 4}})
    assert response.status_code == 201, response.content
    new = response.json()["proposal"]
    assert new["origin"] == "evidence_change"
    assert {p["source_id"]: p["version"] for p in new["passages"]} == {"HOLD-7": 4, "KB-311": 3}
    assert new["body"] == proposal.body


def _checkpoint_insert_fails(monkeypatch):
    from django.db import DatabaseError

    from engine.checkpoints import DatabaseCheckpointStorage

    def disk_full(self, checkpoint, payload=None):
        raise DatabaseError("could not extend file: No space left on device")

    monkeypatch.setattr(DatabaseCheckpointStorage, "write", disk_full)
    return "No space left on device"


def _begin_refused(monkeypatch):
    from core.errors import WorkflowIncompatible
    from workflow import edit

    def refused(case, actor, channel=None):
        raise WorkflowIncompatible("begin: the pause checkpoint for case T-1042 was not saved")

    monkeypatch.setattr(edit, "begin_under_lock", refused)
    return "the pause checkpoint for case T-1042 was not saved"


@pytest.mark.parametrize("failure", [_checkpoint_insert_fails, _begin_refused], ids=lambda f: f.__name__[1:])
def test_edit_whose_review_cannot_be_begun_is_saved_201(api, client, proposal, reviewer, editor, monkeypatch, failure):
    """Begin fails after the revision committed: 201, review_begun false, the new proposal saved and current."""
    from reviews.models import PendingReview, Proposal, WorkflowCheckpoint
    from workflow.begin import review_begin

    review_begin(case=proposal.case, actor=reviewer)
    checkpoints = WorkflowCheckpoint.objects.count()
    why = failure(monkeypatch)
    body = proposal.body + "\n\nWe are sorry for the trouble."
    response = api.post(EDITS, {"expected_operation_id": DEMO_OP, "body": body})
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["changed"] is True and data["review_begun"] is False
    assert why in data["review_error"]
    assert data["pending"] is None
    new_op = data["proposal"]["operation_id"]
    assert new_op != DEMO_OP and data["proposal"]["body"] == body
    # Saved and current; the old pause is superseded; begin left nothing half-written.
    assert Proposal.objects.filter(operation_id=new_op).exists()
    case = api.get("/api/cases/T-1042").json()
    assert case["operation_id"] == case["proposal"]["operation_id"] == new_op
    assert case["pending"] is None
    assert not PendingReview.objects.filter(operation_id=new_op).exists()
    assert PendingReview.objects.get(operation_id=DEMO_OP).status == "superseded"
    assert WorkflowCheckpoint.objects.count() == checkpoints

    # The first decision on the new proposal (by another reviewer: four eyes) begins its
    # review, then decides it.
    monkeypatch.undo()
    from api.services import token_create

    decided = Api(client, token_create(user=editor, name="tests")[1]).post(
        "/api/cases/T-1042/decision", {"operation_id": new_op, "approved": True}
    )
    assert (decided.status_code, decided.json()["outcome"]) == (200, "committed")
    assert PendingReview.objects.filter(operation_id=new_op).count() == 1


def test_edit_refusals_write_nothing(api, proposal):
    before = snapshot()
    for payload in (
        {"expected_operation_id": DEMO_OP, "source_versions": {"HOLD-7": 99}},  # no such version
        {"expected_operation_id": DEMO_OP, "source_versions": {"NOPE-1": 1}},  # not cited
        {"expected_operation_id": DEMO_OP, "body": "   "},  # blank
    ):
        assert_error(api.post(EDITS, payload), 400, "invalid_request")
    assert snapshot() == before


def test_decided_proposal_is_not_edited(api, proposal):
    assert api.post("/api/cases/T-1042/decision", {"operation_id": DEMO_OP, "approved": True}).status_code == 200
    before = snapshot()
    assert_error(api.post(EDITS, {"expected_operation_id": DEMO_OP, "body": "Changed."}), 409, "already_decided")
    assert snapshot() == before


def test_edit_before_begin_begins_the_review_first_and_another_identity_is_refused(api, case):
    """A case whose review was never begun has no proposal to revise. Naming the identity its
    case file gives, the edit begins the review first, as a first decision would, and revises
    that proposal; naming another identity is 400 and writes nothing."""
    before = snapshot()
    other = "op-v1-" + "1" * 64
    body = assert_error(api.post(EDITS, {"expected_operation_id": other, "body": "Hi."}), 400, "invalid_request")
    assert "begin" in body["message"]
    assert snapshot() == before
    response = api.post(EDITS, {"expected_operation_id": DEMO_OP, "body": "Hi.\n\nSupport"})
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["proposal"]["parent_operation_id"] == DEMO_OP and data["proposal"]["origin"] == "human_edit"
    assert (data["review_begun"], data["pending"]["status"]) == (True, "pending")
