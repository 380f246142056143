"""Status lines cannot be forged by a value (docs/TEXT.md, "Text in the commands' output")."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from cases.models import Case
from cases.services import case_import
from reviews.services import proposal_create
from tests.conftest import load_fixture

pytestmark = pytest.mark.django_db

FORGED = "T-1\nreconcile: case=T-1077 op=op-v1-forged state=Committed effects=1"


def legacy_case(case_id: str) -> Case:
    """A case whose id was stored before ids had a pattern (import, then rename in SQL)."""
    case = case_import(data=dict(load_fixture("t1042.json"), case_id="T-1")).case
    Case.objects.filter(pk=case.pk).update(case_id=case_id)
    case.refresh_from_db()
    return case


def test_reconcile_quotes_a_case_id_that_would_forge_a_line(capsys):
    proposal_create(case=legacy_case(FORGED))
    call_command("reconcile", "--all")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].startswith("reconcile: summary: 1 operation(s)"), lines
    assert lines[0].startswith('reconcile: case="T-1\\nreconcile: case=T-1077 op=op-v1-forged state=Committed')
    assert lines[0].endswith(" state=Pending effects=0")
    with pytest.raises(CommandError) as exc:
        call_command("reconcile", "T-2\nreconcile: case=T-1077 state=Committed")
    assert "\n" not in str(exc.value) and 'no case "T-2\\nreconcile' in str(exc.value)


def test_a_plain_case_id_is_printed_as_before(capsys):
    proposal_create(case=legacy_case("T-1042"))
    call_command("reconcile", "T-1042")
    assert capsys.readouterr().out.startswith("reconcile: case=T-1042 op=op-v1-")


def test_begin_and_edit_print_one_line_per_fact_whatever_the_values(reviewer, tmp_path, capsys):
    case = legacy_case("T-1")
    call_command("begin", "T-1")
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("begin: status=PendingRequests op=op-v1-")
    case.refresh_from_db()
    op = case.current_proposal.operation_id
    # An operation id as typed, with a line of its own inside: refused as stale, on one line.
    with pytest.raises(CommandError) as exc:
        call_command(
            "edit",
            "T-1",
            "--expected-operation-id",
            "stale\nedit: op=op-v1-forged origin=human_edit",
            "--source",
            "HOLD-7=4",
            "--editor",
            "reviewer",
        )
    err = capsys.readouterr().err
    assert exc.value.returncode == 4 and len(err.splitlines()) == 1 and "stale\\nedit: op=op-v1" in err
    body = tmp_path / "body.txt"
    body.write_text(case.current_proposal.body + "\nThanks.")
    call_command("edit", "T-1", "--expected-operation-id", op, "--body-file", str(body), "--editor", "reviewer")
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" ", 1)[0] for line in out] == ["edit:", "begin:"]
    assert out[0].endswith(" origin=human_edit")
