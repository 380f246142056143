"""Bad-input battery: one table per entry point (commands, checkpoints, admin forms, API).

Every row feeds one malformed, hostile or stale input and requires a clear error (a
non-zero exit code with a message, an admin error message or form error, a JSON 4xx with a
code) and that nothing was written: the proposal, decision, effect and pending-review rows
and every case's current-proposal pointer are compared before and after each row. Commit
attempts are the audit log and may grow (a refused decision is recorded as refused).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.test import Client
from django.urls import reverse

from tests.reliability.conftest import case_data, command, record
from tests.reliability.test_security import snapshot

pytestmark = pytest.mark.django_db

HEX = "0123456789abcdef" * 4


@dataclass
class World:
    a: object  # case B-1, begun
    b: object  # case B-2, begun
    c: object  # case B-3, edited once: its first proposal is stale
    op_a: str
    op_b: str
    op_c_stale: str
    op_c: str
    reviewer: object
    token: str
    tmp: object


@pytest.fixture
def w(db, reviewer, tmp_path):
    from api.services import token_create
    from cases.services import case_import
    from workflow.begin import review_begin
    from workflow.edit import review_edit

    a = case_import(data=case_data("B-1")).case
    b = case_import(data=case_data("B-2")).case
    c = case_import(data=case_data("B-3")).case
    op_a = review_begin(case=a).operation_id
    op_b = review_begin(case=b).operation_id
    op_c_stale = review_begin(case=c).operation_id
    edited = review_edit(case=c, expected_operation_id=op_c_stale, source_versions={"HOLD-7": 4}, editor=reviewer)
    assert edited.begun is not None, edited.begin_error
    for case in (a, b, c):
        case.refresh_from_db()
    return World(
        a,
        b,
        c,
        op_a,
        op_b,
        op_c_stale,
        edited.revision.proposal.operation_id,
        reviewer,
        token_create(user=reviewer, name="battery")[1],
        tmp_path,
    )


class Battery:
    """Runs rows, each in its own subtest, and keeps the figures."""

    def __init__(self, entry, subtests):
        self.entry, self.subtests = entry, subtests
        self.tried = self.refused = self.written = 0
        self.names: list[str] = []
        self.started = time.monotonic()

    def row(self, name: str, attempt: Callable[[], str | None]):
        """``attempt`` performs the input and returns the error text it got (None: no clear error)."""
        assert name not in self.names, name
        self.names.append(name)
        with self.subtests.test(msg=f"{self.entry}: {name}"):
            before = snapshot()
            self.tried += 1
            message = attempt()
            after = snapshot()
            self.written += after != before
            assert after == before, f"{name}: something was written"
            assert message, f"{name}: no clear error"
            assert "Traceback" not in message, message
            self.refused += 1

    def save(self):
        record(
            "bad-input",
            entry=self.entry,
            inputs=self.tried,
            refused_clearly=self.refused,
            wrote_something=self.written,
            seconds=round(time.monotonic() - self.started, 1),
            names=self.names,
        )
        assert self.refused == self.tried and self.written == 0


# --- commands ----------------------------------------------------------------------------


def cmd_error(name, *args, stdin_bytes=None, expect=None, code=None):
    def attempt():
        rc, _out, err = command(name, *args, stdin_bytes=stdin_bytes)
        if rc == 0 or (code is not None and rc != code):
            return None
        if expect is not None and expect.lower() not in err.lower():
            return None
        return err.strip() or None

    return attempt


def load_case_rows(w):
    def file(name, data=None, raw=None):
        path = w.tmp / name
        path.write_bytes(raw if raw is not None else json.dumps(data, ensure_ascii=False).encode("utf-8"))
        return str(path)

    good = case_data("L-1")
    no_draft = {k: v for k, v in good.items() if k != "draft"}
    dup_version = json.loads(json.dumps(good))
    dup_version["sources"][0]["versions"].append(dict(dup_version["sources"][0]["versions"][0]))
    float_policy = json.loads(json.dumps(good))
    float_policy["policy"]["parameters"]["allowance_units"] = 9.5
    null_policy = json.loads(json.dumps(good))
    null_policy["policy"]["parameters"]["allowance_units"] = None
    twice = json.loads(json.dumps(good))
    twice["selected_evidence"].append(dict(twice["selected_evidence"][0]))
    wrong_quote = json.loads(json.dumps(good))
    wrong_quote["selected_evidence"][0]["quotation"] = "Not in the source at all."
    str_version = json.loads(json.dumps(good))
    str_version["selected_evidence"][0]["version"] = "2"
    changed = case_data("B-1", subject="A different subject for an existing case")
    text = json.dumps(good)
    return [
        ("load_case: a required key (draft) missing", cmd_error("load_case", file("1.json", no_draft), expect="draft")),
        ("load_case: a duplicated source version", cmd_error("load_case", file("2.json", dup_version), expect="twice")),
        (
            "load_case: a policy with a float value",
            cmd_error("load_case", file("3.json", float_policy), expect="allowance_units"),
        ),
        (
            "load_case: a policy with a null value",
            cmd_error("load_case", file("3b.json", null_policy), expect="allowance_units"),
        ),
        (
            "load_case: invalid UTF-8",
            cmd_error(
                "load_case", file("4.json", raw=text.encode()[:50] + b"\xff\xfe" + text.encode()[50:]), expect="UTF-8"
            ),
        ),
        (
            "load_case: a lone surrogate escape",
            cmd_error(
                "load_case", file("5.json", raw=text.replace('"Hello,', '"\\ud800Hello,').encode()), expect="surrogate"
            ),
        ),
        (
            "load_case: truncated JSON",
            cmd_error("load_case", file("6.json", raw=text.encode()[: len(text) // 2]), expect="JSON"),
        ),
        ("load_case: the same evidence selected twice", cmd_error("load_case", file("7.json", twice), expect="twice")),
        (
            "load_case: a quotation not in its source",
            cmd_error("load_case", file("8.json", wrong_quote), expect="not in the text"),
        ),
        (
            "load_case: a version given as a string",
            cmd_error("load_case", file("9.json", str_version), expect="integer"),
        ),
        (
            "load_case: an existing case with other content",
            cmd_error("load_case", file("10.json", changed), expect="already exists"),
        ),
        ("load_case: an empty case_id", cmd_error("load_case", file("11.json", case_data("  ")), expect="empty")),
        ("load_case: a JSON list, not an object", cmd_error("load_case", file("12.json", [good]), expect="object")),
        ("load_case: a missing file", cmd_error("load_case", str(w.tmp / "missing.json"), expect="cannot read")),
    ]


def resume_rows(w):
    r = ("--reviewer", w.reviewer.get_username())
    a = w.a.case_id
    return [
        ("resume: no --approve or --decline", cmd_error("resume", a, "--operation-id", w.op_a, *r, expect="approve")),
        (
            "resume: both --approve and --decline",
            cmd_error("resume", a, "--operation-id", w.op_a, "--approve", "--decline", *r, expect="not allowed"),
        ),
        (
            "resume: a malformed identity",
            cmd_error("resume", a, "--operation-id", "op-v1-xyz", "--approve", *r, expect="no pending review"),
        ),
        ("resume: a truncated identity", cmd_error("resume", a, "--operation-id", w.op_a[:-1], "--approve", *r)),
        ("resume: an upper-case identity", cmd_error("resume", a, "--operation-id", w.op_a.upper(), "--approve", *r)),
        ("resume: the identity of another case", cmd_error("resume", a, "--operation-id", w.op_b, "--approve", *r)),
        (
            "resume: a stale identity",
            cmd_error("resume", w.c.case_id, "--operation-id", w.op_c_stale, "--approve", *r, code=4, expect="stale"),
        ),
        (
            "resume: an unknown case",
            cmd_error("resume", "NOPE-1", "--operation-id", w.op_a, "--approve", *r, expect="no case"),
        ),
        (
            "resume: SQL metacharacters in the case ID",
            cmd_error(
                "resume", "B-1'; DROP TABLE cases_case; --", "--operation-id", w.op_a, "--approve", *r, expect="no case"
            ),
        ),
        (
            "resume: HTML in the case ID",
            cmd_error(
                "resume", "<script>alert(1)</script>", "--operation-id", w.op_a, "--approve", *r, expect="no case"
            ),
        ),
        (
            "resume: SQL metacharacters in the identity",
            cmd_error("resume", a, "--operation-id", "op-v1-' OR '1'='1", "--approve", *r),
        ),
        (
            "resume: an unknown reviewer",
            cmd_error("resume", a, "--operation-id", w.op_a, "--approve", "--reviewer", "nobody", expect="no user"),
        ),
        (
            "resume: an unknown fault",
            cmd_error("resume", a, "--operation-id", w.op_a, "--approve", *r, "--fault", "explode", expect="fault"),
        ),
    ]


def edit_rows(w):
    e = ("--editor", w.reviewer.get_username())
    a = w.a.case_id

    def body(name, raw):
        path = w.tmp / name
        path.write_bytes(raw)
        return str(path)

    return [
        (
            "edit: a body file that is not UTF-8",
            cmd_error(
                "edit",
                a,
                "--expected-operation-id",
                w.op_a,
                "--body-file",
                body("b1.txt", b"Hello \xff\xfe world."),
                *e,
                expect="UTF-8",
            ),
        ),
        (
            "edit: a surrogate encoded in the body bytes",
            cmd_error(
                "edit",
                a,
                "--expected-operation-id",
                w.op_a,
                "--body-file",
                body("b2.txt", b"Hi \xed\xa0\x80."),
                *e,
                expect="UTF-8",
            ),
        ),
        (
            "edit: invalid UTF-8 on stdin",
            cmd_error(
                "edit",
                a,
                "--expected-operation-id",
                w.op_a,
                "--body-file",
                "-",
                *e,
                stdin_bytes=b"\xc3\x28 broken",
                expect="UTF-8",
            ),
        ),
        (
            "edit: a stale expected identity",
            cmd_error(
                "edit",
                w.c.case_id,
                "--expected-operation-id",
                w.op_c_stale,
                "--source",
                "HOLD-7=2",
                *e,
                code=4,
                expect="stale",
            ),
        ),
        (
            "edit: the expected identity of another case",
            cmd_error("edit", a, "--expected-operation-id", w.op_b, "--source", "HOLD-7=4", *e),
        ),
        (
            "edit: a malformed expected identity",
            cmd_error("edit", a, "--expected-operation-id", "op-v1-" + "g" * 64, "--source", "HOLD-7=4", *e),
        ),
        (
            "edit: --source that is not SOURCE=VERSION",
            cmd_error(
                "edit", a, "--expected-operation-id", w.op_a, "--source", "HOLD-7=abc", *e, expect="SOURCE=VERSION"
            ),
        ),
        (
            "edit: --source naming a version that does not exist",
            cmd_error("edit", a, "--expected-operation-id", w.op_a, "--source", "HOLD-7=99", *e),
        ),
        (
            "edit: --source naming a source not in the proposal",
            cmd_error("edit", a, "--expected-operation-id", w.op_a, "--source", "KB-999=1", *e),
        ),
        (
            "edit: neither a body nor a source",
            cmd_error("edit", a, "--expected-operation-id", w.op_a, *e, expect="required"),
        ),
        (
            "edit: a body file that does not exist",
            cmd_error(
                "edit",
                a,
                "--expected-operation-id",
                w.op_a,
                "--body-file",
                str(w.tmp / "none.txt"),
                *e,
                expect="cannot read",
            ),
        ),
    ]


def reconcile_rows(w):
    return [
        ("reconcile: an unknown case", cmd_error("reconcile", "NOPE-1", expect="no case")),
        ("reconcile: a case and --all", cmd_error("reconcile", w.a.case_id, "--all", expect="not both")),
        ("reconcile: neither a case nor --all", cmd_error("reconcile", expect="--all")),
        ("reconcile: SQL metacharacters in the case ID", cmd_error("reconcile", "x' OR 1=1; --", expect="no case")),
        ("reconcile: an unknown option", cmd_error("reconcile", "--all", "--fix-everything")),
    ]


def test_commands_refuse_bad_input_clearly_and_write_nothing(w, subtests):
    battery = Battery("commands", subtests)
    for name, attempt in load_case_rows(w) + resume_rows(w) + edit_rows(w) + reconcile_rows(w):
        battery.row(name, attempt)
    battery.save()
    assert battery.tried >= 40


# --- checkpoints -------------------------------------------------------------------------


def test_damaged_checkpoints_are_refused_and_nothing_is_answered(w, subtests):
    """Every way a pause can fail its binding checks: exit 5, nothing runs, nothing is written."""
    from agent_framework import WorkflowMessage

    from engine.checkpoints import DatabaseCheckpointStorage, encode_checkpoint, payload_digest
    from engine.graph import HUMAN_REVIEW_ID
    from reviews.models import PendingReview, WorkflowCheckpoint

    pending = PendingReview.objects.get(operation_id=w.op_a)
    row = WorkflowCheckpoint.objects.get(checkpoint_id=pending.checkpoint_id)
    original = {f: getattr(row, f) for f in ("payload", "digest", "graph_signature_hash")}
    request_id = f"review:{w.op_a}"

    def refused(expect):
        return cmd_error(
            "resume",
            w.a.case_id,
            "--operation-id",
            w.op_a,
            "--approve",
            "--reviewer",
            w.reviewer.get_username(),
            code=5,
            expect=expect,
        )

    def with_row(attempt, **fields):
        def run():
            WorkflowCheckpoint.objects.filter(pk=row.pk).update(**fields)
            try:
                return attempt()
            finally:
                WorkflowCheckpoint.objects.filter(pk=row.pk).update(**original)

        return run

    def with_payload(change, attempt):
        """A JSON edit of the stored payload, re-signed as someone holding the secret could."""
        document = json.loads(original["payload"])
        change(document)
        payload = json.dumps(document)
        return with_row(attempt, payload=payload, digest=payload_digest(payload))

    def with_checkpoint(change, attempt):
        """An edit of the decoded checkpoint, encoded and re-signed."""
        checkpoint = DatabaseCheckpointStorage().load_sync(pending.checkpoint_id)
        change(checkpoint)
        payload = encode_checkpoint(checkpoint)
        return with_row(attempt, payload=payload, digest=payload_digest(payload))

    def other_version():
        PendingReview.objects.filter(pk=pending.pk).update(workflow_version="review-v0")
        try:
            return refused("workflow version")()
        finally:
            PendingReview.objects.filter(pk=pending.pk).update(workflow_version=pending.workflow_version)

    def missing():
        PendingReview.objects.filter(pk=pending.pk).update(checkpoint_id="no-such-checkpoint")
        try:
            return refused("does not exist")()
        finally:
            PendingReview.objects.filter(pk=pending.pk).update(checkpoint_id=pending.checkpoint_id)

    tampered = original["payload"].replace(w.op_a, w.op_b)
    assert tampered != original["payload"]
    other_graph = "0" * 64

    def set_graph(d):
        d["graph_signature_hash"] = other_graph

    def swap_op(d):
        d["pending_request_info_events"] = json.loads(
            json.dumps(d["pending_request_info_events"]).replace(w.op_a, w.op_b)
        )

    def request_data(**changes):
        def change(d):
            d["pending_request_info_events"][request_id]["data"].update(changes)

        return change

    def from_another_step(d):
        d["pending_request_info_events"][request_id]["source_executor_id"] = "prepare"

    def second_request(d):
        events = d["pending_request_info_events"]
        events[f"review:op-v1-{HEX}"] = events[request_id]

    def no_request(d):
        d["pending_request_info_events"] = {}

    def in_flight(checkpoint):
        approval = {"case_id": w.a.case_id, "operation_id": w.op_a, "approved": True, "reviewer_pk": w.reviewer.pk}
        checkpoint.messages[HUMAN_REVIEW_ID] = [
            WorkflowMessage(data=approval, source_id=HUMAN_REVIEW_ID, target_id="commit")
        ]

    def other_graph_row():
        # Content and column agree (the digest is recomputed), but the graph is not this one.
        WorkflowCheckpoint.objects.filter(pk=row.pk).update(graph_signature_hash=other_graph)
        return with_payload(set_graph, refused("graph"))()

    hmac = "HMAC"
    battery = Battery("checkpoints", subtests)
    rows = [
        ("a tampered checkpoint (payload edited, digest kept)", with_row(refused(hmac), payload=tampered)),
        (
            "a digest that is a bare SHA-256 of the payload",
            with_row(refused(hmac), digest=hashlib.sha256(original["payload"].encode()).hexdigest()),
        ),
        (
            "a digest signed with another SECRET_KEY",
            with_row(refused(hmac), digest=payload_digest(original["payload"], secret="not-this-servers-secret")),
        ),
        ("a checkpoint from another workflow version", other_version),
        ("a checkpoint from another workflow graph", other_graph_row),
        (
            "a checkpoint whose request names another operation (HMAC recomputed)",
            with_payload(swap_op, refused("does not belong")),
        ),
        (
            "a checkpoint whose request names another case (HMAC recomputed)",
            with_payload(request_data(case_id=w.b.case_id), refused("does not belong")),
        ),
        (
            "a checkpoint whose request names another case row (HMAC recomputed)",
            with_payload(request_data(case_pk=w.b.pk), refused("does not belong")),
        ),
        (
            "a checkpoint whose request comes from another step (HMAC recomputed)",
            with_payload(from_another_step, refused("does not belong")),
        ),
        (
            "a checkpoint holding a second pending request (HMAC recomputed)",
            with_payload(second_request, refused("does not belong")),
        ),
        ("a checkpoint holding no pending request (HMAC recomputed)", with_payload(no_request, refused("no request"))),
        (
            "a checkpoint whose request is from another workflow version (HMAC recomputed)",
            with_payload(request_data(workflow_version="review-v0"), refused("review-v0")),
        ),
        (
            "a checkpoint holding an approval in flight (HMAC recomputed)",
            with_checkpoint(in_flight, refused("in flight")),
        ),
        (
            "a checkpoint that is not JSON (HMAC recomputed)",
            with_row(refused("JSON"), payload="{not json", digest=payload_digest("{not json")),
        ),
        ("a checkpoint in another format", with_payload(lambda d: d.update(format="pickle.v0"), refused("format"))),
        ("a missing checkpoint", missing),
    ]
    for name, attempt in rows:
        battery.row(name, attempt)
    battery.save()
    # Nothing ran for any of them: every refusal is an attempt row saying why, and no other.
    from effects.models import CommitAttempt

    attempts = list(CommitAttempt.objects.filter(operation_id=w.op_a).values_list("outcome", "reason", "detail"))
    assert len(attempts) == len(rows)
    assert all(o == "refused" and r == "checkpoint" and d for o, r, d in attempts), attempts


# --- admin forms -------------------------------------------------------------------------


def admin_post(client, url, data=None, *, raw=None, content_type=None):
    def attempt():
        if raw is not None:
            response = client.post(url, raw, content_type=content_type)
        else:
            response = client.post(url, data)
        if response.status_code == 400:
            return f"400 {response.content[:100]!r}"
        if response.status_code == 302:
            response = client.get(response["Location"])
        if response.status_code != 200 or not response.context:
            return None
        # An error (or a "skipped, nothing was written" warning) message, or a form error.
        problems = [str(m) for m in response.context["messages"] if m.level_tag in ("error", "warning")]
        form = response.context.get("form")
        if form is not None and form.errors:
            problems += [f"{k}: {v}" for k, v in form.errors.items()]
        return "; ".join(problems) or None

    return attempt


def test_admin_forms_refuse_bad_input_clearly_and_write_nothing(w, subtests):
    client = Client()
    client.force_login(w.reviewer)
    pa = w.a.current_proposal
    decide = reverse("admin:reviews_proposal_decide", args=[pa.pk])
    edit = reverse("admin:reviews_proposal_edit", args=[pa.pk])
    stale_edit = reverse("admin:reviews_proposal_edit", args=[w.c.proposals.get(operation_id=w.op_c_stale).pk])
    good_edit = {"expected_operation_id": w.op_a, "body": pa.body, "source_0": "2", "source_1": "3"}
    changelist = reverse("admin:cases_case_changelist")
    rows = [
        ("decide: an omitted decision", admin_post(client, decide, {"operation_id": w.op_a})),
        ("decide: decision=yes", admin_post(client, decide, {"operation_id": w.op_a, "decision": "yes"})),
        ("decide: decision=true", admin_post(client, decide, {"operation_id": w.op_a, "decision": "true"})),
        ("decide: decision=1", admin_post(client, decide, {"operation_id": w.op_a, "decision": "1"})),
        ("decide: no identity", admin_post(client, decide, {"decision": "approve"})),
        (
            "decide: a malformed identity",
            admin_post(client, decide, {"operation_id": "op-v1-xyz", "decision": "approve"}),
        ),
        (
            "decide: a truncated identity",
            admin_post(client, decide, {"operation_id": w.op_a[:-1], "decision": "approve"}),
        ),
        (
            "decide: an upper-case identity",
            admin_post(client, decide, {"operation_id": w.op_a.upper(), "decision": "approve"}),
        ),
        (
            "decide: the identity of another case",
            admin_post(client, decide, {"operation_id": w.op_b, "decision": "approve"}),
        ),
        (
            "decide: a stale identity",
            admin_post(
                client,
                reverse("admin:reviews_proposal_decide", args=[w.c.proposals.get(operation_id=w.op_c_stale).pk]),
                {"operation_id": w.op_c_stale, "decision": "approve"},
            ),
        ),
        (
            "decide: HTML in the identity",
            admin_post(client, decide, {"operation_id": "<script>alert(1)</script>", "decision": "approve"}),
        ),
        (
            "decide: SQL metacharacters in the identity",
            admin_post(client, decide, {"operation_id": "op-v1-' OR '1'='1'; --", "decision": "approve"}),
        ),
        (
            "decide: a 10 KiB identity",
            admin_post(client, decide, {"operation_id": "op-v1-" + "a" * 10240, "decision": "approve"}),
        ),
        (
            "edit: a stale expected identity",
            admin_post(
                client,
                stale_edit,
                {"expected_operation_id": w.op_c_stale, "body": "Stale edit.", "source_0": "2", "source_1": "3"},
            ),
        ),
        (
            "edit: the expected identity of another case",
            admin_post(client, edit, {**good_edit, "expected_operation_id": w.op_b}),
        ),
        ("edit: an empty body", admin_post(client, edit, {**good_edit, "body": ""})),
        ("edit: a source version that does not exist", admin_post(client, edit, {**good_edit, "source_0": "99"})),
        ("edit: a source version that is not a number", admin_post(client, edit, {**good_edit, "source_0": "two"})),
        (
            "edit: a malformed expected identity",
            admin_post(client, edit, {**good_edit, "expected_operation_id": "op-v1-" + HEX[:63]}),
        ),
        ("edit: a 10 MiB body", admin_post(client, edit, {**good_edit, "body": "x" * (10 * 1024 * 1024)})),
        (
            "edit: a body that is not UTF-8",
            admin_post(
                client,
                edit,
                raw=f"expected_operation_id={w.op_a}&source_0=2&source_1=3&body=Hello%FF%FE".encode(),
                content_type="application/x-www-form-urlencoded",
            ),
        ),
        (
            "edit: a lone surrogate in the body",
            admin_post(
                client,
                edit,
                raw=f"expected_operation_id={w.op_a}&source_0=2&source_1=3&body=Hi%ED%A0%80".encode(),
                content_type="application/x-www-form-urlencoded",
            ),
        ),
        (
            "action: approve selected naming another case's identity",
            admin_post(
                client,
                changelist,
                {
                    "action": "approve_selected",
                    "_selected_action": [w.a.pk],
                    "post": "yes",
                    f"operation_id_{w.a.pk}": w.op_b,
                },
            ),
        ),
        (
            "action: approve selected with no identity",
            admin_post(client, changelist, {"action": "approve_selected", "_selected_action": [w.a.pk], "post": "yes"}),
        ),
    ]
    battery = Battery("admin forms", subtests)
    for name, attempt in rows:
        battery.row(name, attempt)
    battery.save()


# --- API ---------------------------------------------------------------------------------


def test_api_refuses_bad_input_clearly_and_writes_nothing(w, client, subtests):
    auth = {"Authorization": f"Bearer {w.token}"}
    a = f"/api/cases/{w.a.case_id}"

    def post(url, body=None, *, raw=None, content_type="application/json"):
        def attempt():
            data = raw if raw is not None else json.dumps(body)
            response = client.post(url, data, content_type=content_type, headers=auth)
            if not 400 <= response.status_code < 500:
                return None
            payload = response.json()
            return f"{response.status_code} {payload['code']}: {payload['message']}" if payload.get("message") else None

        return attempt

    d, e = f"{a}/decision", f"{a}/edits"
    rows = [
        ("decision: approved omitted", post(d, {"operation_id": w.op_a})),
        ('decision: approved "true"', post(d, {"operation_id": w.op_a, "approved": "true"})),
        ("decision: approved 1", post(d, {"operation_id": w.op_a, "approved": 1})),
        ("decision: approved null", post(d, {"operation_id": w.op_a, "approved": None})),
        ('decision: approved "yes"', post(d, {"operation_id": w.op_a, "approved": "yes"})),
        ("decision: a malformed identity", post(d, {"operation_id": "op-v1-xyz", "approved": True})),
        ("decision: a truncated identity", post(d, {"operation_id": w.op_a[:-1], "approved": True})),
        ("decision: an upper-case identity", post(d, {"operation_id": w.op_a.upper(), "approved": True})),
        ("decision: the identity of another case", post(d, {"operation_id": w.op_b, "approved": True})),
        (
            "decision: a stale identity",
            post(f"/api/cases/{w.c.case_id}/decision", {"operation_id": w.op_c_stale, "approved": True}),
        ),
        ("decision: an unknown case", post("/api/cases/NOPE-1/decision", {"operation_id": w.op_a, "approved": True})),
        (
            "decision: SQL metacharacters in the case ID",
            post("/api/cases/B-1%27%3B%20DROP%20TABLE%20x%3B--/decision", {"operation_id": w.op_a, "approved": True}),
        ),
        ("decision: HTML in the identity", post(d, {"operation_id": "<script>alert(1)</script>", "approved": True})),
        (
            "decision: a 10 MiB body",
            post(d, raw=json.dumps({"operation_id": w.op_a, "approved": True, "pad": "x" * (10 * 1024 * 1024)})),
        ),
        ("decision: a lone surrogate", post(d, raw='{"operation_id": "op-v1-\\ud800", "approved": true}')),
        ("decision: invalid UTF-8", post(d, raw=b'{"operation_id": "\xff\xfe", "approved": true}')),
        ("decision: truncated JSON", post(d, raw=json.dumps({"operation_id": w.op_a, "approved": True})[:30])),
        (
            "decision: a duplicated key",
            post(d, raw=f'{{"operation_id": "{w.op_a}", "approved": false, "approved": true}}'),
        ),
        (
            "decision: an unknown field (reviewer)",
            post(d, {"operation_id": w.op_a, "approved": True, "reviewer": "someone-else"}),
        ),
        ("decision: NaN", post(d, raw=f'{{"operation_id": "{w.op_a}", "approved": NaN}}')),
        ("decision: a JSON list", post(d, [{"operation_id": w.op_a, "approved": True}])),
        (
            "decision: a form-encoded body",
            post(d, raw=f"operation_id={w.op_a}&approved=true", content_type="application/x-www-form-urlencoded"),
        ),
        ("edit: an empty body", post(e, {"expected_operation_id": w.op_a, "body": ""})),
        ("edit: nothing to change", post(e, {"expected_operation_id": w.op_a})),
        (
            "edit: a float source version",
            post(e, {"expected_operation_id": w.op_a, "source_versions": {"HOLD-7": 2.5}}),
        ),
        (
            "edit: a version that does not exist",
            post(e, {"expected_operation_id": w.op_a, "source_versions": {"HOLD-7": 99}}),
        ),
        (
            "edit: a stale expected identity",
            post(f"/api/cases/{w.c.case_id}/edits", {"expected_operation_id": w.op_c_stale, "body": "Stale."}),
        ),
        (
            "edit: a lone surrogate in the body",
            post(e, raw=f'{{"expected_operation_id": "{w.op_a}", "body": "Hi \\udc00 there"}}'),
        ),
    ]
    battery = Battery("API", subtests)
    for name, attempt in rows:
        battery.row(name, attempt)
    battery.save()
