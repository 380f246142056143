"""The benchmarks still run (tiny sizes, once each). Nothing here is timed or asserts speed.

`make bench` (bench/run.py) measures for real and writes docs/PERFORMANCE.md; this only
proves every benchmark's code path works on the database the suite runs on.
"""

from __future__ import annotations

import os

import pytest

from bench import report
from bench.inproc import SCALES, run_suite

pytestmark = pytest.mark.django_db(transaction=True)


def _check_measured(results, keys):
    by_key = {r["key"]: r for r in results}
    errors = [r for r in results if r["kind"] in ("error", "missing")]
    assert not errors, errors[0].get("error")
    for key in keys:
        r = by_key[key]
        assert len(r["ratios"]) == SCALES["smoke"]["runs"]
        assert all(x > 0 for x in r["ratios"] + r["subject_values"] + r["baseline_values"]), r
    return by_key


def test_in_process_benchmarks_run_once():
    """Commit, replay and begin on any database; on PostgreSQL also identity, 8-worker
    commit (2 workers here), resume, resume against its raw floor, storage and the admin
    pages of section 9."""
    from django.db import connection

    if connection.vendor == "postgresql":
        from bench.bigdata import load_operations, load_page_extras
        from bench.data import raw_connect

        with raw_connect() as conn:
            load_operations(conn, 30)
            load_page_extras(conn, 30)
    results = run_suite(scale=SCALES["smoke"], log=lambda m: None)
    keys = [
        f"commit_{connection.vendor}",
        f"replay_{connection.vendor}",
        f"orm_{connection.vendor}",
        f"begin_{connection.vendor}",
    ]
    if connection.vendor == "postgresql":
        keys += ["identity", "identity_nonascii", "commit_concurrent", "resume_postgresql", "resume_floor"]
    by_key = _check_measured(results, keys)
    if connection.vendor == "postgresql":
        storage = by_key["storage_postgresql"]
        assert storage["checkpoint_payload_bytes_per_paused_case"] > 0
        assert storage["per_table"]["effects_effectrecord"]["rows"] == 1
        (pages,) = run_suite(scale=SCALES["smoke"], only={"pages"}, log=lambda m: None)
        assert pages["kind"] == "pages" and pages["cases"] >= 30
        assert all("error" not in p and p["queries"] > 0 and p["times_ms"] for p in pages["pages"]), pages["pages"]
    text = report.render({"command": "smoke"}, results)
    assert "| 2. commit" in text or "| 10. commit" in text


@pytest.mark.postgres
def test_reconcile_and_process_start_run_once():
    """The reconcile command against the raw COPY of its join, and interpreter start."""
    from django.db import connection

    from bench import measures, run
    from bench.bigdata import expected_states, load_operations
    from bench.data import raw_connect

    with raw_connect() as conn:
        load_operations(conn, 200)
    s = connection.settings_dict
    url = f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    rec = run.measure_reconcile(url, 200, runs=1)
    assert rec["ratios"] and rec["rss_kib"][0] > 0
    assert expected_states(200)["NoLocalEffectRecorded"] == 2
    service = measures.bench_reconcile_service(runs=1)
    assert service["operations"] == 200
    start = run.bench_process_start(url, 1, warm=False)
    assert start["subject_values"][0] > start["baseline_values"][0] > 0


def test_the_raw_reconcile_baseline_is_the_commands_query():
    """Like for like: the raw COPY reads the rows of reconcile's own query, in its order,
    with the columns its lines are made from."""
    from bench.bigdata import RECONCILE_COLUMNS, RECONCILE_SQL
    from effects.services import _reconcile_query

    query = _reconcile_query(RECONCILE_COLUMNS, case_ids=None, operation_ids=None)
    assert query is not None
    assert " ".join(RECONCILE_SQL.split()) == " ".join(query[0].split())
    assert query[1] == []


