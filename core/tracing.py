"""Traces across hosts: OpenTelemetry spans at the service boundaries (docs/DEPLOY.md, "Tracing").

One approval is one trace: the request (the Django instrumentation), the decision service,
the engine run (agent-framework's own spans, made with the global tracer provider set
here), the commit, the delivery's enqueue, the worker's try and its request to the
helpdesk, which receives the ``traceparent`` header. The context crosses the task queue in
the task's arguments (``carrier``, then ``traced(..., parent=...)`` in the worker).

Off (the default) nothing here imports OpenTelemetry: ``traced`` yields a span that does
nothing, ``carrier`` is None and ``outbound_headers`` adds no header. On
(``DECISIONFLOW_TRACING``, on by default when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set), the
processes that serve call ``tracing_start`` once: the web server (decisionflow/wsgi.py) and
the task worker (``manage.py db_worker``). Cron commands never do, so they import no SDK
whichever way it is set.

A span carries identifiers only, named by ``Attr``: the operation, the case, the channel,
outcomes, codes and HTTP statuses; never a draft, a reply's text, or an error's message (an
error's text may quote what it refused): an error is recorded by its class and code. A
span of ours passes its operation and case on to the spans of ours started inside it.
"""

from __future__ import annotations

import contextvars
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from enum import StrEnum
from typing import Any

from django.conf import settings


class SpanName(StrEnum):
    """The spans of ours, each named for the function it times (a grep finds it)."""

    DECISION = "decision_record"  # the decision service, whatever the channel
    COMMIT = "effect_commit"  # the review core's read, verdict and write
    ENQUEUE = "delivery_enqueue"  # the delivery task put on the queue (producer)
    DELIVER = "deliver"  # the worker's task: one try of one delivery (consumer)
    SEND = "helpdesk POST /replies"  # the worker's send (client), carrying traceparent
    LOOKUP = "helpdesk GET /replies/{operation_id}"  # the lookup after Unknown (client)


_KINDS = {
    SpanName.ENQUEUE: "PRODUCER",
    SpanName.DELIVER: "CONSUMER",
    SpanName.SEND: "CLIENT",
    SpanName.LOOKUP: "CLIENT",
}


class Attr(StrEnum):
    """Every attribute a span of ours may carry: identifiers, words and numbers only."""

    OPERATION = "decisionflow.operation_id"
    CASE = "decisionflow.case_id"  # the case's own label (T-1042), as in the events
    CHANNEL = "decisionflow.channel"
    APPROVED = "decisionflow.approved"
    OUTCOME = "decisionflow.outcome"  # the decision's or the commit's outcome word
    BEGUN = "decisionflow.begun"  # the decision began the review first
    DELIVERY = "decisionflow.delivery.result"  # what the try did (delivered, not_claimed, ...)
    TRY_OUTCOME = "decisionflow.delivery.try_outcome"  # what one request proved (DeliveryTry.Outcome)
    CODE = "decisionflow.error_code"  # the error class's code (stale_proposal, case_busy, ...)
    ERROR_TYPE = "error.type"  # the exception's class name
    HTTP_METHOD = "http.request.method"
    HTTP_STATUS = "http.response.status_code"
    SERVER = "server.address"
    PORT = "server.port"


# What a span of ours passes on to the spans of ours inside it.
_INHERITED = (Attr.OPERATION, Attr.CASE)


class Span:
    """What a traced block gets: ``set`` adds attributes. Off, it does nothing."""

    identity: Mapping[Attr, Any] = {}

    def set(self, attributes: Mapping[Attr, Any]) -> None:
        pass

    def end(self, error: BaseException | None = None) -> None:
        pass


_OFF = Span()
_TRACER: Any = None  # the SDK's tracer while tracing runs in this process; None when off
_PROVIDER: Any = None
_INSTRUMENTED_DJANGO = False
_OURS: contextvars.ContextVar[_Recording | None] = contextvars.ContextVar("decisionflow_span", default=None)


def _value(value: Any) -> Any:
    # A word of a vocabulary (a StrEnum) goes as its plain text.
    return value if isinstance(value, bool | int | float) else str(value)


def _clean(attributes: Mapping[Attr, Any]) -> dict[str, Any]:
    out = {}
    for key, value in attributes.items():
        if not isinstance(key, Attr):
            raise TypeError(f"span attribute {key!r} is not a core.tracing.Attr")
        if value is not None:
            out[key.value] = _value(value)
    return out


class _Recording(Span):
    """A span of the SDK, current (in OpenTelemetry's context and ours) until ``end``."""

    identity: dict[Attr, Any]

    def __init__(self, span: Any, identity: dict[Attr, Any], token: Any):
        self._span, self.identity, self._token = span, identity, token
        self._ours = _OURS.set(self)

    def set(self, attributes: Mapping[Attr, Any]) -> None:
        self._span.set_attributes(_clean(attributes))
        self.identity.update({key: value for key, value in attributes.items() if key in _INHERITED and value})

    def end(self, error: BaseException | None = None) -> None:
        from opentelemetry import context, trace  # noqa: PLC0415 (loaded already: the span is one of its)

        if error is not None:
            code = getattr(error, "code", None)
            self._span.set_attributes(
                _clean({Attr.ERROR_TYPE: type(error).__name__, Attr.CODE: code if isinstance(code, str) else None})
            )
            self._span.set_status(trace.Status(trace.StatusCode.ERROR, type(error).__name__))
        try:
            context.detach(self._token)
            _OURS.reset(self._ours)
        finally:
            self._span.end()


