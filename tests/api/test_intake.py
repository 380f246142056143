"""POST /api/cases: the pipeline's intake, with Stripe's Idempotency-Key semantics
(docs/INTAKE.md). Each act is done once, twice and, on PostgreSQL, concurrently."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connections
from django.test import Client

from cases.models import Case, IntakeRequest
from core import identity
from reviews.models import PendingReview, Proposal
from reviews.services import prepared_content
from tests.api.conftest import Api, assert_error
from tests.conftest import load_fixture, snapshot


def case_file(case_id="T-2001", **overrides) -> dict:
    return {**load_fixture("t1042.json"), "case_id": case_id, **overrides}


def post(api, body, key=None):
    return api.post("/api/cases", body, headers={"Idempotency-Key": key} if key else None)


def test_a_case_comes_in_with_its_review_begun_and_the_identity_we_compute(pipeline_api, pipeline):
    response = post(pipeline_api, case_file(), key="k-1")
    assert response.status_code == 201, response.content
    body = response.json()
    case = Case.objects.get(case_id="T-2001")
    # The identity computed from the file alone is the one the prepared proposal has.
    assert body["operation_id"] == prepared_content(case)["operation_id"] == case.current_proposal.operation_id
    assert body["created"] is True and body["review_begun"] is True and body["review_error"] is None
    assert body["case"]["case_id"] == "T-2001" and body["case"]["proposal"]["operation_id"] == body["operation_id"]
    assert body["case"]["status"] == "Pending" and body["case"]["pending"]["begun_by"] == "pipeline"
    assert PendingReview.objects.get(case=case).status == PendingReview.Status.PENDING
    assert "Idempotent-Replayed" not in response


def test_the_same_key_and_body_answer_the_first_answer_again_marked_as_a_replay(pipeline_api):
    first = post(pipeline_api, case_file(), key="k-2")
    before = snapshot()
    again = post(pipeline_api, case_file(), key="k-2")
    assert again.status_code == 201 and again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert snapshot() == before
    # Without a key, the same file is the import's own no-op: 200, created false.
    plain = post(pipeline_api, case_file())
    assert plain.status_code == 200 and plain.json()["created"] is False
    assert Case.objects.count() == 1 and Proposal.objects.count() == 1


def test_the_same_key_with_another_body_is_422_and_writes_nothing(pipeline_api):
    post(pipeline_api, case_file(), key="k-3")
    before, keys = snapshot(), list(IntakeRequest.objects.values_list("key", "digest", "status"))
    for _ in range(2):
        changed = post(pipeline_api, case_file("T-2002"), key="k-3")
        body = assert_error(changed, 422, "idempotency_mismatch")
        assert "Idempotency-Key k-3 was first sent at" in body["message"] and "nothing was written" in body["message"]
    # Another flag is another request too.
    assert_error(post(pipeline_api, {**case_file(), "begin": False}, key="k-3"), 422, "idempotency_mismatch")
    assert snapshot() == before and list(IntakeRequest.objects.values_list("key", "digest", "status")) == keys
    assert not Case.objects.filter(case_id="T-2002").exists()


def test_keys_are_per_user(pipeline_api, make_user, client):
    from api.services import token_create

    other = Api(Client(), token_create(user=make_user("pipeline-2", group="pipeline"), name="intake")[1])
    assert post(pipeline_api, case_file(), key="shared").status_code == 201
    # Another user's same key is another request: this one's own first answer.
    response = post(other, case_file("T-2003"), key="shared")
    assert response.status_code == 201 and "Idempotent-Replayed" not in response


def test_an_operation_id_of_our_own_is_accepted_and_another_is_422_with_both(pipeline_api):
    ours = identity.operation_id(
        "T-2001",
        "record_support_review",
        load_fixture("t1042.json")["draft"],
        identity.evidence_id(
            [{k: p[k] for k in ("source_id", "version", "quotation")} for p in case_file()["selected_evidence"]]
        ),
        identity.policy_id(case_file()["policy"]["name"], case_file()["policy"]["parameters"]),
    )
    wrong = "op-v1-" + "0" * 64
    before = snapshot()
    body = assert_error(
        post(pipeline_api, {**case_file(), "operation_id": wrong}, key="k-4"), 422, "operation_id_mismatch"
    )
    assert (body["operation_id"], body["sent_operation_id"]) == (ours, wrong)
    assert wrong in body["message"] and ours in body["message"]
    assert snapshot() == before and not IntakeRequest.objects.exists()  # refused: the key is let go
    response = post(pipeline_api, {**case_file(), "operation_id": ours}, key="k-4")
    assert response.status_code == 201 and response.json()["operation_id"] == ours


def test_begin_false_imports_only(pipeline_api):
    response = post(pipeline_api, {**case_file(), "begin": False})
    assert response.status_code == 201
    body = response.json()
    assert body["review_begun"] is False and body["case"]["status"] == "NotStarted" and body["case"]["proposal"] is None
    assert not PendingReview.objects.exists()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"case_id": "bad id"}, "case_id"),
        ({"draft": "Hello \u202e world"}, "draft"),
        (
            {"selected_evidence": [{"source_id": "HOLD-7", "version": 2, "quotation": "not in the text"}]},
            "selected_evidence[0].quotation",
        ),
        ({"findings": [load_fixture("t1042.json")["findings"][0]] * 51}, "findings"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_writes_nothing(pipeline_api, change, field):
    before = snapshot()
    body = assert_error(post(pipeline_api, {**case_file(), **change}, key=f"bad-{field}"), 400, "invalid_request")
    assert body["message"].startswith(field) and "nothing was written" in body["message"]
    assert snapshot() == before and not IntakeRequest.objects.exists()


def test_shapes_the_schema_refuses_are_400_before_anything_runs(pipeline_api):
    before = snapshot()
    assert_error(post(pipeline_api, {**case_file(), "reviewer": "x"}), 400, "invalid_request")
    assert_error(post(pipeline_api, {**case_file(), "sources": "none"}), 400, "invalid_request")
    assert_error(post(pipeline_api, case_file(), key="bad key with spaces"), 400, "invalid_request")
    assert snapshot() == before


def test_a_pipeline_token_cannot_decide_and_a_reviewer_token_cannot_bring_cases_in(pipeline_api, api, demo_case):
    op = demo_case.current_proposal.operation_id
    refused = pipeline_api.post(f"/api/cases/{demo_case.case_id}/decision", {"operation_id": op, "approved": True})
    assert_error(refused, 403, "forbidden")
    body = assert_error(post(api, case_file()), 403, "forbidden")
    assert "intake permission" in body["message"]
    assert not Case.objects.filter(case_id="T-2001").exists()


def test_a_claim_past_its_lease_is_taken_over_and_a_running_one_is_409(pipeline_api, pipeline, settings):
    from django.utils import timezone

    from cases.idempotency import request_digest

    body = case_file()
    digest = request_digest("POST /api/cases", {**body, "depends_on": None, "operation_id": None, "begin": True})
    IntakeRequest.objects.create(
        user=pipeline, key="k-run", endpoint="POST /api/cases", digest=digest, created_at=timezone.now()
    )
    running = post(pipeline_api, body, key="k-run")
    assert_error(running, 409, "in_progress")
    assert running["Retry-After"] == "1"
    assert not Case.objects.filter(case_id="T-2001").exists()
    settings.DECISIONFLOW_IDEMPOTENCY_LEASE = "1s"
    IntakeRequest.objects.filter(key="k-run").update(created_at=timezone.now() - timezone.timedelta(seconds=5))
    taken = post(pipeline_api, body, key="k-run")
    assert taken.status_code == 201 and Case.objects.filter(case_id="T-2001").exists()
    assert IntakeRequest.objects.get(key="k-run").status == 201


def test_keys_are_pruned_after_the_keep_period_by_prune_checkpoints(pipeline_api):
    from django.utils import timezone

    from tests.reliability.conftest import command

    post(pipeline_api, case_file(), key="old")
    post(pipeline_api, case_file("T-2004"), key="new")
    IntakeRequest.objects.filter(key="old").update(created_at=timezone.now() - timezone.timedelta(hours=25))
    code, out, _ = command("prune_checkpoints", "--older-than", "30d")
    assert code == 0 and "; 1 idempotency key(s) claimed before" in out and "would be deleted. Nothing" in out
    assert IntakeRequest.objects.count() == 2
    code, out, _ = command("prune_checkpoints", "--older-than", "30d", "--apply")
    assert code == 0 and "; deleted 1 idempotency key(s) claimed before" in out and len(out.splitlines()) == 1
    assert list(IntakeRequest.objects.values_list("key", flat=True)) == ["new"]
    # The key is gone: the same request again is a new one, and the import's own no-op.
    again = post(pipeline_api, case_file(), key="old")
    assert again.status_code == 200 and again.json()["created"] is False and "Idempotent-Replayed" not in again


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_20_concurrent_requests_with_one_key_make_one_case_and_one_proposal(pipeline):
    from api.services import token_create

    token = token_create(user=pipeline, name="intake")[1]
    key = str(uuid.uuid4())
    barrier = threading.Barrier(20)
    answers: list[tuple[int, str | None, dict]] = []

    def send():
        try:
            barrier.wait(10)
            r = Api(Client(), token).post("/api/cases", case_file(), headers={"Idempotency-Key": key})
            answers.append((r.status_code, r.get("Idempotent-Replayed"), r.json()))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(answers) == 20
    # Retried until every one has an answer other than "still running", as a client would.
    retried = Api(Client(), token).post("/api/cases", case_file(), headers={"Idempotency-Key": key})
    assert retried.status_code == 201 and retried["Idempotent-Replayed"] == "true"
    assert (Case.objects.count(), Proposal.objects.count(), PendingReview.objects.count()) == (1, 1, 1)
    first = [a for a in answers if a[0] == 201 and a[1] is None]
    assert len(first) == 1, [(s, r) for s, r, _ in answers]
    for status, replayed, body in [a for a in answers if a is not first[0]]:
        # Every other answer is the first answer again, or "still running: retry".
        assert (status, replayed, body) == (201, "true", first[0][2]) or (status, body["code"]) == (409, "in_progress")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_same_key_with_another_body_concurrently_is_422_and_writes_nothing(pipeline):
    from api.services import token_create

    token = token_create(user=pipeline, name="intake")[1]
    barrier = threading.Barrier(2)
    answers: dict[str, int] = {}

    def send(case_id):
        try:
            barrier.wait(10)
            answers[case_id] = (
                Api(Client(), token)
                .post("/api/cases", case_file(case_id), headers={"Idempotency-Key": "one"})
                .status_code
            )
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send, args=(c,)) for c in ("T-A", "T-B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(answers.values()) in ([201, 409], [201, 422]), answers
    assert Case.objects.count() == 1


def test_the_command_makes_a_pipeline_user_whose_token_brings_cases_in_and_cannot_decide(db, groups, client, demo_case):
    import io

    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    out = io.StringIO()
    call_command("pipeline_user", "pipeline-svc", stdout=out)
    line = out.getvalue().strip()
    assert line.startswith("pipeline_user: user=pipeline-svc created=yes token=dft_")
    token = line.rsplit("token=", 1)[1]
    user = get_user_model().objects.get(username="pipeline-svc")
    assert not user.has_usable_password() and not user.is_staff
    api = Api(client, token)
    assert post(api, case_file()).status_code == 201
    op = demo_case.current_proposal.operation_id
    assert_error(api.post("/api/cases/T-1042/decision", {"operation_id": op, "approved": True}), 403, "forbidden")
    # Again: the same user, another token.
    out = io.StringIO()
    call_command("pipeline_user", "pipeline-svc", stdout=out)
    assert "created=no" in out.getvalue() and out.getvalue().rsplit("token=", 1)[1].strip() != token


def test_the_command_refuses_a_name_that_is_a_person(make_user):
    from tests.reliability.conftest import command

    make_user("alice")
    code, out, err = command("pipeline_user", "alice")
    assert code == 1 and "is not a pipeline service user" in err and "token" not in out


def test_the_command_makes_the_pipeline_group_again_when_it_was_deleted(db):
    from django.contrib.auth.models import Group

    from reviews.groups import INTAKE_PERMISSION, PIPELINE
    from tests.reliability.conftest import command

    Group.objects.filter(name=PIPELINE).delete()
    code, out, err = command("pipeline_user", "pipeline-svc")
    assert (code, err) == (0, "") and "created=yes" in out
    from django.contrib.auth import get_user_model

    assert get_user_model().objects.get(username="pipeline-svc").has_perm(INTAKE_PERMISSION)
