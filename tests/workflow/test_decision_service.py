"""The one decision service, seen through its three channels: admin, API and `manage.py resume`.

One table drives every scenario through each channel and asserts that all three report the
same outcome, and that every refusal wrote no decision and no effect but one attempt row.
The binding checks (a checkpoint of another case, one holding a message in flight, a
forged HMAC), the busy case and the lost connection after the commit are tested here too.
"""

from __future__ import annotations

import functools
import hashlib
import html
import io
import json
import re
import threading
import time
from contextlib import contextmanager

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction
from django.db.models import F
from django.test import Client
from django.urls import reverse

from cases.models import Case
from core.errors import WorkflowIncompatible
from core.locks import case_lock
from core.outcomes import DecisionOutcome as Outcome
from effects.models import CommitAttempt, EffectRecord
from effects.services import operation_reconcile
from engine import graph as engine
from engine.checkpoints import DatabaseCheckpointStorage
from reviews.models import PendingReview, Proposal, ReviewDecision, WorkflowCheckpoint
from tests.conftest import held_elsewhere, load_fixture, snapshot
from workflow.begin import review_begin
from workflow.decide import decision_record
from workflow.edit import review_edit
from workplace import review as workplace_admin

# --- the three channels, each reduced to the outcome a person reads ---------------------


def _admin_client(user) -> Client:
    """One logged-in browser per user (logging in writes the session row)."""
    if not hasattr(user, "_admin_client"):
        user._admin_client = Client()
        user._admin_client.force_login(user)
    return user._admin_client


def _api_headers(user) -> dict:
    """One token per user, used once (its first use writes last_used_at)."""
    from api.services import token_create

    if not hasattr(user, "_api_headers"):
        user._api_headers = {"Authorization": f"Bearer {token_create(user=user, name='channel-test')[1]}"}
        Client().get("/api/cases/none", headers=user._api_headers)
    return dict(user._api_headers)


def via_admin(user, case: Case, op: str, approved: bool, fault: str | None = None) -> str:
    client = _admin_client(user)
    proposal = Proposal.objects.filter(case=case).order_by("-id").first()
    assert proposal is not None
    url = reverse("admin:reviews_proposal_decide", args=[proposal.pk])
    data = {"operation_id": op, "decision": "approve" if approved else "decline"}
    if fault:
        real = workplace_admin.decision_record
        workplace_admin.decision_record = functools.partial(real, fault=fault)  # type: ignore[assignment]
    try:
        response = client.post(url, data, follow=True)
    finally:
        if fault:
            workplace_admin.decision_record = real  # type: ignore[assignment]
    if response.status_code == 403:
        return "forbidden"
    said = " ".join(html.unescape(str(m)) for m in response.context["messages"])
    for pattern, outcome in (
        (r"^Approved:", "committed"),
        (r"^Declined:", "declined"),
        (r"^Already (approved|declined)( by you)?: nothing new was written", "replay"),
        (r"^Approval recorded: 1 of 2 approvals;", "awaiting_approval"),
        # A refusal in its error's own words.
        (r"^conflicting decision:", "conflict"),
        (r"^stale:", "stale"),
        (r"^not in group:", "not_in_group"),
        (r"^not the assignee:", "not_assignee"),
        (r"^four eyes:", "four_eyes"),
        (r"^another action on case \S+ is in progress; try again", "busy"),
        (r"^outcome uncertain:", "uncertain"),
        (r"review permission", "forbidden"),
        (r"^no pending review", "not_found"),
        (r"checkpoint|workflow", "incompatible"),
    ):
        if re.search(pattern, said):
            return outcome
    return f"unclassified admin message: {said!r}"


def via_api(user, case: Case, op: str, approved: bool, fault: str | None = None) -> str:
    headers = _api_headers(user)
    if fault:
        headers["X-Decisionflow-Fault"] = fault
    response = Client().post(
        f"/api/cases/{case.case_id}/decision",
        json.dumps({"operation_id": op, "approved": approved}),
        content_type="application/json",
        headers=headers,
    )
    body = response.json()
    if response.status_code == 200:
        if body["outcome"] == "awaiting_approval":
            assert body["approvals"] == "1 of 2 approvals" and body["effect_count"] == 0
        return body["outcome"]
    if body["code"] == "case_busy":
        assert response["Retry-After"].isdigit()
    return {
        "conflicting_decision": "conflict",
        "stale_proposal": "stale",
        "not_in_group": "not_in_group",
        "not_assignee": "not_assignee",
        "four_eyes": "four_eyes",
        "forbidden": "forbidden",
        "not_found": "not_found",
        "workflow_incompatible": "incompatible",
        "case_busy": "busy",
        "outcome_uncertain": "uncertain",
    }.get(body["code"], f"unclassified API answer: {response.status_code} {body}")