def tracing_enabled() -> bool:
    return bool(getattr(settings, "DECISIONFLOW_TRACING", False))


def span_begin(
    name: SpanName, attributes: Mapping[Attr, Any] | None = None, *, parent: Mapping[str, str] | None = None
) -> Span:
    """Start the span ``name`` as the current one, a child of the current span, or of
    ``parent`` (a ``carrier`` from another process) when given; ``end`` it in the same
    context. ``traced`` is the block form."""
    if _TRACER is None:
        return _OFF
    from opentelemetry import context, propagate, trace  # noqa: PLC0415 (loaded by tracing_start)

    outer = _OURS.get()
    identity = dict(outer.identity) if outer else {}
    identity.update({key: value for key, value in (attributes or {}).items() if key in _INHERITED and value})
    parent_context = propagate.extract(dict(parent)) if parent else None
    span = _TRACER.start_span(
        name.value,
        context=parent_context,
        kind=trace.SpanKind[_KINDS.get(name, "INTERNAL")],
        attributes=_clean({**identity, **(attributes or {})}),
    )
    token = context.attach(trace.set_span_in_context(span, parent_context))
    return _Recording(span, identity, token)


@contextmanager
def traced(
    name: SpanName, attributes: Mapping[Attr, Any] | None = None, *, parent: Mapping[str, str] | None = None
) -> Iterator[Span]:
    """The block is the span ``name`` (see ``span_begin``); an error ends it as an error,
    by its class and code."""
    if _TRACER is None:
        yield _OFF
        return
    span = span_begin(name, attributes, parent=parent)
    try:
        yield span
    except BaseException as exc:
        span.end(exc)
        raise
    span.end()


def annotate(attributes: Mapping[Attr, Any]) -> None:
    """Add attributes to the innermost span of ours (and pass the operation and case on)."""
    if _TRACER is not None and (ours := _OURS.get()) is not None:
        ours.set(attributes)


def carrier() -> dict[str, str] | None:
    """The current trace context as W3C headers (``traceparent``, ``tracestate``), for a
    task's arguments; None when tracing is off."""
    if _TRACER is None:
        return None
    from opentelemetry import propagate  # noqa: PLC0415 (loaded by tracing_start)

    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers or None


def outbound_headers(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with the current trace context added (``traceparent``): what an outbound
    request sends, so that the receiver joins the trace. Unchanged when tracing is off."""
    if _TRACER is not None:
        from opentelemetry import propagate  # noqa: PLC0415 (loaded by tracing_start)

        propagate.inject(headers)
    return headers


def tracing_start(*, service: str, django: bool = False, exporter: Any = None) -> bool:
    """Set up tracing for this process, when it is on (or ``exporter`` is given, as the
    tests do): the SDK's tracer provider, global, so that agent-framework's spans join ours;
    the OTLP exporter over HTTP (the SDK reads ``OTEL_EXPORTER_OTLP_*``, the sampler
    ``OTEL_TRACES_SAMPLER``) behind a batch processor, or ``exporter`` span by span; and, with
    ``django``, the Django instrumentation (a span per request, the incoming
    ``traceparent`` honoured), which must run before the handler loads its middleware.
    ``service`` names the process (``OTEL_SERVICE_NAME`` wins). Returns whether it is on."""
    global _TRACER, _PROVIDER, _INSTRUMENTED_DJANGO
    if _TRACER is not None:
        return True
    if exporter is None and not tracing_enabled():
        return False
    from opentelemetry import trace  # noqa: PLC0415 (only a process that traces loads the SDK)
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor  # noqa: PLC0415

    # agent-framework puts error messages and message contents on its spans only with its
    # sensitive-data switch (ENABLE_SENSITIVE_DATA): never here, whatever the environment says.
    os.environ["ENABLE_SENSITIVE_DATA"] = "false"
    if (engine_telemetry := sys.modules.get("agent_framework.observability")) is not None:
        engine_telemetry.OBSERVABILITY_SETTINGS.enable_sensitive_data = False
    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
    resource = Resource.create({**named, "host.name": socket.gethostname(), "process.pid": os.getpid()})
    provider = TracerProvider(resource=resource)
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    if django:
        from opentelemetry.instrumentation.django import DjangoInstrumentor  # noqa: PLC0415

        excluded = os.environ.get("OTEL_PYTHON_DJANGO_EXCLUDED_URLS", "healthz,readyz,metrics")
        DjangoInstrumentor().instrument(tracer_provider=provider, excluded_urls=excluded)
        _INSTRUMENTED_DJANGO = True
    _PROVIDER, _TRACER = provider, provider.get_tracer("decisionflow")
    return True


def tracing_stop() -> None:
    """Flush and stop what ``tracing_start`` set up (a worker's last spans are sent)."""
    global _TRACER, _PROVIDER, _INSTRUMENTED_DJANGO
    if _TRACER is None:
        return
    if _INSTRUMENTED_DJANGO:
        from opentelemetry.instrumentation.django import DjangoInstrumentor  # noqa: PLC0415

        DjangoInstrumentor().uninstrument()
        _INSTRUMENTED_DJANGO = False
    provider, _TRACER, _PROVIDER = _PROVIDER, None, None
    provider.shutdown()
