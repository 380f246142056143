"""Every row of the error table, each time asserting that nothing was written.

Refusals at the API layer (400, 401, 403, 413) must not reach the workflow at all: the
decision and edit services the endpoints call are replaced by a tripwire, and the
commit-attempt log stays as it was. Refusals from the decision service (404, 409) go
through the real workflow. The table in docs/API.md is checked against ``ERROR_TABLE``.
"""

from __future__ import annotations

import json

import pytest

from tests.api.conftest import DEMO_OP, Api, assert_error
from tests.conftest import snapshot

DECISION = "/api/cases/T-1042/decision"
EDITS = "/api/cases/T-1042/edits"


@pytest.fixture
def tripwire(monkeypatch):
    """Fail loudly if a refusal that belongs to the API layer reached a service."""
    import api.api

    def called(**kwargs):
        raise AssertionError(f"the service was called for a request the API layer must refuse: {kwargs}")

    monkeypatch.setattr(api.api, "decision_record", called)
    monkeypatch.setattr(api.api, "review_edit", called)


@pytest.fixture
def before(case, reviewer, lead):
    """The demo case begun (proposal and pending review written), and the state to compare to."""
    from workflow.begin import review_begin

    review_begin(case=case, actor=reviewer)
    return full_snapshot()


def full_snapshot():
    from effects.models import CommitAttempt

    return {**snapshot(), "attempts": CommitAttempt.objects.count()}


BAD_DECISIONS = {
    "approved missing": {"operation_id": DEMO_OP},
    "approved null": {"operation_id": DEMO_OP, "approved": None},
    "approved a string": {"operation_id": DEMO_OP, "approved": "true"},
    "approved a number": {"operation_id": DEMO_OP, "approved": 1},
    "approved zero": {"operation_id": DEMO_OP, "approved": 0},
    "approved a float": {"operation_id": DEMO_OP, "approved": 1.0},
    "approved a list": {"operation_id": DEMO_OP, "approved": [True]},
    "unknown field": {"operation_id": DEMO_OP, "approved": True, "comment": "x"},
    "a reason with an approval": {"operation_id": DEMO_OP, "approved": True, "reason": "tone"},
    "a note with an approval": {"operation_id": DEMO_OP, "approved": True, "note": "x"},
    "an unknown reason": {"operation_id": DEMO_OP, "approved": False, "reason": "bored"},
    "the system's reason": {"operation_id": DEMO_OP, "approved": False, "reason": "expired"},
    "a reason not a string": {"operation_id": DEMO_OP, "approved": False, "reason": 1},
    "a note too long": {"operation_id": DEMO_OP, "approved": False, "note": "x" * 2001},
    "a note not a string": {"operation_id": DEMO_OP, "approved": False, "note": 5},
    "a reviewer field": {"operation_id": DEMO_OP, "approved": True, "reviewer": "lead"},
    "operation missing": {"approved": True},
    "operation upper-case hex": {"operation_id": DEMO_OP.upper().replace("OP-V1-", "op-v1-"), "approved": True},
    "operation too short": {"operation_id": DEMO_OP[:-1], "approved": True},
    "operation too long": {"operation_id": DEMO_OP + "0", "approved": True},
    "operation wrong prefix": {"operation_id": "op-v2-" + DEMO_OP[6:], "approved": True},
    "operation with a newline": {"operation_id": DEMO_OP + "\n", "approved": True},
    "operation a number": {"operation_id": 1, "approved": True},
    "a list, not an object": [DEMO_OP, True],
    "a string, not an object": "approve",
}


@pytest.mark.parametrize("payload", BAD_DECISIONS.values(), ids=BAD_DECISIONS.keys())
def test_decision_400(api, before, tripwire, payload):
    assert_error(api.post(DECISION, payload), 400, "invalid_request")
    assert full_snapshot() == before


