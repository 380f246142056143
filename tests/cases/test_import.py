"""load_case and load_demo: idempotent imports, and every malformed file refused untouched."""

from __future__ import annotations

import copy
import json
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from cases.models import Case, Finding, Policy, SelectedPassage, Source, SourceVersion
from tests.conftest import DEMO


def counts():
    return tuple(m.objects.count() for m in (Case, Source, SourceVersion, Policy, SelectedPassage, Finding))


def write(tmp_path, data, name="case.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def test_load_case_imports_then_is_idempotent(db, tmp_path, t1042_data, capsys):
    path = write(tmp_path, t1042_data)
    call_command("load_case", path)
    first = counts()
    assert first == (1, 2, 3, 1, 2, 2)
    call_command("load_case", path)
    assert counts() == first
    out = capsys.readouterr().out
    assert "case=T-1042 imported" in out and "case=T-1042 unchanged" in out
    case = Case.objects.get(case_id="T-1042")
    assert case.draft == t1042_data["draft"] and case.current_proposal is None


def test_crlf_draft_is_stored_canonical(db, tmp_path, t1042_data):
    t1042_data["draft"] = t1042_data["draft"].replace("\n", "\r\n")
    call_command("load_case", write(tmp_path, t1042_data))
    assert "\r" not in Case.objects.get().draft


def test_a_file_that_changes_an_existing_case_is_refused(db, tmp_path, t1042_data):
    call_command("load_case", write(tmp_path, t1042_data))
    before = counts()
    changed = dict(t1042_data, draft=t1042_data["draft"] + " Changed.")
    with pytest.raises(CommandError, match="already exists with different content"):
        call_command("load_case", write(tmp_path, changed, "changed.json"))
    assert counts() == before
    assert Case.objects.get().draft == t1042_data["draft"]


def test_a_file_that_changes_a_source_version_text_is_refused(db, tmp_path, t1042_data):
    call_command("load_case", write(tmp_path, t1042_data))
    before = counts()
    other = copy.deepcopy(t1042_data)
    other["case_id"] = "T-2000"
    other["sources"][1]["versions"][0]["text"] += " Edited."
    with pytest.raises(CommandError, match="KB-311 version 3 already exists with different text"):
        call_command("load_case", write(tmp_path, other, "other.json"))
    assert counts() == before


def _bad(mutate):
    def apply(data):
        data = copy.deepcopy(data)
        mutate(data)
        return data

    return apply


BAD_FILES = [
    ("missing-draft", _bad(lambda d: d.pop("draft")), "draft: is required but missing"),
    (
        "missing-source-text",
        _bad(lambda d: d["sources"][0]["versions"][0].pop("text")),
        "sources[0].versions[0].text: is required but missing",
    ),
    ("missing-policy-label", _bad(lambda d: d["policy"].pop("label")), "policy.label: is required"),
    (
        "selected-version-missing",
        _bad(lambda d: d["selected_evidence"][0].update(version=3)),
        "selected_evidence[0].version: HOLD-7 version 3 does not exist",
    ),
    (
        "quotation-not-in-text",
        _bad(lambda d: d["selected_evidence"][1].update(quotation="download the .zip file")),
        "selected_evidence[1].quotation: is not in the text of KB-311 version 3",
    ),
    (
        "finding-not-selected",
        _bad(lambda d: d["findings"][0].update(version=4)),
        "findings[0].source_id: cites HOLD-7 version 4, which is not among the selected evidence",
    ),
    (
        "clause-not-in-text",
        _bad(lambda d: d["findings"][1].update(licensed_clause="Roll back freely.")),
        "findings[1].licensed_clause: is not in the text",
    ),
    (
        "lone-surrogate",
        _bad(lambda d: d.update(subject="Gateway \ud800")),
        "subject: U+D800 LONE SURROGATE at position 9 is refused",
    ),
    (
        "duplicate-selection",
        _bad(lambda d: d["selected_evidence"].append(dict(d["selected_evidence"][0]))),
        "selected_evidence[2].version: HOLD-7 version 2 is selected twice",
    ),
    (
        "float-policy-value",
        _bad(lambda d: d["policy"]["parameters"].update(allowance_units=9.5)),
        "policy.parameters.allowance_units: policy value 9.5 has type float",
    ),
    (
        "string-version",
        _bad(lambda d: d["selected_evidence"][0].update(version="2")),
        "selected_evidence[0].version: must be a non-negative integer",
    ),
    ("sources-not-list", _bad(lambda d: d.update(sources={})), "sources: must be a list"),
]


@pytest.mark.parametrize("name, mutate, message", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_malformed_files_are_refused_naming_the_field(db, tmp_path, t1042_data, name, mutate, message):
    path = write(tmp_path, mutate(t1042_data))
    with pytest.raises(CommandError) as exc:
        call_command("load_case", path)
    assert message in str(exc.value)
    assert counts() == (0, 0, 0, 0, 0, 0)


def test_lone_surrogate_escape_in_raw_json_is_refused(db, tmp_path, t1042_data):
    raw = json.dumps(t1042_data).replace("Gateway reboots", "Gateway \\udc00 reboots")
    with pytest.raises(CommandError, match=re.escape("subject: U+DC00 LONE SURROGATE at position 9 is refused")):
        call_command("load_case", write(tmp_path, raw))
    assert counts() == (0, 0, 0, 0, 0, 0)


@pytest.mark.parametrize(
    "raw, message",
    [(b"\xff\xfe{}", "not valid UTF-8"), (b'{"case_id": ', "not valid JSON"), (b"[]", "must be a JSON object")],
)
def test_unreadable_files_are_refused(db, tmp_path, raw, message):
    path = tmp_path / "bad.json"
    path.write_bytes(raw)
    with pytest.raises(CommandError, match=message):
        call_command("load_case", str(path))
    assert counts() == (0, 0, 0, 0, 0, 0)


def test_a_missing_file_is_a_clear_error(db, tmp_path):
    with pytest.raises(CommandError, match="cannot read"):
        call_command("load_case", str(tmp_path / "nope.json"))


def demo_reviews():
    """The rows begin writes: proposals, pending reviews (pending ones apart) and checkpoints."""
    from reviews.models import PendingReview, Proposal, WorkflowCheckpoint

    pending = PendingReview.objects.filter(status=PendingReview.Status.PENDING).count()
    return Proposal.objects.count(), PendingReview.objects.count(), pending, WorkflowCheckpoint.objects.count()


def test_load_demo_loads_four_cases_and_three_logins_and_is_idempotent(db, capsys):
    from django.contrib.auth import get_user_model

    from workflow.queue import review_queue

    call_command("load_demo")
    first = counts(), get_user_model().objects.count(), demo_reviews()
    cases = len(list(DEMO.glob("*.json")))
    assert first[0][0] == cases >= 4
    # Each demo case's review is begun, as `manage.py begin` begins it: the queue shows them all.
    assert first[2][:3] == (cases, cases, cases) and review_queue().count() == cases
    assert all(case.current_proposal_id for case in Case.objects.all())
    call_command("load_demo")
    assert (counts(), get_user_model().objects.count(), demo_reviews()) == first
    out = capsys.readouterr().out
    assert out.count(" review begun status=PendingRequests op=op-v1-") == cases
    assert out.count(" review unchanged status=PendingRequests op=op-v1-") == cases
    assert "username=reviewer password=" in out and "username=lead password=" in out
    # Four eyes: a second reviewer approves what the first one edited.
    assert "username=reviewer2 password=" in out
    assert get_user_model().objects.get(username="reviewer2").has_perm("reviews.review_proposal")
    reviewer = get_user_model().objects.get(username="reviewer")
    lead = get_user_model().objects.get(username="lead")
    assert reviewer.has_perm("reviews.review_proposal") and reviewer.is_staff
    assert not lead.has_perm("reviews.review_proposal") and lead.has_perm("effects.view_effectrecord")


def test_load_demo_again_leaves_a_decided_demo_case_decided(db, capsys):
    from django.contrib.auth import get_user_model

    from effects.models import EffectRecord
    from workflow.decide import decision_record

    call_command("load_demo")
    case = Case.objects.get(case_id="T-1042")
    reviewer = get_user_model().objects.get(username="reviewer")
    op = case.current_proposal.operation_id
    decision_record(case=case, operation_id=op, approved=True, reviewer=reviewer, channel="test")
    before = demo_reviews()
    call_command("load_demo")
    assert demo_reviews() == before and EffectRecord.objects.count() == 1
    assert f"load_demo: case=T-1042 review unchanged status=Committed op={op}" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["load_case", "load_demo"])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        call_command(command, "--help")
    assert exc.value.code == 0
    assert "python manage.py" in capsys.readouterr().out
