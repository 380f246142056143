"""Domain metrics and structured event logs for the decision paths (docs/DEPLOY.md).

Metrics are Prometheus counters and histograms in the process that did the work. Under
gunicorn, and for commands run from cron, ``PROMETHEUS_MULTIPROC_DIR`` names a directory
shared by every process of the host: each process writes its own file there and ``/metrics``
sums them all, so no worker's (and no finished command's) counts are partial or lost. The
choice, and why not gauges read from the database, is in docs/DEPLOY.md.

Events are one JSON line each on the ``decisionflow.events`` logger (``JsonFormatter``): the
case, the operation, the channel, the actor, the outcome and the duration. Never a draft,
a message text that could quote one, or a secret: only identifiers, codes and numbers.

The decision and commit services are observed by context managers around their own
bodies (``decision_observed``, ``commit_observed``), so that observing them puts no wrapper
function between a caller and the service; the binding checks count their refusals through
a decorator (``counts_refusals``).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import sys
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from django.conf import settings

from core.errors import REFUSALS as REFUSAL_CLASSES
from core.errors import CaseBusy, DecisionflowError, LockBusy
from core.outcomes import RETURNED, DecisionOutcome, Failure, OperationState, ReadSource, ReceiptStatus, error_outcome
from core.tracing import Attr, SpanName, span_begin

events = logging.getLogger("decisionflow.events")


def metrics_enabled() -> bool:
    """``DECISIONFLOW_METRICS`` (on when ``PROMETHEUS_MULTIPROC_DIR`` is set): off, a
    process never imports prometheus_client, so a cron command without a metrics folder
    (whose counts would die with it) does not pay for the import."""
    return bool(getattr(settings, "DECISIONFLOW_METRICS", False))


class _Off:
    """What a metric is when metrics are off: every call does nothing."""

    def labels(self, *args, **kwargs):
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass

    def set(self, value: float) -> None:
        pass


_OFF = _Off()


class _Lazy:
    """A Prometheus metric made on first use (prometheus_client costs ~50 ms to import)."""

    kind: str
    labelnames: tuple[str, ...]

    def __init__(self, kind: str, name: str, documentation: str, labelnames=(), **kwargs):
        self.kind, self.name, self.documentation, self.labelnames, self.kwargs = (
            kind,
            name,
            documentation,
            tuple(labelnames),
            kwargs,
        )
        self._metric: Any = None
        _ALL.append(self)

    def _get(self) -> Any:
        if self._metric is None:
            if not metrics_enabled():
                return _OFF
            import prometheus_client

            make = getattr(prometheus_client, self.kind)
            self._metric = make(self.name, self.documentation, self.labelnames, **self.kwargs)
        return self._metric

    def labels(self, **labels):
        return self._get().labels(**labels)

    def inc(self, amount: float = 1) -> None:
        self._get().inc(amount)

    def set(self, value: float) -> None:
        self._get().set(value)


# Every metric of ours, in the order made: ``metrics_initialise`` walks them.
_ALL: list[_Lazy] = []


def Counter(name, documentation, labelnames=(), **kwargs) -> Any:
    return _Lazy("Counter", name, documentation, labelnames, **kwargs)


def Histogram(name, documentation, labelnames=(), **kwargs) -> Any:
    return _Lazy("Histogram", name, documentation, labelnames, **kwargs)


def Gauge(name, documentation, labelnames=(), **kwargs) -> Any:
    return _Lazy("Gauge", name, documentation, labelnames, **kwargs)


# Buckets from a millisecond to a minute: a commit is a few ms, a busy case waits up to the
# lock timeout (3 s by default), a decision that begins its review first can take a second.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# The outcome labels, from the enums: what the service returns, then its refusals, then
# its failures, counted by whether the commit may have happened (``Failure``) rather than as
# ``failed``, which only the effect store can know. The docs' table and the tests read this.
OUTCOMES: tuple[str, ...] = (
    *(outcome.value for outcome in RETURNED),
    *(outcome.value for outcome in DecisionOutcome if outcome not in RETURNED and outcome != DecisionOutcome.FAILED),
    *Failure.values,
)
RECONCILE_STATES: tuple[str, ...] = tuple(OperationState.values)
# The refusal codes a decision or an edit can answer (the ``code`` label): every refusal's
# but the base class's, which is a failure of ours and counted as ``error``.
REFUSAL_CODES: tuple[str, ...] = tuple(dict.fromkeys(c.code for c in REFUSAL_CLASSES if c is not DecisionflowError))


class LockName(StrEnum):
    """Which lock a wait or a busy refusal was for (the ``lock`` label; core/locks.py)."""

    CASE = "case"  # begin, edit, a decision that begins its review; reconcile --repair per case
    CASE_ROW = "case_row"  # the commit's row lock on the case
    DATABASE = "database"  # SQLite's write lock
    POLICY = "policy"  # an import into a policy, or its publish
    RECONCILE = "reconcile"  # one reconcile run at a time
    CRON = "cron"  # one run of another cron command at a time (sla_report, prune_checkpoints)


class ReconcileResult(StrEnum):
    """How a reconcile run ended (the ``result`` label)."""

    OK = "ok"
    UNREPAIRED = "unrepaired"  # NoLocalEffectRecorded found without --repair (exit 1)
    REPAIRED = "repaired"
    LOCKED = "locked"  # another run held the lock
    ERROR = "error"


class SlaAction(StrEnum):
    """What ``sla_report`` did with a breached review (the ``action`` label and its lines)."""

    REPORTED = "reported"  # the policy says stay pending
    WOULD_EXPIRE = "would_expire"  # fail closed, without --expire: a dry run
    EXPIRED = "expired"  # declined with reason expired by the system actor
    REPLAY = "replay"  # another run expired it first
    NOT_EXPIRED = "not_expired"  # a person's decision (or an edit) got there first
    UNCERTAIN = "uncertain"  # the expiry's COMMIT failed and may have been applied


class AuditScope(StrEnum):
    """What a verification of the audit chain checked (the ``scope`` label; docs/AUDIT.md)."""

    DATABASE = "database"  # manage.py audit_verify: every seal and every chained row
    CASE = "case"  # the history page: one case's rows and the latest seal
    EXPORT = "export"  # manage.py audit_verify FILE: an export against its signature


class AuditResult(StrEnum):
    """How a verification ended (the ``verdict`` label)."""

    VERIFIED = "verified"  # everything chains and matches the latest seal
    NOT_SEALED = "not_sealed"  # everything chains, and no seal covers any of it yet
    BROKEN = "broken"  # a row or a seal does not match: tampering, or a bug to look at now
    ERROR = "error"  # the check could not run (no key, a key that cannot be read)


# The outcomes that count a refusal by its error code as well.
_REFUSED = frozenset({DecisionOutcome.CONFLICT, DecisionOutcome.STALE, DecisionOutcome.REFUSED, Failure.UNCERTAIN})


DECISIONS = Counter(
    "decisionflow_decisions",
    f"Decisions by channel and outcome ({', '.join(OUTCOMES)}); every call of decision_record counts once.",
    ["channel", "outcome"],
)
REFUSALS = Counter(
    "decisionflow_decision_refusals",
    "Decisions refused, by the error code the channel answered (case_busy, stale_proposal, ...).",
    ["code"],
)
DECISION_SECONDS = Histogram(
    "decisionflow_decision_seconds",
    "Time of a whole decision (bind, engine run, commit), by outcome.",
    ["outcome"],
    buckets=LATENCY_BUCKETS,
)
COMMIT_SECONDS = Histogram(
    "decisionflow_commit_seconds",
    "Time of effect_commit (the decision and effect transaction), by outcome.",
    ["outcome"],
    buckets=LATENCY_BUCKETS,
)
LOCK_WAIT_SECONDS = Histogram(
    "decisionflow_lock_wait_seconds",
    "Time spent waiting for a named lock (case, reconcile), whether or not it was had.",
    ["lock"],
    buckets=LATENCY_BUCKETS,
)
BUSY_REFUSALS = Counter(
    "decisionflow_busy_refusals",
    "Locks not had in time: case (the advisory or file lock of begin/edit), case_row (the "
    "commit's row lock), database (SQLite's write lock), reconcile (a second run).",
    ["lock"],
)
CHECKPOINT_REFUSED = Counter(
    "decisionflow_checkpoint_loads_refused",
    "Pause checkpoints that failed a binding check (version, graph, HMAC, request, in-flight "
    "messages): the decision was refused and nothing ran.",
)
REFUSALS_UNRECORDED = Counter(
    "decisionflow_refusal_unrecorded",
    "Refused decisions and edits whose attempt row could not be written (the refusal was still "
    "answered; the audit misses it): by the refusal's error code.",
    ["code"],
)
RECONCILE_RUNS = Counter(
    "decisionflow_reconcile_runs",
    f"reconcile runs by result: ok, unrepaired ({OperationState.NO_LOCAL_EFFECT} found, exit 1), repaired, "
    "locked (another run held the lock), error.",
    ["result"],
)
RECONCILE_OPERATIONS = Counter(
    "decisionflow_reconcile_operations",
    "Operations listed by reconcile runs, by state (summed over runs).",
    ["state"],
)
RECONCILE_LAST = Gauge(
    "decisionflow_reconcile_last_operations",
    "Operations by state in the last complete `reconcile --all` run of this host.",
    ["state"],
    multiprocess_mode="mostrecent",
)
RECONCILE_LAST_RUN = Gauge(
    "decisionflow_reconcile_last_run_timestamp_seconds",
    "When the last complete `reconcile --all` run of this host finished (Unix time).",
    multiprocess_mode="mostrecent",
)
SLA_BREACHED = Gauge(
    "decisionflow_sla_breached_reviews",
    "Pending reviews past their SLA target in the last `sla_report` run of this host (docs/QUEUE.md).",
    multiprocess_mode="mostrecent",
)
SLA_LAST_RUN = Gauge(
    "decisionflow_sla_last_run_timestamp_seconds",
    "When the last `sla_report` run of this host finished (Unix time).",
    multiprocess_mode="mostrecent",
)
SLA_ACTIONS = Counter(
    "decisionflow_sla_reviews",
    "Breached reviews listed by `sla_report`, by what was done: reported, would_expire, expired, replay, not_expired.",
    ["action"],
)


AUDIT_VERIFICATIONS = Counter(
    "decisionflow_audit_verifications",
    "Verifications of the audit chain by scope (database: audit_verify; case: the history page; export: "
    "audit_verify FILE) and verdict (verified, not_sealed, broken, error); a failure is verdict=broken.",
    ["scope", "verdict"],
)


REPLICA_READS = Counter(
    "decisionflow_replica_reads",
    f"Read-only pages by where they read ({', '.join(ReadSource.values)}; core/replicas.py).",
    ["source"],
)
REPLICA_LAG = Gauge(
    "decisionflow_replica_lag_seconds",
    "The read replica's lag as this host last measured it (0: it has replayed all it received).",
    multiprocess_mode="mostrecent",
)


def audit_observed(*, scope: str, result: str) -> None:
    """One verification of the audit chain, counted by what it checked and how it ended."""
    AUDIT_VERIFICATIONS.labels(scope=scope, verdict=result).inc()


def metrics_initialise(*, channels: Iterable[str]) -> None:
    """Make every counter and histogram now, each labelled series at zero for every known
    label value, so that a fresh process's /metrics shows them (a dashboard then has a line
    at 0, not a gap, before the first event). ``channels``: the channel label's values (the
    vocabulary lives above this floor). Called by /metrics; repeated calls cost nothing.

    Gauges are left alone: each is set by the run it describes, and a zero before any run
    would claim a run that did not happen (in multiprocess mode the folder ignores an unset
    most-recent gauge anyway)."""
    if not metrics_enabled():
        return
    known: dict[str, tuple[str, ...]] = {
        "channel": tuple(channels),
        "outcome": OUTCOMES,
        "code": REFUSAL_CODES,
        "lock": tuple(LockName),
        "result": tuple(ReconcileResult),
        "state": RECONCILE_STATES,
        "action": tuple(SlaAction),
        "scope": tuple(AuditScope),
        "verdict": tuple(AuditResult),
        "source": tuple(ReadSource.values),
    }
    for metric in _ALL:
        if metric.kind == "Gauge":
            continue
        made = metric._get()
        for values in itertools.product(*(known[name] for name in metric.labelnames)):
            if values:
                made.labels(**dict(zip(metric.labelnames, values, strict=True)))


def sla_observed(*, breached: int, actions: dict[str, int]) -> None:
    """One finished `sla_report` run: the breached count now, and what was done."""
    SLA_BREACHED.set(breached)
    SLA_LAST_RUN.set(time.time())
    for action, count in actions.items():
        SLA_ACTIONS.labels(action=action).inc(count)


def outcome_of(result: Any = None, exc: BaseException | None = None) -> str:
    """The outcome label of a decision: its result's outcome, or what its error means."""
    if exc is None:
        return str(getattr(result, "outcome", Failure.ERROR))
    return error_outcome(exc).value


