"""Security battery: permissions on every route, escaping on every page, production settings,
and checkpoints that are never unpickled.

The admin and API suites test their own refusals; this battery crosses them: every
state-changing route (admin views, admin actions, API, command, service), for every identity
that must not change state, including a real reviewer whose browser is made to send a
cross-site (CSRF-less) POST. Each must change nothing.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import secrets
import subprocess
import sys

import pytest
from django.test import Client
from django.urls import reverse

from tests.conftest import ROOT, snapshot
from tests.reliability.conftest import case_data, command

XSS_DRAFT = 'Hello <script>alert("draft")</script> and <img src=x onerror="alert(1)"> & "quotes".'
XSS_QUOTE = '<script>alert("quote")</script>'


# --- permissions -------------------------------------------------------------------------


@pytest.fixture
def world(db, reviewer, lead, make_user):
    """S-1 begun and waiting for a decision; S-2 imported and never begun (both copies of T-1042)."""
    from api.services import token_create, token_revoke
    from cases.services import case_import
    from workflow.begin import review_begin

    waiting = case_import(data=case_data("S-1")).case
    review_begin(case=waiting)
    waiting.refresh_from_db()
    fresh = case_import(data=case_data("S-2")).case
    staff = make_user("staff-no-groups", group=None)
    inactive = make_user("inactive-reviewer")
    inactive_token = token_create(user=inactive, name="t")[1]
    inactive.is_active = False
    inactive.save()
    revoked, revoked_plain = token_create(user=reviewer, name="revoked")
    token_revoke(token=revoked)
    return {
        "waiting": waiting,
        "fresh": fresh,
        "op": waiting.current_proposal.operation_id,
        "proposal": waiting.current_proposal,
        "reviewer": reviewer,
        "lead": lead,
        "staff": staff,
        "tokens": {
            "lead": token_create(user=lead, name="t")[1],
            "staff": token_create(user=staff, name="t")[1],
            "inactive": inactive_token,
            "revoked": revoked_plain,
            "forged": "dft_" + secrets.token_urlsafe(32),
        },
    }


def admin_routes(w):
    p, case, fresh, op = w["proposal"], w["waiting"], w["fresh"], w["op"]
    changelist = reverse("admin:cases_case_changelist")
    return [
        (
            "admin decide (approve)",
            reverse("admin:reviews_proposal_decide", args=[p.pk]),
            {"operation_id": op, "decision": "approve"},
        ),
        (
            "admin edit",
            reverse("admin:reviews_proposal_edit", args=[p.pk]),
            {"expected_operation_id": op, "body": p.body + "\nForged.", "source_0": "2", "source_1": "3"},
        ),
        ("admin begin", reverse("admin:cases_case_begin", args=[fresh.pk]), {}),
        (
            "admin action approve_selected",
            changelist,
            {"action": "approve_selected", "_selected_action": [case.pk], "post": "yes", f"operation_id_{case.pk}": op},
        ),
        (
            "admin action decline_selected",
            changelist,
            {"action": "decline_selected", "_selected_action": [case.pk], "post": "yes", f"operation_id_{case.pk}": op},
        ),
        (
            "admin add decision",
            reverse("admin:reviews_reviewdecision_add"),
            {"operation_id": op, "proposal": p.pk, "approved": "on", "reviewer": w["reviewer"].pk},
        ),
        ("admin add effect", reverse("admin:effects_effectrecord_add"), {"operation_id": op}),
    ]


ADMIN_IDENTITIES = ["anonymous", "lead", "staff", "inactive", "csrf-forged reviewer"]
API_TOKENS = ["none", "lead", "staff", "inactive", "revoked", "forged"]


def admin_client_for(who, w, make_user):
    if who == "csrf-forged reviewer":
        # A real reviewer's browser, made to POST by another site: no CSRF token.
        client = Client(enforce_csrf_checks=True)
        client.force_login(w["reviewer"])
        return client
    client = Client()
    user = {"lead": w["lead"], "staff": w["staff"]}.get(who)
    if who == "inactive":
        user = make_user("inactive-2")
        user.is_active = False
        user.save()
    if user is not None:
        client.force_login(user)
    return client


def test_admin_routes_change_nothing_without_the_review_permission(world, make_user):
    """Every identity x every admin route (views, actions, add pages): 403 or the login page."""
    tried = 0
    for who in ADMIN_IDENTITIES:
        client = admin_client_for(who, world, make_user)
        before = snapshot()
        for name, url, data in admin_routes(world):
            response = client.post(url, data)
            if who in ("anonymous", "inactive"):
                # Not logged in (an inactive user's session is not honoured): the login page.
                assert response.status_code == 302 and "/login/" in response["Location"], (who, name)
            else:
                assert response.status_code == 403, (who, name, response.status_code)
            tried += 1
        assert snapshot() == before, who
    assert tried == len(ADMIN_IDENTITIES) * 7


def test_api_routes_change_nothing_without_the_review_permission(world, client):
    op, case_id = world["op"], world["waiting"].case_id
    routes = [
        (f"/api/cases/{case_id}/decision", {"operation_id": op, "approved": True}),
        (f"/api/cases/{case_id}/decision", {"operation_id": op, "approved": False}),
        (f"/api/cases/{case_id}/edits", {"expected_operation_id": op, "body": "Forged."}),
        (f"/api/cases/{world['fresh'].case_id}/decision", {"operation_id": op, "approved": True}),
    ]
    before = snapshot()
    for token in API_TOKENS:
        headers = {} if token == "none" else {"Authorization": f"Bearer {world['tokens'][token]}"}
        for url, body in routes:
            response = client.post(url, json.dumps(body), content_type="application/json", headers=headers)
            expected = 403 if token in ("lead", "staff") else 401
            assert response.status_code == expected, (token, url, response.content[:300])
            assert response.json()["code"] in ("forbidden", "unauthorized")
        assert snapshot() == before, token


def test_api_session_post_without_csrf_changes_nothing(world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world["reviewer"])
    before = snapshot()
    response = client.post(
        f"/api/cases/{world['waiting'].case_id}/decision",
        json.dumps({"operation_id": world["op"], "approved": True}),
        content_type="application/json",
    )
    assert response.status_code == 403 and "CSRF" in response.json()["message"]
    assert snapshot() == before


def test_commands_and_services_refuse_a_user_without_the_permission(world):
    from core.errors import PermissionRefused
    from effects.services import effect_commit
    from workflow.decide import decision_record
    from workflow.selectors import decidable_operation_id

    before = snapshot()
    op, case_id = world["op"], world["waiting"].case_id
    for user in ("lead", "staff-no-groups"):
        code, _out, err = command("resume", case_id, "--operation-id", op, "--approve", "--reviewer", user)
        assert code == 1 and "review permission" in err, err
        code, _out, err = command(
            "edit", case_id, "--expected-operation-id", op, "--source", "HOLD-7=4", "--editor", user
        )
        assert code == 1 and "review permission" in err, err
    # A case nobody began: `resume` would begin it for a reviewer, and begins nothing for them.
    fresh = world["fresh"]
    fresh_op = decidable_operation_id(fresh)
    for user in ("lead", "staff-no-groups"):
        code, _out, err = command("resume", fresh.case_id, "--operation-id", fresh_op, "--approve", "--reviewer", user)
        assert code == 1 and "review permission" in err, err
    for user in (world["lead"], world["staff"]):
        with pytest.raises(PermissionRefused):
            effect_commit(operation_id=op, approved=True, reviewer=user)
        with pytest.raises(PermissionRefused):
            decision_record(case=fresh, operation_id=fresh_op, approved=True, reviewer=user, channel="service")
    assert snapshot() == before


# --- escaping ----------------------------------------------------------------------------


def xss_case_data(case_id: str) -> dict:
    data = case_data(case_id, subject='Subject <b onmouseover="alert(2)">bold</b>', draft=XSS_DRAFT)
    data["sources"] = data["sources"] + [
        {
            "source_id": "XSS-1",
            "title": "<i>Title</i>",
            "versions": [{"version": 1, "text": f"Before {XSS_QUOTE} after."}],
        }
    ]
    data["selected_evidence"] = data["selected_evidence"] + [
        {"source_id": "XSS-1", "version": 1, "quotation": XSS_QUOTE}
    ]
    return data


def test_html_in_a_draft_or_quotation_is_escaped_on_every_page(db, reviewer, lead):
    from cases.services import case_import
    from effects.models import EffectRecord
    from reviews.models import ReviewDecision
    from workflow.begin import review_begin
    from workflow.decide import decision_record

    case = case_import(data=xss_case_data("X-1")).case
    op = review_begin(case=case).operation_id
    case.refresh_from_db()
    proposal = case.current_proposal
    client = Client()
    client.force_login(reviewer)
    pages = {
        "review page": reverse("admin:reviews_proposal_review", args=[proposal.pk]),
        "edit page": reverse("admin:reviews_proposal_edit", args=[proposal.pk]),
        "case changelist": reverse("admin:cases_case_changelist"),
        "case page": reverse("admin:cases_case_change", args=[case.pk]),
        "history": reverse("admin:cases_case_history", args=[case.pk]),
        "proposal changelist": reverse("admin:reviews_proposal_changelist"),
    }
    decision_record(case=case, operation_id=op, approved=True, reviewer=reviewer, channel="command")
    pages["decision page"] = reverse(
        "admin:reviews_reviewdecision_change", args=[ReviewDecision.objects.get(operation_id=op).pk]
    )
    pages["effect page"] = reverse(
        "admin:effects_effectrecord_change", args=[EffectRecord.objects.get(operation_id=op).pk]
    )
    pages["history after the decision"] = pages["history"]
    lead_client = Client()
    lead_client.force_login(lead)
    showing = set()
    for who, c in (("reviewer", client), ("lead", lead_client)):
        for name, url in pages.items():
            response = c.get(url, follow=True)
            if who == "lead" and name == "edit page":
                assert response.status_code == 403
                continue
            assert response.status_code == 200, (who, name)
            html = response.content.decode()
            for raw in (
                '<script>alert("draft")',
                '<script>alert("quote")',
                "<img src=x onerror",
                "<b onmouseover",
                "<i>Title</i>",
            ):
                assert raw not in html, (who, name, raw)
            if "&lt;script&gt;alert(&quot;draft&quot;)" in html or '&lt;script&gt;alert("draft")' in html:
                showing.add((who, name))
            if name == "review page":
                assert "&lt;script&gt;alert(&quot;quote&quot;)&lt;/script&gt;" in html, who
    # The escaped text really is on the pages that show the draft and the quotation.
    for who in ("reviewer", "lead"):
        for name in ("review page", "case page", "effect page"):
            assert (who, name) in showing, (who, name)
    assert ("reviewer", "edit page") in showing
    api = Client()
    api.force_login(reviewer)
    response = api.get(f"/api/cases/{case.case_id}")
    assert response["Content-Type"].startswith("application/json")
    assert response["X-Content-Type-Options"] == "nosniff"


# --- production settings ------------------------------------------------------------------


def _production(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "SECRET_KEY", "DATABASE_URL")}
    env.update(DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="decisionflow.internal")
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_check_deploy_is_clean_with_production_settings():
    result = _production("check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout + result.stderr
    shown = _production(
        "shell",
        "-c",
        "from django.conf import settings as s; import json; print(json.dumps("
        "[s.DEBUG, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, "
        "s.SECURE_HSTS_SECONDS, s.SECURE_CONTENT_TYPE_NOSNIFF, s.X_FRAME_OPTIONS]))",
    )
    assert shown.returncode == 0, shown.stderr
    debug, session, csrf, redirect, hsts, nosniff, frames = json.loads(shown.stdout.strip().splitlines()[-1])
    assert (debug, session, csrf, redirect, nosniff, frames) == (False, True, True, True, True, "DENY")
    assert hsts >= 31536000


# --- checkpoints are never unpickled ------------------------------------------------------


class _Sentinel:
    """Unpickling this writes a file: proof of whether anything ever unpickled it."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('unpickled')",))


