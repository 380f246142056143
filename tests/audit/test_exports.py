"""The exports: the columns, formula neutralisation, the two writers writing the same bytes,
the filters, the command with its signature, and audit_verify catching an edited export."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from audit import exports, formats
from audit.formats import FORMULA_START, csv_line, neutralised
from cases.models import Case
from core import signing
from core.errors import DecisionflowError
from effects.models import CommitAttempt, Delivery
from reviews.models import DeclineReason
from tests.conftest import Terminal, command_run, load_fixture
from workflow.begin import review_begin
from workflow.decide import decision_record

ROOT = Path(__file__).resolve().parents[2]
FORMULAS = ['=HYPERLINK("http://x")', "+1+1", "-2+3", "@SUM(A1)", "\tcmd", "\rcmd"]


@pytest.fixture
def story(transactional_db, reviewer, make_user, settings):
    """T-1042 begun, one refusal (a stale operation), then approved, with a delivery; T-1077
    declined by another reviewer; and attempts whose texts a spreadsheet would run."""
    from cases.services import case_import

    settings.DECISIONFLOW_DELIVERY_URL = "http://127.0.0.1:9"
    other = make_user("other")
    case = case_import(data=load_fixture("t1042.json")).case
    review_begin(case=case)
    case.refresh_from_db()
    with pytest.raises(DecisionflowError):
        decision_record(case=case, operation_id="op-v1-" + "0" * 64, approved=True, reviewer=reviewer, channel="admin")
    decision_record(
        case=case, operation_id=case.current_proposal.operation_id, approved=True, reviewer=reviewer, channel="admin"
    )
    second = case_import(data=load_fixture("t1077.json")).case
    review_begin(case=second)
    second.refresh_from_db()
    decision_record(
        case=second,
        operation_id=second.current_proposal.operation_id,
        approved=False,
        reviewer=other,
        channel="api",
        decline_reason=DeclineReason.values[0],
        decline_note="not this one",
    )
    for text in FORMULAS:
        CommitAttempt.objects.create(
            operation_id=text, outcome=CommitAttempt.Outcome.REFUSED, channel="api", detail=f'{text}, "quoted"\nnext'
        )
    return {"case": case, "second": second, "reviewer": reviewer, "other": other}


def run(tmp_path, *args, name="out.csv") -> tuple[int, str, str, Path]:
    path = tmp_path / name
    code, out, err = command_run("export_audit", *args, "--output", str(path))
    return code, out, err, path


def records(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_formula_neutralisation_covers_owasps_list():
    for text in FORMULAS:
        assert neutralised(text) == "'" + text
    for text in ("a=b", "1-2", "plain", "", "'already"):
        assert neutralised(text) == text
    assert set(FORMULA_START) == {"=", "+", "-", "@", "\t", "\r"}


def test_a_csv_line_quotes_what_would_break_a_record():
    line = csv_line(["a,b", 'say "hi"', "two\nlines", "lone\rcr", "plain", ""])
    assert line == '"a,b","say ""hi""","two\nlines","lone\rcr",plain,\n'
    assert next(csv.reader(io.StringIO(line, newline=""))) == ["a,b", 'say "hi"', "two\nlines", "lone\rcr", "plain", ""]


def test_every_column_is_documented_in_audit_md():
    doc = (ROOT / "docs" / "AUDIT.md").read_text()
    for export in exports.EXPORTS.values():
        section = doc.split(f"### `{export.name}`", 1)
        assert len(section) == 2, f"docs/AUDIT.md has no section ### `{export.name}`"
        table = section[1].split("\n### ", 1)[0]
        assert re.findall(r"^\| `([a-z_]+)` \|", table, re.M) == export.header, export.name


def test_attempts_csv_neutralises_every_formula_and_reads_back(story, tmp_path):
    code, out, err, path = run(tmp_path, "attempts")
    assert code == 0, err
    rows = records(path)
    assert len(rows) == 3 + len(FORMULAS)  # the refusal, the approval, the decline, the planted ones
    planted = rows[-len(FORMULAS) :]
    assert [r["operation_id"] for r in planted] == ["'" + t for t in FORMULAS]
    assert all(r["detail"].startswith("'") and r["detail"].endswith('"quoted"\nnext') for r in planted)
    for row in rows:
        for value in row.values():
            assert value[:1] not in FORMULA_START or value == "", value
    refused, committed = rows[0], rows[1]
    assert (refused["outcome"], refused["reviewer"], refused["approved"], refused["case_id"]) == (
        "refused",
        "reviewer",
        "true",
        "T-1042",
    )
    assert refused["reason"] and refused["detail"]
    assert (committed["outcome"], committed["channel"]) == ("committed", "admin")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", committed["attempted_at"])
    assert re.fullmatch(
        rf"export_audit: kind=attempts format=csv rows={len(rows)} bytes={path.stat().st_size} file={path} "
        rf"sig={path}.sig key=[0-9a-f]{{16}} in \d+\.\d s \(.* rows/s\)\n",
        out,
    ), out