RAW_BODIES = {
    "empty body": b"",
    "malformed JSON": b'{"operation_id": "' + DEMO_OP.encode() + b'", "approved": tru',
    "trailing garbage": b'{"approved": true}{"approved": true}',
    "non-UTF-8 byte": b'{"operation_id": "\xff", "approved": true}',
    "UTF-16 encoded": json.dumps({"operation_id": DEMO_OP, "approved": True}).encode("utf-16"),
    "UTF-8 BOM": b"\xef\xbb\xbf" + json.dumps({"operation_id": DEMO_OP, "approved": True}).encode(),
    "lone surrogate in a value": b'{"operation_id": "\\ud800", "approved": true}',
    "lone surrogate in a key": b'{"operation_id": "' + DEMO_OP.encode() + b'", "approved": true, "\\udfff": 1}',
    "duplicate key": b'{"operation_id": "' + DEMO_OP.encode() + b'", "approved": false, "approved": true}',
    "NaN": b'{"operation_id": "' + DEMO_OP.encode() + b'", "approved": NaN}',
    "deeply nested": b"[" * 100000 + b"]" * 100000,
}


@pytest.mark.parametrize("raw", RAW_BODIES.values(), ids=RAW_BODIES.keys())
def test_decision_400_raw(api, before, tripwire, raw):
    assert_error(api.post(DECISION, raw=raw), 400, "invalid_request")
    assert full_snapshot() == before


BAD_EDITS = {
    "nothing to change": {"expected_operation_id": DEMO_OP},
    "body null and nothing else": {"expected_operation_id": DEMO_OP, "body": None},
    "body a number": {"expected_operation_id": DEMO_OP, "body": 5},
    "body empty": {"expected_operation_id": DEMO_OP, "body": ""},
    "version a string": {"expected_operation_id": DEMO_OP, "source_versions": {"HOLD-7": "4"}},
    "version a bool": {"expected_operation_id": DEMO_OP, "source_versions": {"HOLD-7": True}},
    "version zero": {"expected_operation_id": DEMO_OP, "source_versions": {"HOLD-7": 0}},
    "versions empty": {"expected_operation_id": DEMO_OP, "source_versions": {}},
    "unknown field": {"expected_operation_id": DEMO_OP, "body": "Hi.", "author": "lead"},
    "a reviewer field": {"expected_operation_id": DEMO_OP, "body": "Hi.", "reviewer": "lead"},
    "malformed expected operation": {"expected_operation_id": "op-v1-abc", "body": "Hi."},
    "expected operation missing": {"body": "Hi."},
}


@pytest.mark.parametrize("payload", BAD_EDITS.values(), ids=BAD_EDITS.keys())
def test_edit_400(api, before, tripwire, payload):
    assert_error(api.post(EDITS, payload), 400, "invalid_request")
    assert full_snapshot() == before


def test_edit_lone_surrogate_in_body_400(api, before, tripwire):
    raw = b'{"expected_operation_id": "' + DEMO_OP.encode() + b'", "body": "Hello \\ud83d there."}'
    body = assert_error(api.post(EDITS, raw=raw), 400, "invalid_request")
    assert "surrogate" in body["message"]
    assert full_snapshot() == before


@pytest.mark.parametrize("op", ["op-v1-xyz", DEMO_OP.upper(), DEMO_OP[:-1], "ev-v1-" + DEMO_OP[6:]])
def test_operation_lookup_malformed_400(api, before, op):
    assert_error(api.get(f"/api/operations/{op}"), 400, "invalid_request")


def test_400_message_names_the_field(api, before, tripwire):
    body = assert_error(api.post(DECISION, {"operation_id": DEMO_OP, "approved": "yes"}), 400, "invalid_request")
    assert "approved" in body["message"]
    body = assert_error(
        api.post(DECISION, {"operation_id": DEMO_OP, "approved": True, "reviewer": "x"}), 400, "invalid_request"
    )
    assert "reviewer" in body["message"]


# 401 --------------------------------------------------------------------------------------


def _revoked_token(reviewer):
    from api.services import token_create, token_revoke

    token, plaintext = token_create(user=reviewer, name="old")
    assert token_revoke(token=token)
    return plaintext


def _inactive_token(make_user):
    from api.services import token_create

    user = make_user("gone")
    user.is_active = False
    user.save()
    return token_create(user=user, name="gone")[1]


