"""Traces in tests: the in-memory exporter in this process (``spans``), and a stand-in for an
OpenTelemetry collector's OTLP/HTTP receiver that child processes export to (``collector``)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from core import tracing
from tests.conftest import http_server


@pytest.fixture
def spans():
    """Tracing on in this process, into memory, with the Django instrumentation; afterwards
    off again, and OpenTelemetry's global provider unset (it may be set once per process, so
    the test restores what it found: the tests of opentelemetry-python do the same)."""
    found = trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE
    trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = None, Once()
    exporter = InMemorySpanExporter()
    assert tracing.tracing_start(service="decisionflow-test", django=True, exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.tracing_stop()
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = found


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[str, bytes]] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format, *args):
        pass


class Collector:
    """What the receiver was sent: each POST's path, and the spans in them."""

    def __init__(self, url: str, received: list[tuple[str, bytes]]):
        self.url, self.received = url, received

    def spans(self) -> list[tuple[dict, object]]:
        """(resource attributes, span) for every span exported to /v1/traces."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        found = []
        for path, body in self.received:
            assert path == "/v1/traces", path
            for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    found += [(resource, span) for span in scope_spans.spans]
        return found


@pytest.fixture
def collector():
    _Receiver.received = []
    with http_server(_Receiver) as url:
        yield Collector(url, _Receiver.received)
