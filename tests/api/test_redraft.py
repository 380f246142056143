"""POST /api/cases/{id}/drafts: the pipeline's re-draft supersedes the current proposal
(docs/INTAKE.md, Re-drafts). Once, twice and, on PostgreSQL, concurrently; the race with an
approval is tests/workflow/test_redraft_race.py."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from django.test import Client

from cases.models import Case, IntakeRequest
from core import identity
from core.errors import StaleProposal
from effects.models import CommitAttempt
from reviews.models import Origin, PendingReview, Proposal
from tests.api.conftest import DEMO_OP, Api, assert_error
from tests.conftest import load_fixture, snapshot
from workflow.decide import decision_record

DRAFTS = "/api/cases/T-1042/drafts"
NEW_DRAFT = load_fixture()["draft"].replace("Kind regards", "A fix is planned for firmware 4.2.1.\n\nKind regards")
HOLD_7_V4 = {
    "source_id": "HOLD-7",
    "version": 4,
    "quotation": "Engineering needs a diagnostic export from affected units before advising any change.",
}


@pytest.fixture
def begun(db):
    from cases.services import case_import
    from workflow.begin import review_begin

    case = case_import(data=load_fixture()).case
    review_begin(case=case)
    case.refresh_from_db()
    assert case.current_proposal.operation_id == DEMO_OP
    return case


def post(api, body, key=None):
    return api.post(DRAFTS, body, headers={"Idempotency-Key": key} if key else None)


def redraft(**fields) -> dict:
    return {"expected_operation_id": DEMO_OP, "draft": NEW_DRAFT, **fields}


def ours(body: str = NEW_DRAFT, passages: list[dict] | None = None) -> str:
    """The identity of the re-draft, computed from docs/PROTOCOL.md alone."""
    data = load_fixture()
    passages = data["selected_evidence"] if passages is None else passages
    return identity.operation_id(
        "T-1042",
        data["action"],
        body,
        identity.evidence_id([{k: p[k] for k in ("source_id", "version", "quotation")} for p in passages]),
        identity.policy_id(data["policy"]["name"], data["policy"]["parameters"]),
    )


def test_a_redraft_supersedes_the_current_proposal_and_its_review_is_begun(pipeline_api, begun):
    response = post(pipeline_api, redraft(), key="r-1")
    assert response.status_code == 201, response.content
    body = response.json()
    new = Proposal.objects.get(operation_id=body["operation_id"])
    assert body["operation_id"] == ours() != DEMO_OP
    assert (body["changed"], body["review_begun"], body["review_error"]) == (True, True, None)
    assert new.origin == Origin.PIPELINE_REDRAFT and new.parent.operation_id == DEMO_OP
    assert new.author is None and new.human_author is None and new.unchecked_sentences == []
    assert new.findings == new.parent.findings and new.passages == new.parent.passages
    assert body["case"]["operation_id"] == new.operation_id and body["case"]["proposal"]["origin"] == "pipeline_redraft"
    assert body["case"]["proposal"]["parent_operation_id"] == DEMO_OP and body["case"]["proposal"]["author"] is None
    statuses = dict(PendingReview.objects.values_list("operation_id", "status"))
    assert statuses == {DEMO_OP: PendingReview.Status.SUPERSEDED, new.operation_id: PendingReview.Status.PENDING}
    assert Case.objects.get(pk=begun.pk).current_proposal_id == new.pk


def test_new_evidence_and_findings_make_a_new_proposal_with_the_body_kept(pipeline_api, begun):
    findings = [{**f, "version": 4} for f in load_fixture()["findings"]]
    passages = [HOLD_7_V4, load_fixture()["selected_evidence"][1]]
    body = {"expected_operation_id": DEMO_OP, "selected_evidence": passages, "findings": findings}
    response = post(pipeline_api, {**body, "operation_id": ours(load_fixture()["draft"], passages)})
    assert response.status_code == 201, response.content
    new = Proposal.objects.get(operation_id=response.json()["operation_id"])
    assert new.origin == Origin.PIPELINE_REDRAFT and new.body == begun.current_proposal.body
    assert new.passages == passages and new.findings == findings


def test_the_same_key_and_body_answer_the_first_again_and_without_a_key_it_is_no_change(pipeline_api, begun):
    first = post(pipeline_api, redraft(), key="r-2")
    assert first.status_code == 201
    before = snapshot()
    again = post(pipeline_api, redraft(), key="r-2")
    assert again.status_code == 201 and again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert snapshot() == before
    # Without a key, the same re-draft again finds what the first one wrote: no change.
    plain = post(pipeline_api, redraft())
    assert plain.status_code == 200, plain.content
    assert plain.json()["changed"] is False and plain.json()["operation_id"] == first.json()["operation_id"]
    assert "Idempotent-Replayed" not in plain and snapshot() == before
    # The same key with another body is another request: 422, nothing written.
    assert_error(post(pipeline_api, redraft(draft=NEW_DRAFT + " More."), key="r-2"), 422, "idempotency_mismatch")
    assert snapshot() == before


def test_the_current_content_again_is_no_change(pipeline_api, begun):
    before = snapshot()
    response = post(pipeline_api, redraft(draft=begun.current_proposal.body.replace("\n", "\r\n")))
    assert response.status_code == 200 and response.json()["changed"] is False
    assert response.json()["operation_id"] == DEMO_OP and snapshot() == before


def test_a_stale_expected_operation_is_409_naming_the_current_one(pipeline_api, begun):
    first = post(pipeline_api, redraft()).json()["operation_id"]
    before = snapshot()
    for expected in (DEMO_OP, "op-v1-" + "1" * 64):
        body = assert_error(
            post(pipeline_api, redraft(expected_operation_id=expected, draft="Other.")), 409, "stale_proposal"
        )
        assert body["current_operation_id"] == first and "nothing was written" in body["message"]
    assert snapshot() == before
    rows = CommitAttempt.objects.filter(case=begun).order_by("id")
    assert [(r.refused_edit, r.outcome, r.reason) for r in rows] == [(True, "stale", "stale")] * 2


def test_a_decided_case_is_refused_as_already_decided_with_the_decision(pipeline_api, begun, reviewer):
    decision_record(case=begun, operation_id=DEMO_OP, approved=True, reviewer=reviewer, channel="test")
    before = snapshot()
    body = assert_error(post(pipeline_api, redraft(), key="r-3"), 409, "already_decided")
    assert body["message"].startswith(f"already decided: {identity.short(DEMO_OP)} was approved by reviewer")
    assert body["operation_id"] == DEMO_OP
    assert snapshot() == before and not IntakeRequest.objects.exists()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"draft": "Hello \u202e world"}, "draft"),
        ({"draft": "   "}, "draft"),
        ({"selected_evidence": [{**HOLD_7_V4, "quotation": "not in the text"}]}, "selected_evidence[0].quotation"),
        ({"selected_evidence": [{**HOLD_7_V4, "version": 9}]}, "selected_evidence[0].version"),
        ({"selected_evidence": [HOLD_7_V4, HOLD_7_V4]}, "selected_evidence[1].version"),
        # The kept findings cite HOLD-7 v2, which the new evidence no longer selects.
        ({"selected_evidence": [HOLD_7_V4]}, "findings[0].source_id"),
        ({"selected_evidence": [HOLD_7_V4] * 51}, "selected_evidence"),
        # Findings alone leave the identity as it is: no new proposal can carry them.
        ({"draft": None, "findings": load_fixture()["findings"][:1]}, "findings"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_writes_nothing(pipeline_api, begun, change, field):
    body = {k: v for k, v in redraft(**change).items() if v is not None}
    before = snapshot()
    refused = assert_error(post(pipeline_api, body, key=f"bad-{field}"), 400, "invalid_request")
    assert refused["message"].startswith(field) and refused["field"] == field
    assert snapshot() == before and not IntakeRequest.objects.exists()


def test_shapes_the_schema_refuses_are_400(pipeline_api, begun):
    before = snapshot()
    for body in (
        {"expected_operation_id": DEMO_OP},  # nothing to re-draft
        {**redraft(), "author": "x"},
        {**redraft(), "draft": None},
        {**redraft(), "selected_evidence": [{**HOLD_7_V4, "extra": 1}]},
    ):
        assert_error(post(pipeline_api, body), 400, "invalid_request")
    assert snapshot() == before


def test_an_operation_id_not_ours_is_422_with_both_and_ours_is_accepted(pipeline_api, begun):
    wrong = "op-v1-" + "0" * 64
    before = snapshot()
    body = assert_error(post(pipeline_api, redraft(operation_id=wrong), key="r-4"), 422, "operation_id_mismatch")
    assert (body["operation_id"], body["sent_operation_id"]) == (ours(), wrong)
    assert snapshot() == before and not IntakeRequest.objects.exists()
    assert post(pipeline_api, redraft(operation_id=ours()), key="r-4").status_code == 201


def test_begin_false_supersedes_without_beginning_the_new_review(pipeline_api, begun):
    response = post(pipeline_api, redraft(begin=False))
    assert response.status_code == 201 and response.json()["review_begun"] is False
    assert response.json()["case"]["pending"] is None  # the first decision begins it
    assert dict(PendingReview.objects.values_list("operation_id", "status")) == {
        DEMO_OP: PendingReview.Status.SUPERSEDED
    }


def test_a_reviewer_cannot_redraft_and_the_pipeline_cannot_decide_the_redraft(api, pipeline_api, begun):
    before = snapshot()
    refused = assert_error(post(api, redraft()), 403, "forbidden")
    assert "intake permission" in refused["message"]
    assert snapshot() == before
    new = post(pipeline_api, redraft()).json()["operation_id"]
    decide = {"operation_id": new, "approved": True}
    assert_error(pipeline_api.post("/api/cases/T-1042/decision", decide), 403, "forbidden")
    # No human author: a reviewer approves the pipeline's re-draft (four eyes has nobody to refuse).
    approved = api.post("/api/cases/T-1042/decision", decide)
    assert approved.status_code == 200 and approved.json()["outcome"] == "committed"


def test_a_tab_still_on_the_old_proposal_is_refused_as_stale(api, pipeline_api, begun, reviewer):
    new = post(pipeline_api, redraft()).json()["operation_id"]
    before = snapshot()
    stale = assert_error(
        api.post("/api/cases/T-1042/decision", {"operation_id": DEMO_OP, "approved": True}), 409, "stale_proposal"
    )
    assert stale["current_operation_id"] == new
    with pytest.raises(StaleProposal):
        decision_record(case=begun, operation_id=DEMO_OP, approved=False, reviewer=reviewer, channel="test")
    assert snapshot() == before


def test_the_history_and_the_review_page_show_the_redraft(admin_client, pipeline_api, begun):
    from django.urls import reverse

    new = Proposal.objects.get(operation_id=post(pipeline_api, redraft()).json()["operation_id"])
    history = admin_client.get(reverse("admin:cases_case_history", args=[begun.pk])).content.decode()
    assert "Pipeline re-draft" in history and new.short_operation_id in history
    assert "superseded" in history  # the old review, as the picture's path and the timeline show it
    page = admin_client.get(reverse("admin:reviews_proposal_review", args=[new.pk])).content.decode()
    assert "Pipeline re-draft" in page and "Prepared by the pipeline" not in page.split('id="df-origin"')[1][:200]


@pytest.fixture
def never_begun(db):
    """A case imported by ``load_case`` (or the intake with ``begin: false``): no proposal yet."""
    from cases.services import case_import

    case = case_import(data=load_fixture()).case
    assert case.current_proposal_id is None
    return case


def test_a_never_begun_case_is_begun_first_then_redrafted_as_its_first_decision_would_be(pipeline_api, never_begun):
    response = post(pipeline_api, redraft(), key="r-first")
    assert response.status_code == 201, response.content
    assert response.json()["operation_id"] == ours()
    prepared = Proposal.objects.get(operation_id=DEMO_OP)  # the case file's, begun, then superseded
    assert prepared.origin == Origin.PREPARED
    assert Proposal.objects.get(operation_id=ours()).parent_id == prepared.pk
    statuses = dict(PendingReview.objects.values_list("operation_id", "status"))
    assert statuses == {DEMO_OP: PendingReview.Status.SUPERSEDED, ours(): PendingReview.Status.PENDING}
    # Twice: the same request again is the same answer, and the same draft without a key is no change.
    again = post(pipeline_api, redraft(), key="r-first")
    assert (again.status_code, again.get("Idempotent-Replayed")) == (201, "true")
    assert post(pipeline_api, redraft(expected_operation_id=ours())).json()["changed"] is False
    assert Proposal.objects.count() == 2 and PendingReview.objects.count() == 2


def test_a_never_begun_case_named_by_another_identity_is_refused_and_nothing_is_begun(pipeline_api, never_begun):
    other = "op-v1-" + "0" * 64
    response = post(pipeline_api, redraft(expected_operation_id=other))
    assert_error(response, 400, "invalid_request")
    assert "no proposal yet" in response.json()["message"]
    assert Proposal.objects.count() == 0 and PendingReview.objects.count() == 0
    assert CommitAttempt.objects.filter(operation_id=other).count() == 1  # the refusal, recorded as an edit


def test_an_unknown_case_is_404(pipeline_api, db):
    assert_error(pipeline_api.post("/api/cases/T-404/drafts", redraft()), 404, "not_found")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_one_key_make_one_redraft(pipeline, reviewer):
    from api.services import token_create
    from cases.services import case_import
    from workflow.begin import review_begin

    review_begin(case=case_import(data=load_fixture()).case)
    token = token_create(user=pipeline, name="intake")[1]
    barrier = threading.Barrier(10)
    answers: list[tuple[int, str | None, dict]] = []

    def send():
        try:
            barrier.wait(10)
            r = Api(Client(), token).post(DRAFTS, redraft(), headers={"Idempotency-Key": "same"})
            answers.append((r.status_code, r.get("Idempotent-Replayed"), r.json()))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(answers) == 10
    assert Proposal.objects.filter(origin=Origin.PIPELINE_REDRAFT).count() == 1
    first = [a for a in answers if a[0] == 201 and a[1] is None]
    assert len(first) == 1, [(s, r) for s, r, _ in answers]
    for status, replayed, body in [a for a in answers if a is not first[0]]:
        assert (status, replayed, body) == (201, "true", first[0][2]) or (status, body["code"]) == (409, "in_progress")
    # Without a key, concurrent copies of the same re-draft: still one proposal, the rest no change.
    results = []

    def plain():
        try:
            barrier.wait(10)
            results.append(
                Api(Client(), token)
                .post(DRAFTS, redraft(draft=NEW_DRAFT + " Again.", expected_operation_id=first[0][2]["operation_id"]))
                .status_code
            )
        finally:
            connections.close_all()

    threads = [threading.Thread(target=plain) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [200] * 9 + [201], results
    assert Proposal.objects.filter(origin=Origin.PIPELINE_REDRAFT).count() == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_redrafts_of_a_never_begun_case_begin_it_once(pipeline):
    """Eight re-drafts with their own keys and drafts, all naming the case file's identity:
    one review begun for it, one re-draft supersedes it, the other seven are stale."""
    from api.services import token_create
    from cases.services import case_import

    case_import(data=load_fixture())
    token = token_create(user=pipeline, name="intake")[1]
    n = 8
    barrier = threading.Barrier(n)
    answers: list[tuple[int, dict]] = []

    def send(i: int):
        try:
            barrier.wait(10)
            r = Api(Client(), token).post(
                DRAFTS, redraft(draft=f"{NEW_DRAFT} ({i})"), headers={"Idempotency-Key": f"k{i}"}
            )
            answers.append((r.status_code, r.json()))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    statuses = sorted(s for s, _ in answers)
    assert statuses.count(201) == 1, [(s, b.get("code")) for s, b in answers]
    assert all(b["code"] in ("stale_proposal", "case_busy") for s, b in answers if s != 201), answers
    assert Proposal.objects.filter(operation_id=DEMO_OP).count() == 1
    assert Proposal.objects.filter(origin=Origin.PIPELINE_REDRAFT).count() == 1
    pending = dict(PendingReview.objects.values_list("operation_id", "status"))
    assert pending[DEMO_OP] == PendingReview.Status.SUPERSEDED and len(pending) == 2
