"""The audit exports: cases, a case's history, commit attempts and deliveries, as CSV or JSON
Lines, streamed and signed (docs/AUDIT.md has every column).

One ``Export`` describes each kind: its columns (a name, the ORM path it reads, how its value
is written) and its rows (a queryset, with the filters applied by the ORM). Two writers make
the bytes:

- ``python_chunks``: the rows through ``QuerySet.iterator(chunk_size)`` (a server-side cursor
  on PostgreSQL), formatted here: JSON Lines everywhere, and CSV on SQLite and for the history;
- ``audit.store.copy_csv_chunks``: CSV of a flat kind on PostgreSQL through psycopg's
  ``COPY … TO STDOUT``, the same bytes as ``python_chunks`` writes (a contract test runs both).

Neither ever holds more than one chunk. ``Signed`` counts and hashes the chunks as they go
out, for the detached ``.sig`` (audit/signature.py).

A CSV value that a spreadsheet would run as a formula (it starts with ``=``, ``+``, ``-``,
``@``, a tab or a carriage return, OWASP's list) is written with a ``'`` before it. The
signature covers the bytes after that, exactly as written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from functools import partial
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Exists, Model, OuterRef, QuerySet
from django.utils.dateparse import parse_date, parse_datetime

from audit.formats import (
    BOOL,
    CHUNK_BYTES,
    CHUNK_ROWS,
    INT,
    TEXT,
    TIME,
    Column,
    Format,
    csv_line,
    csv_text,
    flat_values,
    json_value,
)
from audit.signature import signature_text
from audit.store import copy_csv_chunks
from cases.models import Case, Policy
from core.errors import InvalidInput, NotFound
from core.outcomes import DecisionOutcome
from effects.models import CommitAttempt, Delivery, DeliveryState, DeliveryTry
from reviews.models import Origin, Proposal, ReviewDecision
from workflow import selectors


@dataclass(frozen=True)
class Filters:
    """What an export is narrowed to; None is "everything". ``until`` is exclusive."""

    since: datetime | None = None
    until: datetime | None = None
    policy: str | None = None
    state: str | None = None
    reviewer: Any = None  # a user
    case: Case | None = None

    def describe(self) -> str:
        parts = [
            f"since={self.since.isoformat()}" if self.since else "",
            f"until={self.until.isoformat()}" if self.until else "",
            f"policy={self.policy}" if self.policy else "",
            f"state={self.state}" if self.state else "",
            f"reviewer={self.reviewer.get_username()}" if self.reviewer else "",
            f"case={self.case.case_id}" if self.case else "",
        ]
        return " ".join(p for p in parts if p)


@dataclass(frozen=True)
class Export:
    """One kind of export: its columns, its states, and its rows under the filters."""

    name: str
    title: str
    columns: tuple[Column, ...]
    states: tuple[str, ...]
    rows: Callable[[Filters, QuerySet | None], QuerySet | Iterator[dict]]
    # A flat kind is one queryset of scalar columns: COPY can write it.
    flat: bool = True
    needs_case: bool = False
    filters_taken: tuple[str, ...] = ("since", "until", "policy", "state", "reviewer")

    @property
    def header(self) -> list[str]:
        return [c.name for c in self.columns]


def _window(queryset: QuerySet, at: str, filters: Filters) -> QuerySet:
    if filters.since:
        queryset = queryset.filter(**{f"{at}__gte": filters.since})
    if filters.until:
        queryset = queryset.filter(**{f"{at}__lt": filters.until})
    return queryset


# --- cases ------------------------------------------------------------------------------

CASE_COLUMNS = (
    Column("case_id", "case_id", TEXT, "the case's ID"),
    Column("subject", "subject", TEXT, "the case's subject"),
    Column("policy", "policy__name", TEXT, "the name of the case's policy"),
    Column("policy_id", "policy__policy_id", TEXT, "the policy version's identity (name and parameters)"),
    Column("state", "review_status", TEXT, f"where the case stands now: {', '.join(selectors.STATUS_LABELS)}"),
    Column("current_operation_id", "current_operation_id", TEXT, "the operation of its current proposal"),
    Column("approved", "decision_approved", BOOL, "the current proposal's decision: true, false, empty if none"),
    Column("reviewer", "decision_reviewer", TEXT, "who decided the current proposal"),
    Column("decided_at", "decision_at", TIME, "when it was decided"),
    Column("created_at", "created_at", TIME, "when the case was brought in"),
)


def _cases(filters: Filters, selected: QuerySet | None) -> QuerySet:
    queryset: QuerySet = Case.objects.all() if selected is None else Case.objects.filter(pk__in=selected.values("pk"))
    queryset = _window(queryset, "created_at", filters)
    if filters.policy:
        queryset = queryset.filter(policy__name=filters.policy)
    if filters.reviewer:
        queryset = queryset.filter(
            Exists(ReviewDecision.objects.filter(proposal__case_id=OuterRef("pk"), reviewer=filters.reviewer))
        )
    queryset = selectors.cases_with_status(queryset)
    if filters.state:
        queryset = queryset.filter(review_status=filters.state)
    return queryset.order_by("pk")


# --- commit attempts ----------------------------------------------------------------------

ATTEMPT_COLUMNS = (
    Column("id", "pk", INT, "the attempt row's number (rows are never changed or removed)"),
    Column("attempted_at", "attempted_at", TIME, "when the commit was called"),
    Column("case_id", "case__case_id", TEXT, "the case (empty when the request named none that exists)"),
    Column("operation_id", "operation_id", TEXT, "the operation as the request named it"),
    Column("channel", "channel", TEXT, "admin, api, command, system, …"),
    Column("reviewer", "reviewer__username", TEXT, "who asked"),
    Column("approved", "approved", BOOL, "what was asked: true (approve), false (decline), empty (none given)"),
    Column("outcome", "outcome", TEXT, f"how it ended: {', '.join(DecisionOutcome.values)}"),
    Column("reason", "reason", TEXT, "why it was refused (the refusal reasons of docs/API.md)"),
    Column("detail", "detail", TEXT, "the refusal's message"),
    Column("decline_reason", "decline_reason", TEXT, "the decline reason asked for"),
    Column("decline_note", "decline_note", TEXT, "the decline note asked for"),
)


def _rows(
    model, filters: Filters, selected: QuerySet | None, *, at: str, policy: str, state, reviewer: str
) -> QuerySet:
    """The rows of ``model`` an export writes: the admin's selection (or all), within the
    date range on ``at``, of the policy named through ``policy``, in the state ``state``
    names (a field, or a function of the value giving the filter), by the reviewer through
    ``reviewer``; in id order."""
    queryset: QuerySet = model.objects.all() if selected is None else model.objects.filter(pk__in=selected.values("pk"))
    queryset = _window(queryset, at, filters)
    if filters.policy:
        queryset = queryset.filter(**{policy: filters.policy})
    if filters.state:
        queryset = queryset.filter(**(state(filters.state) if callable(state) else {state: filters.state}))
    if filters.reviewer:
        queryset = queryset.filter(**{reviewer: filters.reviewer})
    return queryset.order_by("pk")


_attempts = partial(
    _rows, CommitAttempt, at="attempted_at", policy="case__policy__name", state="outcome", reviewer="reviewer"
)


# --- deliveries -----------------------------------------------------------------------------

DELIVERY_COLUMNS = (
    Column("id", "pk", INT, "the delivery's number"),
    Column("created_at", "created_at", TIME, "when the approval wrote it"),
    Column("case_id", "case__case_id", TEXT, "the case"),
    Column("operation_id", "operation_id", TEXT, "the approved operation (also the helpdesk's Idempotency-Key)"),
    Column("reviewer", "decision__reviewer__username", TEXT, "who approved it"),
    Column("state", "state", TEXT, f"where it stands now: {', '.join(DeliveryState.values)}"),
    Column("tries", "tries", INT, "requests sent so far"),
    Column("reference", "reference", TEXT, "the helpdesk's reference of the stored reply"),
    Column("reason", "reason", TEXT, "why it was rejected or needs a check"),
    Column("updated_at", "updated_at", TIME, "when its state last moved"),
    Column("settled_at", "settled_at", TIME, "when it became final"),
)


_deliveries = partial(
    _rows, Delivery, at="created_at", policy="case__policy__name", state="state", reviewer="decision__reviewer"
)


# --- proposals and decisions ----------------------------------------------------------------

PROPOSAL_COLUMNS = (
    Column("id", "pk", INT, "the proposal's number (proposals are never changed: an edit is a new one)"),
    Column("created_at", "created_at", TIME, "when it was made"),
    Column("case_id", "case__case_id", TEXT, "the case"),
    Column("operation_id", "operation_id", TEXT, "its operation identity"),
    Column("origin", "origin", TEXT, f"why it was made: {', '.join(Origin.values)}"),
    Column("author", "author__username", TEXT, "who made it (empty: the pipeline's import)"),
    Column("parent_operation_id", "parent__operation_id", TEXT, "the proposal it was made from"),
    Column("policy_id", "policy_id", TEXT, "the policy version it was made under"),
    Column("evidence_id", "evidence_id", TEXT, "the identity of its evidence"),
    Column("body", "body", TEXT, "the reply as proposed"),
)


_proposals = partial(_rows, Proposal, at="created_at", policy="case__policy__name", state="origin", reviewer="author")


DECISION_COLUMNS = (
    Column("id", "pk", INT, "the decision's number (decisions are never changed)"),
    Column("decided_at", "decided_at", TIME, "when it was recorded"),
    Column("case_id", "proposal__case__case_id", TEXT, "the case"),
    Column("operation_id", "operation_id", TEXT, "the operation decided"),
    Column("approved", "approved", BOOL, "true (approved) or false (declined)"),
    Column("reviewer", "reviewer__username", TEXT, "who decided (for a system actor, the user it acted as)"),
    Column("system_actor", "system_actor", TEXT, "the system actor that declined (expired, withdrawn), if any"),
    Column("decline_reason", "decline_reason", TEXT, "why it was declined"),
    Column("decline_note", "decline_note", TEXT, "the decline's note"),
)

APPROVED, DECLINED = "approved", "declined"


_decisions = partial(
    _rows,
    ReviewDecision,
    at="decided_at",
    policy="proposal__case__policy__name",
    state=lambda value: {"approved": value == APPROVED},
    reviewer="reviewer",
)


# --- a case's history -------------------------------------------------------------------------

HISTORY_COLUMNS = (
    Column("at", "at", TIME, "when it happened"),
    Column(
        "event",
        "event",
        TEXT,
        "proposal, review_begun, escalation, assignment, claim, attempt, decision, effect, delivery, delivery_try, notification",
    ),
    Column("row", "row", INT, "the row's number in its own table"),
    Column("operation_id", "operation_id", TEXT, "the operation it is about"),
    Column("actor", "actor", TEXT, "who: the author, reviewer, claimant, or the system actor"),
    Column(
        "channel",
        "channel",
        TEXT,
        "how: admin, api, command (a delivery try: send or lookup; a notification: its channels)",
    ),
    Column("approved", "approved", BOOL, "an attempt's or a decision's approve (true) or decline (false)"),
    Column(
        "outcome",
        "outcome",
        TEXT,
        "a proposal's origin, a review's status, an attempt's outcome, approved/declined, a delivery's or a try's or a notification's state",
    ),
    Column(
        "reason",
        "reason",
        TEXT,
        "a refusal's reason, a decline reason, a notification's kind, whom an assignment moved the review to, "
        "an escalation's step and action",
    ),
    Column(
        "detail",
        "detail",
        TEXT,
        "a proposal's or effect's body, a refusal's message, a decline note, a try's HTTP status and error",
    ),
    Column("diff", "diff", TEXT, "a proposal's body against its parent (unified diff)"),
)

_EVENT = {"pending_review": "review_begun"}


def _history_row(event: selectors.HistoryEvent) -> dict:
    obj: Any = event.obj
    row: dict[str, Any] = {"at": event.at, "event": _EVENT.get(event.kind, event.kind), "row": obj.pk}
    row["operation_id"] = getattr(obj, "operation_id", "")
    if event.kind == "proposal":
        row |= {"actor": _name(obj.author), "outcome": obj.origin, "detail": obj.body, "diff": "\n".join(event.diff)}
    elif event.kind == "pending_review":
        row |= {"actor": _name(obj.begun_by), "channel": obj.begun_channel, "outcome": obj.status}
    elif event.kind == "claim":
        row |= {"actor": _name(obj.user), "outcome": obj.kind}
    elif event.kind == "escalation":
        row |= {
            "actor": "sla-escalation",
            "outcome": obj.outcome,
            "reason": f"{obj.step}:{obj.action}",
            "detail": obj.detail,
        }
    elif event.kind == "assignment":
        to = _name(obj.to_user) or f"group {obj.to_group}"
        if obj.meant_for is not None:
            to += f" (for {_name(obj.meant_for)}, away)"
        row |= {"actor": _name(obj.by) or "sla-escalation", "outcome": obj.kind, "reason": to, "detail": obj.note}
    elif event.kind == "attempt":
        row |= {
            "actor": _name(obj.reviewer),
            "channel": obj.channel,
            "approved": obj.approved,
            "outcome": obj.outcome,
            "reason": obj.reason or obj.decline_reason,
            "detail": obj.detail or obj.decline_note,
        }
    elif event.kind == "decision":
        row |= {
            "actor": obj.system_actor or _name(obj.reviewer),
            "approved": obj.approved,
            "outcome": "approved" if obj.approved else "declined",
            "reason": obj.decline_reason,
            "detail": obj.decline_note,
        }
    elif event.kind == "effect":
        row |= {"actor": _name(obj.reviewer), "outcome": obj.action, "detail": obj.body}
    elif event.kind == "notification":
        row |= {"channel": obj.channels, "outcome": obj.state, "reason": obj.kind, "detail": obj.last_error}
    return row


def _name(user) -> str:
    return user.get_username() if user is not None else ""


def _delivery_rows(case: Case) -> Iterator[tuple[datetime, int, dict]]:
    for delivery in Delivery.objects.filter(case=case).select_related("decision__reviewer"):
        yield (
            delivery.created_at,
            0,
            {
                "at": delivery.created_at,
                "event": "delivery",
                "row": delivery.pk,
                "operation_id": delivery.operation_id,
                "actor": _name(delivery.decision.reviewer),
                "outcome": delivery.state,
                "reason": delivery.reason,
                "detail": delivery.reference,
            },
        )
    for attempt in DeliveryTry.objects.filter(delivery__case=case):
        yield (
            attempt.started_at,
            1,
            {
                "at": attempt.started_at,
                "event": "delivery_try",
                "row": attempt.pk,
                "operation_id": attempt.operation_id,
                "actor": attempt.worker,
                "channel": attempt.kind,
                "outcome": attempt.outcome,
                "detail": " ".join(
                    p for p in (f"HTTP {attempt.http_status}" if attempt.http_status else "", attempt.error) if p
                ),
            },
        )


def _history(filters: Filters, selected: QuerySet | None) -> Iterator[dict]:
    """The history page's events (``case_history``), with the deliveries and their tries,
    oldest first; a case's history is read whole, as the page does."""
    assert filters.case is not None
    history = selectors.case_history(filters.case)
    rows: list[tuple[datetime, int, Any, dict]] = [(e.at, 0, i, _history_row(e)) for i, e in enumerate(history.events)]
    rows += [(at, 1, (order, row["row"]), row) for at, order, row in _delivery_rows(filters.case)]
    # Within one transaction the times can tie: the page's own order first, then a delivery
    # before its tries.
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    for at, _, _, row in rows:
        if (filters.since and at < filters.since) or (filters.until and at >= filters.until):
            continue
        yield row


