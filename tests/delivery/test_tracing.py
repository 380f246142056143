"""One approval is one trace (docs/DEPLOY.md, "Tracing"): the API request, the decision
service, the engine run (agent-framework's own spans), the commit, the delivery's enqueue,
and, once the task worker runs the task it finds in the database, its try and its send to the
helpdesk, which receives the trace in its traceparent header. The spans name the operation and
the case, and never carry the reply's text."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone
from django_tasks import default_task_backend
from django_tasks_db.management.commands.db_worker import Worker
from django_tasks_db.models import DBTaskResult
from opentelemetry import trace

from core import tracing
from core.tracing import Attr, SpanName
from effects.models import Delivery, DeliveryState, EffectRecord
from reviews.models import PendingReview
from tests.api.conftest import Api
from tests.reliability.conftest import ROOT, child_env
from workflow.begin import review_begin

DB_TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}


def _walk_up(span, by_id) -> list:
    """The span and its ancestors, up to the root."""
    chain = [span]
    while chain[-1].parent is not None:
        chain.append(by_id[chain[-1].parent.span_id])
    return chain


def test_one_approval_is_one_trace_across_the_queue_to_the_helpdesk(
    client, case, reviewer, delivering, settings, spans, django_capture_on_commit_callbacks
):
    from api.services import token_create

    settings.TASKS = DB_TASKS
    review_begin(case=case)  # begun before: the trace below is the approval's alone
    operation_id = PendingReview.objects.get().operation_id
    spans.clear()

    api = Api(client, token_create(user=reviewer, name="tests")[1])
    # The test's transaction never commits: its commit callbacks (the enqueue) are run as it would.
    with django_capture_on_commit_callbacks(execute=True):
        answer = api.post("/api/cases/T-1042/decision", {"operation_id": operation_id, "approved": True})
    assert answer.status_code == 200 and answer.json()["outcome"] == "committed", answer.content

    # The task was enqueued into the database with the trace context in its arguments, and
    # the worker runs it as it would from another host: nothing current, only what the row says.
    task_row = DBTaskResult.objects.get()
    assert set(task_row.args_kwargs["kwargs"]) == {"trace"}
    assert trace.get_current_span() is trace.INVALID_SPAN
    worker = Worker(
        queue_names=["default"],
        interval=0,
        batch=True,
        backend_name="default",
        startup_delay=False,
        max_tasks=1,
        worker_id="worker-test",
        excluded_queue_names=[],
    )
    worker.run_task(task_row)
    task_row.refresh_from_db()
    assert task_row.return_value == "delivered", task_row.exception_class_path
    assert Delivery.objects.get().state == DeliveryState.DELIVERED

    finished = spans.get_finished_spans()
    by_id = {span.context.span_id: span for span in finished}
    (trace_id,) = {span.context.trace_id for span in finished}  # one trace, nothing else

    def named(name):
        found = [span for span in finished if span.name == name]
        assert len(found) == 1, (name, [span.name for span in finished])
        return found[0]

    (request,) = [span for span in finished if span.kind == trace.SpanKind.SERVER]
    assert request.parent is None and request.attributes["http.status_code"] == 200
    decision, commit = named(SpanName.DECISION), named(SpanName.COMMIT)
    enqueue, deliver, send = named(SpanName.ENQUEUE), named(SpanName.DELIVER), named(SpanName.SEND)
    engine = [span for span in finished if span.instrumentation_scope.name == "agent_framework"]
    assert engine and any(span.name == "workflow.run" for span in engine), [span.name for span in engine]

    # request -> decision -> the engine's spans -> commit -> enqueue, then, across the queue,
    # enqueue -> deliver -> send; every span's way up ends at the request.
    assert decision.parent.span_id == request.context.span_id
    assert {span.context.span_id for span in _walk_up(commit, by_id)} >= {
        decision.context.span_id,
        *(span.context.span_id for span in engine if span.name == "workflow.run"),
    }
    assert enqueue.parent.span_id == commit.context.span_id
    assert deliver.parent.span_id == enqueue.context.span_id and deliver.kind == trace.SpanKind.CONSUMER
    assert send.parent.span_id == deliver.context.span_id and send.kind == trace.SpanKind.CLIENT
    assert all(_walk_up(span, by_id)[-1] is request for span in finished)

    # The helpdesk received the send span's context, in the same trace.
    (received,) = delivering.stats()["traceparents_by_key"][operation_id]
    assert received[:-3] == f"00-{trace_id:032x}-{send.context.span_id:016x}"
    assert int(received[-2:], 16) & 1  # sampled

    # Ours name the operation and the case; the answers and outcomes are there.
    for span in (decision, commit, enqueue, deliver, send):
        assert span.attributes[Attr.OPERATION] == operation_id, span.name
        assert span.attributes[Attr.CASE] == "T-1042", span.name
    assert decision.attributes[Attr.OUTCOME] == "committed" and decision.attributes[Attr.CHANNEL] == "api"
    assert commit.attributes[Attr.OUTCOME] == "committed" and type(commit.attributes[Attr.OUTCOME]) is str
    assert deliver.attributes[Attr.DELIVERY] == "delivered"
    assert send.attributes[Attr.HTTP_STATUS] == 201 and send.attributes[Attr.TRY_OUTCOME] == "delivered"

    # Never the reply's text: not in an attribute, an event or a span name, of any span; nor
    # would agent-framework add message contents or error messages, whatever its environment.
    from agent_framework.observability import OBSERVABILITY_SETTINGS

    assert not OBSERVABILITY_SETTINGS.SENSITIVE_DATA_ENABLED
    body = EffectRecord.objects.get().body
    assert len(body) > 40
    pieces = {body, body[:40], body[-40:], json.dumps(body)[1:41]}
    for span in finished:
        seen = [span.name, *map(str, span.attributes.values())]
        for event in span.events:
            seen += [event.name, *map(str, event.attributes.values())]
        for link in span.links:
            seen += list(map(str, link.attributes.values()))
        assert not [text for text in seen for piece in pieces if piece in text], span.name


def test_a_refusal_is_an_error_span_by_its_code_not_its_words(client, case, reviewer, settings, spans):
    from api.services import token_create

    api = Api(client, token_create(user=reviewer, name="tests")[1])
    answer = api.post("/api/cases/T-1042/decision", {"operation_id": "op-v1-" + "0" * 64, "approved": True})
    assert answer.status_code == 404
    (decision,) = [span for span in spans.get_finished_spans() if span.name == SpanName.DECISION]
    assert decision.status.status_code == trace.StatusCode.ERROR
    assert decision.attributes[Attr.CODE] == "not_found" and decision.attributes[Attr.ERROR_TYPE] == "NotFound"
    assert decision.attributes[Attr.OUTCOME] == "refused"
    assert not decision.events  # no exception event: its message is not recorded
    assert answer.json()["message"] not in decision.status.description


def test_off_nothing_is_traced_and_the_task_carries_no_context(
    proposal, reviewer, delivering, django_capture_on_commit_callbacks
):
    from effects.services import effect_commit

    assert not tracing.tracing_start(service="decisionflow-test")  # off: DECISIONFLOW_TRACING unset
    assert tracing.carrier() is None and tracing.outbound_headers({"a": "b"}) == {"a": "b"}
    with tracing.traced(SpanName.DECISION, {Attr.OPERATION: "x"}) as span:
        span.set({Attr.OUTCOME: "y"})  # does nothing
    with django_capture_on_commit_callbacks(execute=True):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    (enqueued,) = default_task_backend.results
    assert enqueued.args == [proposal.operation_id] and enqueued.kwargs == {}
    assert delivering.stats()["traceparents_by_key"] == {}


def test_attributes_are_named_by_the_vocabulary(spans):
    not_ours = {"decisionflow.body": "text"}  # a name outside the vocabulary: refused
    with pytest.raises(TypeError, match="not a core.tracing.Attr"), tracing.traced(SpanName.DECISION, not_ours):  # type: ignore[arg-type]
        pass


@pytest.mark.django_db(transaction=True)
def test_the_worker_process_joins_the_trace_and_exports_it(proposal, reviewer, delivering, settings, spans, collector):
    """Across processes for real: the approval here, ``manage.py db_worker`` as another host,
    sending its spans over OTLP/HTTP to the collector (a stand-in), in the approval's trace."""
    from effects.services import effect_commit

    settings.TASKS = DB_TASKS
    with tracing.traced(SpanName.DECISION, {Attr.OPERATION: proposal.operation_id}):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    (enqueue,) = [span for span in spans.get_finished_spans() if span.name == SpanName.ENQUEUE]
    worker = subprocess.run(
        [sys.executable, "manage.py", "db_worker", "--batch", "--no-startup-delay"],
        cwd=ROOT,
        env=child_env(
            DECISIONFLOW_DELIVERY_URL=delivering.url,
            DECISIONFLOW_DELIVERY_TOKEN="t",
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.url,
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert worker.returncode == 0, worker.stderr[-2000:]
    assert Delivery.objects.get().state == DeliveryState.DELIVERED
    sent = {span.name: (resource, span) for resource, span in collector.spans()}
    (resource, deliver), (_, send) = sent[SpanName.DELIVER], sent[SpanName.SEND]
    assert resource["service.name"] == "decisionflow-worker" and resource["host.name"]
    assert deliver.trace_id == send.trace_id == enqueue.context.trace_id.to_bytes(16, "big")
    assert deliver.parent_span_id == enqueue.context.span_id.to_bytes(8, "big")
    assert send.parent_span_id == deliver.span_id
    (received,) = delivering.stats()["traceparents_by_key"][proposal.operation_id]
    assert received.startswith(f"00-{deliver.trace_id.hex()}-{send.span_id.hex()}-")


def test_an_approval_in_the_admin_is_one_trace_too(
    client, case, reviewer, delivering, spans, django_capture_on_commit_callbacks
):
    from django.urls import reverse

    review_begin(case=case)
    pending = PendingReview.objects.get()
    spans.clear()
    client.force_login(reviewer)
    with django_capture_on_commit_callbacks(execute=True):
        decided = client.post(
            reverse("admin:reviews_proposal_decide", args=[pending.proposal_id]),
            {"operation_id": pending.operation_id, "decision": "approve"},
        )
    assert decided.status_code == 302 and Delivery.objects.filter(operation_id=pending.operation_id).exists()
    finished = spans.get_finished_spans()
    (request,) = [span for span in finished if span.kind == trace.SpanKind.SERVER]
    (decision,) = [span for span in finished if span.name == SpanName.DECISION]
    assert request.attributes["http.route"].endswith("decide/") and decision.parent.span_id == request.context.span_id
    assert decision.attributes[Attr.CHANNEL] == "admin" and decision.attributes[Attr.OUTCOME] == "committed"
    (enqueued,) = default_task_backend.results
    assert enqueued.kwargs["trace"]["traceparent"].split("-")[1] == f"{request.context.trace_id:032x}"
    assert {span.context.trace_id for span in finished} == {request.context.trace_id}


def test_a_try_enqueued_by_the_sweep_joins_the_approvals_trace(
    proposal, reviewer, delivering, spans, django_capture_on_commit_callbacks
):
    """The approval's trace context is stored on its delivery, in the commit's transaction:
    when the enqueue after the commit is lost, the sweep's enqueue joins that trace."""
    from effects.services import effect_commit
    from effects.tasks import delivery_sweep_and_enqueue

    with (
        tracing.traced(SpanName.DECISION, {Attr.OPERATION: proposal.operation_id}),
        django_capture_on_commit_callbacks(execute=False),  # the process stops: no enqueue
    ):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert default_task_backend.results == []
    (commit,) = [span for span in spans.get_finished_spans() if span.name == SpanName.COMMIT]
    trace_id = f"{commit.context.trace_id:032x}"
    assert Delivery.objects.get().traceparent.startswith(f"00-{trace_id}-{commit.context.span_id:016x}-")

    # Later, the sweep (no span current: a worker's sweep thread) finds it due, twice in a row.
    Delivery.objects.update(next_try_at=timezone.now() - timedelta(minutes=5))
    spans.clear()
    for enqueued in (1, 0):  # the second sweep, within the grace, enqueues nothing
        with django_capture_on_commit_callbacks(execute=True):
            assert delivery_sweep_and_enqueue() == {"unknown": 0, "enqueued": enqueued}
    (task,) = default_task_backend.results
    (enqueue,) = [span for span in spans.get_finished_spans() if span.name == SpanName.ENQUEUE]
    assert enqueue.context.trace_id == commit.context.trace_id and enqueue.parent.span_id == commit.context.span_id
    assert task.kwargs["trace"]["traceparent"].startswith(f"00-{trace_id}-{enqueue.context.span_id:016x}-")


def test_a_sweep_that_does_not_trace_passes_the_stored_context_on(
    proposal, reviewer, delivering, django_capture_on_commit_callbacks
):
    """Cron's ``reconcile --repair`` imports no OpenTelemetry: the stored context travels as it is."""
    from effects.services import effect_commit
    from effects.tasks import delivery_sweep_and_enqueue

    with django_capture_on_commit_callbacks(execute=False):
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert Delivery.objects.get().traceparent is None  # tracing off: nothing stored
    stored = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    Delivery.objects.update(traceparent=stored, next_try_at=timezone.now() - timedelta(minutes=5))
    with django_capture_on_commit_callbacks(execute=True):
        assert delivery_sweep_and_enqueue()["enqueued"] == 1
    (task,) = default_task_backend.results
    assert task.kwargs == {"trace": {"traceparent": stored}}
