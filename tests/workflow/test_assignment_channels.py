"""Assignment and hand-over through the three channels (the review page, the API,
``manage.py assign``): the same act gives the same answer and the same rows in each; a move
to whom the review is already on is a replay; twice in a row and at once on PostgreSQL, one
move and one ``assigned`` notification; whom the notification goes to.

T-1077's billing-reply names "Billing reviewers"; T-1042's support-reply names no group.
"""

from __future__ import annotations

import html
import io
import json

import pytest
from django.contrib.auth.models import Group
from django.core import mail
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from api.services import token_create
from cases.models import Case
from cases.services import case_import
from reviews import notifications
from reviews.models import Notification, PendingReview, ReviewAssignment
from tests.conftest import ROOT, load_fixture, race
from workflow.assignment import away_set, move_target, pending_for_move, review_assign
from workflow.begin import review_begin
from workflow.decide import decision_record

BILLING = "Billing reviewers"


def begun(name: str = "t1077.json") -> PendingReview:
    case = case_import(data=load_fixture(name)).case
    return review_begin(case=case).pending_review


@pytest.fixture
def people(make_user, settings):
    # Notifications on: every move writes its "assigned" notification (sent by the workers).
    settings.DECISIONFLOW_NOTIFY_EMAIL_TO = ["leads@example.test"]
    made = {
        "lead": make_user("lead", group="leads"),
        "anna": make_user("anna"),
        "bo": make_user("bo"),
        "outsider": make_user("outsider", billing_reviewer=False),
    }
    for name, user in made.items():
        user.email = f"{name}@example.test"
        user.save(update_fields=["email"])
    return made


# --- the three channels, each reduced to what a person reads ---------------------------------


def _names(pending: PendingReview, to_user=None, to_group=None) -> dict:
    return {"to_user": to_user.get_username() if to_user else None, "to_group": to_group.name if to_group else None}


def via_admin(by, pending: PendingReview, *, to_user=None, to_group=None, note="", hand_over=False, op=None) -> str:
    client = Client()
    client.force_login(by)
    view = "handover" if hand_over else "assign"
    data = {"to_user": to_user.pk if to_user else "", "to_group": to_group.pk if to_group else "", "note": note}
    response = client.post(reverse(f"admin:reviews_reviewqueueitem_{view}", args=[pending.pk]), data, follow=True)
    if response.status_code == 403:
        return "forbidden"
    said = " ".join(html.unescape(str(m)) for m in response.context["messages"])
    if " is now assigned to " in said:
        return "moved"
    if " is already assigned to " in said:
        return "replay"
    if "does not have the assign permission" in said or "may not decide this review" in said:
        return "forbidden"
    return "invalid" if "nothing was written" in said else f"unclassified admin message: {said!r}"