def test_a_checkpoint_row_holding_a_pickle_is_refused_never_unpickled(db, reviewer, tmp_path):
    from cases.services import case_import
    from engine.checkpoints import CheckpointRefused, DatabaseCheckpointStorage, payload_digest
    from reviews.models import WorkflowCheckpoint
    from workflow.begin import review_begin

    case = case_import(data=case_data("K-1")).case
    begun = review_begin(case=case)
    row = WorkflowCheckpoint.objects.get(checkpoint_id=begun.pending_review.checkpoint_id)
    sentinel = tmp_path / "unpickled"
    blob = base64.b64encode(pickle.dumps(_Sentinel(sentinel))).decode()
    document = json.loads(row.payload)
    # agent-framework's own encoding of a non-JSON value, exactly as FileCheckpointStorage writes it.
    document["state"]["injected"] = {"__pickled__": blob, "__type__": "builtins.object"}
    payload = json.dumps(document)
    # The digest is made to match: only the refusal to unpickle stands between this row and exec.
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(payload=payload, digest=payload_digest(payload))
    before = snapshot()

    with pytest.raises(CheckpointRefused, match="pickle"):
        DatabaseCheckpointStorage().load_sync(row.checkpoint_id)
    code, _out, err = command(
        "resume", case.case_id, "--operation-id", begun.operation_id, "--approve", "--reviewer", reviewer.get_username()
    )
    assert code == 5 and "pickle" in err, err
    assert not sentinel.exists()
    assert snapshot() == before

    # Control: the payload is a live pickle; decoding it the way a pickle store would runs it.
    pickle.loads(base64.b64decode(blob))  # noqa: S301 - the point of the control experiment
    assert sentinel.read_text() == "unpickled"


