"""The reference helpdesk (helpdesk/), driven over HTTP as its own process.

The assertions read the helpdesk's SQLite file directly, so "nothing stored" and "one reply"
are checked in the table, not taken from the helpdesk's own answers.
"""

from __future__ import annotations

import http.client
import json
import secrets
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from helpdesk.testing import ROOT, Helpdesk, HelpdeskError, accept_rate, running_helpdesk


def new_key() -> str:
    return secrets.token_hex(32)


def payload(key: str, *, body: str = "Your refund was approved.", case_id: str = "case-1") -> dict:
    return {
        "case_id": case_id,
        "operation_id": key,
        "body": body,
        "evidence_id": "ev-1",
        "policy_id": "refunds-v3",
        "source_versions": {"orders": 3, "refund-policy": 7},
    }


def rows(helpdesk: Helpdesk, key: str | None = None) -> list[tuple]:
    with sqlite3.connect(helpdesk.db) as conn:
        if key is None:
            return conn.execute("SELECT idempotency_key, case_id, body FROM replies").fetchall()
        return conn.execute(
            "SELECT idempotency_key, case_id, body FROM replies WHERE idempotency_key = ?", (key,)
        ).fetchall()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with running_helpdesk(tmp_path_factory.mktemp("helpdesk")) as helpdesk:
        yield helpdesk


@pytest.fixture
def helpdesk(shared):
    shared.set_faults(reset=True)
    yield shared
    shared.set_faults(reset=True)


# -- idempotency ---------------------------------------------------------------------------


def test_same_key_same_body_gives_the_same_reference_and_one_row(helpdesk):
    key = new_key()
    first = helpdesk.post_reply(payload(key))
    assert first.status == 201
    assert first.json["replay"] is False
    assert first.json["reference"].startswith("HD-")
    assert first.json["operation_id"] == key
    assert first.json["case_id"] == "case-1"

    # The same body with its keys in another order and other spacing is the same body.
    reordered = json.dumps(dict(reversed(list(payload(key).items()))), indent=2).encode()
    second = helpdesk.request(
        "POST", "/replies", body=reordered, headers={"Idempotency-Key": key, "Content-Type": "application/json"}
    )
    assert second.status == 200
    assert second.json == {**first.json, "replay": True}
    assert rows(helpdesk, key) == [(key, "case-1", "Your refund was approved.")]


def test_same_key_with_another_body_is_refused_and_stores_nothing(helpdesk):
    key = new_key()
    assert helpdesk.post_reply(payload(key)).status == 201
    before = len(rows(helpdesk))

    refused = helpdesk.post_reply(payload(key, body="Your refund was declined."))
    assert refused.status == 422
    assert refused.json["error"] == "idempotency_key_reused"
    assert "HD-" in refused.json["detail"]
    assert rows(helpdesk, key) == [(key, "case-1", "Your refund was approved.")]
    assert len(rows(helpdesk)) == before


def test_the_lookup_finds_a_reply_by_its_key_and_says_not_found_otherwise(helpdesk):
    key = new_key()
    created = helpdesk.post_reply(payload(key)).json
    found = helpdesk.lookup(key)
    assert found.status == 200
    assert found.json == {name: value for name, value in created.items() if name != "replay"}

    missing = helpdesk.lookup(new_key())
    assert (missing.status, missing.json["error"]) == (404, "not_found")
    assert helpdesk.lookup("not-a-key").status == 404


def race(calls):
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(index, call):
        barrier.wait()
        try:
            results[index] = call()
        except Exception as error:
            results[index] = error

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_twenty_identical_posts_from_threads_store_one_reply(helpdesk):
    key = new_key()
    results = race([lambda: helpdesk.post_reply(payload(key))] * 20)
    assert all(not isinstance(result, Exception) for result in results), results
    assert Counter(result.status for result in results) == {201: 1, 200: 19}
    assert len({result.json["reference"] for result in results}) == 1
    assert len(rows(helpdesk, key)) == 1


CLIENT = """
import json, sys, threading, time, urllib.request
url, token, key, body, start_at = sys.argv[1:6]
out = []
def post():
    request = urllib.request.Request(url + "/replies", data=body.encode(), method="POST", headers={
        "Authorization": "Bearer " + token, "Idempotency-Key": key, "Content-Type": "application/json"})
    while time.time() < float(start_at):
        pass
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            out.append([response.status, json.loads(response.read())["reference"]])
    except Exception as error:
        out.append([repr(error), None])
threads = [threading.Thread(target=post) for _ in range(10)]
[thread.start() for thread in threads]
[thread.join() for thread in threads]
print(json.dumps(out))
"""


