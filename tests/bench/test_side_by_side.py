"""The side-by-side benchmark's own parts, cheaply: no LangGraph, no timing.

`make bench` runs the peer in its own venv (.venv-peer), which CI does not build. Here: the
parsing of the peer's output on a recorded run (peer_bench_sample.txt: `langgraph_hitl.py
bench 20 --effect keyed --runs 1 --durability sync`, stdout), the report's goals table, and,
on PostgreSQL, what our side counts for one begin and one resume.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import report, side_by_side
from bench.side_by_side import PeerFailed, parse_peer_output, peer_missing_reason, writes

SAMPLE = Path(__file__).with_name("peer_bench_sample.txt")


def test_parse_peer_output_reads_its_last_line():
    out = parse_peer_output(SAMPLE.read_text())
    assert out["n"] == 20
    assert out["begin"] == {"median_ms": pytest.approx(6.5609305), "p90_ms": pytest.approx(8.3231950)}
    assert out["resume"] == {"median_ms": pytest.approx(6.6524010), "p90_ms": pytest.approx(8.0331160)}
    assert out["checkpoint_rows_per_case"] == 18.0
    assert out["durability"] == "sync"
    assert out["versions"]["langgraph"] == "1.2.24"


def test_parse_peer_output_refuses_what_it_cannot_trust():
    with pytest.raises(PeerFailed, match="not JSON"):
        parse_peer_output("[run 1/1] effect=keyed N=20\n  begin median 6 ms\n")
    with pytest.raises(PeerFailed, match="printed nothing"):
        parse_peer_output("\n")
    with pytest.raises(PeerFailed, match="lacks"):
        parse_peer_output('{"summary": {}}')
    duplicated = SAMPLE.read_text().replace('"effect_rows":20}}', '"effect_rows":21}}')
    with pytest.raises(PeerFailed, match="21 effect rows for 20 cases"):
        parse_peer_output(duplicated)


def test_a_missing_peer_venv_is_a_reason_not_a_crash(tmp_path):
    reason = peer_missing_reason(tmp_path / "bin" / "python")
    assert reason and ".venv-peer" in reason and "skipped" in reason


def test_write_statements_are_told_apart():
    assert writes('INSERT INTO "t" ("a") VALUES (%s) ON CONFLICT DO NOTHING RETURNING "id"')
    assert writes('UPDATE "t" SET "a" = %s WHERE "id" = %s')
    assert writes("WITH x AS (DELETE FROM t RETURNING id) SELECT count(*) FROM x")
    assert writes('SELECT "id" FROM "cases_case" WHERE "id" = %s LIMIT 21 FOR UPDATE')
    assert not writes('SELECT "payload" FROM "reviews_workflowcheckpoint" WHERE "id" = %s')
    assert not writes("SELECT pg_try_advisory_lock(%s)")
    assert not writes('SAVEPOINT "s1_x1"')


def _timing(key, ours, peer):
    ratios = [o / p for o, p in zip(ours, peer, strict=True)]
    return {
        "key": key,
        "title": key,
        "subject": "ours",
        "baseline": "peer",
        "kind": "cost",
        "unit": "ms",
        "goal": ("≤", 1.0),
        "n": 20,
        "subject_values": ours,
        "baseline_values": peer,
        "ratios": ratios,
        "subject_p90": [x * 1.2 for x in ours],
        "baseline_p90": [x * 1.2 for x in peer],
        "ours_only": {"median_ms": ours, "p90_ms": [x * 1.2 for x in ours]},
    }


COUNTS = {
    "key": "side_counts",
    "kind": "counts",
    "service": "decision_record",
    "n": 3,
    "begin": {
        k: {"median": v, "max": v}
        for k, v in {
            "statements": 20,
            "commits": 12,
            "durable_commits": 5,
            "autocommit_statements": 7,
            "checkpoint_rows": 3,
        }.items()
    },
    "resume": {
        k: {"median": v, "max": v}
        for k, v in {
            "statements": 11,
            "commits": 3,
            "durable_commits": 2,
            "autocommit_statements": 2,
            "checkpoint_rows": 1,
        }.items()
    },
    "goals": {"statements": 12, "durable_commits": 2, "checkpoint_rows": 1},
    "peer_checkpoint_rows_per_case": 18.0,
}


def test_the_report_lists_each_goal_with_its_verdict():
    peer_round = {"begin": {"median_ms": 6.0, "p90_ms": 7.0}, "resume": {"median_ms": 5.0, "p90_ms": 6.0}}
    results = [
        _timing("side_resume", [4.0, 4.5, 4.2], [5.0, 5.0, 5.0]),
        _timing("side_begin", [9.0, 8.0, 9.5], [6.0, 6.0, 6.0]),
        {
            "key": "side_peer",
            "kind": "peer",
            "command": "PEER_PG_DB=x .venv-peer/bin/python bench/peer/langgraph_hitl.py bench 20",
            "rounds": [peer_round] * 3,
            "versions": {"langgraph": "1.2.24"},
        },
        COUNTS,
        {
            **_timing("commit_postgresql", [150.0], [1000.0]),
            "kind": "speed",
            "unit": "ops/s",
            "goal": ("≥", 0.5),
        },
    ]
    text = report.render({"command": "test"}, results)
    goals = text.split("## Goals", 1)[1].split("## Summary", 1)[0]
    rows = [line for line in goals.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 9, rows
    assert "ours ÷ LangGraph" in rows[0] and "**0.84×**, median of 3 runs" in rows[0] and rows[0].endswith("**met** |")
    assert "**1.50×**" in rows[1] and rows[1].endswith("**missed** |")
    assert "**0.15×**" in rows[2] and "| ≥ 0.5× | **missed** |" in rows[2]  # commit, 1 connection
    assert all("not measured" in row and "| ≥ 0.5× | — |" in row for row in rows[3:5])  # 8 connections, replay
    assert "the raw floor" in rows[5] and "not measured" in rows[5] and "| ≤ 2.5× | — |" in rows[5]
    assert "**11 statements, 2 durable commits**" in rows[6] and rows[6].endswith("**met** |")
    assert rows[7].endswith("**met** |")
    assert "intake through the API" in rows[8] and "not measured" in rows[8] and "| ≥ 0.5× | — |" in rows[8]
    assert "## 11–12. Side by side with LangGraph" in text
    assert "LangGraph 18 (its three tables" in text


def test_the_report_says_when_the_peer_was_not_measured():
    resume = _timing("side_resume", [], [])
    resume["ours_only"] = {"median_ms": [30.0], "p90_ms": [33.0]}
    missing = {"key": "side_peer", "kind": "missing", "error": side_by_side.peer_missing_reason(Path("/nowhere"))}
    text = report.render({"command": "test"}, [resume, missing, {**COUNTS, "peer_checkpoint_rows_per_case": None}])
    assert "**The LangGraph peer was not measured in this run**" in text
    goals = text.split("## Goals", 1)[1].split("## Summary", 1)[0]
    assert "not measured: the LangGraph peer's virtual environment is missing" in goals
    assert "| resume + approve + commit | 30.00 ms | 33.00 ms | — |" in text


def _counted_and_logged(fn):
    """Count ``fn()`` with the bench's counter and, at the same time, Django's query log."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as log:
        counted, value = side_by_side.count_one(fn)
    sql = [q["sql"] for q in log.captured_queries]
    # count_one's own two counts of the checkpoint table, before and after the call.
    assert sql[0] == sql[-1] == 'SELECT COUNT(*) AS "__count" FROM "reviews_workflowcheckpoint"', sql
    sql = sql[1:-1]
    assert counted["statements"] == len([s for s in sql if s not in ("BEGIN", "COMMIT", "ROLLBACK")]), sql
    assert counted["commits"] - counted["autocommit_statements"] == sql.count("COMMIT"), sql
    assert counted["rollbacks"] == 0
    # The ORM's checkpoint insert, or a first begin's one write statement on PostgreSQL
    # (workflow/store.py: it also inserts the proposal and the pending review).
    begin_write = 'WITH proposal AS (INSERT INTO "reviews_proposal"'
    inserts = [s for s in counted["sql"] if s.startswith(('INSERT INTO "reviews_workflowcheckpoint"', begin_write))]
    assert counted["checkpoint_rows"] == len(inserts)
    assert 1 <= counted["durable_commits"] <= counted["commits"]
    return counted, value


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_our_side_counts_one_begin_and_one_resume():
    """The counts agree with Django's own query log and include the engine's checkpoint
    saves (they run on the caller's thread, on the same connection)."""
    from bench.data import make_cases
    from workflow.begin import review_begin

    reviewer = side_by_side.authenticated_reviewer()
    warm, case = make_cases(2, prefix="SBS", proposals=False)
    side_by_side.decide(warm, review_begin(case=warm, actor=None).operation_id, reviewer)

    counted, begun = _counted_and_logged(lambda: review_begin(case=case, actor=None))
    assert counted["checkpoint_rows"] >= 1  # the pause
    _, done = _counted_and_logged(lambda: side_by_side.decide(case, begun.operation_id, reviewer))
    assert done.outcome == "committed" and done.commit.effect_count == 1
