"""POST /api/sources/{id}/versions and GET /api/jobs/{id} (docs/INTAKE.md, "New source versions").

The seed's T-1042 cites HOLD-7 v2, and the seed has HOLD-7 v4 too, whose text still holds
every quotation: posting v4 moves T-1042 onto it, with a new operation identity.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from django_tasks import default_task_backend

from cases.models import Case, EvidenceChange, SourceVersion, SourceVersionJob
from reviews.models import Origin, ReviewDecision
from tests.api.conftest import assert_error
from tests.conftest import load_fixture, snapshot
from workflow.begin import review_begin
from workflow.edit import review_edit
from workflow.sources import source_version_job

SEED = {v["version"]: v["text"] for v in load_fixture("t1042.json")["sources"][0]["versions"]}
QUOTATION = "Engineering needs a diagnostic export from affected units before advising any change."
DROPPED = SEED[4].replace(QUOTATION + " ", "")
DUMMY = {"default": {"BACKEND": "django_tasks.backends.dummy.DummyBackend"}}


@pytest.fixture
def queued(settings):
    """Enqueued tasks go to the dummy backend: the test runs each job as a worker would."""
    settings.TASKS = DUMMY
    default_task_backend.clear()
    yield default_task_backend
    default_task_backend.clear()


@pytest.fixture
def t1042(case):
    review_begin(case=case)
    case.refresh_from_db()
    return case


def post_version(api, version, text, key=None, source="HOLD-7"):
    headers = {"Idempotency-Key": key} if key else None
    return api.post(f"/api/sources/{source}/versions", {"version": version, "text": text}, headers=headers)


def run_jobs(backend) -> int:
    """Run every enqueued job, as ``manage.py db_worker`` would; how many ran."""
    ran = 0
    for result in list(backend.results):
        assert result.task.name == source_version_job.name
        source_version_job.call(*result.args, **result.kwargs)
        ran += 1
    backend.clear()
    return ran


def test_t1042_moves_from_v2_to_v4_and_an_old_tab_is_refused_as_stale(
    t1042, pipeline_api, api, queued, django_capture_on_commit_callbacks
):
    """The issue's goal, through the API: v4 with the identical quotation moves T-1042 to a
    new operation identity, and an approval from the old tab is refused as stale."""
    old = api.get("/api/cases/T-1042").json()["operation_id"]
    with django_capture_on_commit_callbacks(execute=True):
        response = post_version(pipeline_api, 4, SEED[4])
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["version_created"], body["to_move"], body["to_mark"]) == (False, 1, 0)
    job = body["job"]
    assert job["state"] == "queued" and (job["total"], job["done"]) == (1, 0)
    assert pipeline_api.get(f"/api/jobs/{job['id']}").json()["state"] == "queued"
    assert run_jobs(queued) == 1
    polled = pipeline_api.get(f"/api/jobs/{job['id']}").json()
    assert polled["state"] == "done"
    assert {k: polled[k] for k in ("done", "moved", "marked", "failed")} == {
        "done": 1,
        "moved": 1,
        "marked": 0,
        "failed": 0,
    }
    case = api.get("/api/cases/T-1042").json()
    new = case["operation_id"]
    assert new != old and case["proposal"]["origin"] == Origin.EVIDENCE_CHANGE
    assert {p["version"] for p in case["proposal"]["passages"] if p["source_id"] == "HOLD-7"} == {4}
    assert case["pending"]["status"] == "pending"
    stale = api.post("/api/cases/T-1042/decision", {"operation_id": old, "approved": True})
    assert assert_error(stale, 409, "stale_proposal")["current_operation_id"] == new
    assert not ReviewDecision.objects.exists()
    assert api.get("/api/cases/T-1042").json()["evidence_changed"] is None  # the new proposal carries no mark
    assert api.post("/api/cases/T-1042/decision", {"operation_id": new, "approved": True}).status_code == 200


def test_the_same_version_again_is_a_no_op(t1042, pipeline_api, queued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        assert post_version(pipeline_api, 4, SEED[4]).status_code == 202
    run_jobs(queued)
    before, jobs = snapshot(), SourceVersionJob.objects.count()
    with django_capture_on_commit_callbacks(execute=True):
        again = post_version(pipeline_api, 4, SEED[4])
    assert again.status_code == 200 and again.json()["job"] is None
    assert (again.json()["version_created"], again.json()["to_move"]) == (False, 0)
    assert snapshot() == before and SourceVersionJob.objects.count() == jobs and not queued.results


def test_a_new_version_no_case_needs_is_201_without_a_job(t1042, pipeline_api, queued):
    kb311 = load_fixture("t1042.json")["sources"][1]["versions"][0]["text"]
    response = post_version(pipeline_api, 1, kb311, source="KB-311")  # older than the v3 T-1042 cites
    assert response.status_code == 201 and response.json()["job"] is None and response.json()["version_created"]


def test_a_marked_case_is_refused_with_evidence_changed_until_an_edit(
    t1042, pipeline_api, api, reviewer, editor, queued, django_capture_on_commit_callbacks
):
    old = t1042.current_proposal.operation_id
    with django_capture_on_commit_callbacks(execute=True):
        response = post_version(pipeline_api, 5, DROPPED)
    assert response.status_code == 202 and response.json()["to_mark"] == 1
    run_jobs(queued)
    job = pipeline_api.get(f"/api/jobs/{response.json()['job']['id']}").json()
    assert (job["state"], job["moved"], job["marked"]) == ("done", 0, 1)
    assert EvidenceChange.objects.get(operation_id=old).reason == (
        "evidence changed: the quotation is no longer in HOLD-7 v5"
    )
    refused = assert_error(
        api.post("/api/cases/T-1042/decision", {"operation_id": old, "approved": True}), 409, "evidence_changed"
    )
    assert "no longer in HOLD-7 v5" in refused["message"] and refused["operation_id"] == old
    # The pipeline reads the mark back on the case, before anyone tries to approve.
    shown = pipeline_api.get("/api/cases/T-1042").json()
    assert shown["evidence_changed"] == "evidence changed: the quotation is no longer in HOLD-7 v5"
    # The admin's button says the same words.
    client = Client()
    client.force_login(reviewer)
    clicked = client.post(
        reverse("admin:reviews_proposal_decide", args=[t1042.current_proposal.pk]),
        {"operation_id": old, "decision": "approve"},
        follow=True,
    )
    assert refused["message"] in " ".join(str(m) for m in clicked.context["messages"])
    assert not ReviewDecision.objects.exists()
    # An edit makes a new current proposal, which carries no mark (the editor's is four eyes'
    # to refuse; another reviewer approves it).
    edited = review_edit(
        case=Case.objects.get(pk=t1042.pk),
        expected_operation_id=old,
        body=t1042.current_proposal.body + "\n\nThanks.",
        editor=editor,
    )
    new = edited.revision.proposal.operation_id
    assert api.post("/api/cases/T-1042/decision", {"operation_id": new, "approved": True}).status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"version": 4, "text": SEED[4] + " Changed."}, "version"),  # immutable: another text for v4
        ({"version": -1, "text": "x"}, "version"),
        ({"version": 5, "text": "a bell \x07"}, "text"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_writes_nothing(t1042, pipeline_api, queued, body, field):
    before, versions = snapshot(), SourceVersion.objects.count()
    response = pipeline_api.post("/api/sources/HOLD-7/versions", body)
    assert assert_error(response, 400, "invalid_request")["field"] == field
    assert snapshot() == before and SourceVersion.objects.count() == versions
    assert not SourceVersionJob.objects.exists() and not queued.results


def test_an_unknown_source_is_404_and_a_wrong_shape_400(t1042, pipeline_api):
    assert_error(post_version(pipeline_api, 1, "x", source="NOPE-1"), 404, "not_found")
    assert_error(pipeline_api.post("/api/sources/HOLD-7/versions", {"version": 5}), 400, "invalid_request")
    assert_error(
        pipeline_api.post("/api/sources/HOLD-7/versions", {"version": "5", "text": "x"}), 400, "invalid_request"
    )


def test_a_reviewer_token_is_403_and_writes_nothing(t1042, api, lead_api):
    before = snapshot()
    for who in (api, lead_api):
        assert "intake permission" in assert_error(post_version(who, 5, SEED[4]), 403, "forbidden")["message"]
    assert snapshot() == before and not SourceVersion.objects.filter(version=5).exists()


def test_an_idempotency_key_answers_the_first_answer_again(
    t1042, pipeline_api, queued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        first = post_version(pipeline_api, 5, SEED[4], key="v5-1")
        again = post_version(pipeline_api, 5, SEED[4], key="v5-1")
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert SourceVersionJob.objects.count() == 1 and len(queued.results) == 1
    assert_error(post_version(pipeline_api, 6, SEED[4], key="v5-1"), 422, "idempotency_mismatch")


def test_a_job_runs_on_the_immediate_backend_too(t1042, pipeline_api, settings, django_capture_on_commit_callbacks):
    settings.TASKS = {"default": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend"}}
    with django_capture_on_commit_callbacks(execute=True):
        response = post_version(pipeline_api, 5, SEED[4])
    job = pipeline_api.get(f"/api/jobs/{response.json()['job']['id']}").json()
    assert (job["state"], job["moved"]) == ("done", 1)


def test_an_unknown_job_is_404(db, pipeline_api, pipeline):
    assert_error(pipeline_api.get("/api/jobs/999"), 404, "not_found")