def test_cases_export_has_the_current_state(story, tmp_path):
    code, _, err, path = run(tmp_path, "cases")
    assert code == 0, err
    rows = {r["case_id"]: r for r in records(path)}
    assert rows["T-1042"]["state"] == "committed" and rows["T-1042"]["approved"] == "true"
    assert rows["T-1042"]["reviewer"] == "reviewer"
    assert rows["T-1077"]["state"] == "declined" and rows["T-1077"]["approved"] == "false"
    assert rows["T-1077"]["policy"] and rows["T-1077"]["current_operation_id"].startswith("op-v1-")


def test_the_filters(story, tmp_path):
    def ids(*args):
        code, _, err, path = run(tmp_path, *args, "--force")
        assert code == 0, err
        return [r["case_id"] for r in records(path)]

    assert ids("cases", "--state", "declined") == ["T-1077"]
    assert ids("cases", "--reviewer", "other") == ["T-1077"]
    assert ids("cases", "--reviewer", "reviewer") == ["T-1042"]
    policy = Case.objects.get(case_id="T-1042").policy.name
    same = sorted(Case.objects.filter(policy__name=policy).values_list("case_id", flat=True))
    assert "T-1042" in same and ids("cases", "--policy", policy) == same
    assert ids("cases", "--until", "2000-01-01") == []
    assert ids("cases", "--since", "2000-01-01") == ["T-1042", "T-1077"]
    assert ids("attempts", "--reviewer", "other") == ["T-1077"]
    assert ids("attempts", "--state", "committed") == ["T-1042"]
    assert ids("deliveries") == ["T-1042"]
    assert ids("deliveries", "--state", "delivered") == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["cases", "--state", "bogus"], "--state 'bogus' is not a state of cases with their current state"),
        (["cases", "--since", "yesterday"], "--since: 'yesterday' is not a date"),
        (["cases", "--since", "2026-12-05", "--until", "2026-12-01"], "is not before --until"),
        (["cases", "--reviewer", "nobody"], "no user named 'nobody'"),
        (["cases", "--policy", "nothing"], "no policy named 'nothing'"),
        (["cases", "--case", "T-1042"], "--case applies to the history export only"),
        (["history"], "the history export needs --case CASE_ID"),
        (["history", "--case", "T-9"], "no case 'T-9'"),
        (["history", "--case", "T-1042", "--state", "committed"], "--state does not apply to the history export"),
    ],
)
def test_bad_filters_are_refused_and_write_nothing(story, tmp_path, args, message):
    code, out, err, path = run(tmp_path, *args)
    assert code == 1 and message in err, err
    assert list(tmp_path.iterdir()) == []


def test_the_history_has_every_kind_of_event(story, tmp_path):
    code, _, err, path = run(tmp_path, "history", "--case", "T-1042")
    assert code == 0, err
    rows = records(path)
    events = [r["event"] for r in rows]
    for kind in ("proposal", "review_begun", "attempt", "decision", "effect", "delivery"):
        assert kind in events, events
    assert events.index("proposal") < events.index("decision") < events.index("delivery")
    refusal = next(r for r in rows if r["event"] == "attempt" and r["outcome"] != "committed")
    assert refusal["reason"] and refusal["detail"] and refusal["actor"] == "reviewer"
    assert [r["at"] for r in rows] == sorted(r["at"] for r in rows)
    assert next(r for r in rows if r["event"] == "decision")["actor"] == "reviewer"
    declined = run(tmp_path, "history", "--case", "T-1077", name="t1043.csv")
    decision = next(r for r in records(declined[3]) if r["event"] == "decision")
    assert (decision["outcome"], decision["reason"], decision["detail"]) == (
        "declined",
        DeclineReason.values[0],
        "not this one",
    )


def test_json_lines_one_object_per_row_with_the_columns(story, tmp_path):
    code, _, err, path = run(tmp_path, "attempts", "--format", "jsonl", name="a.jsonl")
    assert code == 0, err
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    objects = [json.loads(line) for line in lines[:-1]]
    assert [list(o) for o in objects] == [exports.EXPORTS["attempts"].header] * len(objects)
    assert objects[1]["approved"] is True and isinstance(objects[1]["id"], int)
    assert objects[-1]["operation_id"] == "\rcmd"  # JSON is not a spreadsheet: kept as it is
    call_command("audit_verify", str(path), stdout=io.StringIO())