@pytest.mark.parametrize(
    "credentials", ["none", "unknown token", "empty bearer", "revoked", "inactive user", "basic scheme"]
)
def test_401(client, reviewer, make_user, before, tripwire, credentials):
    headers = {
        "none": {},
        "unknown token": {"Authorization": "Bearer dft_not-a-token"},
        "empty bearer": {"Authorization": "Bearer "},
        "revoked": {"Authorization": f"Bearer {_revoked_token(reviewer)}"} if credentials == "revoked" else {},
        "inactive user": {"Authorization": f"Bearer {_inactive_token(make_user)}"}
        if credentials == "inactive user"
        else {},
        "basic scheme": {"Authorization": "Basic cmV2aWV3ZXI6cHctVDEwNDItdGVzdA=="},
    }[credentials]
    before = full_snapshot()
    anon = Api(client)
    for response in (
        anon.post(DECISION, {"operation_id": DEMO_OP, "approved": True}, headers=headers),
        anon.post(EDITS, {"expected_operation_id": DEMO_OP, "body": "Hi."}, headers=headers),
        anon.get("/api/cases/T-1042", headers=headers),
        anon.get(f"/api/operations/{DEMO_OP}", headers=headers),
    ):
        assert_error(response, 401, "unauthorized")
        assert response["WWW-Authenticate"].startswith("Bearer")
    assert full_snapshot() == before


def test_bad_token_does_not_fall_back_to_the_session(client, reviewer, before, tripwire):
    client.force_login(reviewer)
    response = client.get("/api/cases/T-1042", headers={"Authorization": "Bearer dft_wrong"})
    assert_error(response, 401, "unauthorized")


# 403 --------------------------------------------------------------------------------------


def test_403_without_review_permission(lead_api, before, tripwire):
    assert_error(lead_api.post(DECISION, {"operation_id": DEMO_OP, "approved": True}), 403, "forbidden")
    assert_error(lead_api.post(EDITS, {"expected_operation_id": DEMO_OP, "body": "Hi."}), 403, "forbidden")
    # Even an invalid body is refused for the permission first: nothing is validated for them.
    assert_error(lead_api.post(DECISION, {"approved": "yes"}), 403, "forbidden")
    # Nothing is written but the audit of the two refused decisions and the refused edit.
    assert full_snapshot() == before | {"attempts": before["attempts"] + 3}
    from effects.models import CommitAttempt

    rows = CommitAttempt.objects.order_by("id").values_list("reason", "approved", "reviewer__username", "channel")
    assert [
        (*row, op)
        for row, op in zip(
            rows, CommitAttempt.objects.order_by("id").values_list("operation_id", flat=True), strict=True
        )
    ] == [
        ("no_permission", True, "lead", "api", DEMO_OP),
        ("no_permission", None, "lead", "api", DEMO_OP),  # the edit: no decision asked
        ("no_permission", None, "lead", "api", DEMO_OP),  # no decision given: recorded as none
    ]
    assert [a.refused_edit for a in CommitAttempt.objects.order_by("id")] == [False, True, False]
    # Reading needs no review permission: support leads browse.
    assert lead_api.get("/api/cases/T-1042").status_code == 200
    assert lead_api.get(f"/api/operations/{DEMO_OP}").status_code == 200


@pytest.mark.parametrize(
    ("is_staff", "group", "status"),
    [
        (True, None, 403),  # staff alone opens no admin page, so it reads nothing here either
        (False, None, 403),
        (False, "leads", 200),  # a token needs the view permission, not is_staff
        (False, "reviewers", 200),
        (True, "leads", 200),
    ],
)
def test_reads_follow_the_admin_view_permission(client, make_user, before, is_staff, group, status):
    from api.services import token_create

    user = make_user(f"reader-{is_staff}-{group}", group=group)
    user.is_staff = is_staff
    user.save()
    reader = Api(client, token_create(user=user, name="tests")[1])
    for path in ("/api/cases/T-1042", f"/api/operations/{DEMO_OP}"):
        response = reader.get(path)
        if status == 403:
            body = assert_error(response, 403, "forbidden")
            assert "cases.view_case" in body["message"]
        else:
            assert response.status_code == 200, response.content[:300]
    # The admin session answers the same, whatever is_staff says about the admin's login.
    client.force_login(user)
    assert client.get("/api/cases/T-1042").status_code == status