def test_twenty_identical_posts_from_two_processes_to_two_helpdesks_on_one_file_store_one_reply(tmp_path):
    # Two helpdesk processes on one SQLite file, each sent 10 concurrent POSTs by its own
    # client process: only the database's UNIQUE key and the IMMEDIATE transaction can
    # keep it to one reply.
    with (
        running_helpdesk(tmp_path / "a") as first,
        running_helpdesk(tmp_path / "b", db=first.db) as second,
    ):
        key = new_key()
        body = json.dumps(payload(key))
        start_at = str(time.time() + 0.5)
        clients = [
            subprocess.Popen(
                [sys.executable, "-c", CLIENT, helpdesk.url, helpdesk.token, key, body, start_at],
                stdout=subprocess.PIPE,
                text=True,
            )
            for helpdesk in (first, second)
        ]
        results = [item for client in clients for item in json.loads(client.communicate(timeout=60)[0])]
        assert len(results) == 20
        assert Counter(status for status, _ in results) == {201: 1, 200: 19}, results
        assert len({reference for _, reference in results}) == 1
        assert len(rows(first, key)) == 1
        assert first.stats()["posts"] + second.stats()["posts"] == 20


def test_a_duplicate_under_fresh_keys_is_counted(helpdesk):
    # The naive sender (a fresh key per try) makes a second reply; /_stats says so.
    before = helpdesk.stats()["duplicate_replies"]
    case_id = f"case-{new_key()[:8]}"
    helpdesk.post_reply(payload(new_key(), case_id=case_id))
    helpdesk.post_reply(payload(new_key(), case_id=case_id))
    stats = helpdesk.stats()
    assert stats["duplicate_replies"] == before + 1
    assert stats["replies_by_case"][case_id] == 2


# -- auth and bad input --------------------------------------------------------------------


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "t", "Basic dDp0"])
def test_a_missing_or_wrong_token_is_refused_and_stores_nothing(helpdesk, authorization):
    key = new_key()
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    if authorization:
        headers["Authorization"] = authorization
    response = helpdesk.request("POST", "/replies", body=json.dumps(payload(key)).encode(), headers=headers, auth=False)
    assert response.status == 401
    assert response.json["error"] == "unauthorized"
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert rows(helpdesk, key) == []

    lookup_headers = {"Authorization": authorization} if authorization else {}
    assert helpdesk.request("GET", f"/replies/{key}", headers=lookup_headers, auth=False).status == 401