def via_command(user, case: Case, op: str, approved: bool, fault: str | None = None) -> str:
    out, err = io.StringIO(), io.StringIO()
    argv = ["resume", case.case_id, "--operation-id", op, "--approve" if approved else "--decline"]
    argv += ["--reviewer", user.get_username()] + (["--fault", fault] if fault else [])
    try:
        call_command(*argv, stdout=out, stderr=err)
        code = 0
    except CommandError as exc:
        code = exc.returncode
    if code == 0:
        receipt = json.loads(out.getvalue().split("result=", 1)[1])
        if receipt["Replay"]:
            return "replay"
        if receipt["Status"] == "AwaitingApproval":
            assert "approvals=1 of 2 approvals\n" in out.getvalue()
            return "awaiting_approval"
        return "declined" if receipt["Status"] == "Declined" else "committed"
    if code == 1 and "review permission" in err.getvalue():
        return "forbidden"
    if code == 1 and "no pending review" in err.getvalue():
        return "not_found"
    return {
        3: "conflict",
        4: "stale",
        5: "incompatible",
        6: "busy",
        11: "not_in_group",
        8: "four_eyes",
        14: "not_assignee",
        42: "uncertain",
    }.get(code, f"unclassified exit {code}: {err.getvalue()!r}")


CHANNELS = {"admin": via_admin, "api": via_api, "command": via_command}
# What a decision that went through reports; everything else is a refusal or a failure.
DECIDED_HERE = ("committed", "declined", "replay", "awaiting_approval")


# --- scenarios ---------------------------------------------------------------------------


def _begun(name="t1042.json") -> Case:
    from cases.services import case_import

    case = case_import(data=load_fixture(name)).case
    review_begin(case=case)
    case.refresh_from_db()
    return case


def _op(case: Case) -> str:
    case.refresh_from_db()
    return case.current_proposal.operation_id


@pytest.fixture
def world(transactional_db, make_user, settings):
    settings.DECISIONFLOW_FAULT_INJECTION = True
    settings.DECISIONFLOW_DECISION_LOCK_TIMEOUT = 0.3
    return {
        "reviewer": make_user("reviewer"),
        "other": make_user("other"),
        "lead": make_user("lead", group="leads"),
        # A reviewer, but not in billing-reply's group (cases/demo/t1077.json).
        "outsider": make_user("outsider", billing_reviewer=False),
    }


@contextmanager
def _case_row_locked(case_pk: int):
    """Hold the case row's lock from another connection, as an edit in progress does (on
    SQLite, whose writers lock the whole database, a write transaction)."""

    @contextmanager
    def hold():
        with transaction.atomic():
            Case.objects.select_for_update().filter(pk=case_pk).update(subject=F("subject"))
            yield

    with held_elsewhere(hold):
        yield


def scenario_first_approval(world, decide):
    case = _begun()
    return decide(world["reviewer"], case, _op(case), True)


def scenario_first_decline(world, decide):
    case = _begun()
    return decide(world["reviewer"], case, _op(case), False)


def scenario_never_begun(world, decide):
    # A current proposal whose review was never begun (an import without begin, or an edit
    # whose begin failed): every channel begins it first.
    from cases.services import case_import
    from reviews.services import proposal_create

    case = case_import(data=load_fixture("t1042.json")).case
    proposal = proposal_create(case=case)
    assert not PendingReview.objects.exists()
    return decide(world["reviewer"], case, proposal.operation_id, True)


def scenario_replay(world, decide):
    case = _begun()
    decision_record(case=case, operation_id=_op(case), approved=True, reviewer=world["other"], channel="test")
    return decide(world["reviewer"], case, _op(case), True)


