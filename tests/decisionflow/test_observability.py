"""Domain metrics and the decision event log, for every outcome of the one decision service.

Each scenario of tests/workflow/test_decision_service.py runs once through ``decision_record``
under its own channel label. The metrics are read the way /metrics reads them (the
multiprocess folder the test settings set up) and must move by exactly one, on the right
outcome; the event log must hold exactly one JSON line for that call, with its fields, and no
draft text.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import subprocess
import uuid

import pytest
from django.core.management import CommandError, call_command

from core.errors import DecisionflowError
from core.locks import reconcile_lock
from core.observability import OUTCOMES, JsonFormatter
from tests.conftest import held_elsewhere
from tests.workflow.test_decision_service import SCENARIOS, world  # noqa: F401 - the fixture
from workflow.decide import decision_record

# What each scenario's label (as the channels name it) must count as, and the refusal code.
EXPECTED = {
    "committed": ("committed", None),
    "declined": ("declined", None),
    "replay": ("replay", None),
    "awaiting_approval": ("awaiting_approval", None),
    "four_eyes": ("refused", "four_eyes"),
    "conflict": ("conflict", "conflicting_decision"),
    "stale": ("stale", "stale_proposal"),
    "not_found": ("refused", "not_found"),
    "forbidden": ("refused", "forbidden"),
    "not_in_group": ("refused", "not_in_group"),
    "not_assignee": ("refused", "not_assignee"),
    "incompatible": ("refused", "workflow_incompatible"),
    "busy": ("refused", "case_busy"),
    "uncertain": ("outcome_uncertain", "outcome_uncertain"),
}


def metrics() -> dict[tuple[str, frozenset], float]:
    """Every sample, summed over every process file, as /metrics would show it."""
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name.startswith("decisionflow_")
    }


def delta(before: dict, after: dict, name: str, **labels) -> float:
    """The change of every sample called ``name`` whose labels include ``labels``."""

    def total(values):
        return sum(v for (n, ls), v in values.items() if n == name and set(labels.items()) <= ls)

    return total(after) - total(before)


class Lines(logging.Handler):
    """The decision events exactly as the configured handler writes them (JsonFormatter)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(self.format(record))


@pytest.fixture
def event_lines():
    handler = Lines()
    logger = logging.getLogger("decisionflow.events")
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_each_outcome_moves_its_metrics_by_one_and_logs_one_line(world, event_lines, scenario):  # noqa: F811
    run, label, _effects = SCENARIOS[scenario]
    outcome, code = EXPECTED[label]
    channel = f"m-{uuid.uuid4().hex[:8]}"  # this call's own label: setup decisions use others
    measured: dict = {}

    def decide(user, case, operation_id, approved, fault=None):
        measured.update(before=metrics(), case=case, user=user, operation_id=operation_id)
        with contextlib.suppress(DecisionflowError):
            decision_record(
                case=case, operation_id=operation_id, approved=approved, reviewer=user, channel=channel, fault=fault
            )
        measured["after"] = metrics()
        return label

    run(world, decide)
    before, after = measured["before"], measured["after"]

    # Exactly one decision, on the right outcome, under this channel.
    assert delta(before, after, "decisionflow_decisions_total", channel=channel) == 1
    assert delta(before, after, "decisionflow_decisions_total", channel=channel, outcome=outcome) == 1
    assert delta(before, after, "decisionflow_decision_seconds_count", outcome=outcome) == 1
    assert outcome in OUTCOMES
    refusals = delta(before, after, "decisionflow_decision_refusals_total")
    assert refusals == (1 if code else 0)
    if code:
        assert delta(before, after, "decisionflow_decision_refusals_total", code=code) == 1
    assert delta(before, after, "decisionflow_checkpoint_loads_refused_total") == (1 if label == "incompatible" else 0)
    assert delta(before, after, "decisionflow_busy_refusals_total") == (1 if label == "busy" else 0)
    if label in ("committed", "declined", "replay", "conflict"):
        # The commit ran once and was timed under the same outcome.
        assert delta(before, after, "decisionflow_commit_seconds_count", outcome=outcome) == 1

    # Exactly one JSON event line for this call, with its fields and nothing of the draft.
    mine = [json.loads(line) for line in event_lines if f'"channel":"{channel}"' in line]
    assert len(mine) == 1, event_lines
    event = mine[0]
    case = measured["case"]
    assert event["event"] == "decision" and event["logger"] == "decisionflow.events" and event["level"] == "info"
    assert event["case_id"] == case.case_id
    assert event["operation_id"] == measured["operation_id"]
    assert event["actor"] == measured["user"].get_username()
    assert event["outcome"] == outcome and event["code"] == code
    assert isinstance(event["duration_ms"], float) and event["duration_ms"] > 0
    assert event["ts"].endswith("+00:00")
    line = next(line for line in event_lines if f'"channel":"{channel}"' in line)
    case.refresh_from_db()
    for proposal in case.proposals.all():
        assert proposal.body[:40] not in line  # no draft text


def run_reconcile(*args) -> int:
    try:
        call_command("reconcile", *args, stdout=io.StringIO(), stderr=io.StringIO())
    except CommandError as exc:
        return exc.returncode
    return 0