EXPORTS: dict[str, Export] = {
    export.name: export
    for export in (
        Export("cases", "cases with their current state", CASE_COLUMNS, tuple(selectors.STATUS_LABELS), _cases),
        Export("attempts", "commit attempts", ATTEMPT_COLUMNS, tuple(DecisionOutcome.values), _attempts),
        Export("deliveries", "deliveries", DELIVERY_COLUMNS, tuple(DeliveryState.values), _deliveries),
        Export("proposals", "proposals", PROPOSAL_COLUMNS, tuple(Origin.values), _proposals),
        Export("decisions", "decisions", DECISION_COLUMNS, (APPROVED, DECLINED), _decisions),
        Export(
            "history",
            "a case's history",
            HISTORY_COLUMNS,
            (),
            _history,
            flat=False,
            needs_case=True,
            filters_taken=("since", "until"),
        ),
    )
}


# --- filters from text (the command, the admin's link) ----------------------------------------


def _moment(text: str, *, option: str, end: bool) -> datetime:
    """A date (the whole day: ``until`` a date includes it) or an ISO date and time (UTC
    unless it names its zone)."""
    moment = parse_datetime(text)
    if moment is None:
        day = parse_date(text) if len(text) == 10 else None
        if day is None:
            raise InvalidInput(f"{option}: {text!r} is not a date (YYYY-MM-DD) or an ISO date and time")
        moment = datetime.combine(day + timedelta(days=1) if end else day, time.min)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def filters_parse(
    export: Export,
    *,
    since: str | None = None,
    until: str | None = None,
    policy: str | None = None,
    state: str | None = None,
    reviewer: str | None = None,
    case: str | None = None,
) -> Filters:
    """The filters given as text, checked: ``InvalidInput`` or ``NotFound`` names the one
    that is wrong, before anything is read or written."""
    given = {"since": since, "until": until, "policy": policy, "state": state, "reviewer": reviewer}
    refused = [name for name, value in given.items() if value and name not in export.filters_taken]
    if refused:
        raise InvalidInput(f"--{refused[0]} does not apply to the {export.name} export")
    if export.needs_case and not case:
        raise InvalidInput(f"the {export.name} export needs --case CASE_ID")
    if case and not export.needs_case:
        raise InvalidInput(
            f"--case applies to the history export only (the {export.name} export has --policy, --state, …)"
        )
    found_case = None
    if case:
        found_case = Case.objects.filter(case_id=case).first()
        if found_case is None:
            raise NotFound(f"no case {case!r}")
    start = _moment(since, option="--since", end=False) if since else None
    end = _moment(until, option="--until", end=True) if until else None
    if start and end and start >= end:
        raise InvalidInput(f"--since {since} is not before --until {until}")
    if state and state not in export.states:
        raise InvalidInput(f"--state {state!r} is not a state of {export.title}: {', '.join(export.states)}")
    if policy and not Policy.objects.filter(name=policy).exists():
        raise NotFound(f"no policy named {policy!r}")
    user = None
    if reviewer:
        user = get_user_model().objects.filter(username=reviewer).first()
        if user is None:
            raise NotFound(f"no user named {reviewer!r}")
    return Filters(since=start, until=end, policy=policy, state=state, reviewer=user, case=found_case)


