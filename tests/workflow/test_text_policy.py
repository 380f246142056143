"""The text policy (docs/TEXT.md) through every entry point: a case file (load_case), an edit
in the admin, an edit through the API and ``manage.py edit``. Each refused code point is
refused with its name and position, and nothing is written; marked characters are kept and
reported."""

from __future__ import annotations

import copy
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from cases.models import Case, Finding, Policy, SelectedPassage, Source, SourceVersion
from effects.models import CommitAttempt
from tests.api.conftest import Api
from tests.conftest import snapshot

pytestmark = pytest.mark.django_db

# One of each refused family (bidi override and isolate, tag, NUL, C0, DEL, C1, surrogate).
REFUSED = {
    "U+202E": "\u202e",
    "U+2067": "\u2067",
    "U+E0041": "\U000e0041",
    "U+0000": "\x00",
    "U+001B": "\x1b",
    "U+007F": "\x7f",
    "U+0085": "\x85",
    "U+D800": "\ud800",
}
SURROGATE = "U+D800"
ENTRY_POINTS = ["load_case", "admin", "api", "cli"]


def import_counts():
    return tuple(m.objects.count() for m in (Case, Source, SourceVersion, Policy, SelectedPassage, Finding))


@pytest.fixture
def begun(case):
    from workflow.begin import review_begin

    review_begin(case=case, actor=None)
    case.refresh_from_db()
    return case.current_proposal


def body_with(ch: str) -> str:
    return f"Hello,\r\nwe credit you {ch}0001 EUR.\n"


def refuse_through_load_case(tmp_path, data, cp, ch):
    data = copy.deepcopy(data)
    data["draft"] = body_with(ch)
    path = tmp_path / "case.json"
    # json.dumps writes a lone surrogate as the escape "\ud800", as a file would carry it.
    path.write_text(json.dumps(data))
    with pytest.raises(CommandError) as exc:
        call_command("load_case", str(path))
    assert import_counts() == (0, 0, 0, 0, 0, 0)
    return str(exc.value)


def refuse_through_admin(proposal, reviewer, cp, ch):
    client = Client()
    client.force_login(reviewer)
    form = {
        "expected_operation_id": proposal.operation_id,
        "body": body_with(ch),
        "source_0": "2",
        "source_1": "3",
    }
    url = reverse("admin:reviews_proposal_edit", args=[proposal.pk])
    if cp == SURROGATE:
        # A form carries UTF-8: the nearest a browser can send is the surrogate's encoding,
        # which is not valid UTF-8 and arrives as U+FFFD.
        raw = f"expected_operation_id={proposal.operation_id}&source_0=2&source_1=3&body=Hi%ED%A0%80"
        response = client.post(url, raw, content_type="application/x-www-form-urlencoded")
    else:
        response = client.post(url, form)
    assert response.status_code == 200  # the form again, with its error; no redirect
    return " ".join(str(e) for e in response.context["form"].errors["body"])


def refuse_through_api(reviewer, cp, ch, proposal):
    from api.services import token_create

    api = Api(Client(), token_create(user=reviewer, name="t")[1])
    response = api.post(
        "/api/cases/T-1042/edits", {"expected_operation_id": proposal.operation_id, "body": body_with(ch)}
    )
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid_request"
    return response.json()["message"]


def refuse_through_cli(tmp_path, proposal, cp, ch):
    path = tmp_path / "body.txt"
    # A file holds UTF-8; a lone surrogate can only be there as invalid bytes.
    path.write_bytes(body_with(ch).encode("utf-8", "surrogatepass"))
    args = ["T-1042", "--expected-operation-id", proposal.operation_id, "--body-file", str(path)]
    with pytest.raises(CommandError) as exc:
        call_command("edit", *args, "--editor", "reviewer")
    assert exc.value.returncode == 1
    return str(exc.value)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("cp", REFUSED)