def test_reconcile_runs_and_operations_by_state(world):  # noqa: F811
    from tests.workflow.test_decision_service import _begun, _op

    reviewer = world["reviewer"]
    committed, pending = _begun(), _begun("t1077.json")
    decision_record(case=committed, operation_id=_op(committed), approved=True, reviewer=reviewer, channel="t")

    before = metrics()
    assert run_reconcile("--all") == 0
    middle = metrics()
    assert delta(before, middle, "decisionflow_reconcile_runs_total", result="ok") == 1
    assert delta(before, middle, "decisionflow_reconcile_operations_total", state="Committed") == 1
    assert delta(before, middle, "decisionflow_reconcile_operations_total", state="Pending") == 1
    assert delta(before, middle, "decisionflow_lock_wait_seconds_count", lock="reconcile") == 1
    last = {dict(ls)["state"]: v for (n, ls), v in middle.items() if n == "decisionflow_reconcile_last_operations"}
    assert last == {"Pending": 1, "AwaitingApproval": 0, "Committed": 1, "Declined": 0, "NoLocalEffectRecorded": 0}

    # A run for one case counts its operations but leaves the whole-store gauges alone.
    assert run_reconcile(pending.case_id) == 0
    after_one = metrics()
    assert delta(middle, after_one, "decisionflow_reconcile_operations_total", state="Pending") == 1
    assert delta(middle, after_one, "decisionflow_reconcile_last_operations", state="Pending") == 0

    # A second run while one holds the lock: refused at once, counted as locked and busy.
    with held_elsewhere(reconcile_lock):
        assert run_reconcile("--all") == 1
    locked = metrics()
    assert delta(after_one, locked, "decisionflow_reconcile_runs_total", result="locked") == 1
    assert delta(after_one, locked, "decisionflow_busy_refusals_total", lock="reconcile") == 1
    assert delta(after_one, locked, "decisionflow_reconcile_runs_total") == 1


def test_metrics_off_imports_nothing_and_records_nothing(settings, monkeypatch):
    """With metrics off (a cron command without a metrics folder) every metric is a no-op."""
    from core import observability

    # The throwaway metric registers itself: this test's copy of the list, not the process's
    # (tests/decisionflow/test_health.py checks that every registered metric is served).
    monkeypatch.setattr(observability, "_ALL", list(observability._ALL))
    settings.DECISIONFLOW_METRICS = False
    metric = observability.Counter("decisionflow_test_off", "never made")
    metric.labels(x="1").inc()
    metric.inc()
    assert metric._metric is None


def test_a_command_writes_its_decision_event_to_the_file_and_keeps_stderr_for_errors(world, tmp_path):  # noqa: F811
    """`manage.py resume`: stderr holds only the error line scripts parse; the event goes to
    DECISIONFLOW_EVENT_LOG_FILE, one JSON line per decision."""
    from tests.workflow.conftest import child_env, manage_argv
    from tests.workflow.test_decision_service import _begun, _op

    case = _begun()
    log_file = tmp_path / "events.jsonl"
    env = child_env(DECISIONFLOW_EVENT_LOG_FILE=str(log_file))
    argv = ["resume", case.case_id, "--operation-id", _op(case), "--reviewer", world["reviewer"].get_username()]
    first = subprocess.run(manage_argv(*argv, "--approve"), env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""
    conflict = subprocess.run(manage_argv(*argv, "--decline"), env=env, capture_output=True, text=True, timeout=120)
    assert conflict.returncode == 3
    assert conflict.stderr.startswith("conflicting decision: ") and "{" not in conflict.stderr.splitlines()[0]
    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [(e["channel"], e["outcome"], e["code"]) for e in events] == [
        ("command", "committed", None),
        ("command", "conflict", "conflicting_decision"),
    ]
    assert all(e["case_id"] == case.case_id and e["actor"] == "reviewer" for e in events)


def test_sla_report_feeds_its_metrics(world, settings):  # noqa: F811
    """The breached count after a run, and what was done, for /metrics."""
    from datetime import timedelta

    from django.utils import timezone

    from reviews.models import PendingReview
    from tests.workflow.test_decision_service import _begun

    _begun()
    settings.DECISIONFLOW_REVIEW_SLA = "4h"
    PendingReview.objects.update(created_at=timezone.now() - timedelta(hours=5))

    def sla_report(*args) -> int:
        try:
            call_command("sla_report", *args, stdout=io.StringIO(), stderr=io.StringIO())
        except CommandError as exc:
            return exc.returncode
        return 0

    before = metrics()
    assert sla_report() == 10
    middle = metrics()
    assert delta(before, middle, "decisionflow_sla_reviews_total", action="reported") == 1
    assert [v for (n, _), v in middle.items() if n == "decisionflow_sla_breached_reviews"] == [1]
    settings.DECISIONFLOW_REVIEW_ON_BREACH = "decline"
    assert sla_report("--expire") == 10
    after = metrics()
    assert delta(middle, after, "decisionflow_sla_reviews_total", action="expired") == 1
    # Expired now: nothing is past its target any more.
    assert [v for (n, _), v in after.items() if n == "decisionflow_sla_breached_reviews"] == [0]