def via_api(by, pending: PendingReview, *, to_user=None, to_group=None, note="", hand_over=False, op=None) -> str:
    token = token_create(user=by, name="assign-test")[1]
    body = {"operation_id": op or pending.operation_id, **_names(pending, to_user, to_group), "note": note}
    if hand_over:
        body.pop("to_group")
    case_id = Case.objects.get(pk=pending.case_id).case_id
    path = "hand-over" if hand_over else "assignment"
    response = Client().post(
        f"/api/cases/{case_id}/{path}",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    answer = response.json()
    if response.status_code == 200:
        assert answer["said"].startswith(case_id)
        return "replay" if answer["replay"] else "moved"
    return {400: "invalid", 403: "forbidden", 404: "not_found", 409: "stale"}.get(
        response.status_code, f"unclassified API answer: {response.status_code} {answer}"
    )


def via_command(by, pending: PendingReview, *, to_user=None, to_group=None, note="", hand_over=False, op=None) -> str:
    case_id = Case.objects.get(pk=pending.case_id).case_id
    argv = ["assign", case_id, "--operation-id", op or pending.operation_id, "--user", by.get_username()]
    argv += ["--to-user", to_user.get_username()] if to_user else ["--to-group", to_group.name]
    argv += ["--note", note] + (["--hand-over"] if hand_over else [])
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(*argv, stdout=out, stderr=err)
    except CommandError as exc:
        said = err.getvalue()
        if exc.returncode == 4:
            return "stale"
        assert exc.returncode == 1, (exc.returncode, said)
        if "does not have the assign permission" in said or "may not decide this review" in said:
            return "forbidden"
        return "invalid" if "nothing was written" in said else f"unclassified command error: {said!r}"
    line, result = out.getvalue().splitlines()
    assert line.startswith(f"assign: {case_id} op=") and result.startswith("result={")
    return "replay" if json.loads(result.removeprefix("result="))["replay"] else "moved"


CHANNELS = {"admin": via_admin, "api": via_api, "command": via_command}


def scenario_assign_to_a_person(p, act):
    return act(p["lead"], begun(), to_user=p["anna"], note="she knows the account")


def scenario_assign_to_a_group(p, act):
    return act(p["lead"], begun(), to_group=Group.objects.get(name=BILLING))


def scenario_the_same_assignment_again(p, act):
    pending = begun()
    review_assign(pending=pending, by=p["lead"], to_user=p["anna"])
    return act(p["lead"], pending, to_user=p["anna"])


def scenario_assigned_by_a_reviewer(p, act):
    return act(p["anna"], begun(), to_user=p["bo"])


def scenario_assigned_to_someone_outside_the_groups(p, act):
    return act(p["lead"], begun(), to_user=p["outsider"])


def scenario_assigned_to_a_group_that_does_not_decide_it(p, act):
    return act(p["lead"], begun(), to_group=Group.objects.get_or_create(name="Shipping reviewers")[0])


def scenario_assigned_once_decided(p, act):
    pending = begun()
    case = Case.objects.get(pk=pending.case_id)
    decision_record(case=case, operation_id=pending.operation_id, approved=False, reviewer=p["bo"], channel="test")
    return act(p["lead"], pending, to_user=p["anna"])


def scenario_a_hand_over(p, act):
    return act(p["anna"], begun(), to_user=p["bo"], note="on leave tomorrow", hand_over=True)


def scenario_a_hand_over_without_a_note(p, act):
    return act(p["anna"], begun(), to_user=p["bo"], note=" ", hand_over=True)


def scenario_a_hand_over_by_an_outsider(p, act):
    return act(p["outsider"], begun(), to_user=p["bo"], note="not mine", hand_over=True)


def scenario_a_hand_over_to_oneself(p, act):
    return act(p["anna"], begun(), to_user=p["anna"], note="me", hand_over=True)


# scenario: (setup and act, what every channel must answer, the moves in the end)
SCENARIOS = {
    "a lead assigns to a person": (scenario_assign_to_a_person, "moved", 1),
    "a lead assigns to a group": (scenario_assign_to_a_group, "moved", 1),
    "the same assignment again": (scenario_the_same_assignment_again, "replay", 1),
    "a reviewer assigns": (scenario_assigned_by_a_reviewer, "forbidden", 0),
    "to someone outside the policy's groups": (scenario_assigned_to_someone_outside_the_groups, "invalid", 0),
    "to a group that does not decide it": (scenario_assigned_to_a_group_that_does_not_decide_it, "invalid", 0),
    "a decided review": (scenario_assigned_once_decided, "invalid", 0),
    "a hand-over with a note": (scenario_a_hand_over, "moved", 1),
    "a hand-over without a note": (scenario_a_hand_over_without_a_note, "invalid", 0),
    "a hand-over by someone who may not decide it": (scenario_a_hand_over_by_an_outsider, "forbidden", 0),
    "a hand-over to oneself": (scenario_a_hand_over_to_oneself, "invalid", 0),
}


@pytest.mark.django_db
@pytest.mark.parametrize("channel", sorted(CHANNELS))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_channel_gives_the_same_answer_and_rows(people, scenario, channel):
    run, expected, moves = SCENARIOS[scenario]
    assert run(people, CHANNELS[channel]) == expected
    assert ReviewAssignment.objects.count() == moves
    # One "assigned" notification per move, written with it; none for a refusal or a replay.
    assert Notification.objects.filter(kind="assigned").count() == moves


@pytest.mark.django_db
@pytest.mark.parametrize("channel", ["api", "command"])
def test_a_stale_operation_is_refused_where_an_operation_is_named(people, channel):
    pending = begun()
    assert CHANNELS[channel](people["lead"], pending, to_user=people["anna"], op="op-v1-" + "0" * 64) == "stale"
    assert not ReviewAssignment.objects.exists()


@pytest.mark.django_db
def test_bad_input_is_a_clear_error_and_writes_nothing(people):
    pending = begun()
    token = token_create(user=people["lead"], name="bad-input")[1]
    headers = {"Authorization": f"Bearer {token}"}
    url = f"/api/cases/{pending.case.case_id}/assignment"
    for body, said in (
        ({"operation_id": pending.operation_id, "to_user": "nobody-here"}, "no user named nobody-here;"),
        ({"operation_id": pending.operation_id, "to_group": "No such group"}, 'no group named "No such group";'),
        ({"operation_id": pending.operation_id}, "name one person or one group"),
        ({"operation_id": pending.operation_id, "to_user": "anna", "to_group": BILLING}, "not both"),
        ({"operation_id": pending.operation_id, "to_user": "anna", "reviewer": "bo"}, "Extra inputs"),
        ({"operation_id": pending.operation_id, "to_user": "anna", "note": "x" * 2001}, "2000"),
    ):
        response = Client().post(url, json.dumps(body), content_type="application/json", headers=headers)
        assert response.status_code == 400 and said in response.json()["message"], (body, response.json())
    # A case that does not exist, a review never begun.
    missing = Client().post(
        "/api/cases/NOPE/assignment",
        json.dumps({"operation_id": pending.operation_id, "to_user": "anna"}),
        content_type="application/json",
        headers=headers,
    )
    assert missing.status_code == 404
    unbegun = case_import(data=load_fixture("t1042.json")).case
    with pytest.raises(Exception, match="no pending review of .* begin it first"):
        pending_for_move(case=unbegun, operation_id="op-v1-" + "1" * 64)
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command(
            "assign", pending.case.case_id, "--operation-id", pending.operation_id, "--user", "lead",
            "--hand-over", "--to-group", BILLING, "--note", "x", stdout=io.StringIO(), stderr=err,
        )  # fmt: skip
    assert "a hand-over goes to a person, not a group" in err.getvalue()
    assert not ReviewAssignment.objects.exists() and not Notification.objects.filter(kind="assigned").exists()


def test_the_command_has_help():
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("assign", "--help", stdout=out)


# --- once: twice in a row, then at once ------------------------------------------------------


@pytest.mark.django_db
def test_the_same_move_twice_in_a_row_is_one_move_and_one_notification(people):
    pending = begun()
    first = review_assign(pending=pending, by=people["lead"], to_user=people["anna"])
    again = review_assign(pending=pending, by=people["lead"], to_user=people["anna"], note="again")
    assert (first.replay, again.replay, again.row.pk) == (False, True, first.row.pk)
    assert again.said("T-1077") == "T-1077 is already assigned to anna; nothing was written."
    assert ReviewAssignment.objects.count() == 1
    assert Notification.objects.filter(kind="assigned").count() == 1
    # Elsewhere and back again: three moves, three notifications.
    review_assign(pending=pending, by=people["lead"], to_user=people["bo"])
    review_assign(pending=pending, by=people["lead"], to_user=people["anna"])
    assert ReviewAssignment.objects.count() == Notification.objects.filter(kind="assigned").count() == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_sixteen_identical_moves_at_once_make_one_move_and_one_notification(people):
    pending = begun()
    token = token_create(user=people["lead"], name="race")[1]
    body = json.dumps({"operation_id": pending.operation_id, "to_user": "anna", "note": "yours"})

    def through_the_api():
        return (
            Client()
            .post(
                f"/api/cases/{pending.case.case_id}/assignment",
                body,
                content_type="application/json",
                headers={"Authorization": f"Bearer {token}"},
            )
            .json()["replay"]
        )

    def through_the_service():
        mine = PendingReview.objects.select_related("case", "proposal").get(pk=pending.pk)
        return review_assign(pending=mine, by=people["lead"], to_user=people["anna"], note="yours").replay

    results, errors = race([through_the_api] * 8 + [through_the_service] * 8)
    assert not errors, errors
    assert sorted(results) == [False] + [True] * 15, results
    assert ReviewAssignment.objects.count() == 1
    assert Notification.objects.filter(kind="assigned").count() == 1
    assert PendingReview.objects.get(pk=pending.pk).assigned_to == people["anna"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_different_moves_at_once_are_one_move_each_and_the_last_one_stands(people):
    pending = begun()
    billing = Group.objects.get(name=BILLING)
    targets = [{"to_user": people["anna"]}, {"to_user": people["bo"]}, {"to_group": billing}] * 4

    def move(target):
        def run():
            mine = PendingReview.objects.select_related("case", "proposal").get(pk=pending.pk)
            return review_assign(pending=mine, by=people["lead"], **target).replay

        return run

    results, errors = race([move(target) for target in targets])
    assert not errors, errors
    moves = ReviewAssignment.objects.count()
    # Each call either moved it (one row, one notification) or found it already there.
    assert moves == results.count(False) and moves >= 3
    assert Notification.objects.filter(kind="assigned").count() == moves
    last = ReviewAssignment.objects.order_by("-id").first()
    now = PendingReview.objects.get(pk=pending.pk)
    assert (now.assigned_to_id, now.assigned_group.name if now.assigned_group else "") == (
        last.to_user_id,
        last.to_group,
    )


# --- the notification follows the assignee --------------------------------------------------


def _send(row: ReviewAssignment) -> mail.EmailMessage:
    notification = Notification.objects.get(assignment=row)
    mail.outbox.clear()
    assert notifications.send_notification.call(notification.pk) == "sent"
    (sent,) = mail.outbox
    return sent


def _documented_text() -> str:
    lines = (ROOT / "docs" / "QUEUE.md").read_text(encoding="utf-8").splitlines()
    (row,) = [line for line in lines if line.startswith("| `assigned` |")]
    return row.strip("|").split("|")[2].strip().strip("`")


@pytest.mark.django_db
def test_the_assignee_is_told_their_substitute_when_away_and_a_groups_members(people):
    pending = begun()
    case_id, op = pending.case.case_id, pending.operation_id
    text = _documented_text()
    sent = _send(review_assign(pending=pending, by=people["lead"], to_user=people["anna"]).row)
    assert sent.to == ["anna@example.test"]
    assert sent.body == text.format(case=case_id, to="anna", operation=op)
    assert sent.subject == f"decisionflow: case {case_id} was assigned to anna"
    assert sent.extra_headers["References"] == notifications.message_id(op, "review_begun")
    # Away: the substitute is told, and the text says for whom.
    from django.utils import timezone

    away_set(user=people["bo"], until=timezone.now() + timezone.timedelta(days=1), substitute=people["anna"])
    review_assign(pending=pending, by=people["lead"], to_group=Group.objects.get(name=BILLING))
    sent = _send(review_assign(pending=pending, by=people["lead"], to_user=people["bo"]).row)
    assert sent.to == ["anna@example.test"]
    assert sent.body == text.format(case=case_id, to="anna (for bo, who is away)", operation=op)
    # A group: its active members with an address (anna and bo are billing reviewers).
    moved = review_assign(pending=pending, by=people["lead"], to_group=Group.objects.get(name=BILLING)).row
    sent = _send(moved)
    assert sent.to == ["anna@example.test", "bo@example.test"]
    assert sent.body == text.format(case=case_id, to=f"group {BILLING}", operation=op)
    # Each move its own message: a resend of one threads with it, never with another move's.
    ids = {notifications.message_id(op, "assigned", row.pk) for row in ReviewAssignment.objects.all()}
    assert len(ids) == ReviewAssignment.objects.count() == 4


@pytest.mark.django_db
def test_an_assignee_without_an_address_falls_back_to_the_configured_list(people):
    people["anna"].email = ""
    people["anna"].save(update_fields=["email"])
    pending = begun()
    assert _send(review_assign(pending=pending, by=people["lead"], to_user=people["anna"]).row).to == [
        "leads@example.test"
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
def test_two_workers_sending_one_moves_notification_send_it_once(people):
    pending = begun()
    row = review_assign(pending=pending, by=people["lead"], to_user=people["anna"]).row
    notification = Notification.objects.get(assignment=row)
    mail.outbox.clear()
    results, errors = race([lambda: notifications.send_notification.call(notification.pk)] * 2)
    assert not errors, errors
    assert sorted(results) == ["not_claimed", "sent"] and len(mail.outbox) == 1


def test_move_target_names_one_person_or_one_group():
    from core.errors import InvalidInput

    for user, group in ((None, None), ("a", "b"), ("", "")):
        with pytest.raises(InvalidInput, match="one person or one group"):
            move_target(to_user=user, to_group=group)
