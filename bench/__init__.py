"""Benchmarks: the cost of each guarantee, as ratios against raw baselines.

``make bench`` runs ``python -m bench.run``, which writes docs/PERFORMANCE.md. Nothing here is
a timed test: tests/bench/test_bench_smoke.py runs every benchmark once with tiny sizes only
to prove it still works.
"""
