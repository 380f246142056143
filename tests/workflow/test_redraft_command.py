"""`manage.py redraft`: the re-draft service from the command line, with edit's exit codes."""

from __future__ import annotations

import json

import pytest

from reviews.models import Origin, PendingReview, Proposal
from tests.conftest import load_fixture, snapshot
from tests.reliability.conftest import command
from workflow.decide import decision_record

DRAFT = "Hello,\n\nA shorter draft from the pipeline.\n\nSupport"


@pytest.fixture
def begun(db):
    from cases.services import case_import
    from workflow.begin import review_begin

    case = case_import(data=load_fixture()).case
    review_begin(case=case)
    case.refresh_from_db()
    return case


@pytest.fixture
def redraft_file(tmp_path):
    def write(**fields) -> str:
        path = tmp_path / "redraft.json"
        path.write_text(json.dumps({"draft": DRAFT, **fields}))
        return str(path)

    return write


def run(case, op, path, *extra):
    return command("redraft", case.case_id, "--expected-operation-id", op, "--file", path, *extra)


def test_a_redraft_prints_its_operation_and_begins_its_review(begun, make_user, redraft_file):
    make_user("pipeline", group="pipeline")
    old = begun.current_proposal.operation_id
    code, out, err = run(begun, old, redraft_file(), "--user", "pipeline")
    assert code == 0, err
    new = Proposal.objects.get(origin=Origin.PIPELINE_REDRAFT)
    lines = out.splitlines()
    assert lines[0] == f"redraft: op={new.operation_id} origin=pipeline_redraft"
    assert lines[1].startswith(f"begin: status=PendingRequests op={new.operation_id} checkpoints=")
    assert PendingReview.objects.get(operation_id=old).status == PendingReview.Status.SUPERSEDED
    # Again: the current proposal is already the re-draft.
    code, out, _ = run(begun, old, redraft_file(), "--user", "pipeline")
    assert (code, out.strip()) == (0, f"redraft: op={new.operation_id} unchanged")


def test_no_begin_saves_without_beginning(begun, make_user, redraft_file):
    make_user("pipeline", group="pipeline")
    code, out, err = run(begun, begun.current_proposal.operation_id, redraft_file(), "--user", "pipeline", "--no-begin")
    assert code == 0, err
    assert len(out.splitlines()) == 1 and "origin=pipeline_redraft" in out


def test_refusals_exit_with_their_codes_and_write_nothing(begun, make_user, reviewer, redraft_file):
    make_user("pipeline", group="pipeline")
    op = begun.current_proposal.operation_id
    before = snapshot()
    # A reviewer is not the pipeline.
    code, _, err = run(begun, op, redraft_file(), "--user", "reviewer")
    assert code == 1 and "intake permission" in err
    code, _, err = run(begun, "op-v1-" + "2" * 64, redraft_file(), "--user", "pipeline")
    assert code == 4 and "stale" in err
    code, _, err = run(begun, op, redraft_file(operation_id="op-v1-" + "0" * 64), "--user", "pipeline")
    assert code == 1 and "operation_id: you computed" in err
    code, _, err = run(begun, op, redraft_file(reviewer="x"), "--user", "pipeline")
    assert code == 1 and "not a field of a re-draft" in err
    assert snapshot() == before
    decision_record(case=begun, operation_id=op, approved=False, reviewer=reviewer, channel="test")
    before = snapshot()
    code, _, err = run(begun, op, redraft_file(), "--user", "pipeline")
    assert code == 4 and "was declined by reviewer and cannot be re-drafted" in err
    assert snapshot() == before
