"""Which database a read-only page reads: the streaming replica when it is near enough, else
the primary (docs/DEPLOY.md, "Read replicas").

With ``DATABASE_REPLICA_URL`` set, settings add a ``replica`` database alias and this
module's ``ReplicaRouter``. Nothing reads the replica unless a view asks for it: the named
read-only pages are wrapped in ``replica_reads``, which decides once per request where that
request's reads go (``reads_for``) and holds the choice in a context variable that the router
reads. Everything else (decisions, the binding check, ``GET /api/operations/…``, reconcile,
begin, edit, every command) reads and writes the primary, as it does without a replica.

A request reads the primary instead, and its page says it shows live data, when:

- its session wrote something within the lag window (``OWN_WRITES_COOKIE``, set on every
  successful write by ``OwnWritesMiddleware``), so a reviewer who has just decided reads
  their own decision;
- the replica lags more than ``DECISIONFLOW_REPLICA_MAX_LAG``: the lag is 0 when the
  standby has replayed all it has received (an idle primary sends nothing, and is no lag),
  otherwise the time since its last replayed transaction (``LAG_SQL``);
- the replica does not answer (a bounded ``connect_timeout``), or fails during the page:
  the page is then read again from the primary, never answered with a 500.

The lag is measured at most once per ``LAG_KEEP`` seconds per process, so a page pays no
extra query; a replica that did not answer is asked again after ``DOWN_KEEP`` seconds, so a
dead one costs one connect timeout per process in that time, not one per page.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.http import Http404, HttpResponseBase

from core.durations import duration_setting
from core.errors import NotFound
from core.observability import REPLICA_LAG, REPLICA_READS
from core.outcomes import ReadSource

log = logging.getLogger(__name__)

REPLICA = "replica"
# How long one lag measurement stands, and how long a replica that did not answer is left
# alone, per process (seconds).
LAG_KEEP = 1.0
DOWN_KEEP = 5.0
# Set on the answer to a successful write; while present, the session reads the primary.
OWN_WRITES_COOKIE = "decisionflow_own_writes"
# The answer header naming where a page read (a ReadSource value), for scripts and tests.
READS_HEADER = "X-Decisionflow-Reads"

# 0 when the standby has replayed everything it received (an idle primary is no lag); else
# the seconds since the last transaction it replayed; NULL (unknown, taken for lagging) when
# it has replayed none since it started. A server not in recovery is a primary: no lag.
LAG_SQL = """
    SELECT CASE
        WHEN NOT pg_is_in_recovery() THEN 0.0
        WHEN pg_last_wal_receive_lsn() <= pg_last_wal_replay_lsn() THEN 0.0
        ELSE EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8
    END
"""

# The replica's alias while a replica_reads view runs, with how many atomic blocks the primary's
# connection had open when it began (a transaction opened inside the view reads the primary).
_reading: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar("decisionflow_reading", default=None)


def configured() -> bool:
    """A replica is configured (``DATABASE_REPLICA_URL``)."""
    return bool(getattr(settings, "DATABASE_REPLICA_URL", "")) and REPLICA in settings.DATABASES


def max_lag() -> float:
    """``DECISIONFLOW_REPLICA_MAX_LAG`` in seconds: more than this behind, pages read the primary."""
    return duration_setting("DECISIONFLOW_REPLICA_MAX_LAG", "5s").total_seconds()


def measure_lag(alias: str = REPLICA) -> float | None:
    """The replica's lag in seconds (``LAG_SQL``), or None when it does not answer."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return 0.0  # a SQLite "replica" is the same file: nothing to replay
    try:
        with connection.cursor() as cursor:
            cursor.execute(LAG_SQL)
            row = cursor.fetchone()
    except DatabaseError as exc:
        log.warning("the read replica did not answer (%s): pages read the primary", exc)
        _close(alias)
        return None
    if row is None or row[0] is None:
        return math.inf
    return max(0.0, float(row[0]))


def _close(alias: str) -> None:
    # A broken connection is dropped, so the next measurement connects afresh.
    with contextlib.suppress(DatabaseError):
        connections[alias].close()


@dataclasses.dataclass(frozen=True)
class _Measured:
    lag: float | None
    at: float


_lock = threading.Lock()
_last: _Measured | None = None


def replica_lag() -> float | None:
    """The replica's lag (None: it did not answer), measured at most once per ``LAG_KEEP``."""
    global _last
    now = time.monotonic()
    with _lock:
        last = _last
    if last is not None and now - last.at < (LAG_KEEP if last.lag is not None else DOWN_KEEP):
        return last.lag
    lag = measure_lag()
    with _lock:
        _last = _Measured(lag, time.monotonic())
    if lag is not None and math.isfinite(lag):
        REPLICA_LAG.set(lag)
    return lag


def replica_unreachable() -> None:
    """The replica failed during a page: leave it alone for ``DOWN_KEEP``."""
    global _last
    with _lock:
        _last = _Measured(None, time.monotonic())
    _close(REPLICA)


def forget_lag() -> None:
    """Forget the last measurement (tests; a process that knows the replica changed)."""
    global _last
    with _lock:
        _last = None


