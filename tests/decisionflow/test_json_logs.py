"""LOG_FORMAT=json: a request line names the request as ``METHOD /path``, never an object's repr.

The development server (django.server) logs each request with its socket as the ``request``
extra, and Django's request logger with the HttpRequest; both become ``"GET /path"``, without
the query string. Once through the formatter, once through a real ``runserver``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from django.test import RequestFactory

from core.observability import JsonFormatter
from tests.conftest import ROOT


def _formatted(**extra) -> dict:
    record = logging.LogRecord("django.server", logging.WARNING, __file__, 1, '"%s" %s %s', (), None)
    record.args = extra.pop("args", ())
    record.__dict__.update(extra)
    return json.loads(JsonFormatter().format(record))


def test_the_development_servers_socket_becomes_the_request_line():
    with socket.socket() as sock:
        line = _formatted(
            request=sock, server_time="x", status_code=404, args=("GET /admin/?token=abc HTTP/1.1", "404", "179")
        )
    assert line["request"] == "GET /admin/"
    assert line["status_code"] == 404 and line["message"] == '"GET /admin/?token=abc HTTP/1.1" 404 179'
    assert "socket" not in json.dumps(line)


def test_an_http_request_becomes_its_method_and_path():
    request = RequestFactory().post("/api/cases/T-1042/decision?x=1")
    assert _formatted(request=request, status_code=400)["request"] == "POST /api/cases/T-1042/decision"


def test_a_request_extra_with_nothing_to_show_is_dropped():
    line = _formatted(request=object(), args=())
    assert "request" not in line and "object at" not in json.dumps(line)


def test_runserver_writes_its_request_lines_as_json_with_method_and_path(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR")}
    env.update(DEBUG="1", LOG_FORMAT="json", DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", PYTHONUNBUFFERED="1")
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # runserver logs a request line after the response has gone out: read its stderr as it
    # comes, and stop it only once that line is there (or 30 s have passed), not as soon as
    # the client has its answer.
    collected: list[str] = []
    logged = threading.Event()

    def read() -> None:
        assert server.stderr is not None
        for line in server.stderr:
            collected.append(line)
            if '"logger":"django.server"' in line:
                logged.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/no-such-page?token=abc", timeout=5)
            except urllib.error.HTTPError as exc:
                assert exc.code == 404
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "runserver did not answer"
                time.sleep(0.2)
        logged.wait(30)
    finally:
        server.terminate()
        server.wait(timeout=30)
        reader.join(timeout=30)
    err = "".join(collected)
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    served = [line for line in lines if line["logger"] == "django.server"]
    assert served, err[-2000:]
    assert {line["request"] for line in served} == {"GET /no-such-page"}
    assert "<socket" not in err and "token=abc" not in json.dumps([line.get("request") for line in lines])