def test_each_refused_code_point_through_each_entry_point_writes_only_its_attempt(
    request, entry, cp, tmp_path, t1042_data, reviewer
):
    ch = REFUSED[cp]
    if entry == "load_case":
        message = refuse_through_load_case(tmp_path, t1042_data, cp, ch)
        assert f"draft: {cp} " in message and "line 2, column 15" in message, message
        return
    proposal = request.getfixturevalue("begun")
    before, attempts = snapshot(), CommitAttempt.objects.count()
    if entry == "admin":
        message = refuse_through_admin(proposal, reviewer, cp, ch)
    elif entry == "api":
        message = refuse_through_api(reviewer, cp, ch, proposal)
    else:
        message = refuse_through_cli(tmp_path, proposal, cp, ch)
    # Nothing is written but the refused edit's attempt row; a body the API's JSON or the
    # command's file cannot carry is refused by the channel before the edit service.
    recorded = 0 if cp == SURROGATE and entry != "admin" else 1
    assert snapshot() == before and CommitAttempt.objects.count() == attempts + recorded
    if recorded:
        row = CommitAttempt.objects.order_by("-id").first()
        assert (row.refused_edit, row.reason, row.outcome) == (True, "bad_input", "refused")
    assert "\n" not in message  # one line, on every channel
    if cp == SURROGATE and entry in ("admin", "cli"):
        # The transport refuses it first, as invalid UTF-8.
        assert "UTF-8" in message, message
    elif cp == SURROGATE and entry == "api":
        assert "lone surrogate" in message, message
    else:
        # After newline normalisation the CRLF is one line break: line 2, column 15.
        assert f"body: {cp} " in message and "at line 2, column 15 is refused" in message, message


@pytest.mark.parametrize(
    "where",
    ["subject", "customer_message", "quotation", "source text", "finding", "licensed clause", "policy label"],
)
def test_every_text_of_a_case_file_is_under_the_policy(tmp_path, t1042_data, where):
    data = copy.deepcopy(t1042_data)
    evil = "\u202e"
    if where in ("subject", "customer_message"):
        data[where] += evil
    elif where == "quotation":
        data["selected_evidence"][0]["quotation"] += evil
    elif where == "source text":
        data["sources"][0]["versions"][0]["text"] += evil
    elif where == "finding":
        data["findings"][0]["finding"] += evil
    elif where == "licensed clause":
        data["findings"][0]["licensed_clause"] += evil
    else:
        data["policy"]["label"] += evil
    path = tmp_path / "case.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CommandError, match="U\\+202E RIGHT-TO-LEFT OVERRIDE"):
        call_command("load_case", str(path))
    assert import_counts() == (0, 0, 0, 0, 0, 0)


def test_marked_characters_enter_through_every_channel_and_are_reported(begun, reviewer, tmp_path):
    """Kept, not refused: the API lists them as warnings, the identity hashes them."""
    from api.services import token_create
    from core import identity
    from reviews.models import Proposal

    api = Api(Client(), token_create(user=reviewer, name="t")[1])
    body = "Hello,\nwe credit you 1000\u200b EUR via p\u0430ypal.\n"
    response = api.post("/api/cases/T-1042/edits", {"expected_operation_id": begun.operation_id, "body": body})
    assert response.status_code == 201, response.content
    proposal = response.json()["proposal"]
    assert proposal["body"] == body
    assert [(w["field"], w["kind"], w["line"], w["column"]) for w in proposal["warnings"]] == [
        ("body", "invisible_character", 2, 19),
        ("body", "mixed_script_word", 2, 29),
    ]
    stored = Proposal.objects.get(operation_id=proposal["operation_id"])
    assert stored.body == body  # exactly, the marker included
    assert stored.operation_id == identity.operation_id(
        "T-1042", stored.action, body, stored.evidence_id, stored.policy_id
    )
    case = api.get("/api/cases/T-1042").json()
    assert [w["field"] for w in case["warnings"]] == ["proposal.body", "proposal.body"]
