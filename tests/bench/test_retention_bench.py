"""The retention and cron-start benchmarks still run (tiny sizes, once). Nothing is timed."""

from __future__ import annotations

import pytest

from bench import report
from bench.inproc import SCALES, run_suite

pytestmark = pytest.mark.django_db(transaction=True)


def test_retention_bench_prunes_the_finished_cases_only():
    from django.db import connection

    results = run_suite(scale=SCALES["smoke"], only={"retention"}, log=lambda m: None)
    assert [r["kind"] for r in results] == ["retention"], results
    r = results[0]
    assert r["vendor"] == connection.vendor and r["finished_checkpoints_left"] == 0
    assert r["deleted"] == SCALES["smoke"]["retention_n"]
    # Only the pending pauses remain: one per pending case, over all the run's cases.
    assert r["checkpoint_after"]["rows"] * (r["finished"] + r["pending"]) == pytest.approx(r["pending"])
    assert r["checkpoint_before"]["rows"] > r["checkpoint_after"]["rows"]
    assert r["before"]["data"] > r["after"]["data"] > 0
    text = report.render({"command": "smoke"}, results)
    assert "## 13. Checkpoint retention" in text and f"| {connection.vendor} |" in text


def test_cron_start_bench_runs_once():
    from bench.cron_start import bench_cron_start
    from bench.env import env_for
    from tests.conftest import database_url

    r = bench_cron_start(env_for(database_url()), runs=1)
    assert r["agent_framework_imported"] is False
    assert len(r["ratios"]) == 1 and r["subject_values"][0] > 0 and r["baseline_values"][0] > 0
    assert len(r["cpu_ratios"]) == 1 and r["cpu_ratios"][0] > 0
    text = report.render({"command": "smoke"}, [r])
    assert "14. cron start" in text and "| 14 (CPU). cron start, CPU time" in text
