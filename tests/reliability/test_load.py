"""Load, quick version: two gunicorn hosts on the test database for a few seconds.

``make reliability`` runs the same script for 60 s on its own database (see
reliability/load.py); this keeps a short run of it in ``make test`` on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.reliability.conftest import database_url, record

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

QUICK_SECONDS = os.environ.get("DECISIONFLOW_LOAD_SECONDS", "4")


def test_two_hosts_under_load_settle_with_no_duplicates(tmp_path):
    out = tmp_path / "load.json"
    env = {k: v for k, v in os.environ.items() if k != "DECISIONFLOW_FAULT_INJECTION"}
    proc = subprocess.run(
        [
            sys.executable,
            "reliability/load.py",
            "--database-url",
            database_url(),
            "--seconds",
            QUICK_SECONDS,
            "--clients",
            "4",
            "--workers",
            "1",
            "--threads",
            "4",
            "--json",
            str(out),
            "--log-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.exists(), proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert proc.returncode == 0, summary["failures"]
    assert summary["requests"] > 0 and summary["effects"] > 0
    assert summary["duplicates"] == 0 and summary["unexpected_errors"] == 0 and summary["transport_errors"] == 0
    assert summary["reconcile_states"].get("NoLocalEffectRecorded", 0) == 0
    assert summary["disagreements"] == 0
    # Every error a client saw was one of the expected 409s.
    assert summary["errors"] == sum(summary["expected_409"].values())
    record(
        "load",
        **{
            k: summary[k]
            for k in (
                "seconds",
                "elapsed_seconds",
                "clients",
                "requests",
                "errors",
                "expected_409",
                "effects",
                "duplicates",
                "reconcile_states",
                "operations_told_committed",
                "operations_told_declined",
                "requests_per_second",
                "latency_p50_ms",
                "latency_p95_ms",
            )
        },
    )