# --- the bytes ------------------------------------------------------------------------------------


def header_bytes(export: Export, fmt: str) -> bytes:
    return csv_line(export.header).encode() if fmt == Format.CSV else b""


def _python_rows(export: Export, rows: QuerySet | Iterator[dict]) -> Iterator[tuple]:
    if isinstance(rows, QuerySet):
        yield from (
            flat_values(export.columns, rows)
            .values_list(*[f"c{i}" for i in range(len(export.columns))])
            .iterator(chunk_size=CHUNK_ROWS)
        )
    else:
        for row in rows:
            yield tuple(row.get(c.path) for c in export.columns)


def python_chunks(
    export: Export, rows: QuerySet | Iterator[dict], fmt: str, counter: Callable[[int], None]
) -> Iterator[bytes]:
    """The export's bytes after its header, formatted here, about ``CHUNK_BYTES`` at a time."""
    kinds = [c.kind for c in export.columns]
    names = export.header
    pending: list[str] = []
    size = count = 0
    for values in _python_rows(export, rows):
        if fmt == Format.CSV:
            line = csv_line([csv_text(k, v) for k, v in zip(kinds, values, strict=True)])
        else:
            line = (
                json.dumps(
                    {n: json_value(k, v) for n, k, v in zip(names, kinds, values, strict=True)},
                    ensure_ascii=False,
                    separators=(",", ":"),
                )
                + "\n"
            )
        pending.append(line)
        size += len(line)
        count += 1
        if size >= CHUNK_BYTES:
            counter(count)
            yield "".join(pending).encode()
            pending, size, count = [], 0, 0
    if pending:
        counter(count)
        yield "".join(pending).encode()


