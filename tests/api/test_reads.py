"""The API's reads in one statement each (api/selectors.py, docs/PERFORMANCE.md "load"): they
must show exactly what the ORM and reconcile read, row by row."""

from __future__ import annotations

import pytest

from effects.services import effect_commit, operation_reconcile
from reviews.models import ReviewDecision
from reviews.services import proposal_create
from tests.api.conftest import DEMO_OP
from tests.conftest import load_fixture

pytestmark = pytest.mark.django_db


def test_the_case_is_read_as_the_orm_reads_it(api, proposal):
    from api.selectors import case_get
    from cases.models import Case

    edited = api.post(
        "/api/cases/T-1042/edits", {"expected_operation_id": DEMO_OP, "body": proposal.body + "\n\nEdited."}
    )
    assert edited.status_code == 201
    orm = Case.objects.select_related("current_proposal__parent", "current_proposal__author").get(case_id="T-1042")
    raw = case_get("T-1042")
    fields = [f.attname for f in Case._meta.concrete_fields]
    assert [getattr(raw, f) for f in fields] == [getattr(orm, f) for f in fields]
    current, expected = raw.current_proposal, orm.current_proposal
    fields = [f.attname for f in type(expected)._meta.concrete_fields]
    assert [getattr(current, f) for f in fields] == [getattr(expected, f) for f in fields]
    assert current.parent.operation_id == expected.parent.operation_id == DEMO_OP
    assert current.author.get_username() == expected.author.get_username() == "reviewer"
    assert isinstance(current.passages, list) and current.created_at.tzinfo is not None  # converted, not text
    assert Case.policy.is_cached(raw) and raw.policy.parameters == orm.policy.parameters
    assert raw.policy.name == orm.policy.name and raw.policy.pk == orm.policy_id


def test_a_case_without_a_proposal_reads_none(case):
    from api.selectors import case_get

    assert case_get("T-1042").current_proposal is None


@pytest.mark.parametrize("state", ["Pending", "Committed", "Declined", "NoLocalEffectRecorded"])
def test_the_case_and_the_operation_agree_with_reconcile(api, reviewer, state):
    from cases.services import case_import

    data = load_fixture("t1042.json")
    proposal = proposal_create(case=case_import(data=data).case)
    op = proposal.operation_id
    if state in ("Committed", "Declined"):
        effect_commit(operation_id=op, approved=state == "Committed", reviewer=reviewer)
    elif state == "NoLocalEffectRecorded":
        ReviewDecision.objects.create(operation_id=op, proposal=proposal, approved=True, reviewer=reviewer)
    row = operation_reconcile(op)
    shown = api.get(f"/api/operations/{op}").json()
    assert (shown["state"], shown["effect_count"], shown["case_id"], shown["current"]) == (
        row.state,
        row.effects,
        row.case_id,
        True,
    )
    assert shown["state"] == state
    case = api.get(f"/api/cases/{data['case_id']}").json()
    assert case["reconcile"] == shown and case["status"] == state
    assert case["decidable"] is (state == "Pending")


def test_an_edit_shows_the_pending_review_a_read_shows(api, proposal):
    edited = api.post(
        "/api/cases/T-1042/edits", {"expected_operation_id": DEMO_OP, "body": proposal.body + "\n\nEdited."}
    ).json()
    assert edited["pending"]["begun_by"] == "reviewer"
    assert edited["pending"] == api.get("/api/cases/T-1042").json()["pending"]
