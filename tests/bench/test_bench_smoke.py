"""The benchmarks still run (tiny sizes, once each). Nothing here is timed or asserts speed.

`make bench` (bench/run.py) measures for real and writes docs/PERFORMANCE.md; this only
proves every benchmark's code path works on the database the suite runs on.
"""

from __future__ import annotations

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
    commit (2 workers here), resume, storage and the admin pages."""
    from django.db import connection

    if connection.vendor == "postgresql":
        from bench.bigdata import load_operations
        from bench.data import raw_connect

        with raw_connect() as conn:
            load_operations(conn, 30)
    results = run_suite(scale=SCALES["smoke"], log=lambda m: None)
    keys = [
        f"commit_{connection.vendor}",
        f"replay_{connection.vendor}",
        f"orm_{connection.vendor}",
        f"begin_{connection.vendor}",
    ]
    if connection.vendor == "postgresql":
        keys += ["identity", "identity_nonascii", "commit_concurrent", "resume_postgresql"]
    by_key = _check_measured(results, keys)
    if connection.vendor == "postgresql":
        storage = by_key["storage_postgresql"]
        assert storage["checkpoint_payload_bytes_per_paused_case"] > 0
        assert storage["per_table"]["effects_effectrecord"]["rows"] == 1
        admin = by_key["admin"]
        assert admin["cases"] >= 30 and not admin["missing"]
        assert all("error" not in p and p["queries"] > 0 for p in admin["pages"]), admin["pages"]
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
