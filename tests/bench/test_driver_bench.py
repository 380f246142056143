"""The driver-against-asgiref benchmark still runs (tiny sizes, once) and yields its ratios.
Nothing is timed."""

from __future__ import annotations

import os

import pytest

from bench import driver as bench
from engine import checkpoints, driver, graph
from workflow import answer, begin

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_bench_measures_both_bridges_and_renders_their_ratios():
    from django.db import connection

    scale = bench.SCALES["smoke"]
    r = bench.bench_bridges(**scale, log=lambda m: None)
    assert r["vendor"] == connection.vendor
    measures = (*bench.MEASURES, *bench.CPU, "crossing")
    for bridge in bench.BRIDGES:
        for m in measures:
            assert r["values"][bridge][m]["n"] == scale["rounds"], (bridge, m)
    for m in measures:
        assert r["ratios"][m]["n"] == scale["rounds"] and r["ratios"][m]["median"] is not None
    assert all(r["values"][b][m]["median"] > 0 for b in bench.BRIDGES for m in ("run_1", "begin", "resume"))
    # The engine's own API cannot carry the ORM work: refused, and with the check off, on another connection.
    assert r["asyncio_run"]["check_on"].startswith("SynchronousOnlyOperation")
    assert r["asyncio_run"]["check_off_uses_callers_connection"] is False
    text = bench.render([r])
    assert "| measure | driver | asgiref | asgiref ÷ driver |" in text
    assert text.count("\n| ") == 1 + len(bench.LABELS)  # the header and one row per measure shown


def test_a_bridge_is_swapped_in_for_its_block_only():
    flag = os.environ.get(bench.UNSAFE)
    with bench.bridged("asgiref") as (run, call):
        assert begin.run_on_caller is run is not driver.run_on_caller
        assert answer.hosted is not driver.hosted
        assert graph.on_caller is checkpoints.on_caller is call is not driver.on_caller
    with pytest.raises(RuntimeError, match="a failing op"), bench.bridged("asyncio.run"):
        assert os.environ[bench.UNSAFE] == "1"
        raise RuntimeError("a failing op")
    assert begin.run_on_caller is driver.run_on_caller
    assert answer.hosted is driver.hosted
    assert graph.on_caller is checkpoints.on_caller is driver.on_caller
    assert os.environ.get(bench.UNSAFE) == flag
