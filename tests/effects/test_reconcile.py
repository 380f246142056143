"""Reconciliation classifies from the effect store; repair completes missing effects once."""

from __future__ import annotations

import pytest

from effects.models import EffectRecord
from effects.services import effect_commit, effects_repair, operation_reconcile, operations_reconcile
from reviews.models import ReviewDecision
from reviews.services import proposal_create, proposal_revise
from tests.conftest import load_fixture


@pytest.fixture
def four_cases(db, reviewer):
    """One case in each state; the NoLocalEffectRecorded one built directly, as after an import."""
    from cases.services import case_import

    ops = {}
    for name, state in [
        ("t1042.json", "Pending"),
        ("t1077.json", "Committed"),
        ("t1103.json", "Declined"),
        ("t1150.json", "NoLocalEffectRecorded"),
    ]:
        case = case_import(data=load_fixture(name)).case
        proposal = proposal_create(case=case)
        ops[state] = proposal.operation_id
        if state == "Committed":
            effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
        elif state == "Declined":
            effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=reviewer)
        elif state == "NoLocalEffectRecorded":
            ReviewDecision.objects.create(
                operation_id=proposal.operation_id, proposal=proposal, approved=True, reviewer=reviewer
            )
    return ops


def test_each_state_is_classified(four_cases):
    rows = {row.operation_id: row for row in operations_reconcile()}
    assert {op: (rows[op].state, rows[op].effects) for op in four_cases.values()} == {
        four_cases["Pending"]: ("Pending", 0),
        four_cases["Committed"]: ("Committed", 1),
        four_cases["Declined"]: ("Declined", 0),
        four_cases["NoLocalEffectRecorded"]: ("NoLocalEffectRecorded", 0),
    }
    assert len(rows) == 4
    assert {state: operation_reconcile(op).state for state, op in four_cases.items()} == {s: s for s in four_cases}


def test_filters_by_case_and_operation(four_cases):
    assert [r.case_id for r in operations_reconcile(case_ids=["T-1077"])] == ["T-1077"]
    assert [r.state for r in operations_reconcile(operation_ids=[four_cases["Declined"]])] == ["Declined"]
    assert list(operations_reconcile(case_ids=["T-9999"])) == []
    assert list(operations_reconcile(case_ids=[])) == []
    assert operation_reconcile("op-v1-" + "0" * 64) is None


def test_a_superseded_undecided_proposal_is_not_reported(case, reviewer):
    old = proposal_create(case=case)
    new = proposal_revise(case=case, expected_operation_id=old.operation_id, body="Edited.", editor=reviewer).proposal
    assert [(r.operation_id, r.state) for r in operations_reconcile()] == [(new.operation_id, "Pending")]


def test_reconcile_is_one_query_whatever_the_size(four_cases):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        rows = list(operations_reconcile())
    assert len(rows) == 4
    assert sum("SELECT" in q["sql"] for q in captured.captured_queries) == 1


def test_repair_writes_the_missing_effect_and_is_a_no_op_twice(four_cases):
    missing = four_cases["NoLocalEffectRecorded"]
    dry = effects_repair(rows=operations_reconcile(), dry_run=True)
    assert [r.operation_id for r in dry] == [missing]
    assert not EffectRecord.objects.filter(operation_id=missing).exists()

    repaired = effects_repair(rows=operations_reconcile(), dry_run=False)
    assert [r.operation_id for r in repaired] == [missing]
    assert operation_reconcile(missing).state == "Committed"
    total = EffectRecord.objects.count()
    assert effects_repair(rows=operations_reconcile(), dry_run=False) == []
    assert EffectRecord.objects.count() == total == 2

    # Repairing from stale rows (a second cron run that read before the first wrote) is a no-op too.
    from effects.services import ReconcileRow

    stale_row = ReconcileRow("T-1150", missing, "NoLocalEffectRecorded", 0)
    effects_repair(rows=[stale_row], dry_run=False)
    assert EffectRecord.objects.filter(operation_id=missing).count() == 1


def test_reconcile_json_lines_match_json_dumps_for_awkward_case_ids(db, reviewer, capsys):
    """The command formats JSON lines by hand for speed; they must be exactly json.dumps."""
    import json

    from django.core.management import call_command

    from cases.models import Case
    from cases.services import case_import

    ids = ['T-"quoted"', "T-ünï\\code", "T-tab\there", "T-1042"]
    for n, case_id in enumerate(ids):
        case = case_import(data=dict(load_fixture("t1042.json"), case_id=f"T-{n}")).case
        # Case ids now follow a pattern (docs/TEXT.md); rows stored before it may not.
        Case.objects.filter(pk=case.pk).update(case_id=case_id)
        case.refresh_from_db()
        proposal_create(case=case)
    call_command("reconcile", "--all", "--json")
    *lines, summary = capsys.readouterr().out.splitlines()
    expected = [json.dumps(row.as_dict(), ensure_ascii=False, separators=(",", ":")) for row in operations_reconcile()]
    assert lines == expected and len(lines) == 4
    # --all ends with one summary object, told apart by its "summary" key.
    assert json.loads(summary)["summary"] == "reconcile" and json.loads(summary)["operations"] == 4
    assert {json.loads(line)["case"] for line in lines} == set(ids)


def test_the_database_made_json_lines_match_json_dumps_for_every_state_and_delivery(four_cases, reviewer, capsys):
    """reconcile --json prints lines the database builds (COPY on PostgreSQL); each must be
    exactly json.dumps of the row, for every state, a delivery with or without a reference,
    and values COPY or JSON escape (quotes, backslashes, controls, non-ASCII)."""
    import json

    from django.core.management import CommandError, call_command
    from django.utils import timezone

    from cases.models import Case
    from effects.models import Delivery, DeliveryState
    from effects.services import operations_reconcile_lines
    from tests.delivery_rows import delivery_in

    committed = EffectRecord.objects.get(operation_id=four_cases["Committed"])
    delivery = delivery_in(committed, DeliveryState.SENDING)
    Case.objects.filter(pk=committed.case_id).update(case_id='T-"q"\\ \\\\ \t\n\x01ü€')
    # A delivery without a reference yet, and the filters, through the service itself.
    (line,) = b"".join(operations_reconcile_lines(operation_ids=[four_cases["Committed"]])).decode().splitlines()
    (row,) = operations_reconcile(operation_ids=[four_cases["Committed"]])
    assert line == json.dumps(row.as_dict(), ensure_ascii=False, separators=(",", ":"))
    assert json.loads(line)["delivery_reference"] is None and json.loads(line)["delivery"] == "Sending"
    assert list(operations_reconcile_lines(case_ids=[])) == []
    Delivery.objects.filter(pk=delivery.pk).update(
        state=DeliveryState.DELIVERED, reference='HD-"7"\\n\\x01 ü', settled_at=timezone.now()
    )
    # Exit 1: one operation is NoLocalEffectRecorded (not repaired without --repair).
    with pytest.raises(CommandError, match="1 operation"):
        call_command("reconcile", "--all", "--json")
    *lines, summary = capsys.readouterr().out.splitlines()
    expected = [json.dumps(row.as_dict(), ensure_ascii=False, separators=(",", ":")) for row in operations_reconcile()]
    assert lines == expected and len(lines) == 4
    assert {json.loads(line)["state"] for line in lines} == set(four_cases)
    assert json.loads(summary)["states"] == dict.fromkeys(sorted(four_cases), 1)
    assert json.loads(summary)["deliveries"] == {DeliveryState.DELIVERED.label: 1}
    assert 'HD-"7"\\n\\x01 ü' in {json.loads(line).get("delivery_reference") for line in lines}
