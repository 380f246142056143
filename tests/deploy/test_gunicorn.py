"""The shipped deployment, booted: gunicorn with deploy/gunicorn.conf.py, DEBUG=0, PostgreSQL.

collectstatic, then gunicorn with the shipped config (two workers, the JSON access log, the
metrics folder), then what an operator and a client do: /readyz, a static file through
WhiteNoise, a login to the admin, an approval through the API, and /metrics showing the
committed decision counted. PostgreSQL only: production's database, and the test database
must be reachable from the server processes (DATABASE_URL is the one this run uses).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import pytest

from tests.conftest import ROOT, database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

HOST = "127.0.0.1"
TOKEN = secrets.token_urlsafe(24)
COMMITTED = 'decisionflow_decisions_total{channel="api",outcome="committed"}'


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Browser:
    """Requests over plain HTTP as if behind the TLS proxy (X-Forwarded-Proto: https), with cookies."""

    def __init__(self, port: int):
        self.port = port
        self.cookies: dict[str, str] = {}

    def request(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection(HOST, self.port, timeout=30)
        origin = f"https://{HOST}:{self.port}"
        sent = {"Host": f"{HOST}:{self.port}", "X-Forwarded-Proto": "https", "Referer": origin + path}
        if method == "POST":
            sent["Origin"] = origin
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        sent.update(headers or {})
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        for header in response.headers.get_all("Set-Cookie") or []:
            for name, morsel in SimpleCookie(header).items():
                self.cookies[name] = morsel.value
        return response.status, response.headers, data


def wait_ready(port: int, proc: subprocess.Popen, log_path, timeout: float = 40) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"gunicorn exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
        try:
            status, _headers, data = Browser(port).request("GET", "/readyz")
            if status == 200:
                return json.loads(data)
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"gunicorn never became ready:\n{log_path.read_text()[-3000:]}")


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_gunicorn_with_the_shipped_config_serves_admin_api_and_metrics(tmp_path, case, make_user):
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    from api.services import token_create

    reviewer = make_user("deploy-reviewer")
    # The tests' MD5 hasher is not one production settings accept; a cheap PBKDF2 hash is.
    reviewer.password = PBKDF2PasswordHasher().encode("pw-deploy-T1042", "deploysalt1234", iterations=1000)
    reviewer.save(update_fields=["password"])
    api_token = token_create(user=reviewer, name="deploy test")[1]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DECISIONFLOW_", "GUNICORN_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="decisionflow.settings",  # production's, not the tests'
        DATABASE_URL=database_url(),
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS=HOST,
        STATIC_ROOT=str(tmp_path / "static"),
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"),
        DECISIONFLOW_METRICS_TOKEN=TOKEN,
        GUNICORN_BIND=f"{HOST}:{port}",
        GUNICORN_WORKERS="2",
        GUNICORN_THREADS="2",
    )
    collected = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert collected.returncode == 0, collected.stderr
    out, err = tmp_path / "gunicorn.out", tmp_path / "gunicorn.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py"],
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        ready = wait_ready(port, proc, err)
        assert ready["checks"]["migrations"] == {"ok": True}

        browser = Browser(port)
        # The admin's login page, with its stylesheet under a hashed name served by WhiteNoise.
        status, _headers, page = browser.request("GET", "/admin/login/?next=/admin/")
        assert status == 200, page[:500]
        css = re.search(rb'href="(/static/admin/css/base\.[0-9a-f]{12}\.css)"', page)
        assert css, "the admin page does not use the hashed static names"
        status, headers, _css = browser.request("GET", css.group(1).decode())
        assert status == 200 and "max-age=315360000" in headers["Cache-Control"]

        csrf = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1).decode()
        form = urlencode(
            {
                "csrfmiddlewaretoken": csrf,
                "username": "deploy-reviewer",
                "password": "pw-deploy-T1042",
                "next": "/admin/",
            }
        )
        status, headers, _ = browser.request(
            "POST", "/admin/login/", form, {"Content-Type": "application/x-www-form-urlencoded"}
        )
        assert status == 302 and headers["Location"] == "/admin/", headers
        status, _headers, page = browser.request("GET", "/admin/")
        assert status == 200 and b"deploy-reviewer" in page

        scraper = Browser(port)
        status, _h, data = scraper.request("GET", "/metrics")
        assert status == 403  # no token
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, _h, data = scraper.request("GET", "/metrics", headers=auth)
        assert status == 200
        before = metric(data.decode(), COMMITTED)

        # Approve through the API, as automation does.
        client = Browser(port)
        bearer = {"Authorization": f"Bearer {api_token}"}
        status, _h, data = client.request("GET", f"/api/cases/{case.case_id}", headers=bearer)
        assert status == 200, data[:500]
        operation_id = json.loads(data)["operation_id"]
        body = json.dumps({"operation_id": operation_id, "approved": True})
        status, _h, data = client.request(
            "POST",
            f"/api/cases/{case.case_id}/decision",
            body,
            {**bearer, "Content-Type": "application/json"},
        )
        assert status == 200, data[:500]
        assert json.loads(data)["outcome"] == "committed"

        status, _h, data = scraper.request("GET", "/metrics", headers=auth)
        text = data.decode()
        assert metric(text, COMMITTED) == before + 1
        assert metric(text, 'decisionflow_commit_seconds_count{outcome="committed"}') >= 1
        assert "django_http_requests_total_by_method_total" in text and "django_db_execute_total" in text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    # The access log is one JSON object per request; the decision left one JSON event line.
    access = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
    decision_posts = [a for a in access if a["path"] == f"/api/cases/{case.case_id}/decision"]
    assert len(decision_posts) == 1 and decision_posts[0]["status"] == 200
    assert {"ts", "remote_addr", "method", "status", "duration_ms", "bytes"} <= set(decision_posts[0])
    events = [json.loads(line) for line in err.read_text().splitlines() if '"event":"decision"' in line]
    assert len(events) == 1
    assert events[0]["outcome"] == "committed" and events[0]["channel"] == "api"
    assert events[0]["actor"] == "deploy-reviewer" and events[0]["operation_id"] == operation_id
    assert api_token not in err.read_text() + out.read_text()  # no secret in any log