def scenario_conflict(world, decide):
    case = _begun()
    decision_record(case=case, operation_id=_op(case), approved=True, reviewer=world["other"], channel="test")
    return decide(world["reviewer"], case, _op(case), False)


def scenario_stale(world, decide):
    case = _begun()
    old = _op(case)
    review_edit(case=case, expected_operation_id=old, body="A different reply.", editor=world["other"])
    return decide(world["reviewer"], case, old, True)


def scenario_unknown_operation(world, decide):
    case = _begun()
    return decide(world["reviewer"], case, "op-v1-" + "0" * 64, True)


def scenario_no_permission(world, decide):
    case = _begun()
    return decide(world["lead"], case, _op(case), True)


def scenario_not_in_group_approves(world, decide):
    case = _begun("t1077.json")
    return decide(world["outsider"], case, _op(case), True)


def scenario_not_in_group_declines(world, decide):
    case = _begun("t1077.json")
    return decide(world["outsider"], case, _op(case), False)


def scenario_in_group(world, decide):
    case = _begun("t1077.json")
    return decide(world["reviewer"], case, _op(case), True)


def _assigned_to_other(world) -> Case:
    """T-1042 under a policy that lets only the assignee decide, assigned to "other" by a lead."""
    from cases.services import case_import
    from workflow.assignment import review_assign

    data = load_fixture("t1042.json")
    data["policy"]["parameters"]["assignee_only"] = True
    case = case_import(data=data).case
    pending = review_begin(case=case).pending_review
    review_assign(pending=pending, by=world["lead"], to_user=world["other"])
    case.refresh_from_db()
    return case


def scenario_not_the_assignee(world, decide):
    case = _assigned_to_other(world)
    return decide(world["reviewer"], case, _op(case), True)


def scenario_the_assignee(world, decide):
    case = _assigned_to_other(world)
    return decide(world["other"], case, _op(case), True)


def _two_person() -> Case:
    """T-1042 under a policy that needs two distinct approvers, begun."""
    from cases.services import case_import

    data = load_fixture("t1042.json")
    data["policy"]["parameters"]["approvals_required"] = 2
    case = case_import(data=data).case
    review_begin(case=case)
    case.refresh_from_db()
    return case


def scenario_first_of_two_approvals(world, decide):
    case = _two_person()
    return decide(world["reviewer"], case, _op(case), True)


def scenario_second_of_two_approvals(world, decide):
    case = _two_person()
    decision_record(case=case, operation_id=_op(case), approved=True, reviewer=world["other"], channel="test")
    return decide(world["reviewer"], case, _op(case), True)


def scenario_same_approver_again_of_two(world, decide):
    case = _two_person()
    decision_record(case=case, operation_id=_op(case), approved=True, reviewer=world["reviewer"], channel="test")
    return decide(world["reviewer"], case, _op(case), True)


def scenario_decline_after_one_of_two(world, decide):
    case = _two_person()
    decision_record(case=case, operation_id=_op(case), approved=True, reviewer=world["other"], channel="test")
    return decide(world["reviewer"], case, _op(case), False)


def scenario_editor_approves_one_of_two(world, decide):
    case = _two_person()
    review_edit(case=case, expected_operation_id=_op(case), body="A different reply.", editor=world["reviewer"])
    return decide(world["reviewer"], case, _op(case), True)


def scenario_checkpoint_of_another_case(world, decide):
    case, other = _begun(), _begun("t1077.json")
    theirs = PendingReview.objects.get(case=other).checkpoint_id
    PendingReview.objects.filter(case=case).update(checkpoint_id=theirs)
    return decide(world["reviewer"], case, _op(case), True)


def scenario_busy(world, decide):
    case = _begun()
    # Log in (and use the token) first: those write too, and are not what is measured here.
    _admin_client(world["reviewer"]), _api_headers(world["reviewer"])
    with _case_row_locked(case.pk):
        started = time.monotonic()
        said = decide(world["reviewer"], case, _op(case), True)
        assert time.monotonic() - started < 5, "a busy case must answer within a few seconds"
    return said


def scenario_lost_connection(world, decide):
    case = _begun()
    said = decide(world["reviewer"], case, _op(case), True, fault="lose-connection")
    connection.close()
    return said


