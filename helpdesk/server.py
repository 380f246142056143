"""The helpdesk's HTTP side: `POST /replies`, `GET /replies/{operation_id}`, `/healthz`, and
with --faults the test switches `/_faults` and `/_stats`. helpdesk/README.md is the protocol.

Standard library only (http.server, sqlite3, json), so it starts in a fraction of a second
and needs nothing installed.
"""

from __future__ import annotations

import argparse
import collections
import hmac
import json
import os
import re
import signal
import sqlite3
import sys
import threading
import time
import traceback
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NoReturn

from helpdesk import store
from helpdesk.faults import SWITCHES, FaultError, Faults

DEFAULT_PORT = 8025
DEFAULT_DB = "var/helpdesk.sqlite3"
MAX_BODY_BYTES = 256 * 1024
# A refused body up to this size is read and dropped, so the answer reaches the client.
DRAIN_LIMIT = 8 * 1024 * 1024
# decisionflow's operation ids (op-v1- and 64 hex digits); a bare 64-hex key is accepted too.
KEY_RE = re.compile(r"(?:op-v1-)?[0-9a-f]{64}")
# W3C Trace Context (version 00): the sender's trace, logged and counted; nothing else reads it.
TRACEPARENT_RE = re.compile(r"00-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
REQUIRED_STRINGS = ("case_id", "operation_id", "body", "evidence_id", "policy_id")
FIELDS = frozenset({*REQUIRED_STRINGS, "source_versions"})


class Refusal(Exception):
    """A request answered with an error; nothing was stored."""

    def __init__(self, status: int, error: str, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers or {}


def payload_validate(raw: bytes) -> dict[str, Any]:
    """The request body as a checked dict, or Refusal(400) saying what is wrong."""

    def reject_constant(name: str) -> NoReturn:
        raise ValueError(f"{name} is not JSON")

    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=reject_constant)
    except (UnicodeDecodeError, ValueError) as error:
        raise Refusal(400, "invalid_json", f"the body is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise Refusal(400, "invalid_request", "the body must be a JSON object")
    missing = sorted(FIELDS - data.keys())
    if missing:
        raise Refusal(400, "invalid_request", f"missing field(s): {', '.join(missing)}")
    unknown = sorted(data.keys() - FIELDS)
    if unknown:
        raise Refusal(400, "invalid_request", f"unknown field(s): {', '.join(unknown)}")
    for name in REQUIRED_STRINGS:
        if not isinstance(data[name], str) or not data[name].strip():
            raise Refusal(400, "invalid_request", f"{name} must be a non-empty string")
    if not KEY_RE.fullmatch(data["operation_id"]):
        raise Refusal(400, "invalid_request", "operation_id must be op-v1- and 64 lower-case hex digits")
    versions = data["source_versions"]
    if not isinstance(versions, dict) or not all(
        isinstance(value, int) and not isinstance(value, bool) for value in versions.values()
    ):
        raise Refusal(400, "invalid_request", "source_versions must be an object of {source_id: integer}")
    return data


class Counters:
    """What this process was asked, for /_stats (the stored replies are counted in the file)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.posts = 0
        self.posts_by_key: collections.Counter[str] = collections.Counter()
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.traceparents_by_key: collections.defaultdict[str, list[str]] = collections.defaultdict(list)

    def post(self, key: str | None, traceparent: str | None = None) -> None:
        with self.lock:
            self.posts += 1
            if key:
                self.posts_by_key[key] += 1
                if traceparent:
                    self.traceparents_by_key[key].append(traceparent)

    def outcome(self, name: str) -> None:
        with self.lock:
            self.outcomes[name] += 1

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "posts": self.posts,
                "posts_by_key": dict(self.posts_by_key),
                "outcomes": dict(self.outcomes),
                "traceparents_by_key": {key: list(values) for key, values in self.traceparents_by_key.items()},
            }


class HelpdeskServer(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5: a burst of concurrent senders would see
    # refused or reset connections before any request is read.
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], *, db: Path, token: str, faults: Faults | None, max_body: int = MAX_BODY_BYTES
    ) -> None:
        store.initialise(db)
        self.db = db
        self.pool = store.ConnectionPool(db)
        self.token = token
        self.faults = faults
        self.max_body = max_body
        self.counters = Counters()
        super().__init__(address, Handler)


def _log(line: str) -> None:
    stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    sys.stderr.write(f"{stamp} {line}\n")
    sys.stderr.flush()


class Handler(BaseHTTPRequestHandler):
    server: HelpdeskServer
    protocol_version = "HTTP/1.1"
    server_version = "helpdesk/1"
    # Headers and body go out in two writes; with Nagle's algorithm the second waits for the
    # client's delayed ACK (~40 ms on Linux) on every kept-alive request.
    disable_nagle_algorithm = True
    # Seconds a connection may sit idle or trickle its body before the thread gives it up.
    timeout = 30

    # One line per request is written by _finish; http.server's own line would repeat it.
    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- plumbing ----------------------------------------------------------------------

    def _begin(self) -> None:
        self._started = time.perf_counter()
        self._note = ""
        self._key: str | None = None
        self._body_read = False
        given = (self.headers.get("traceparent") or "").strip().lower()
        self._traceparent = given if TRACEPARENT_RE.fullmatch(given) else None

    def _finish(self, status: int | str) -> None:
        elapsed = (time.perf_counter() - self._started) * 1000
        key = f" key={self._key[:12]}" if self._key else ""
        note = f" {self._note}" if self._note else ""
        trace = f" trace={self._traceparent[3:35]}" if self._traceparent else ""
        _log(f"{self.command} {self.path} {status}{note}{key}{trace} {elapsed:.1f}ms")

    def _send_json(self, status: int, data: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        body = json.dumps(data).encode("utf-8")
        if not self._body_read:
            self._drain()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self._finish(status)

    def _drain(self) -> None:
        """Read and drop a body that was refused unread.

        Left unread, it would be taken for the next request on a kept-alive connection, and
        closing a socket with unread data makes the kernel answer RST, which the client may
        see instead of our answer. A body too large to drain closes the connection.
        """
        self._body_read = True
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if self.headers.get("Transfer-Encoding") or length < 0 or length > DRAIN_LIMIT:
            self.close_connection = True
            return
        while length > 0:
            chunk = self.rfile.read(min(length, 65536))
            if not chunk:
                self.close_connection = True
                return
            length -= len(chunk)

    def _refuse(self, refusal: Refusal) -> None:
        self._note = self._note or refusal.error
        self._send_json(refusal.status, {"error": refusal.error, "detail": refusal.detail}, refusal.headers)

    def _authorise(self) -> None:
        expected = f"Bearer {self.server.token}".encode()
        given = (self.headers.get("Authorization") or "").encode("utf-8", "replace")
        if not hmac.compare_digest(given, expected):
            self.server.counters.outcome("unauthorized")
            raise Refusal(
                401, "unauthorized", "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"}
            )

    def _check_available(self) -> None:
        faults = self.server.faults
        retry_after = faults.take_unavailable() if faults else None
        if retry_after is not None:
            self.server.counters.outcome("unavailable")
            raise Refusal(
                503,
                "unavailable",
                "the helpdesk is unavailable (fault switch); retry later with the same key",
                headers={"Retry-After": str(retry_after)},
            )

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise Refusal(411, "length_required", "send the body with a Content-Length, not chunked")
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            raise Refusal(411, "length_required", "a Content-Length header is required")
        try:
            length = int(length_header)
        except ValueError:
            raise Refusal(400, "invalid_request", "Content-Length is not a number") from None
        if length < 0:
            raise Refusal(400, "invalid_request", "Content-Length is negative")
        if length > self.server.max_body:
            raise Refusal(413, "payload_too_large", f"the body is {length} bytes; the limit is {self.server.max_body}")
        raw = self.rfile.read(length)
        self._body_read = True
        if len(raw) != length:
            raise Refusal(400, "invalid_request", "the body is shorter than its Content-Length")
        return raw

    def _handle(self, route: Any) -> None:
        self._begin()
        try:
            route()
        except Refusal as refusal:
            self._refuse(refusal)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            self._finish("client-gone")
        except Exception:  # noqa: BLE001 (any failure gets a JSON 500, not a dropped connection)
            # A clear 500 and a traceback in the log; any transaction was rolled back, so
            # nothing is half stored.
            traceback.print_exc()
            self.close_connection = True
            self._note = "internal_error"
            self._send_json(500, {"error": "internal_error", "detail": "see the helpdesk's log"})

    def _path(self) -> str:
        return self.path.split("?", 1)[0]

    # -- routes ------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._handle(self._route_get)

    def do_POST(self) -> None:
        self._handle(self._route_post)

    def _method_not_allowed(self) -> None:
        raise Refusal(405, "method_not_allowed", f"{self.command} is not served; see helpdesk/README.md")

    def do_PUT(self) -> None:
        self._handle(self._method_not_allowed)

    do_PATCH = do_DELETE = do_PUT

    def _route_get(self) -> None:
        path = self._path()
        if path == "/healthz":
            self._send_json(200, {"status": "ok"})
        elif path.startswith("/replies/"):
            self._authorise()
            self._lookup(path.removeprefix("/replies/"))
        elif path in ("/_faults", "/_stats") and self.server.faults is not None:
            self._authorise()
            if path == "/_faults":
                self._send_json(200, self.server.faults.snapshot())
            else:
                self._send_json(200, self._stats())
        else:
            raise Refusal(404, "not_found", f"no such path: {path}")

    def _route_post(self) -> None:
        path = self._path()
        if path == "/replies":
            self._authorise()
            self._create()
        elif path == "/_faults" and self.server.faults is not None:
            self._authorise()
            self._set_faults()
        else:
            raise Refusal(404, "not_found", f"no such path: {path}")

    def _create(self) -> None:
        key = self.headers.get("Idempotency-Key")
        self._key = key if key and KEY_RE.fullmatch(key) else None
        self.server.counters.post(self._key, self._traceparent)
        self._check_available()
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        raw = self._read_body()
        if content_type != "application/json":
            raise Refusal(415, "unsupported_media_type", "the body must be sent as application/json")
        if not key:
            raise Refusal(400, "invalid_request", "the Idempotency-Key header is required")
        if self._key is None:
            raise Refusal(400, "invalid_request", "Idempotency-Key must be op-v1- and 64 lower-case hex digits")
        payload = payload_validate(raw)
        if payload["operation_id"] != key:
            raise Refusal(422, "idempotency_key_mismatch", "Idempotency-Key must equal the body's operation_id")
        if self.server.faults is not None and self.server.faults.take_ticket_closed():
            # Like a helpdesk that checks the ticket before the key: a closed ticket refuses
            # even a resend of a reply it already holds.
            self.server.counters.outcome("ticket_closed")
            raise Refusal(422, "ticket_closed", f"ticket {payload['case_id']} is closed; no reply can be added")

        with self.server.pool.connection() as conn:
            outcome, reply = store.reply_store(conn, payload=payload)
        self.server.counters.outcome(outcome.value)
        self._note = outcome.value
        if outcome is store.Outcome.CONFLICT:
            raise Refusal(
                422,
                "idempotency_key_reused",
                f"this key already holds reply {reply.reference} with another body; a new reply needs a new key",
            )
        faults = self.server.faults
        if faults is not None:
            if faults.delay_s:
                time.sleep(faults.delay_s)
            if faults.take_drop():
                # The reply is committed; the sender hears nothing and must find out.
                self.server.counters.outcome("dropped")
                self.close_connection = True
                self._finish("dropped")
                return
        status = 201 if outcome is store.Outcome.CREATED else 200
        self._send_json(status, {**reply.as_json(), "replay": outcome is store.Outcome.REPLAYED})

    def _lookup(self, operation_id: str) -> None:
        self._key = operation_id if KEY_RE.fullmatch(operation_id) else None
        self._check_available()
        reply = None
        if self._key:
            with self.server.pool.connection() as conn:
                reply = store.reply_get(conn, operation_id=operation_id)
        faults = self.server.faults
        if reply is not None and faults is not None and time.time() - reply.created_ts < faults.lookup_lag_s:
            self._note = "lagging"
            reply = None
        if reply is None:
            raise Refusal(404, "not_found", "no reply is stored under this operation id")
        self._send_json(200, reply.as_json())

    def _set_faults(self) -> None:
        assert self.server.faults is not None
        try:
            data = json.loads(self._read_body() or b"{}")
        except (UnicodeDecodeError, ValueError) as error:
            raise Refusal(400, "invalid_json", f"the body is not JSON: {error}") from None
        if not isinstance(data, dict):
            raise Refusal(400, "invalid_request", "the body must be a JSON object of switches")
        reset = data.pop("reset", False)
        if not isinstance(reset, bool):
            raise Refusal(400, "invalid_request", "reset must be true or false")
        try:
            self.server.faults.update(data, reset=reset)
        except FaultError as error:
            raise Refusal(400, "invalid_fault", str(error)) from None
        self._send_json(200, self.server.faults.snapshot())

    def _stats(self) -> dict[str, Any]:
        assert self.server.faults is not None
        with self.server.pool.connection() as conn:
            summary = store.replies_summary(conn)
        return {
            **summary,
            **self.server.counters.snapshot(),
            "faults": self.server.faults.snapshot(),
            "pid": os.getpid(),
        }


# -- the command line --------------------------------------------------------------------


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parser_build() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="python -m helpdesk",
        description="The reference helpdesk that decisionflow delivers approved replies to (helpdesk/README.md).",
    )
    parser.add_argument("--host", default=env.get("HELPDESK_HOST", "127.0.0.1"), help="default 127.0.0.1")
    parser.add_argument(
        "--port", type=int, default=int(env.get("HELPDESK_PORT", DEFAULT_PORT)), help="0 picks a free port"
    )
    parser.add_argument("--db", type=Path, default=Path(env.get("HELPDESK_DB", DEFAULT_DB)))
    parser.add_argument("--token", default=env.get("HELPDESK_TOKEN"), help="the bearer token (or HELPDESK_TOKEN)")
    parser.add_argument(
        "--faults",
        action="store_true",
        default=env.get("HELPDESK_FAULTS", "") not in ("", "0"),
        help="enable the fault switches, /_faults and /_stats (tests and the demo only)",
    )
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    parser.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    switches = parser.add_argument_group("fault switches at start-up (need --faults; also HELPDESK_<NAME>)")
    for name in SWITCHES:
        switches.add_argument(_flag(name), dest=name, default=env.get(f"HELPDESK_{name.upper()}"))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = parser_build()
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("a bearer token is required: --token or HELPDESK_TOKEN")
    initial = {name: getattr(args, name) for name in SWITCHES if getattr(args, name) is not None}
    faults: Faults | None = None
    if args.faults:
        faults = Faults()
        try:
            faults.update(initial)
        except FaultError as error:
            parser.error(str(error))
    elif initial:
        parser.error(f"fault switches ({', '.join(sorted(initial))}) need --faults")

    try:
        server = HelpdeskServer((args.host, args.port), db=args.db, token=args.token, faults=faults)
    except (OSError, sqlite3.Error) as error:
        # A port in use, a database file that cannot be opened: one line, no traceback.
        _log(f"helpdesk: cannot start on {args.host}:{args.port} with {args.db}: {error}")
        return 1
    port = server.server_address[1]

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    if args.port_file:
        # Written whole, then renamed: a reader never sees half a number.
        partial = args.port_file.with_name(args.port_file.name + ".partial")
        partial.write_text(str(port))
        partial.replace(args.port_file)
    _log(
        f"helpdesk listening on http://{args.host}:{port} (db {args.db}, faults {'on' if faults else 'off'}, pid {os.getpid()})"
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.pool.close()
        _log("helpdesk stopped")
    return 0