def _bad(key: str) -> dict[str, tuple[bytes, dict, int, str]]:
    good = payload(key)
    json_headers = {"Idempotency-Key": key, "Content-Type": "application/json"}

    def body(**changes):
        return json.dumps({**good, **changes}).encode()

    return {
        "not json": (b"{not json", json_headers, 400, "invalid_json"),
        "not utf-8": (b'{"case_id": "\xff"}', json_headers, 400, "invalid_json"),
        "NaN": (body().replace(b'"orders": 3', b'"orders": NaN'), json_headers, 400, "invalid_json"),
        "a list": (b"[]", json_headers, 400, "invalid_request"),
        "a missing field": (
            json.dumps({k: v for k, v in good.items() if k != "body"}).encode(),
            json_headers,
            400,
            "invalid_request",
        ),
        "an unknown field": (body(extra=1), json_headers, 400, "invalid_request"),
        "case_id a number": (body(case_id=5), json_headers, 400, "invalid_request"),
        "body empty": (body(body="  "), json_headers, 400, "invalid_request"),
        "source_versions a list": (body(source_versions=[1]), json_headers, 400, "invalid_request"),
        "a version a string": (body(source_versions={"orders": "3"}), json_headers, 400, "invalid_request"),
        "a version a boolean": (body(source_versions={"orders": True}), json_headers, 400, "invalid_request"),
        "no key header": (body(), {"Content-Type": "application/json"}, 400, "invalid_request"),
        "an upper-case key": (body(), {**json_headers, "Idempotency-Key": key.upper()}, 400, "invalid_request"),
        "key and operation_id differ": (
            body(),
            {**json_headers, "Idempotency-Key": new_key()},
            422,
            "idempotency_key_mismatch",
        ),
        "not application/json": (body(), {**json_headers, "Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        "oversized": (body(body="x" * (256 * 1024)), json_headers, 413, "payload_too_large"),
    }


@pytest.mark.parametrize("case", list(_bad("0" * 64)))
def test_bad_input_gets_a_clear_json_error_and_stores_nothing(helpdesk, case):
    key = new_key()
    raw, headers, status, error = _bad(key)[case]
    before = len(rows(helpdesk))
    response = helpdesk.request("POST", "/replies", body=raw, headers=headers)
    assert (response.status, response.json["error"]) == (status, error), response.json
    assert response.json["detail"]
    assert len(rows(helpdesk)) == before
    # The connection and the server survive it: the good request then works.
    assert helpdesk.post_reply(payload(key)).status == 201


@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE"])
def test_other_methods_are_refused_in_json(helpdesk, method):
    key = new_key()
    response = helpdesk.request(method, "/replies", body=json.dumps(payload(key)).encode())
    assert (response.status, response.json["error"]) == (405, "method_not_allowed")
    assert rows(helpdesk, key) == []


# -- fault switches ------------------------------------------------------------------------


def test_drop_after_commit_commits_then_drops_and_the_lookup_finds_the_reply(helpdesk):
    key = new_key()
    helpdesk.set_faults(drop_after_commit=1)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        helpdesk.post_reply(payload(key))
    assert len(rows(helpdesk, key)) == 1
    found = helpdesk.lookup(key)
    assert found.status == 200
    # The resend with the same key is answered, as a replay of the same reply.
    again = helpdesk.post_reply(payload(key))
    assert (again.status, again.json["replay"], again.json["reference"]) == (200, True, found.json["reference"])
    assert len(rows(helpdesk, key)) == 1
    assert helpdesk.stats()["outcomes"]["dropped"] >= 1


def test_drop_after_commit_by_probability(helpdesk):
    helpdesk.set_faults(drop_after_commit_probability=1.0)
    keys = [new_key() for _ in range(3)]
    for key in keys:
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            helpdesk.post_reply(payload(key))
    assert all(len(rows(helpdesk, key)) == 1 for key in keys)


def test_delay_answers_late_after_the_commit(helpdesk):
    key = new_key()
    helpdesk.set_faults(delay_ms=400)
    with pytest.raises(TimeoutError):
        helpdesk.post_reply(payload(key), timeout=0.1)
    # The sender gave up, but the reply is there already.
    assert len(rows(helpdesk, key)) == 1
    assert helpdesk.lookup(key).status == 200


def test_unavailable_count_answers_503_and_stores_nothing(helpdesk):
    key = new_key()
    helpdesk.set_faults(unavailable_count=2)
    for _ in range(2):
        response = helpdesk.post_reply(payload(key))
        assert (response.status, response.json["error"]) == (503, "unavailable")
        assert response.headers["Retry-After"] == "1"
        assert rows(helpdesk, key) == []
    assert helpdesk.post_reply(payload(key)).status == 201


def test_a_closed_ticket_refuses_even_a_resend_of_a_stored_reply_and_stores_nothing(helpdesk):
    stored, fresh = new_key(), new_key()
    assert helpdesk.post_reply(payload(stored)).status == 201
    helpdesk.set_faults(ticket_closed_count=2)
    for key in (stored, fresh):
        response = helpdesk.post_reply(payload(key))
        assert (response.status, response.json["error"]) == (422, "ticket_closed")
    # The stored reply stands, the new one was not stored, and the switch is used up.
    assert len(rows(helpdesk, stored)) == 1 and rows(helpdesk, fresh) == []
    assert helpdesk.lookup(stored).status == 200
    assert helpdesk.stats()["outcomes"]["ticket_closed"] == 2
    assert helpdesk.post_reply(payload(stored)).status == 200


def test_unavailable_for_a_while_answers_503_to_posts_and_lookups_then_recovers(helpdesk):
    key = new_key()
    helpdesk.set_faults(unavailable_for_s=0.5)
    response = helpdesk.post_reply(payload(key))
    assert response.status == 503
    assert int(response.headers["Retry-After"]) >= 1
    assert helpdesk.lookup(key).status == 503
    assert helpdesk.request("GET", "/healthz").status == 200
    assert rows(helpdesk, key) == []
    deadline = time.monotonic() + 5
    while (response := helpdesk.post_reply(payload(key))).status == 503:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert response.status == 201
    assert len(rows(helpdesk, key)) == 1


def test_a_lagging_lookup_says_not_found_then_finds_the_reply(helpdesk):
    key = new_key()
    helpdesk.set_faults(lookup_lag_s=0.4)
    assert helpdesk.post_reply(payload(key)).status == 201
    assert len(rows(helpdesk, key)) == 1
    assert helpdesk.lookup(key).status == 404  # stored, but the lookup lags
    deadline = time.monotonic() + 5
    while (found := helpdesk.lookup(key)).status == 404:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert found.status == 200


@pytest.mark.parametrize(
    "switches",
    [
        {"no_such_switch": 1},
        {"delay_ms": -1},
        {"delay_ms": 1.5},
        {"delay_ms": True},
        {"drop_after_commit_probability": 2},
    ],
)
def test_a_wrong_fault_setting_is_refused_and_changes_nothing(helpdesk, switches):
    helpdesk.set_faults(delay_ms=5)
    with pytest.raises(HelpdeskError, match="400"):
        helpdesk.set_faults(unavailable_count=3, **switches)
    assert helpdesk.set_faults()["unavailable_count"] == 0
    assert helpdesk.set_faults()["delay_ms"] == 5


def test_faults_and_stats_are_not_found_without_the_faults_flag(tmp_path):
    with running_helpdesk(tmp_path, faults=False) as helpdesk:
        assert helpdesk.request("POST", "/_faults", body=b'{"drop_after_commit": 1}').status == 404
        assert helpdesk.request("GET", "/_faults").status == 404
        assert helpdesk.request("GET", "/_stats").status == 404
        key = new_key()
        assert helpdesk.post_reply(payload(key)).status == 201


def test_fault_switches_at_start_up_from_flags_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HELPDESK_LOOKUP_LAG_S", "30")
    with running_helpdesk(tmp_path, extra_args=["--unavailable-count", "1"]) as helpdesk:
        key = new_key()
        assert helpdesk.post_reply(payload(key)).status == 503
        assert helpdesk.post_reply(payload(key)).status == 201
        assert helpdesk.lookup(key).status == 404
        assert helpdesk.stats()["faults"]["lookup_lag_s"] == 30.0


def run_helpdesk(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "helpdesk", "--port", "0", *args],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        capture_output=True,
        text=True,
        timeout=10,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "a bearer token is required"),
        (("--token", "t", "--delay-ms", "5"), "need --faults"),
        (("--token", "t", "--faults", "--delay-ms", "soon"), "delay_ms must be an integer"),
    ],
)
def test_start_up_refuses_a_wrong_command_line_with_a_clear_message(tmp_path, args, message):
    result = run_helpdesk("--db", str(tmp_path / "h.sqlite3"), *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_port_in_use_or_an_unusable_file_is_one_clear_line(tmp_path, shared):
    result = run_helpdesk("--token", "t", "--db", str(tmp_path / "h.sqlite3"), "--port", str(shared.port))
    assert (result.returncode, "Traceback" in result.stderr) == (1, False)
    assert "cannot start" in result.stderr and "in use" in result.stderr

    (tmp_path / "a-directory").mkdir()
    result = run_helpdesk("--token", "t", "--db", str(tmp_path / "a-directory"))
    assert (result.returncode, "Traceback" in result.stderr) == (1, False)
    assert "cannot start" in result.stderr


def test_sigterm_stops_it_cleanly_and_each_request_is_logged(tmp_path):
    with running_helpdesk(tmp_path) as helpdesk:
        key = new_key()
        helpdesk.post_reply(payload(key))
        assert helpdesk.stop() == 0
    log = helpdesk.log.read_text()
    assert "helpdesk listening on http://127.0.0.1:" in log
    assert f"POST /replies 201 created key={key[:12]}" in log
    assert "helpdesk stopped" in log
    assert "Traceback" not in log


def test_a_restart_keeps_the_port_and_the_replies(tmp_path):
    with running_helpdesk(tmp_path) as helpdesk:
        key = new_key()
        reference = helpdesk.post_reply(payload(key)).json["reference"]
        port = helpdesk.port
        helpdesk.kill()
        helpdesk.start()
        assert helpdesk.port == port
        again = helpdesk.post_reply(payload(key))
        assert (again.status, again.json["reference"]) == (200, reference)


def test_the_helpdesk_loads_nothing_of_decisionflow():
    # import-linter checks the imports; this checks what a running helpdesk has loaded.
    code = (
        "import sys, helpdesk.server, helpdesk.testing;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'decisionflow', 'cases', 'reviews', 'effects', 'api', 'django'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=10)
    assert result.stdout.strip() == "[]", result.stderr


def test_the_accept_rate_baseline_stores_what_it_counts(helpdesk):
    before = helpdesk.stats()["replies_by_case"].get("bench-baseline", 0)
    assert accept_rate(helpdesk, replies=20) > 0
    assert helpdesk.stats()["replies_by_case"]["bench-baseline"] == before + 20