# scenario: (setup and decision, what every channel must report, effects in the end)
SCENARIOS = {
    "first approval": (scenario_first_approval, "committed", 1),
    "first decline": (scenario_first_decline, "declined", 0),
    "never begun": (scenario_never_begun, "committed", 1),
    "the same approval again": (scenario_replay, "replay", 1),
    "the opposite decision": (scenario_conflict, "conflict", 1),
    "a tab from before an edit": (scenario_stale, "stale", 0),
    "an operation of no case": (scenario_unknown_operation, "not_found", 0),
    "no review permission": (scenario_no_permission, "forbidden", 0),
    "an approval from outside the policy's groups": (scenario_not_in_group_approves, "not_in_group", 0),
    "a decline from outside the policy's groups": (scenario_not_in_group_declines, "not_in_group", 0),
    "an approval by a member of the policy's group": (scenario_in_group, "committed", 1),
    "an approval by another than the assignee, assignee only": (scenario_not_the_assignee, "not_assignee", 0),
    "an approval by the assignee, assignee only": (scenario_the_assignee, "committed", 1),
    "the first of two approvals": (scenario_first_of_two_approvals, "awaiting_approval", 0),
    "the second of two approvals": (scenario_second_of_two_approvals, "committed", 1),
    "the same approver again, of two": (scenario_same_approver_again_of_two, "replay", 0),
    "a decline after one of two approvals": (scenario_decline_after_one_of_two, "declined", 0),
    "the editor approves, of two": (scenario_editor_approves_one_of_two, "four_eyes", 0),
    "a checkpoint of another case": (scenario_checkpoint_of_another_case, "incompatible", 0),
    "another action holds the case": (scenario_busy, "busy", 0),
    "connection lost after the commit": (scenario_lost_connection, "uncertain", 1),
}


@pytest.mark.parametrize("channel", sorted(CHANNELS))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_channel_gives_the_same_outcome(world, scenario, channel):
    run, expected, effects = SCENARIOS[scenario]
    assert run(world, CHANNELS[channel]) == expected
    assert EffectRecord.objects.count() == effects
    # One decision at most per operation, whatever happened.
    assert ReviewDecision.objects.count() == len(set(ReviewDecision.objects.values_list("operation_id", flat=True)))
    unrecorded = channel in ("admin", "api") and expected == "forbidden"
    # SQLite locks the whole database for a writer: while another holds it, not even the
    # busy refusal's own row can be written (it is logged instead).
    unrecorded |= expected == "busy" and connection.vendor == "sqlite"
    if not unrecorded:
        # Every decision the service saw is in the audit log, refusals included (the admin
        # and the API refuse a user without the permission before calling the service).
        assert CommitAttempt.objects.exists()


# --- every channel shows the refusal's own message ---------------------------------------


def said_by_admin(user, case: Case, op: str, approved: bool, fault: str | None = None) -> str:
    client = _admin_client(user)
    proposal = Proposal.objects.filter(case=case).order_by("-id").first()
    assert proposal is not None
    url = reverse("admin:reviews_proposal_decide", args=[proposal.pk])
    data = {"operation_id": op, "decision": "approve" if approved else "decline"}
    service = workplace_admin.decision_record
    if fault:
        workplace_admin.decision_record = functools.partial(service, fault=fault)  # type: ignore[assignment]
    try:
        response = client.post(url, data, follow=True)
    finally:
        workplace_admin.decision_record = service  # type: ignore[assignment]
    return [html.unescape(str(m)) for m in response.context["messages"]][0]


def said_by_api(user, case: Case, op: str, approved: bool, fault: str | None = None) -> str:
    headers = {**_api_headers(user), **({"X-Decisionflow-Fault": fault} if fault else {})}
    body = json.dumps({"operation_id": op, "approved": approved})
    response = Client().post(
        f"/api/cases/{case.case_id}/decision", body, content_type="application/json", headers=headers
    )
    assert response.status_code >= 400
    return response.json()["message"]


def said_by_command(user, case: Case, op: str, approved: bool, fault: str | None = None) -> str:
    err = io.StringIO()
    argv = ["resume", case.case_id, "--operation-id", op, "--approve" if approved else "--decline"]
    argv += ["--reviewer", user.get_username()] + (["--fault", fault] if fault else [])
    with pytest.raises(CommandError):
        call_command(*argv, stdout=io.StringIO(), stderr=err)
    return err.getvalue().splitlines()[0]


