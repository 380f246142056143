"""The load balancer's config, quick version: deploy/haproxy.cfg as reliability/balancer.py
renders it, checked by Debian's haproxy and run in front of two tiny backends.

``make reliability`` runs the real thing (three gunicorn hosts, PgBouncer, one host killed:
reliability/balancer.py). Here: the rendered config keeps every setting of the example and
changes only the addresses, the log and the stats socket; haproxy accepts it; and, run for a
second or two, it answers through the live backend when the other one is gone (the example's
``retry-on conn-failure`` and ``option redispatch``), and its log says which backend answered.

haproxy comes from `make haproxy`; without it the last two skip (they fail when
``DECISIONFLOW_REQUIRE_POSTGRES=1``, as in CI, like the pooler's).
"""

from __future__ import annotations

import http.client
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reliability import balancer


@pytest.fixture
def haproxy_installed() -> str:
    found = balancer.binary()
    if found is None:
        message = "haproxy is not installed: `make haproxy` installs Debian's package (as root)"
        if os.environ.get("DECISIONFLOW_REQUIRE_POSTGRES") == "1":
            pytest.fail(message + ", and DECISIONFLOW_REQUIRE_POSTGRES=1 requires it")
        pytest.skip(message)
    return found


def test_render_changes_only_addresses_log_and_socket(tmp_path):
    example = balancer.EXAMPLE.read_text()
    rendered = balancer.render(port=18080, backends=[18001, 18002], maxconn=5, stats_socket=tmp_path / "s.sock")
    servers = [line.split() for line in rendered.splitlines() if line.strip().startswith("server ")]
    assert [s[1:3] for s in servers] == [["web1", "127.0.0.1:18001"], ["web2", "127.0.0.1:18002"]]
    assert "    bind 127.0.0.1:18080" in rendered.splitlines()
    assert f"stats socket {tmp_path / 's.sock'} " in rendered
    assert "log stdout format raw local0" in rendered
    assert "default-server check inter 1s fall 2 rise 2 maxconn 5" in rendered
    assert "10.0.0." not in rendered and "/dev/log" not in rendered and " ssl crt " not in rendered
    changed = ("server ", "bind ", "stats socket ", "log /dev/log", "default-server ")
    kept = [line for line in example.splitlines() if not line.strip().startswith(changed)]
    assert [line for line in kept if line not in rendered.splitlines()] == []
    assert "http-check send meth GET uri /readyz" in rendered


def test_render_refuses_an_example_it_cannot_place_its_addresses_in(tmp_path):
    example = "".join(line for line in balancer.EXAMPLE.read_text().splitlines(True) if "bind " not in line)
    with pytest.raises(ValueError, match="bind"):
        balancer.render(port=1, backends=[2], maxconn=1, stats_socket=tmp_path / "s", example=example)


def test_haproxy_accepts_the_rendered_config(haproxy_installed, tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text(balancer.render(port=18080, backends=[18001], maxconn=8, stats_socket=tmp_path / "s.sock"))
    checked = subprocess.run([haproxy_installed, "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


class _Backend(BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(0.2)  # long enough that a second request at once finds this one busy
        body = f'{{"port": {self.server.server_address[1]}}}'.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_backend_gone_costs_no_answer_the_other_gives_it(haproxy_installed, tmp_path):
    backends = [ThreadingHTTPServer((balancer.HOST, 0), _Backend) for _ in range(2)]
    threads = [threading.Thread(target=b.serve_forever, daemon=True) for b in backends]
    for t in threads:
        t.start()
    ports = [b.server_address[1] for b in backends]
    lb = balancer.HAProxy(backends=ports, maxconn=4, log_path=tmp_path / "haproxy.log").start()
    try:
        backends[1].shutdown()
        backends[1].server_close()  # connections to it are refused from now on
        answers = []

        def ask():
            conn = http.client.HTTPConnection(balancer.HOST, lb.port, timeout=10)
            conn.request("GET", "/api/cases/X")
            response = conn.getresponse()
            answers.append((response.status, response.read()))
            conn.close()

        for _ in range(3):
            # Two at once: leastconn gives the second to web2, the one with no connection.
            pair = [threading.Thread(target=ask) for _ in range(2)]
            for t in pair:
                t.start()
            for t in pair:
                t.join(20)
    finally:
        lb.stop()
        backends[0].shutdown()
        backends[0].server_close()
    assert answers == [(200, f'{{"port": {ports[0]}}}'.encode())] * 6
    logged = balancer.read_log(tmp_path / "haproxy.log")
    assert [(r["server"], r["status"], r["method"], r["path"]) for r in logged] == [
        ("web1", 200, "GET", "/api/cases/X")
    ] * 6
    # Each sent to web2 first found it gone and was resent to web1, where it is logged.
    assert any(r["redispatched"] for r in logged)


def test_run_only_balancer_rewrites_its_own_section_and_no_other(tmp_path, monkeypatch):
    from reliability import run

    doc = tmp_path / "RELIABILITY.md"
    doc.write_text("# Reliability\n\n## Load\n\nkept\n\n## Bad input\n\nkept too\n")
    monkeypatch.setattr(run, "DOC", doc)
    run.splice(["", "## Behind a load balancer", "", "first"])
    assert (
        doc.read_text()
        == "# Reliability\n\n## Load\n\nkept\n\n## Behind a load balancer\n\nfirst\n\n## Bad input\n\nkept too\n"
    )
    run.splice(["", "## Behind a load balancer", "", "second", ""])
    assert (
        doc.read_text()
        == "# Reliability\n\n## Load\n\nkept\n\n## Behind a load balancer\n\nsecond\n\n## Bad input\n\nkept too\n"
    )
