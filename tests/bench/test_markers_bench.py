"""The markers benchmark still runs (tiny sizes, once). Nothing here is timed."""

from __future__ import annotations

from bench import measures, report


def test_markers_benchmark_runs_once_at_each_size():
    results = measures.bench_markers(runs=1, sizes=(1_000, 2_000))
    assert [r["key"] for r in results] == ["markers_1k", "markers_2k"]
    for r in results:
        assert len(r["ratios"]) == 1 and all(x > 0 for x in r["ratios"] + r["subject_values"] + r["baseline_values"])
    assert results[1]["markers"] > results[0]["markers"]
    assert "1b. text policy: markers over 2 KB" in report.render({"command": "smoke"}, results)


def test_the_adversarial_text_fits_the_api_limit_at_250_kb():
    body = measures.adversarial_text(250_000)
    assert 249_000 <= len(body.encode()) <= 256 * 1024