# The modules each channel calls the decision service from.
SAID_BY = {"admin": (said_by_admin, "workplace.review"), "api": (said_by_api, "api.api")}
SAID_BY["command"] = (said_by_command, "workflow.management.commands.resume")
REFUSED = [name for name, (_run, expected, _effects) in SCENARIOS.items() if expected not in DECIDED_HERE]


@pytest.fixture
def raised(monkeypatch) -> list:
    """The errors ``decision_record`` raises, as each channel module sees it."""
    import importlib

    seen: list = []

    def recording(**kwargs):
        try:
            return decision_record(**kwargs)
        except Exception as exc:
            seen.append(exc)
            raise

    for _said, module in SAID_BY.values():
        monkeypatch.setattr(importlib.import_module(module), "decision_record", recording)
    return seen


@pytest.mark.parametrize("channel", sorted(SAID_BY))
@pytest.mark.parametrize("scenario", REFUSED)
def test_every_channel_shows_the_refusals_own_message(world, raised, scenario, channel):
    """A channel shows ``exc.message`` as the error class wrote it: the admin may add a link,
    the API where to look after an uncertain outcome; none rewrites it."""
    run, expected, _effects = SCENARIOS[scenario]
    if expected == "forbidden" and channel != "command":
        pytest.skip("the admin and the API refuse a user without the permission before the service")
    said, _module = SAID_BY[channel]
    shown = run(world, said)
    assert len(raised) == 1, raised
    assert shown.startswith(raised[0].message), (shown, raised[0].message)


# --- bind before running -----------------------------------------------------------------


def _decide(case, reviewer):
    return decision_record(case=case, operation_id=_op(case), approved=True, reviewer=reviewer, channel="test")


def test_a_checkpoint_of_another_case_is_refused_and_nothing_runs(case, reviewer):
    review_begin(case=case)
    from cases.services import case_import

    other = case_import(data=load_fixture("t1077.json")).case
    review_begin(case=other)
    PendingReview.objects.filter(case=case).update(checkpoint_id=PendingReview.objects.get(case=other).checkpoint_id)
    before, attempts = snapshot(), CommitAttempt.objects.count()
    with pytest.raises(WorkflowIncompatible, match="does not belong to case T-1042") as refused:
        _decide(case, reviewer)
    assert snapshot() == before
    assert CommitAttempt.objects.count() == attempts + 1
    row = CommitAttempt.objects.latest("id")
    assert (row.outcome, row.reason, row.detail) == ("refused", "checkpoint", refused.value.message)


def test_a_mid_commit_checkpoint_is_refused_even_for_its_own_case(transactional_db, reviewer, monkeypatch):
    """The seed's attack: kill a commit mid-way, point another case's pause at the checkpoint
    it left (which still carries the approval it was delivering): refused, case A untouched."""
    from asgiref.sync import async_to_sync

    case_a, case_b = _begun(), _begun("t1077.json")
    pending_a = PendingReview.objects.get(case=case_a)
    checkpoint = DatabaseCheckpointStorage().load_sync(pending_a.checkpoint_id)

    def killed(**kwargs):
        raise SystemError("killed mid-commit")

    monkeypatch.setattr(engine, "effect_commit", killed)
    storage = DatabaseCheckpointStorage()  # keeps every checkpoint the run saves, mid-commit ones too
    workflow = engine.build_workflow(answer=engine.Answer(reviewer=reviewer))
    response = {"approved": True, "reviewer_pk": reviewer.pk, "channel": "test"}

    async def run():
        return await workflow.run(
            checkpoint_id=checkpoint.checkpoint_id,
            responses={engine.review_request_id(pending_a.operation_id): response},
            checkpoint_storage=_Preloaded(checkpoint, storage),
        )

    with pytest.raises(SystemError):
        async_to_sync(run)()
    monkeypatch.undo()
    in_flight = [c for c in storage.saved if sum(len(m) for m in storage.load_sync(c).messages.values())]
    assert in_flight, "the killed run left a checkpoint with the approval in flight"
    for target, pending_case in ((case_b, case_b), (case_a, case_a)):
        PendingReview.objects.filter(case=pending_case).update(checkpoint_id=in_flight[-1])
        with pytest.raises(WorkflowIncompatible):
            _decide(target, reviewer)
    assert ReviewDecision.objects.count() == 0 and EffectRecord.objects.count() == 0