@dataclasses.dataclass(frozen=True)
class Reads:
    """Where one request's reads went, and why; the staff footer shows ``footer``."""

    source: ReadSource
    lag: float | None = None
    limit: float = 0.0

    @property
    def alias(self) -> str:
        return REPLICA if self.source == ReadSource.REPLICA else DEFAULT_DB_ALIAS

    @property
    def live(self) -> bool:
        return self.source != ReadSource.REPLICA

    @property
    def footer(self) -> str:
        if self.source == ReadSource.REPLICA:
            return f"Read from the replica, {_seconds(self.lag)} behind the primary."
        why = {
            ReadSource.OWN_WRITE: "you changed something within the last few seconds",
            ReadSource.LAGGING: f"the replica is {_seconds(self.lag)} behind, more than {_seconds(self.limit)}",
            ReadSource.UNREACHABLE: "the replica does not answer",
            ReadSource.NOT_YET: "what you asked for is not on the replica yet",
        }[self.source]
        return f"Live data, read from the primary: {why}."


def _seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "an unknown time"
    return f"{value:.1f} s"


def reads_for(request) -> Reads:
    """Where this request's reads go: the rules in the module's docstring, decided once."""
    limit = max_lag()
    if OWN_WRITES_COOKIE in request.COOKIES:
        return Reads(ReadSource.OWN_WRITE, limit=limit)
    lag = replica_lag()
    if lag is None:
        return Reads(ReadSource.UNREACHABLE, limit=limit)
    if lag > limit:
        return Reads(ReadSource.LAGGING, lag, limit)
    return Reads(ReadSource.REPLICA, lag, limit)


def replica_reads(view: Callable) -> Callable:
    """A read-only view whose GET reads the replica when ``reads_for`` allows it.

    Other methods (a changelist's POSTed action) read the primary. The response is rendered
    (a TemplateResponse) or streamed (an export) with the same choice. A database error
    while reading the replica reads the page again from the primary."""

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        if request.method not in ("GET", "HEAD") or not configured():
            return view(request, *args, **kwargs)
        # Who is asking is read from the primary, before any read goes elsewhere: a session
        # begun a moment ago may not be on the replica yet.
        user = getattr(request, "user", None)
        if user is not None:
            user.is_authenticated  # noqa: B018
        reads = reads_for(request)
        if reads.source == ReadSource.REPLICA:
            try:
                return _shown(request, reads, _on_replica(view, request, reads, args, kwargs))
            except DatabaseError as exc:
                log.warning("the read replica failed during %s (%s): read again from the primary", request.path, exc)
                replica_unreachable()
                reads = Reads(ReadSource.UNREACHABLE, limit=reads.limit)
            except (Http404, ObjectDoesNotExist, NotFound):
                # What was asked for may be younger than the replica's copy: the primary says.
                reads = Reads(ReadSource.NOT_YET, reads.lag, reads.limit)
        request.database_reads = reads
        return _shown(request, reads, view(request, *args, **kwargs))

    return wrapped


def _on_replica(view: Callable, request, reads: Reads, args, kwargs):
    request.database_reads = reads
    token = _reading.set(_entered())
    try:
        response = view(request, *args, **kwargs)
        if callable(getattr(response, "render", None)) and not getattr(response, "is_rendered", True):
            response.render()  # the template's own queries, on the same choice
        if getattr(response, "streaming", False):
            response.streaming_content = _streamed_on_replica(response.streaming_content)
        return response
    finally:
        _reading.reset(token)


def _streamed_on_replica(chunks: Iterable) -> Iterator:
    parts = iter(chunks)
    while True:
        token = _reading.set(_entered())
        try:
            chunk = next(parts)
        except StopIteration:
            return
        finally:
            _reading.reset(token)
        yield chunk


def _shown(request, reads: Reads, response):
    request.database_reads = reads
    REPLICA_READS.labels(source=reads.source).inc()
    if isinstance(response, HttpResponseBase):  # the API's views return data, not a response
        response[READS_HEADER] = reads.source
    return response


def _entered() -> tuple[str, int]:
    return REPLICA, len(connections[DEFAULT_DB_ALIAS].atomic_blocks)


def reading_alias() -> str | None:
    """The replica while a ``replica_reads`` view runs, unless it opened a transaction on the
    primary (what is read there may decide what is written); else None."""
    reading = _reading.get()
    if reading is None:
        return None
    alias, depth = reading
    return alias if len(connections[DEFAULT_DB_ALIAS].atomic_blocks) <= depth else None


def read_connection():
    """The connection a raw SQL read uses: the replica's inside a ``replica_reads`` view, as
    the router's choice for the ORM, else the primary's."""
    return connections[reading_alias() or DEFAULT_DB_ALIAS]


class ReplicaRouter:
    """Reads go where ``replica_reads`` chose (the primary by default); writes and
    migrations always go to the primary, whichever database an instance was read from."""

    def db_for_read(self, model, **hints) -> str | None:
        return reading_alias()

    def db_for_write(self, model, **hints) -> str:
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1, obj2, **hints) -> bool:
        return True  # the replica is a copy of the primary: the same rows

    def allow_migrate(self, db, app_label, model_name=None, **hints) -> bool:
        return db == DEFAULT_DB_ALIAS


class OwnWritesMiddleware:
    """After a successful write (a decision, an edit, any POST that did not fail), that
    session reads the primary for the lag window: its own change may not be on the replica."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            request.method not in ("GET", "HEAD", "OPTIONS")
            and response.status_code < 400
            and configured()
            and getattr(request, "user", None) is not None
            and request.user.is_authenticated
        ):
            response.set_cookie(
                OWN_WRITES_COOKIE,
                "1",
                # The lag allowed, plus how long a measurement stands.
                max_age=math.ceil(max_lag() + LAG_KEEP),
                httponly=True,
                samesite="Lax",
                secure=settings.SESSION_COOKIE_SECURE,
            )
        return response
