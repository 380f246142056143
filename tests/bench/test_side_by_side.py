"""The side-by-side benchmark's own parts, cheaply: no LangGraph, no DBOS, no timing.

`make bench` runs each peer in its own venv (.venv-peer, .venv-dbos), which CI does not
build. Here: the parsing of each peer's output on a recorded run (peer_bench_sample.txt:
`langgraph_hitl.py bench 20 --effect keyed --runs 1 --durability sync`, stdout;
dbos_bench_sample.txt: `dbos_hitl.py bench 20 --effect keyed --runs 1 --durability sync`,
stdout), who goes first in each round, the whole harness on PostgreSQL with stand-ins for
the peers (scripts that print those recordings), the report's goals table, and, on
PostgreSQL, what our side counts for one begin and one resume. One test runs the real DBOS
peer once, where its venv is built (`make .venv-dbos/.installed`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bench import report, side_by_side
from bench.side_by_side import DBOS, LANGGRAPH, PeerFailed, parse_peer_output, peer_missing_reason, writes

SAMPLE = Path(__file__).with_name("peer_bench_sample.txt")
DBOS_SAMPLE = Path(__file__).with_name("dbos_bench_sample.txt")


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


def test_parse_peer_output_reads_the_dbos_peers_summary():
    out = parse_peer_output(DBOS_SAMPLE.read_text())
    assert out["n"] == 20
    assert out["begin"] == {"median_ms": pytest.approx(10.576468), "p90_ms": pytest.approx(12.876606)}
    assert out["resume"] == {"median_ms": pytest.approx(6.5444285), "p90_ms": pytest.approx(7.478094)}
    assert out["checkpoint_rows_per_case"] == 9.0
    assert out["effect_rows"] == 20
    assert out["durability"] == "synchronous_commit=on"
    assert out["versions"]["dbos"] == "3.4.0"
    assert DBOS.not_durable(out) is None
    # The LangGraph peer's check reads its own --durability word, which DBOS does not print.
    assert LANGGRAPH.not_durable(out) == "durability 'synchronous_commit=on', not sync"


def test_a_dbos_run_that_did_not_commit_durably_is_refused():
    for text in (
        DBOS_SAMPLE.read_text().replace(
            '"dbos_engine_synchronous_commit":"on"', '"dbos_engine_synchronous_commit":"off"'
        ),
        DBOS_SAMPLE.read_text().replace('"synchronous_commit":"on","fsync"', '"synchronous_commit":"local","fsync"'),
    ):
        assert "not on" in DBOS.not_durable(parse_peer_output(text))
    assert DBOS.not_durable(parse_peer_output(SAMPLE.read_text())) is not None  # no settings at all


def test_a_missing_peer_venv_is_a_reason_not_a_crash(tmp_path):
    reason = peer_missing_reason(tmp_path / "bin" / "python")
    assert reason and ".venv-peer" in reason and "LangGraph" in reason and "skipped" in reason
    reason = peer_missing_reason(tmp_path / "bin" / "python", DBOS)
    assert reason and "make .venv-dbos/.installed" in reason and "DBOS" in reason and "skipped" in reason


def test_each_side_goes_first_in_turn():
    orders = [side_by_side.round_order(i) for i in range(6)]
    assert orders[:3] == [("langgraph", "dbos", "ours"), ("dbos", "ours", "langgraph"), ("ours", "langgraph", "dbos")]
    assert orders[3:] == orders[:3]
    for place in range(3):
        assert sorted(o[place] for o in orders) == sorted(side_by_side.SIDES * 2)  # each side twice in each place
    assert side_by_side.SCALES["full"]["rounds"] % len(side_by_side.SIDES) == 0


def _stand_in(tmp_path: Path, name: str, sample: Path, log: Path) -> Path:
    """A 'python' that notes which peer script it was asked to run, then prints ``sample``."""
    exe = tmp_path / f"{name}-python"
    exe.write_text(f'#!/bin/sh\necho "$(basename "$1")" >> "{log}"\ncat "{sample}"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_a_peer_round_runs_the_peers_own_command_and_checks_it(tmp_path):
    log = tmp_path / "calls"
    exe = _stand_in(tmp_path, "dbos", DBOS_SAMPLE, log)
    out = side_by_side.run_peer_round(20, python=exe, admin_url="postgres://x/postgres", db="d", peer=DBOS)
    assert out["begin"]["median_ms"] == pytest.approx(10.576468) and log.read_text() == "dbos_hitl.py\n"
    with pytest.raises(PeerFailed, match="the LangGraph peer ran with durability 'synchronous_commit=on'"):
        side_by_side.run_peer_round(20, python=exe, admin_url="postgres://x/postgres", db="d", peer=LANGGRAPH)
    failing = tmp_path / "failing-python"
    failing.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    failing.chmod(0o755)
    with pytest.raises(PeerFailed, match="the DBOS peer exited 3: boom"):
        side_by_side.run_peer_round(20, python=failing, admin_url="postgres://x/postgres", db="d", peer=DBOS)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_harness_interleaves_three_sides_and_pairs_each_round(tmp_path, monkeypatch):
    """With stand-ins for both peers: each round runs all three sides in round_order, each
    ratio pairs ours with a peer in the same round, and a peer that is missing is reported as
    not measured while the others are still measured."""
    log = tmp_path / "calls"
    lang = _stand_in(tmp_path, "langgraph", SAMPLE, log)
    dbos = _stand_in(tmp_path, "dbos", DBOS_SAMPLE, log)
    our_round = side_by_side.our_round

    def noted_round(cases, reviewer):
        with log.open("a") as fh:
            fh.write("ours\n")
        return our_round(cases, reviewer)

    monkeypatch.setattr(side_by_side, "our_round", noted_round)
    sizes = {"n": 2, "rounds": 3, "warmup": 1, "count_n": 1}
    results = side_by_side.bench_side_by_side(
        **sizes, peer_python=lang, dbos_python=dbos, peer_url="postgres://x/postgres", log=lambda m: None
    )
    by_key = {r["key"]: r for r in results}
    calls = log.read_text().split()
    names = {"langgraph_hitl.py": "langgraph", "dbos_hitl.py": "dbos", "ours": "ours"}
    assert [names[c] for c in calls] == [s for i in range(3) for s in side_by_side.round_order(i)]
    assert by_key["side_resume"]["orders"] == [list(side_by_side.round_order(i)) for i in range(3)]
    for key, peer_ms, goal in (("side_dbos_begin", 10.576468, 0.5), ("side_begin", 6.5609305, 1.0)):
        r = by_key[key]
        assert r["goal"] == ("≤", goal) and len(r["ratios"]) == 3
        assert r["baseline_values"] == [pytest.approx(peer_ms)] * 3
        assert r["ratios"] == [pytest.approx(o / peer_ms) for o in r["ours_only"]["median_ms"]]
    assert by_key["side_dbos"]["kind"] == "peer" and [x["round"] for x in by_key["side_dbos"]["rounds"]] == [1, 2, 3]
    assert by_key["side_counts"]["dbos_checkpoint_rows_per_case"] == 9.0
    assert by_key["side_counts"]["peer_checkpoint_rows_per_case"] == 18.0
    text = report.render({"command": "test"}, results)
    assert "| 1 | LangGraph, DBOS, ours |" in text and "| 2 | DBOS, ours, LangGraph |" in text

    log.unlink()
    results = side_by_side.bench_side_by_side(
        **sizes, peer_python=lang, dbos_python=tmp_path / "none", peer_url="postgres://x/postgres", log=lambda m: None
    )
    by_key = {r["key"]: r for r in results}
    assert by_key["side_dbos"]["kind"] == "missing" and not by_key["side_dbos_resume"]["ratios"]
    assert len(by_key["side_resume"]["ratios"]) == 3 and "dbos_hitl.py" not in log.read_text()
    assert "**The DBOS peer was not measured in this run**" in report.render({"command": "test"}, results)


needs_dbos_venv = pytest.mark.skipif(
    not DBOS.python.is_file(), reason="the DBOS peer's venv is not built (make .venv-dbos/.installed)"
)


@needs_dbos_venv
@pytest.mark.postgres
def test_the_real_dbos_peer_runs_once_in_its_own_venv():
    """The copied peer, in .venv-dbos, on its own database on the test server: it commits
    durably and prints the summary the harness reads."""
    db = f"decisionflow_bench_test_dbos_{os.getpid()}"
    out = side_by_side.run_peer_round(3, python=DBOS.python, admin_url=side_by_side._server_url(), db=db, peer=DBOS)
    assert out["n"] == 3 and out["effect_rows"] == 3 and out["begin"]["median_ms"] > 0
    assert out["settings"]["dbos_engine_synchronous_commit"] == "on"


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
    "dbos_checkpoint_rows_per_case": 9.0,
}


def test_the_report_lists_each_goal_with_its_verdict():
    peer_round = {"begin": {"median_ms": 6.0, "p90_ms": 7.0}, "resume": {"median_ms": 5.0, "p90_ms": 6.0}}
    dbos_round = {"begin": {"median_ms": 20.0, "p90_ms": 21.0}, "resume": {"median_ms": 10.0, "p90_ms": 11.0}}
    orders = [list(side_by_side.round_order(i)) for i in range(3)]
    results = [
        {**_timing("side_resume", [4.0, 4.5, 4.2], [5.0, 5.0, 5.0]), "orders": orders},
        _timing("side_begin", [9.0, 8.0, 9.5], [6.0, 6.0, 6.0]),
        {
            **_timing("side_dbos_resume", [4.0, 4.5, 4.2], [10.0, 10.0, 10.0]),
            "title": "18. resume + approve + commit vs DBOS",
            "goal": ("≤", 0.5),
        },
        {
            **_timing("side_dbos_begin", [9.0, 8.0, 9.5], [10.0, 10.0, 10.0]),
            "title": "19. begin vs DBOS",
            "goal": ("≤", 0.5),
        },
        {
            "key": "side_dbos",
            "kind": "peer",
            "command": "PEER_PG_DB=y .venv-dbos/bin/python bench/peer/dbos/dbos_hitl.py bench 20",
            "rounds": [{"round": i + 1, **dbos_round} for i in range(3)],
            "versions": {"dbos": "3.4.0"},
            "settings": {"synchronous_commit": "on", "dbos_engine_synchronous_commit": "on"},
        },
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
    assert len(rows) == 12, rows
    assert "ours ÷ LangGraph" in rows[0] and "**0.84×**, median of 3 runs" in rows[0] and rows[0].endswith("**met** |")
    assert "**1.50×**" in rows[1] and rows[1].endswith("**missed** |")
    assert "resume + approve + commit, ours ÷ DBOS" in rows[2] and "DBOS on its defaults, ours on ours" in rows[2]
    assert "**0.42×**, median of 3 runs (0.40–0.45" in rows[2] and "| ≤ 0.5× | **met** |" in rows[2]
    assert "begin, ours ÷ DBOS" in rows[3] and "**0.90×**" in rows[3] and "| ≤ 0.5× | **missed** |" in rows[3]
    assert "**0.15×**" in rows[4] and "| ≥ 0.5× | **missed** |" in rows[4]  # commit, 1 connection
    assert all("not measured" in row and "| ≥ 0.5× | — |" in row for row in rows[5:7])  # 8 connections, replay
    assert "the raw floor" in rows[7] and "not measured" in rows[7] and "| ≤ 2.5× | — |" in rows[7]
    assert "**11 statements, 2 durable commits**" in rows[8] and rows[8].endswith("**met** |")
    assert rows[9].endswith("**met** |")
    assert "intake through the API" in rows[10] and "not measured" in rows[10] and "| ≥ 0.5× | — |" in rows[10]
    assert "audit export of 1M attempts" in rows[11] and "not measured" in rows[11] and "| ≥ 0.5× | — |" in rows[11]
    assert "## 11–12, 18–19. Side by side with LangGraph and with DBOS" in text
    assert "**DBOS runs on its defaults**" in text and "**and we run on ours**" in text
    assert (
        "| resume + approve + commit | 4.20 ms | 5.04 ms | DBOS | 10.00 ms | 12.00 ms | **0.42×** (0.40–0.45) | ≤ 0.5× |"
        in text
    )
    assert "LangGraph 18 (its three tables" in text and "DBOS 9 (its five tables" in text
    assert "| 1 | LangGraph, DBOS, ours | 9.00 / 10.80 | 6.00 / 7.00 | 20.00 / 21.00 |" in text
    summary = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "| 18. resume + approve + commit vs DBOS" in summary and "| 19. begin vs DBOS" in summary


def test_the_report_says_when_the_peer_was_not_measured():
    resume = _timing("side_resume", [], [])
    resume["ours_only"] = {"median_ms": [30.0], "p90_ms": [33.0]}
    missing = {"key": "side_peer", "kind": "missing", "error": side_by_side.peer_missing_reason(Path("/nowhere"))}
    dbos_missing = {
        "key": "side_dbos",
        "kind": "missing",
        "error": side_by_side.peer_missing_reason(Path("/nowhere"), side_by_side.DBOS),
    }
    counts = {**COUNTS, "peer_checkpoint_rows_per_case": None, "dbos_checkpoint_rows_per_case": None}
    text = report.render({"command": "test"}, [resume, missing, dbos_missing, counts])
    assert "**The LangGraph peer was not measured in this run**" in text
    assert "**The DBOS peer was not measured in this run**" in text
    goals = text.split("## Goals", 1)[1].split("## Summary", 1)[0]
    assert "not measured: the LangGraph peer's virtual environment is missing" in goals
    dbos_rows = [line for line in goals.splitlines() if "ours ÷ DBOS" in line]
    assert len(dbos_rows) == 2 and all(
        "not measured: the DBOS peer's virtual environment is missing" in row
        and row.endswith("| ≤ 0.5× | **missed** (not measured) |")
        for row in dbos_rows
    ), dbos_rows
    assert "| resume + approve + commit | 30.00 ms | 33.00 ms | LangGraph | — |" in text
    assert "LangGraph not measured in this run; DBOS not measured in this run" in text


def test_a_partial_run_replaces_the_side_section_and_adds_the_new_goal_rows(tmp_path):
    """``--only side`` on a document from before the DBOS peer: the old section (numbered
    11–12, without markers) is replaced in place, and the DBOS goal rows join the goals table."""
    from bench import run

    old = (
        "# Performance\n\n## Goals\n\n| goal | measured | target | met? |\n|---|---|---|---|\n"
        "| begin, ours ÷ LangGraph (median ms per call) | old | ≤ 1× | **met** |\n"
        "| intake through the API | kept | ≥ 0.5× | **met** |\n\n## Summary\n\n"
        "## 11–12. Side by side with LangGraph (PostgreSQL)\n\nold text\n\n## Storage per case (PostgreSQL)\n\nkept\n"
        f"\n{run.HAND_WRITTEN}\n\nby hand\n"
    )
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text(old)
    ours = [2.0, 2.2, 2.1]
    results = [
        {**_timing("side_resume", ours, [5.0] * 3), "orders": [list(side_by_side.round_order(i)) for i in range(3)]},
        _timing("side_begin", ours, [6.0] * 3),
        {**_timing("side_dbos_resume", ours, [8.0] * 3), "goal": ("≤", 0.5)},
        {**_timing("side_dbos_begin", ours, [10.0] * 3), "goal": ("≤", 0.5)},
        COUNTS,
    ]
    info = {"command": "only side", "date": "today", "part_s": {"side": 200}}
    run._write_sections(doc, report.render_sections(info, results))
    new = doc.read_text()
    assert "Run: `only side`, today; this part took 3.3 min of wall time." in new
    assert "old text" not in new and new.count("Side by side with LangGraph") == 1
    assert "## 11–12, 18–19. Side by side with LangGraph and with DBOS" in new
    assert "kept\n" in new and "by hand" in new and "| intake through the API | kept |" in new
    goals = new.split("## Goals", 1)[1].split("## Summary", 1)[0]
    assert "| begin, ours ÷ LangGraph (median ms per call) | **0.35×**" in goals
    assert "| resume + approve + commit, ours ÷ DBOS" in goals and "| begin, ours ÷ DBOS" in goals
    run._write_sections(doc, report.render_sections(info, results))  # again: no duplicates
    assert doc.read_text() == new


def test_the_run_reports_each_parts_wall_time():
    assert report.wall_time_line(1830, {"side": 95, "pages": 900, "sqlite": 40}) == (
        "wall time 30.5 min in all; by part: pages 15.0 min, side 1.6 min, sqlite 40 s"
    )
    text = report.render({"command": "make bench", "duration_s": 600, "part_s": {"postgres": 300, "side": 100}}, [])
    assert "- Wall time: wall time 10.0 min in all; by part: postgres 5.0 min, side 1.7 min" in text
    goals = text.split("## Goals", 1)[1].split("## Summary", 1)[0]
    assert (
        "| `make bench` wall time, every part (2 cores) | **10.0 min** (postgres 5.0 min, side 1.7 min) | ≤ 30 min "
        "| **met** |"
    ) in goals
    text = report.render({"command": "make bench", "duration_s": 1801, "part_s": {"pages": 1700}}, [])
    assert "| **30.0 min** (pages 28.3 min) | ≤ 30 min | **missed** |" in text


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