class _Preloaded(DatabaseCheckpointStorage):
    def __init__(self, checkpoint, storage):
        super().__init__()
        self._checkpoint, self._storage = checkpoint, storage

    async def load(self, checkpoint_id):
        return self._checkpoint

    async def save(self, checkpoint):
        return await self._storage.save(checkpoint)


def test_a_forged_hmac_is_refused(case, reviewer):
    """Someone who can write the table but does not hold the secret cannot make a checkpoint."""
    begun = review_begin(case=case)
    row = WorkflowCheckpoint.objects.get(checkpoint_id=begun.pending_review.checkpoint_id)
    payload = row.payload.replace('"session_id":"ws-', '"session_id":"ws-forged-')
    WorkflowCheckpoint.objects.filter(pk=row.pk).update(
        payload=payload, digest=hashlib.sha256(payload.encode()).hexdigest()
    )
    before = snapshot()
    with pytest.raises(WorkflowIncompatible, match="HMAC"):
        _decide(case, reviewer)
    assert snapshot() == before


def test_the_secret_can_be_rotated(case, reviewer, settings):
    begun = review_begin(case=case)
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "a-new-secret-" + "x" * 50
    assert (
        decision_record(
            case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer, channel="test"
        ).outcome
        == Outcome.COMMITTED
    )


def test_a_pause_signed_with_an_unknown_secret_is_refused(case, reviewer, settings):
    begun = review_begin(case=case)
    settings.SECRET_KEY = "another-deployment-" + "y" * 50
    with pytest.raises(WorkflowIncompatible, match="HMAC"):
        decision_record(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer, channel="test")


# --- one engine run, no checkpoint rows -------------------------------------------------


def test_a_resume_writes_no_checkpoint_and_a_begin_writes_one(case, reviewer):
    rows = WorkflowCheckpoint.objects.count()
    begun = review_begin(case=case)
    assert WorkflowCheckpoint.objects.count() == rows + 1 and begun.checkpoints == 1
    decided = decision_record(case=case, operation_id=begun.operation_id, approved=True, reviewer=reviewer, channel="t")
    assert decided.outcome == Outcome.COMMITTED and decided.checkpoint_id == begun.pending_review.checkpoint_id
    assert WorkflowCheckpoint.objects.count() == rows + 1


# --- the truth after a fault -------------------------------------------------------------


@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_a_lost_connection_after_the_commit_is_uncertain_then_reconciled_and_replayed(world, channel):
    case = _begun()
    op = _op(case)
    assert CHANNELS[channel](world["reviewer"], case, op, True, fault="lose-connection") == "uncertain"
    connection.close()
    row = operation_reconcile(op)
    assert row is not None and (row.state, row.effects) == ("Committed", 1)
    assert CHANNELS[channel](world["reviewer"], case, op, True) == "replay"
    assert EffectRecord.objects.filter(operation_id=op).count() == 1


def test_releasing_the_case_lock_on_a_dead_connection_does_not_raise(transactional_db):
    with case_lock("T-DEAD"):
        connection.close()  # the session (and, on PostgreSQL, its advisory lock) is gone
    with case_lock("T-DEAD", timeout=0):
        pass


# --- once, twice and concurrently ------------------------------------------------------


def test_five_concurrent_decisions_write_one_effect(world):
    case = _begun()
    op = _op(case)
    barrier = threading.Barrier(5)
    outcomes, errors = [], []

    def click():
        try:
            barrier.wait(10)
            outcomes.append(
                decision_record(
                    case=Case.objects.get(pk=case.pk),
                    operation_id=op,
                    approved=True,
                    reviewer=world["reviewer"],
                    channel="test",
                ).outcome
            )
        except Exception as exc:  # recorded: busy is an allowed answer under contention
            errors.append(type(exc).__name__)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=click) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes).count(Outcome.COMMITTED) == 1
    assert set(errors) <= {"CaseBusy"}
    assert EffectRecord.objects.filter(operation_id=op).count() == 1