def uses_copy(export: Export, fmt: str) -> bool:
    return export.flat and fmt == Format.CSV and connection.vendor == "postgresql"


def export_chunks(
    export: Export,
    filters: Filters,
    fmt: str,
    *,
    selected: QuerySet | None = None,
    counter: Callable[[int], None] = lambda n: None,
) -> Iterator[bytes]:
    """The whole export, header first, as chunks: nothing is read before the first is asked."""
    yield header_bytes(export, fmt)
    rows = export.rows(filters, selected)
    if uses_copy(export, fmt):
        assert isinstance(rows, QuerySet)
        yield from copy_csv_chunks(export.columns, rows, counter)
    else:
        yield from python_chunks(export, rows, fmt, counter)


@dataclass
class Signed:
    """The chunks as they go out, counted and hashed (and written to ``sink``, where given:
    the command's file); ``signature()`` once they are all out."""

    chunks: Iterable[bytes]
    sink: Callable[[bytes], Any] | None = None
    size: int = 0
    digest: Any = field(default_factory=hashlib.sha256)

    def __iter__(self) -> Iterator[bytes]:
        update, sink = self.digest.update, self.sink
        for chunk in self.chunks:
            if chunk:
                update(chunk)
                if sink is not None:
                    sink(chunk)
                self.size += len(chunk)
                yield chunk

    @property
    def sha256(self) -> str:
        return self.digest.hexdigest()

    def signature(self, key=None) -> bytes:
        return signature_text(sha256=self.sha256, size=self.size, key=key)


def file_name(export: Export, fmt: str, filters: Filters, now: datetime) -> str:
    """``decisionflow-attempts-20261204T180000Z.csv``; a history names its case."""
    subject = f"history-{filters.case.case_id}" if filters.case else export.name
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in subject)
    return f"decisionflow-{safe}-{now.astimezone(UTC).strftime('%Y%m%dT%H%M%SZ')}.{fmt}"


def export_for_model(model: type[Model]) -> Export:
    """The export a changelist of ``model`` offers."""
    return EXPORTS[
        {
            Case: "cases",
            CommitAttempt: "attempts",
            Delivery: "deliveries",
            Proposal: "proposals",
            ReviewDecision: "decisions",
        }[model]
    ]
