"""Start a reference helpdesk for a test, and talk to it (standard library only).

    from helpdesk.testing import running_helpdesk

    def test_delivery(tmp_path):
        with running_helpdesk(tmp_path) as helpdesk:
            settings.DECISIONFLOW_DELIVERY_URL = helpdesk.url
            helpdesk.set_faults(drop_after_commit=1)
            ...
            assert helpdesk.stats()["duplicate_replies"] == 0

The helpdesk runs as its own process (`python -m helpdesk`) on a free port with its own
SQLite file in tmp_path; its log is tmp_path / "helpdesk.log".
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 10.0


class HelpdeskError(RuntimeError):
    """The helpdesk did not start, or answered a control request with an error."""


@dataclass
class HelpdeskResponse:
    status: int
    json: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Helpdesk:
    """A running helpdesk process: its url, token and database, and its control calls."""

    directory: Path
    token: str
    faults: bool
    db: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    extra_args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.directory / "helpdesk.log"

    # -- the process ---------------------------------------------------------------------

    def start(self, *, timeout: float = START_TIMEOUT_S) -> None:
        """Start the process (on the same port again after stop/kill) and wait for /healthz."""
        if self.process is not None and self.process.poll() is None:
            raise HelpdeskError("the helpdesk is already running")
        port_file = self.directory / f"helpdesk-port-{time.monotonic_ns()}"
        args = [sys.executable, "-m", "helpdesk", "--port", str(self.port), "--db", str(self.db)]
        args += ["--port-file", str(port_file), *self.extra_args]
        if self.faults:
            args.append("--faults")
        env = {**os.environ, "HELPDESK_TOKEN": self.token, "PYTHONPATH": str(ROOT)}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            self._wait_step(deadline)
        self.port = int(port_file.read_text())
        port_file.unlink()
        while True:
            try:
                if self.request("GET", "/healthz", auth=False).status == 200:
                    return
            except OSError:
                pass
            self._wait_step(deadline)

    def _wait_step(self, deadline: float) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise HelpdeskError(f"the helpdesk exited with {self.process.returncode}; see {self.log}")
        if time.monotonic() > deadline:
            self.kill()
            raise HelpdeskError(f"the helpdesk did not answer /healthz in time; see {self.log}")
        time.sleep(0.02)

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, and wait; returns the exit code (SIGKILL if it does not stop in time)."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()

    def kill(self) -> int | None:
        """SIGKILL, as a crash would."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.kill()
        return self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    # -- HTTP ----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
        timeout: float = 10.0,
    ) -> HelpdeskResponse:
        """One request; an HTTP error status is returned, not raised. A dropped connection raises."""
        all_headers = {"Authorization": f"Bearer {self.token}"} if auth else {}
        all_headers.update(headers or {})
        request = urllib.request.Request(self.url + path, data=body, method=method, headers=all_headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return HelpdeskResponse(response.status, _json(response.read()), dict(response.headers))
        except urllib.error.HTTPError as error:
            with error:
                return HelpdeskResponse(error.code, _json(error.read()), dict(error.headers))

    def post_reply(self, payload: dict[str, Any], *, key: str | None = None, timeout: float = 10.0) -> HelpdeskResponse:
        """POST /replies with payload, keyed by payload's operation_id unless key is given."""
        return self.request(
            "POST",
            "/replies",
            body=json.dumps(payload).encode(),
            headers={"Idempotency-Key": key or payload["operation_id"], "Content-Type": "application/json"},
            timeout=timeout,
        )

    def lookup(self, operation_id: str) -> HelpdeskResponse:
        return self.request("GET", f"/replies/{operation_id}")

    def set_faults(self, *, reset: bool = False, **switches: int | float) -> dict[str, Any]:
        """Change fault switches (helpdesk/faults.py names them); returns them all."""
        response = self.request("POST", "/_faults", body=json.dumps({"reset": reset, **switches}).encode())
        if response.status != 200:
            raise HelpdeskError(f"POST /_faults answered {response.status}: {response.json}")
        return response.json

    def stats(self) -> dict[str, Any]:
        """Stored replies (from the file) and this process's request counts; see README."""
        response = self.request("GET", "/_stats")
        if response.status != 200:
            raise HelpdeskError(f"GET /_stats answered {response.status}: {response.json}")
        return response.json


def accept_rate(helpdesk: Helpdesk, *, replies: int = 200, case_id: str = "bench-baseline") -> float:
    """The helpdesk's raw accept rate: new replies per second from one kept-alive client.

    The baseline for a delivery benchmark, measured in the same run on the same machine. It
    stores `replies` replies under case_id (fresh keys), which /_stats then counts.
    """
    connection = http.client.HTTPConnection("127.0.0.1", helpdesk.port, timeout=30)
    try:
        started = time.perf_counter()
        for _ in range(replies):
            key = secrets.token_hex(32)
            body = json.dumps(
                {
                    "case_id": case_id,
                    "operation_id": key,
                    "body": "baseline",
                    "evidence_id": "baseline",
                    "policy_id": "baseline",
                    "source_versions": {},
                }
            )
            headers = {
                "Authorization": f"Bearer {helpdesk.token}",
                "Idempotency-Key": key,
                "Content-Type": "application/json",
            }
            connection.request("POST", "/replies", body, headers)
            response = connection.getresponse()
            response.read()
            if response.status != 201:
                raise HelpdeskError(f"the baseline POST answered {response.status}")
        return replies / (time.perf_counter() - started)
    finally:
        connection.close()


def _json(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        return {"raw": raw.decode("utf-8", "replace")}
    return data if isinstance(data, dict) else {"value": data}


@contextmanager
def running_helpdesk(
    tmp_path: Path,
    *,
    faults: bool = True,
    token: str = "t",
    db: Path | None = None,
    extra_args: list[str] | None = None,
) -> Iterator[Helpdesk]:
    """A helpdesk process for the duration of the block, stopped (then killed) after it.

    Pass db to share one database file between several helpdesk processes.
    """
    tmp_path.mkdir(parents=True, exist_ok=True)
    helpdesk = Helpdesk(
        directory=tmp_path,
        token=token,
        faults=faults,
        db=db or tmp_path / "helpdesk.sqlite3",
        extra_args=list(extra_args or []),
    )
    helpdesk.start()
    try:
        yield helpdesk
    finally:
        helpdesk.stop()