def test_a_checkpoint_forged_without_the_secret_is_refused(db, reviewer):
    """Write access to the checkpoint table is not enough: the digest is an HMAC keyed from SECRET_KEY.

    The forged pause asks to approve another case's operation; signed with a bare SHA-256
    (what anyone can compute) or another secret, it is refused before anything runs.
    """
    import hashlib

    from cases.services import case_import
    from effects.models import CommitAttempt
    from engine.checkpoints import payload_digest
    from reviews.models import WorkflowCheckpoint
    from workflow.begin import review_begin

    victim = review_begin(case=case_import(data=case_data("F-1")).case)
    other = review_begin(case=case_import(data=case_data("F-2")).case)
    row = WorkflowCheckpoint.objects.get(checkpoint_id=victim.pending_review.checkpoint_id)
    forged = row.payload.replace(victim.operation_id, other.operation_id)
    assert forged != row.payload
    before = snapshot()
    for digest in (hashlib.sha256(forged.encode()).hexdigest(), payload_digest(forged, secret="a-guessed-secret")):
        WorkflowCheckpoint.objects.filter(pk=row.pk).update(payload=forged, digest=digest)
        code, out, err = command(
            "resume", "F-1", "--operation-id", victim.operation_id, "--approve", "--reviewer", reviewer.get_username()
        )
        assert code == 5 and "HMAC" in err and "result=" not in out, err
    assert snapshot() == before
    assert CommitAttempt.objects.filter(outcome="refused").count() == 2
