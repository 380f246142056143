"""What tracing costs a process that does not trace: nothing imported (docs/DEPLOY.md,
"Tracing"). Off, a web process imports neither the OpenTelemetry SDK nor an instrumentation
(agent-framework brings the API alone); the cron commands import no OpenTelemetry SDK even
with the collector's endpoint in their environment (cron reads the web's env file), so cron
start stays as it was. Checked with ``python -X importtime``, as tests/workflow/test_retention.py
checks that cron imports no agent-framework."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.workflow.conftest import ROOT, child_env, manage_argv

pytestmark = pytest.mark.any_database  # what a process imports


def _imported(argv: list[str], **env: str) -> set[str]:
    """The modules ``argv`` imported (``-X importtime``), after it exited 0."""
    run = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]],
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 0, (argv, run.stderr[-2000:])
    return set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", run.stderr, re.MULTILINE))


def _sdk_or_instrumentation(modules: set[str]) -> set[str]:
    return {
        m
        for m in modules
        if m.startswith(("opentelemetry.sdk", "opentelemetry.instrumentation", "opentelemetry.exporter"))
    }


WEB = [sys.executable, "-c", "import decisionflow.wsgi"]


def test_a_web_process_imports_the_sdk_only_with_tracing_on(transactional_db, collector):
    off = _imported(WEB, DECISIONFLOW_TRACING="")
    assert "agent_framework" in off and "opentelemetry.trace" in off  # the engine's API: loaded anyway
    assert _sdk_or_instrumentation(off) == set()
    # The check can fail: on, the same start loads the SDK, the exporter and the Django
    # instrumentation, and sends what it traced (the engine's workflow build) to the endpoint.
    on = _sdk_or_instrumentation(_imported(WEB, OTEL_EXPORTER_OTLP_ENDPOINT=collector.url))
    assert {"opentelemetry.sdk.trace", "opentelemetry.instrumentation.django"} <= on
    assert any(m.startswith("opentelemetry.exporter.otlp.proto.http") for m in on)
    sent = collector.spans()
    assert sent and {resource["service.name"] for resource, _ in sent} == {"decisionflow-web"}


@pytest.mark.parametrize("argv", [("reconcile", "--all"), ("sla_report",), ("notify_sweep",)], ids=lambda argv: argv[0])
def test_cron_commands_import_no_opentelemetry_sdk_even_with_the_endpoint_set(transactional_db, collector, argv):
    modules = _imported(manage_argv(*argv), OTEL_EXPORTER_OTLP_ENDPOINT=collector.url)
    assert _sdk_or_instrumentation(modules) == set(), argv
    assert collector.received == []
    if argv[0] == "reconcile":
        # Nor the API: without the engine, nothing of OpenTelemetry at all.
        assert not {m for m in modules if m.startswith("opentelemetry")}