def test_pages_report_and_partial_write(tmp_path):
    """The pages of two sizes are pooled and judged; a partial run (``--only pages``)
    replaces its own section and summary row and keeps the rest of the document."""
    from bench import run

    def res(n, ms, queries=5):
        page = {"key": "first", "label": "first page", "url": "/x/", "queries": queries}
        return {"kind": "pages", "cases": n, "pages": [{**page, "times_ms": ms, "bytes": 1}]}

    ok = run.pages_combine({10: [res(10, [10, 12])], 1000: [res(1000, [14, 15])]}, requests=2)
    (row,) = ok["pages"]
    assert row["met"] and row["same_queries"] and row["ratio"] == pytest.approx(14.5 / 11)
    slow = run.pages_combine({10: [res(10, [10])], 1000: [res(1000, [16], queries=6)]}, requests=1)
    assert not slow["pages"][0]["met"] and not slow["pages"][0]["same_queries"]
    doc = tmp_path / "PERFORMANCE.md"
    info = {"command": "make bench", "date": "today"}
    run._write_report(doc, report.render(info, [slow]) + "\n" + run.HAND_WRITTEN + "\nkept by hand\n")
    before = doc.read_text()
    assert "| 9. admin pages" in before and "**no**" in before and "## Findings and what remains" in before
    run._write_sections(doc, report.render_sections({"command": "only pages", "date": "later"}, [ok]))
    after = doc.read_text()
    assert after.count("## 9. Admin pages") == 1 and "Run: `only pages`, later" in after
    assert "1.32×" in after and "kept by hand" in after and after.count("| 9. admin pages") == 1
    assert after.split("## 9.")[0].replace("**no**", "**yes**").count("| 9.") == 1


def test_a_page_that_fails_to_render_fails_the_goal_and_says_so():
    from bench import run

    page = {"key": "first", "label": "first page", "url": "/x/", "queries": 5}
    good = {
        "kind": "pages",
        "cases": 10,
        "pages": [{**page, "times_ms": [10], "bytes": 1}, {**page, "key": "b", "times_ms": [10], "bytes": 1}],
    }
    broken = {
        "kind": "pages",
        "cases": 1000,
        "pages": [
            {**page, "times_ms": [11], "bytes": 1},
            {**page, "key": "b", "error": "ValueError: Missing staticfiles manifest entry"},
        ],
    }
    combined = run.pages_combine({10: [good], 1000: [broken]}, requests=1)
    assert [p["met"] for p in combined["pages"]] == [True, False]
    row = report.pages_summary_row(combined)
    assert "**1 not measured**" in row and row.rstrip(" |").endswith("**no**")
    nothing = run.pages_combine({10: [broken], 1000: [broken]}, requests=1)
    nothing["pages"] = [p for p in nothing["pages"] if "ratio" not in p]
    assert "**not measured**" in report.pages_summary_row(nothing)
    section = report.pages_section(combined, {"command": "make bench", "date": "today"})
    assert "Missing staticfiles manifest entry" in section and "context" not in section


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_pages_render_with_debug_off_in_the_benchmarks_own_process():
    """As ``make bench`` runs them: a process of its own with DEBUG off (the static files'
    manifest, which a fresh clone lacks, is collected by the benchmark itself)."""
    from bench import run
    from bench.bigdata import load_operations, load_page_extras
    from bench.data import raw_connect
    from tests.conftest import database_url

    with raw_connect() as conn:
        load_operations(conn, 50)
        load_page_extras(conn, 50)
        # One attempt per operation, a delivery per effect, a tenth of the cases pending.
        counts = [
            conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("effects_commitattempt", "effects_delivery", "reviews_pendingreview")
        ]
    assert counts == [50, 29, 10]
    (pages,) = run.inproc(database_url(), "smoke", only="pages", requests=1)
    assert pages["kind"] == "pages", pages
    assert [p.get("error") for p in pages["pages"]] == [None] * len(pages["pages"]), pages["pages"]