def test_the_export_verifies_and_every_edit_is_caught(story, tmp_path):
    code, _, err, path = run(tmp_path, "attempts")
    assert code == 0, err
    public = tmp_path / "public.pem"
    public.write_bytes(signing.public_key_pem())
    code, out, err = command_run("audit_verify", str(path), "--public-key", str(public))
    assert code == 0 and out.startswith(f"audit_verify: ok file={path} bytes="), err
    original = path.read_bytes()

    def refused(data: bytes, *extra) -> str:
        path.write_bytes(data)
        code, out, err = command_run("audit_verify", str(path), "--public-key", str(public), *extra)
        path.write_bytes(original)
        assert code == 12, (code, out, err)
        return err

    assert "same size: bytes were changed" in refused(original.replace(b"committed", b"declined!"))
    assert "were signed" in refused(original + b"99,forged\n")
    assert "were signed" in refused(original[: original.rindex(b"\n", 0, -1) + 1])
    sig = Path(str(path) + ".sig")
    good_sig = sig.read_bytes()
    sig.write_bytes(good_sig.replace(b"sha256=", b"sha256=0", 1)[: -0 or None])
    code, _, err = command_run("audit_verify", str(path), "--public-key", str(public))
    assert code == 1 and "is not a decisionflow export signature" in err
    line, b64 = good_sig.split(b"\n")[:2]
    forged = line.replace(b"bytes=", b"bytes=1", 1)
    sig.write_bytes(forged + b"\n" + b64 + b"\n")
    code, _, err = command_run("audit_verify", str(path), "--public-key", str(public))
    assert code == 12 and "does not verify with this public key" in err
    sig.write_bytes(good_sig)
    other = tmp_path / "other.pem"
    other.write_bytes(signing.public_key_pem(signing.generate_key()))
    code, _, err = command_run("audit_verify", str(path), "--public-key", str(other))
    assert code == 12 and "was signed by key" in err


def test_no_signing_key_writes_nothing(story, tmp_path, settings):
    settings.DECISIONFLOW_AUDIT_SIGNING_KEY = ""
    settings.DECISIONFLOW_AUDIT_SIGNING_KEY_FILE = ""
    settings.DECISIONFLOW_AUDIT_DEV_KEY_FILE = None
    code, _, err, _ = run(tmp_path, "cases")
    assert code == 78 and "no audit signing key" in err
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_is_kept_unless_forced(story, tmp_path):
    (tmp_path / "out.csv").write_text("mine")
    code, _, err, path = run(tmp_path, "cases")
    assert code == 1 and "exists (give --force to replace it)" in err
    assert path.read_text() == "mine"
    code, _, err, path = run(tmp_path, "cases", "--force")
    assert code == 0 and path.read_text().startswith("case_id,")


def test_a_terminal_gets_a_bar_and_cron_one_line(story, tmp_path):
    terminal = Terminal()
    code, _, _ = command_run("export_audit", "attempts", "--output", str(tmp_path / "t.csv"), stdout=terminal)
    assert code == 0
    shown = terminal.getvalue()
    assert "export attempts" in shown and "rows/s" in shown and "export_audit: kind=attempts" in shown


@pytest.mark.skipif(connection.vendor != "postgresql", reason="COPY is PostgreSQL's")
@pytest.mark.parametrize("name", ["cases", "attempts", "deliveries", "proposals", "decisions"])
def test_copy_writes_the_same_bytes_as_the_python_writer(story, name):
    export = exports.EXPORTS[name]
    rows = export.rows(exports.Filters(), None)
    assert rows.exists()
    python = b"".join(exports.python_chunks(export, rows, formats.Format.CSV, lambda n: None))
    from audit.store import copy_csv_chunks

    copied = b"".join(copy_csv_chunks(export.columns, rows, lambda n: None))
    assert copied == python


def test_nothing_is_read_before_the_first_chunk_is_asked(story, django_assert_num_queries):
    chunks = exports.export_chunks(exports.EXPORTS["attempts"], exports.Filters(), formats.Format.CSV)
    with django_assert_num_queries(0):
        header = next(chunks)
    assert (
        header
        == b"id,attempted_at,case_id,operation_id,channel,reviewer,approved,outcome,reason,detail,decline_reason,decline_note\n"
    )
    assert b"".join(chunks).count(b"committed") == 1


def test_help():
    from audit.management.commands.export_audit import Command

    assert Command.help.startswith("Run by a support lead or from cron")
    assert Delivery  # the deliveries export reads this model


def test_the_demo_cases_history_reads_back_with_nothing_to_run_and_verifies(transactional_db, tmp_path):
    """The issue's goal as a support lead meets it: the demo (manage.py load_demo), its case's
    history exported as CSV, read back as a spreadsheet would (every cell), no cell that a
    spreadsheet would run as a formula, and audit_verify accepts the file with the public key."""
    code, _, err = command_run("load_demo")
    assert code == 0, err
    case = Case.objects.order_by("pk").first()
    code, _, err, path = run(tmp_path, "history", "--case", case.case_id)
    assert code == 0, err
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert len(rows) > 2  # the header, and the case's events
    cells = [cell for row in rows for cell in row]
    assert not [cell for cell in cells if cell[:1] in FORMULA_START], "a cell a spreadsheet would run"
    public = tmp_path / "public.pem"
    public.write_bytes(signing.public_key_pem())
    code, out, err = command_run("audit_verify", str(path), "--public-key", str(public))
    assert code == 0 and out.startswith("audit_verify: ok"), err
