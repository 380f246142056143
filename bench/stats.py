"""Medians and spreads. No Django here: the orchestrator and the report use it too."""

from __future__ import annotations

import statistics


def summary(values: list[float]) -> dict:
    """Median, min and max of several runs; spread is (max - min) / median."""
    values = [float(v) for v in values]
    if not values:
        return {"median": None, "min": None, "max": None, "spread": None, "n": 0}
    median = statistics.median(values)
    spread = (max(values) - min(values)) / median if median else None
    return {"median": median, "min": min(values), "max": max(values), "spread": spread, "n": len(values)}


def p50(values: list[float]) -> float:
    return statistics.median(values)
