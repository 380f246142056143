"""A private redis-server for the RQ task backend's tests and reliability step.

``RedisServer()`` starts Debian's ``redis-server`` as a child process on a free loopback
port, with nothing written to disk (``--save ''``, ``--appendonly no``), waits until it
answers PING, and stops it (SIGTERM, then SIGKILL) when the ``with`` block ends. It never
uses the system service, and gets SIGTERM when the process that started it dies, so a
killed harness leaves no server behind.

Usage::

    with RedisServer() as redis:
        url = redis.url  # redis://127.0.0.1:<port>/0
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from reliability.pooler import HOST, _die_with_parent, free_port

CANDIDATES = ("/usr/bin/redis-server", "/usr/sbin/redis-server")


def binary() -> str | None:
    """The redis-server executable, or None when it is not installed (`make redis`)."""
    return shutil.which("redis-server") or next((p for p in CANDIDATES if Path(p).exists()), None)


def _pong(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, *, log_path: Path | None = None):
        self.log_path = log_path
        self.port = 0
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def __enter__(self) -> RedisServer:
        found = binary()
        if found is None:
            raise RuntimeError("redis-server is not installed: `make redis` installs Debian's package (as root)")
        self.port = free_port()
        argv = [found, "--port", str(self.port), "--bind", HOST, "--save", "", "--appendonly", "no"]
        argv += ["--logfile", str(self.log_path) if self.log_path else ""]
        self._proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
        until = time.monotonic() + 15
        while not _pong(self.port):
            if self._proc.poll() is not None or time.monotonic() > until:
                self.__exit__(None, None, None)
                raise RuntimeError(f"redis-server did not answer on port {self.port}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._proc = None
