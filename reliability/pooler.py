"""A private PgBouncer in front of the local PostgreSQL, for the load and the pooler tests.

``PgBouncer(mode=...)`` writes a generated ini and userlist into a temporary folder, starts
Debian's ``pgbouncer`` binary as a child process on a free loopback port, waits until it
answers, and stops it (SIGTERM, then SIGKILL) when the ``with`` block ends. It never uses
the system service and never outlives the block.

- ``pool_mode``: ``transaction``, ``session`` or ``statement``.
- ``default_pool_size`` (4 by default): fewer server connections than the two hosts have
  threads, so that server connections are shared between clients, as a managed pooler does.
- ``auth_type = trust``: the loopback server trusts its clients (pg_hba), and so does this
  pooler, which listens on 127.0.0.1 only.
- Every database name is forwarded to the same server (the ``*`` entry), so the test
  database of the running suite can be reached through it by its own name.

PgBouncer refuses to run as root: as root it is started as ``postgres`` (or ``nobody``), and
the folder is given to that user. It gets SIGTERM when the process that started it dies
(Linux's parent-death signal), so even a SIGKILLed harness leaves no pooler behind.

``advisory_locks(admin_url, database)`` counts the advisory locks held on the real server
in one database, which is how a lock left behind by a pooled session shows.

Usage::

    with PgBouncer(server_url="postgres://postgres@127.0.0.1:5432/postgres", mode="transaction") as bouncer:
        url = bouncer.url("decisionflow_load")   # postgres://postgres@127.0.0.1:<port>/decisionflow_load
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

HOST = "127.0.0.1"
MODES = ("session", "transaction", "statement")
# The user PgBouncer drops to when started as root: the server's own, or nobody.
RUN_AS = ("postgres", "nobody")
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def debian_binary(name: str) -> str | None:
    """``name`` on PATH, or in /usr/sbin or /usr/bin, where Debian's packages put it; None
    when it is not installed."""
    found = shutil.which(name)
    if found:
        return found
    return next((path for path in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(path, os.X_OK)), None)


def binary() -> str | None:
    """The pgbouncer executable, or None when it is not installed (`make pgbouncer`)."""
    return debian_binary("pgbouncer")


def spawn(argv: list[str], log, **kwargs) -> subprocess.Popen:
    """Start a child server: its output to ``log``, no input, a session of its own, and
    SIGTERM when this process dies (``_die_with_parent``)."""
    return subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent,
        **kwargs,
    )


def terminate(proc: subprocess.Popen | None) -> None:
    """SIGTERM a child server, then SIGKILL if it has not exited within 10 s."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _system_user() -> str:
    for name in RUN_AS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError(f"pgbouncer will not run as root, and none of the users {', '.join(RUN_AS)} exists")


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the process that started it dies, so that a
    killed harness (a test's timeout SIGKILLs it) never leaves a pooler running (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def advisory_locks(admin_url: str, database: str) -> int:
    """Advisory locks held on the real server in ``database`` (by any session)."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            " WHERE l.locktype = 'advisory' AND l.granted AND d.datname = %s",
            [database],
        ).fetchone()
    return int(row[0]) if row else 0


class PgBouncer:
    def __init__(
        self,
        *,
        server_url: str,
        mode: str,
        default_pool_size: int = 4,
        max_client_conn: int = 200,
        query_wait_timeout: int = 20,
        log_path: Path | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"pool mode {mode!r}: one of {', '.join(MODES)}")
        server = urlsplit(server_url)
        self.server_host = server.hostname or HOST
        self.server_port = server.port or 5432
        self.user = server.username or "postgres"
        self.mode = mode
        self.default_pool_size = default_pool_size
        self.max_client_conn = max_client_conn
        self.query_wait_timeout = query_wait_timeout
        self.log_path = log_path
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.folder: Path | None = None

    def url(self, database: str) -> str:
        """A DATABASE_URL for ``database``, through this pooler."""
        return f"postgres://{self.user}@{HOST}:{self.port}/{database}"

    def _write_config(self, folder: Path) -> Path:
        userlist = folder / "userlist.txt"
        userlist.write_text(f'"{self.user}" ""\n')
        ini = folder / "pgbouncer.ini"
        ini.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={self.server_host} port={self.server_port}",
                    "",
                    "[pgbouncer]",
                    f"listen_addr = {HOST}",
                    f"listen_port = {self.port}",
                    # No Unix socket: two of these on one machine must not share a path.
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {userlist}",
                    f"admin_users = {self.user}",
                    f"pool_mode = {self.mode}",
                    f"max_client_conn = {self.max_client_conn}",
                    f"default_pool_size = {self.default_pool_size}",
                    "min_pool_size = 0",
                    "reserve_pool_size = 0",
                    # The default: session mode resets a server connection with DISCARD ALL
                    # before another client gets it.
                    "server_reset_query = DISCARD ALL",
                    "ignore_startup_parameters = extra_float_digits",
                    # A client waits this long for a server connection, then gets an error:
                    # a pool that stays exhausted (server connections held by sessions that
                    # never end their transaction) fails the run instead of stalling it.
                    f"query_wait_timeout = {self.query_wait_timeout}",
                    "log_connections = 0",
                    "log_disconnections = 0",
                    "",
                ]
            )
        )
        return ini

    def start(self, timeout: float = 15) -> PgBouncer:
        executable = binary()
        if executable is None:
            raise RuntimeError("pgbouncer is not installed: run `make pgbouncer` (Debian's pgbouncer package)")
        self.folder = Path(tempfile.mkdtemp(prefix="decisionflow-pgbouncer-"))
        self.port = free_port()
        ini = self._write_config(self.folder)
        as_user: dict = {}
        if os.geteuid() == 0:
            # PgBouncer will not run as root. The child switches user before it executes
            # pgbouncer (rather than pgbouncer's own -u, later), so that the parent-death
            # signal set after the switch survives: a credential change clears it.
            account = pwd.getpwnam(_system_user())
            for path in (self.folder, *self.folder.iterdir()):
                os.chown(path, account.pw_uid, account.pw_gid)
            as_user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        log_path = self.log_path or self.folder / "pgbouncer.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log:
            self.proc = spawn([executable, str(ini)], log, **as_user)
        try:
            self._wait_ready(timeout, log_path)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float, log_path: Path) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"pgbouncer exited with {self.proc.returncode}:\n{tail}")
            try:
                # The admin console answers once the pooler listens; SHOW needs no server.
                with psycopg.connect(self.url("pgbouncer"), autocommit=True, connect_timeout=2) as conn:
                    conn.execute("SHOW VERSION")
                return
            except psycopg.Error:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"pgbouncer did not answer on {HOST}:{self.port} within {timeout:.0f} s"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        terminate(proc)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