def _code(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    return getattr(exc, "code", None) or type(exc).__name__


def _username(user) -> str | None:
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return user.get_username()


class Observed:
    """What an observed call returned, set by the service before its block ends."""

    result: Any = None


@contextmanager
def decision_observed(*, case, operation_id, channel, reviewer, approved):
    """Count, time and log one call of the decision service, whose body is the block.

    Exactly one metric increment and one event line per call, whatever the outcome; the
    service sets ``result`` on what it yields before it returns.
    """
    seen = Observed()
    started = time.perf_counter()
    error = None
    channel = str(channel or "service")[:20]
    span = span_begin(
        SpanName.DECISION,
        {
            Attr.OPERATION: str(operation_id)[:100],
            Attr.CASE: getattr(case, "case_id", None),
            Attr.CHANNEL: channel,
            Attr.APPROVED: approved if isinstance(approved, bool) else None,
        },
    )
    try:
        yield seen
    except BaseException as exc:
        error = exc
        raise
    finally:
        seconds = time.perf_counter() - started
        outcome = outcome_of(seen.result if error is None else None, error)
        span.set({Attr.OUTCOME: outcome, Attr.BEGUN: getattr(seen.result, "begun", None) if error is None else None})
        span.end(error)
        DECISIONS.labels(channel=channel, outcome=outcome).inc()
        DECISION_SECONDS.labels(outcome=outcome).observe(seconds)
        if outcome in _REFUSED:
            REFUSALS.labels(code=_code(error)).inc()
        events.info(
            "decision",
            extra={
                "event": "decision",
                "case_id": getattr(case, "case_id", None),
                "operation_id": str(operation_id)[:100],
                "channel": channel,
                "actor": _username(reviewer),
                "approved": approved if isinstance(approved, bool) else None,
                "outcome": outcome,
                "code": _code(error) or None,
                "begun": getattr(seen.result, "begun", None) if error is None else None,
                "duration_ms": round(seconds * 1000, 2),
            },
        )


@contextmanager
def commit_observed(*, approved, operation_id=None):
    """Time one ``effect_commit``, whose body is the block, by outcome (and trace it); a busy
    case row counts as a busy refusal. The commit sets ``result`` on what it yields before it
    returns."""
    seen = Observed()
    started = time.perf_counter()
    outcome: str = Failure.ERROR
    error = None
    span = span_begin(SpanName.COMMIT, {Attr.OPERATION: str(operation_id)[:100] if operation_id else None})
    try:
        yield seen
        if getattr(seen.result, "status", None) == ReceiptStatus.CONFLICTING:
            outcome = DecisionOutcome.CONFLICT
        elif getattr(seen.result, "replay", False):
            outcome = DecisionOutcome.REPLAY
        elif getattr(seen.result, "status", None) == ReceiptStatus.AWAITING_APPROVAL:
            outcome = DecisionOutcome.AWAITING_APPROVAL
        else:
            outcome = DecisionOutcome.COMMITTED if approved is True else DecisionOutcome.DECLINED
    except BaseException as exc:
        outcome, error = outcome_of(exc=exc), exc
        if isinstance(exc, CaseBusy):
            BUSY_REFUSALS.labels(lock=LockName.CASE_ROW).inc()
        raise
    finally:
        COMMIT_SECONDS.labels(outcome=outcome).observe(time.perf_counter() - started)
        span.set({Attr.OUTCOME: outcome})
        span.end(error)


def counts_refusals(counter: Any, refusal: type[BaseException]) -> Callable:
    """Count each ``refusal`` the wrapped function raises on ``counter``."""

    def decorate(function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except refusal:
                counter.inc()
                raise

        return wrapper

    return decorate


def lock_waited(lock: str, seconds: float, *, had: bool) -> None:
    """A named lock's wait: ``had`` False means the caller answers busy."""
    LOCK_WAIT_SECONDS.labels(lock=lock).observe(seconds)
    if not had:
        BUSY_REFUSALS.labels(lock=lock).inc()


class ReconcileRun:
    """What one reconcile run saw; ``listed`` once every operation was read."""

    def __init__(self, scope: str):
        self.scope = scope
        self.states: Tally[str] = Tally()
        self.listed = False
        self.repaired = 0


@contextmanager
def reconcile_observed(*, scope: str, exit_error: type[BaseException]):
    """Count one reconcile run by result, and its operations by state.

    ``scope`` is ``all`` or ``cases``; only a complete ``--all`` listing sets the last-run
    gauges (a run over a few cases would make them look like the whole store).
    ``exit_error`` is the command's "stop with exit code" exception: the run found
    ``NO_LOCAL_EFFECT`` operations it did not repair.
    """
    run = ReconcileRun(scope)
    result = ReconcileResult.ERROR
    try:
        yield run
        result = ReconcileResult.REPAIRED if run.repaired else ReconcileResult.OK
    except LockBusy:
        result = ReconcileResult.LOCKED
        raise
    except exit_error:
        result = ReconcileResult.UNREPAIRED if run.listed else ReconcileResult.ERROR
        raise
    finally:
        RECONCILE_RUNS.labels(result=result).inc()
        for state, count in run.states.items():
            RECONCILE_OPERATIONS.labels(state=state).inc(count)
        if run.listed and scope == "all":
            for state in RECONCILE_STATES:
                RECONCILE_LAST.labels(state=state).set(run.states.get(state, 0))
            RECONCILE_LAST_RUN.set(time.time())


# --- logs ---------------------------------------------------------------------------------


@contextmanager
def events_off_stderr():
    """Within a command, keep the decision events off stderr (and on any file handler).

    A command's stderr carries exactly its one-line error (docs/COMMANDS.md): scripts parse
    it. Its events still go to ``DECISIONFLOW_EVENT_LOG_FILE`` when that is set.
    """
    streams = {sys.stderr, sys.__stderr__}
    detached = [
        h
        for h in events.handlers
        if isinstance(h, logging.StreamHandler)
        and not isinstance(h, logging.FileHandler)
        and getattr(h, "stream", None) in streams
    ]
    for handler in detached:
        events.removeHandler(handler)
    try:
        yield
    finally:
        for handler in detached:
            events.addHandler(handler)


# The attributes every LogRecord has; anything else was passed in ``extra`` and is a field.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


def _request_shown(request: Any, record: logging.LogRecord) -> str | None:
    """The ``request`` extra as ``METHOD /path``, or None when there is nothing to show.

    Django's request logger passes the HttpRequest; the development server's (django.server)
    passes its socket, whose text names only addresses, so its request line (the record's
    first argument, "GET /path HTTP/1.1") says it instead. Never the query string: it may
    carry a token.
    """
    method, path = getattr(request, "method", None), getattr(request, "path", None)
    if isinstance(method, str) and isinstance(path, str):
        return f"{method} {path}"
    first = record.args[0] if isinstance(record.args, tuple) and record.args else None
    if isinstance(first, str):
        words = first.split()
        if len(words) >= 2 and words[0].isalpha() and words[0].isupper():
            return f"{words[0]} {words[1].split('?', 1)[0]}"
    return None


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, then the ``extra`` fields.

    Used for the ``decisionflow.events`` logger and, with ``LOG_FORMAT=json``, for every log
    line of the process (docs/DEPLOY.md, "Logs").
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if "request" in line:
            shown = _request_shown(line["request"], record)
            if shown is None:
                del line["request"]
            else:
                line["request"] = shown
        if record.exc_info:
            line["exc_type"] = record.exc_info[0].__name__ if record.exc_info[0] else None
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False, separators=(",", ":"))