def test_403_session_post_without_csrf(reviewer, before, tripwire):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(reviewer)
    response = client.post(DECISION, {"operation_id": DEMO_OP, "approved": True}, content_type="application/json")
    body = assert_error(response, 403, "forbidden")
    assert "CSRF" in body["message"]
    assert full_snapshot() == before
    # A safe method needs no CSRF token.
    assert client.get("/api/cases/T-1042").status_code == 200


def test_session_form_bodies_are_400_not_500(reviewer, before, tripwire):
    """A form or multipart body is not JSON; the session CSRF check reads it as a form first."""
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(reviewer)
    client.get("/admin/")
    token = client.cookies["csrftoken"].value
    for content_type in ("multipart/form-data; boundary=BoUnDaRy", "application/x-www-form-urlencoded"):
        data = (
            {"operation_id": DEMO_OP, "approved": "true"}
            if content_type.startswith("multipart")
            else f"operation_id={DEMO_OP}&approved=true"
        )
        if content_type.startswith("multipart"):
            from django.test.client import encode_multipart

            data = encode_multipart("BoUnDaRy", data)
        response = client.post(DECISION, data, content_type=content_type, headers={"X-CSRFToken": token})
        assert_error(response, 400, "invalid_request")
    assert full_snapshot() == before


# 404 --------------------------------------------------------------------------------------


def test_404_unknown_case_and_operation(api, before):
    unknown_op = "op-v1-" + "0" * 64
    for response in (
        api.get("/api/cases/T-0000"),
        api.post("/api/cases/T-0000/decision", {"operation_id": DEMO_OP, "approved": True}),
        api.post("/api/cases/T-0000/edits", {"expected_operation_id": DEMO_OP, "body": "Hi."}),
        api.get(f"/api/operations/{unknown_op}"),
        api.post(DECISION, {"operation_id": unknown_op, "approved": True}),
        api.get("/api/no/such/endpoint"),
        api.get("/api/cases/T-1042/decision/extra"),
    ):
        assert_error(response, 404, "not_found")
    assert snapshot() == {k: v for k, v in before.items() if k != "attempts"}


# 409 --------------------------------------------------------------------------------------


def _pause_for_another_operation():
    """Rewrite the pause so its request is for another operation, signed with the server's key."""
    from engine.checkpoints import payload_digest
    from reviews.models import PendingReview, WorkflowCheckpoint

    row = WorkflowCheckpoint.objects.get(checkpoint_id=PendingReview.objects.get().checkpoint_id)
    payload = row.payload.replace(DEMO_OP, "op-v1-" + "a" * 64)
    assert payload != row.payload
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(payload=payload, digest=payload_digest(payload))


def test_409_workflow_incompatible_when_the_pause_fails_its_binding_check(api, before):
    """A checkpoint naming another operation (valid HMAC) is refused before anything runs."""
    from effects.models import CommitAttempt
    from reviews.models import WorkflowCheckpoint

    _pause_for_another_operation()
    rows = WorkflowCheckpoint.objects.count()
    body = assert_error(api.post(DECISION, {"operation_id": DEMO_OP, "approved": True}), 409, "workflow_incompatible")
    assert "does not belong to case T-1042" in body["message"] and "nothing ran" in body["message"]
    assert full_snapshot() == {**before, "attempts": before["attempts"] + 1}  # the attempt row, nothing else
    attempt = CommitAttempt.objects.get()
    assert (attempt.outcome, attempt.channel) == ("refused", "api")
    assert attempt.reason == "checkpoint" and attempt.detail == body["message"]
    assert WorkflowCheckpoint.objects.count() == rows


