"""Every length and integer range of the schema, at and just over the boundary, checked by the
services before the database sees them (docs/TEXT.md, docs/CASE_FORMAT.md).

At the boundary the row really is written (on PostgreSQL a ``varchar(n)`` or ``integer``
column would refuse one more); just over it the service refuses with a clear message and
nothing is written. Run on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from cases.models import Case, Finding, Policy, SelectedPassage, Source, SourceVersion
from cases.services import VERSION_RANGE, case_import
from core.errors import InvalidInput
from core.text import CASE_ID_MAX
from reviews.models import Proposal
from reviews.services import proposal_create, proposal_revise
from tests.conftest import snapshot

pytestmark = pytest.mark.django_db

INT_MAX = VERSION_RANGE[1]


def counts():
    return tuple(m.objects.count() for m in (Case, Source, SourceVersion, Policy, SelectedPassage, Finding))


def limit(model, name):
    return model._meta.get_field(name).max_length


def rename_source(data, old, new):
    for item in data["sources"] + data["selected_evidence"] + data["findings"]:
        if item["source_id"] == old:
            item["source_id"] = new


def set_version(data, source_id, old, new):
    for source in data["sources"]:
        if source["source_id"] == source_id:
            for version in source["versions"]:
                if version["version"] == old:
                    version["version"] = new
    for item in data["selected_evidence"] + data["findings"]:
        if item["source_id"] == source_id and item["version"] == old:
            item["version"] = new


# (name, how to set a value of the given size, the schema's limit, the field named on refusal)
def _set(key):
    def apply(data, n):
        data[key] = "x" * n

    return apply


LENGTHS = [
    ("case_id", lambda d, n: d.update(case_id="T" * n), CASE_ID_MAX, "case_id"),
    ("subject", _set("subject"), limit(Case, "subject"), "subject"),
    ("action", _set("action"), limit(Case, "action"), "action"),
    ("source_id", lambda d, n: rename_source(d, "HOLD-7", "H" * n), limit(Source, "source_id"), "sources[0].source_id"),
    ("title", lambda d, n: d["sources"][0].update(title="t" * n), limit(Source, "title"), "sources[0].title"),
    ("policy name", lambda d, n: d["policy"].update(name="p" * n), limit(Policy, "name"), "policy.name"),
    ("policy label", lambda d, n: d["policy"].update(label="l" * n), limit(Policy, "label"), "policy.label"),
]


def test_the_limits_are_the_schemas():
    # The case id's pattern is stricter than its column; the action is copied into proposals.
    assert limit(Case, "case_id") >= CASE_ID_MAX
    assert limit(Case, "action") == limit(Proposal, "action")
    assert VERSION_RANGE == (0, 2**31 - 1)


@pytest.mark.parametrize("name, apply, size, field", LENGTHS, ids=[row[0] for row in LENGTHS])
def test_each_length_at_the_limit_is_stored_and_one_over_is_refused(t1042_data, name, apply, size, field):
    over = copy.deepcopy(t1042_data)
    apply(over, size + 1)
    with pytest.raises(InvalidInput, match=re.escape(f"{field}: ")) as exc:
        case_import(data=over)
    assert f"is {size + 1} characters long; at most {size} are allowed" in exc.value.message
    assert counts() == (0, 0, 0, 0, 0, 0)

    at = copy.deepcopy(t1042_data)
    apply(at, size)
    case = case_import(data=at).case
    # Written, read back intact; and the proposal built from it (the action is copied) too.
    case.refresh_from_db()
    proposal = proposal_create(case=case)
    assert Proposal.objects.get(pk=proposal.pk).action == case.action
    assert counts()[0] == 1


@pytest.mark.parametrize("version, ok", [(INT_MAX, True), (INT_MAX + 1, False), (0, True), (-1, False)])
def test_source_versions_range(t1042_data, version, ok):
    data = copy.deepcopy(t1042_data)
    set_version(data, "HOLD-7", 2, version)
    if ok:
        case = case_import(data=data).case
        assert SourceVersion.objects.filter(source__source_id="HOLD-7", version=version).count() == 1
        assert proposal_create(case=case).passages[0]["version"] == version
        return
    with pytest.raises(InvalidInput, match=re.escape(f"{version} is out of range; it must be from 0 to {INT_MAX}")):
        case_import(data=data)
    assert counts() == (0, 0, 0, 0, 0, 0)


def test_edit_limits_are_checked_before_any_query(proposal, reviewer):
    before = snapshot()
    for source_versions, message in [
        ({"HOLD-7": INT_MAX + 1}, f"{INT_MAX + 1} is out of range"),
        ({"HOLD-7": -1}, "-1 is out of range"),
        ({"H" * (limit(Source, "source_id") + 1): 2}, "is 101 characters long; at most 100"),
        ({"HOLD-7\nx": 2}, "must be one line"),
    ]:
        with pytest.raises(InvalidInput, match=re.escape(message)):
            proposal_revise(
                case=proposal.case,
                expected_operation_id=proposal.operation_id,
                source_versions=source_versions,
                editor=reviewer,
            )
    # At the limit: a clear "no such version", from the query the database could run.
    with pytest.raises(InvalidInput, match=f"HOLD-7 has no version {INT_MAX}"):
        proposal_revise(
            case=proposal.case,
            expected_operation_id=proposal.operation_id,
            source_versions={"HOLD-7": INT_MAX},
            editor=reviewer,
        )
    assert snapshot() == before


def test_over_the_limit_through_the_channels(proposal, reviewer, tmp_path, t1042_data):
    """CLI: exit 1 with one line; API: 400 invalid_request; nothing written."""
    from django.test import Client

    from api.services import token_create
    from tests.api.conftest import Api

    before = snapshot()
    with pytest.raises(CommandError) as exc:
        call_command(
            "edit",
            "T-1042",
            "--expected-operation-id",
            proposal.operation_id,
            "--source",
            f"HOLD-7={INT_MAX + 1}",
            "--editor",
            "reviewer",
        )
    assert exc.value.returncode == 1 and "out of range" in str(exc.value) and "\n" not in str(exc.value)
    api = Api(Client(), token_create(user=reviewer, name="t")[1])
    response = api.post(
        "/api/cases/T-1042/edits",
        {"expected_operation_id": proposal.operation_id, "source_versions": {"HOLD-7": INT_MAX + 1}},
    )
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"
    assert snapshot() == before

    data = dict(t1042_data, case_id="T-9", subject="s" * 501)
    path = tmp_path / "long.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CommandError) as exc:
        call_command("load_case", str(path))
    assert exc.value.returncode == 1 and "\n" not in str(exc.value)
    assert "subject: is 501 characters long; at most 500 are allowed" in str(exc.value)
    assert not Case.objects.filter(case_id="T-9").exists()


def test_a_json_number_too_long_to_read_is_a_clear_refusal(tmp_path, t1042_data):
    raw = json.dumps(t1042_data).replace('"allowance_units": 9', '"allowance_units": ' + "9" * 5000)
    path = tmp_path / "huge.json"
    path.write_text(raw)
    with pytest.raises(CommandError, match="file: not valid JSON"):
        call_command("load_case", str(path))
    assert counts() == (0, 0, 0, 0, 0, 0)