def test_a_partial_run_replaces_the_goal_rows_context_rows_and_findings_it_measured(tmp_path):
    """``--only postgres`` rewrites the commit goal, the ORM floor's "(context)" row and the
    commit's finding with the new figures, and leaves the measures it did not make alone."""
    from bench import run
    from bench.measures import add_pair, result

    def commit(ratio):
        r = result(
            "commit_postgresql",
            "2. commit: fresh approvals/s, one connection, PostgreSQL",
            subject="s",
            baseline="b",
            kind="speed",
            unit="ops/s",
            goal=("≥", 0.5),
        )
        add_pair(r, 100 * ratio, 100)
        return r

    def orm(ratio):
        r = result(
            "orm_postgresql",
            "2 (context). the Django ORM floor, PostgreSQL",
            subject="o",
            baseline="b",
            kind="speed",
            unit="ops/s",
        )
        add_pair(r, 100 * ratio, 100)
        return r

    doc = tmp_path / "PERFORMANCE.md"
    run._write_report(
        doc,
        report.render({"command": "make bench", "date": "today"}, [commit(0.3), orm(0.4)])
        + "\n"
        + run.HAND_WRITTEN
        + "\nkept by hand\n",
    )
    before = doc.read_text()
    assert "| commit, 1 connection, ÷ raw psycopg (approvals/s) | **0.30×**" in before
    assert "(no, 0.30×)" in before and "| 2 (context). the Django ORM floor" in before
    run._write_sections(doc, report.render_sections({}, [commit(0.7), orm(0.6)]))
    after = doc.read_text()
    assert "| commit, 1 connection, ÷ raw psycopg (approvals/s) | **0.70×**" in after and "**0.30×**" not in after
    assert "(yes, 0.70×)" in after and "(no, 0.30×)" not in after and "reaches 0.60× of raw" in after
    assert after.count("| 2 (context). the Django ORM floor") == 1 and "**0.60×** of the baseline" in after
    # What this run did not measure is left as it was, and so is the hand-written part.
    assert "| replay ÷ raw conflicting inserts (replays/s) | not measured" in after or (
        before.split("| replay ÷")[1].split("\n")[0] == after.split("| replay ÷")[1].split("\n")[0]
    )
    assert after.endswith("kept by hand\n")


@pytest.mark.postgres
def test_the_intake_benchmark_runs_once_through_gunicorn(tmp_path):
    """bench/intake.py on a scratch database of its own: gunicorn starts with the shipped
    config, every case comes in, and the report renders the section and the goal row."""
    import psycopg

    from bench.intake import bench_intake
    from tests.conftest import database_url

    base = database_url().rsplit("/", 1)[0]
    name = f"dfbench_intake_smoke_{os.getpid()}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        result = bench_intake(f"{base}/{name}", 4, 1)
    finally:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert result["kind"] == "intake" and all(v[0] > 0 for v in result["rates"].values()), result
    text = report.render({"command": "smoke"}, [result])
    assert "## 17. Intake" in text and "| intake through the API, 8 clients" in text


@pytest.mark.postgres
def test_the_audit_export_runs_once_and_its_section_renders():
    """20: export_audit over a few hundred attempts against the raw COPY of the same rows;
    every row in the file, the signature accepted by audit_verify."""
    from django.db import connection

    from bench import audit_export
    from bench.bigdata import load_operations
    from bench.data import raw_connect

    with raw_connect() as conn:
        load_operations(conn, 50)
        audit_export.load_attempts(conn, 300)
    s = connection.settings_dict
    url = f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    result = audit_export.measure_export(url, 300, runs=1)
    assert result["verified"] and result["ratios"][0] > 0 and result["rss_kib"][0] > 0
    text = audit_export.section([result], {"command": "test", "date": "now"})
    assert "## 20. Audit export" in text and "peak RSS" in text and "`audit_verify` accepted it" in text


def test_a_goal_whose_measure_failed_is_missed_not_a_dash():
    """A measure that ran and failed (an exception, a missing part) misses its goal in the
    table; one this run left out (a partial run) shows a dash."""
    failed = {"side_resume": {"key": "side_resume", "kind": "error", "error": "Traceback ...\nImportError: boom"}}
    rows = [line for line in report.goals_table(failed) if line.startswith("| resume + approve + commit, ours ÷ L")]
    assert rows and "not measured: ImportError: boom" in rows[0] and rows[0].endswith("**missed** (not measured) |")
    rows = [line for line in report.goals_table({}) if line.startswith("| resume + approve + commit, ours ÷ L")]
    assert rows[0].endswith("| — |")
    intake = [line for line in report.goals_table({"intake": {"kind": "error"}}) if "intake through" in line]
    assert intake[0].endswith("**missed** (not measured) |")