def test_409_case_busy_with_retry_after(api, case, settings):
    """Another action holds the case (here: the proposal was never begun, so the decision must
    begin its review under the case lock, and that is held)."""
    import time

    from core.errors import CaseBusy
    from reviews.services import proposal_create
    from tests.conftest import case_held_elsewhere

    settings.DECISIONFLOW_DECISION_LOCK_TIMEOUT = 0.2
    assert proposal_create(case=case).operation_id == DEMO_OP
    with case_held_elsewhere("T-1042"):
        before = full_snapshot()
        started = time.monotonic()
        response = api.post(DECISION, {"operation_id": DEMO_OP, "approved": True})
        assert time.monotonic() - started < 3
    assert_error(response, 409, "case_busy")
    assert response["Retry-After"] == str(CaseBusy.retry_after)
    assert full_snapshot() == {**before, "attempts": before["attempts"] + 1}
    # The same request again, once the case is free: it goes through.
    assert api.post(DECISION, {"operation_id": DEMO_OP, "approved": True}).json()["outcome"] == "committed"


# 413 --------------------------------------------------------------------------------------


def test_413_body_over_the_limit(api, before, tripwire, settings):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert limit == 256 * 1024  # the documented default
    big = {"expected_operation_id": DEMO_OP, "body": "x" * limit}
    body = assert_error(api.post(EDITS, big), 413, "too_large")
    assert str(limit) in body["message"]
    assert_error(api.post(DECISION, raw=b" " * (limit + 1)), 413, "too_large")
    assert full_snapshot() == before


def test_body_just_under_the_limit_is_read(api, before, settings):
    """The limit is on bytes: a body of exactly the limit is parsed (and here refused for its content)."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    payload = json.dumps({"operation_id": DEMO_OP, "approved": "no"}).encode()
    raw = payload + b" " * (limit - len(payload))
    assert len(raw) == limit
    assert_error(api.post(DECISION, raw=raw), 400, "invalid_request")
    assert full_snapshot() == before


# 405 --------------------------------------------------------------------------------------


def test_405_wrong_method_is_json_with_allow(api, before):
    for method, path in (("delete", "/api/cases/T-1042"), ("put", DECISION), ("get", EDITS)):
        response = getattr(api.client, method)(path, headers=api.headers())
        assert_error(response, 405, "method_not_allowed")
        assert response["Allow"]
    assert full_snapshot() == before


# 500 --------------------------------------------------------------------------------------


def test_500_is_json_too(api, before, monkeypatch):
    """A workflow failure or a bug still answers in the JSON error shape (and is logged)."""
    from api import api as endpoints
    from core.errors import DecisionflowError

    def workflow_failed(**kwargs):
        raise DecisionflowError("begin: the workflow ended Idle with 0 review request(s)")

    def bug(**kwargs):
        raise ZeroDivisionError("oops")

    for failure in (workflow_failed, bug):
        monkeypatch.setattr(endpoints, "decision_record", failure)
        assert_error(api.post(DECISION, {"operation_id": DEMO_OP, "approved": True}), 500, "internal_error")
    assert full_snapshot() == before


# The table in docs/API.md ----------------------------------------------------------------


def test_docs_error_table_lists_every_code_with_its_status():
    """Every code the API can answer from an error class is in docs/API.md, with its status."""
    import re
    from pathlib import Path

    from api.api import ERROR_TABLE, HTTP_CODES

    docs = (Path(__file__).resolve().parents[2] / "docs" / "API.md").read_text()
    errors = docs.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d{3}) \| `([a-z_]+)` \|", errors, re.M)
    documented: dict[str, set[int]] = {}
    for status, code in rows:
        documented.setdefault(code, set()).add(int(status))
    assert ERROR_TABLE, "the error table is built from the error classes"
    for code, status in ERROR_TABLE.items():
        assert documented.get(code) == {status}, f"docs/API.md: {code} should be listed with status {status}"
    # The refusals that come from HTTP itself (authentication, method, size) are there too,
    # and nothing is documented that the API cannot answer.
    answered = {**{code: status for status, code in HTTP_CODES.items()}, **ERROR_TABLE}
    for code in ("unauthorized", "method_not_allowed", "too_large"):
        assert documented.get(code) == {answered[code]}, code
    assert set(documented) <= set(answered), set(documented) - set(answered)
    assert "Retry-After" in errors.split("`case_busy`", 1)[1].split("\n", 1)[0]
