"""A private PostgreSQL streaming pair (primary and hot standby), for the replica proofs.

``streaming_pair(workdir)`` (a folder the ``postgres`` user can reach; the system's temporary
folder by default) makes a small primary with Debian's ``initdb`` in a temporary
folder under ``workdir``, starts it with ``pg_ctl`` on a free loopback port (``wal_level
replica``, trust authentication on 127.0.0.1 only), makes its standby from it with
``pg_basebackup -R`` (which writes ``standby.signal`` and ``primary_conninfo``), starts that on
another free port, and yields a ``Pair``. When the ``with`` block ends both servers are
stopped (fast shutdown, then immediate) and their folders removed.

It never touches the shared server on 5432, which holds other databases: the pair is a
cluster of its own, made from nothing, and copies only from its own primary.

``pg_ctl`` starts each server detached, so a harness killed outright (SIGKILL) leaves its
pair running: stop it with ``runuser -u postgres -- pg_ctl -D /tmp/decisionflow-streaming-*/standby
stop`` (then ``primary``) and remove the folder.

The PostgreSQL binaries refuse to run as root: as root, every one of them is run as the
``postgres`` OS user (``runuser``), and the folder is given to that user.

Usage::

    with streaming_pair(Path("/tmp")) as pair:
        pair.primary_url("decisionflow_load")   # postgres://postgres@127.0.0.1:<p>/decisionflow_load
        pair.replica_url("decisionflow_load")   # the standby, read-only
        pair.stop_standby()                      # the replica goes away mid-run...
        pair.start_standby()                     # ...and comes back, catching up from the primary

Run alone, ``python -m reliability.streaming`` starts a pair, writes a row on the primary,
reads it back from the standby, stops and restarts the standby, and prints what it saw.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from reliability.pooler import HOST, free_port

RUN_AS = "postgres"
SUPERUSER = "postgres"


def bin_dir() -> Path | None:
    """Debian's server binaries (newest major first), or None when the server package is
    missing (`make postgresql-server`)."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_major, reverse=True):
        if os.access(os.path.join(candidate, "initdb"), os.X_OK):
            return Path(candidate)
    return None


def _major(path: str) -> int:
    try:
        return int(Path(path).parent.name)
    except ValueError:
        return 0


@dataclass
class Pair:
    """A running primary and its streaming standby, both on 127.0.0.1."""

    folder: Path
    bin: Path
    primary_port: int
    standby_port: int
    primary_dir: Path = field(init=False)
    standby_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.primary_dir = self.folder / "primary"
        self.standby_dir = self.folder / "standby"

    def primary_url(self, database: str = "postgres") -> str:
        return f"postgres://{SUPERUSER}@{HOST}:{self.primary_port}/{database}"

    def replica_url(self, database: str = "postgres") -> str:
        return f"postgres://{SUPERUSER}@{HOST}:{self.standby_port}/{database}"

    def _pg_ctl(self, data: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run([str(self.bin / "pg_ctl"), "-D", str(data), *args], check=check)

    def _start(self, data: Path, port: int) -> None:
        log = self.folder / f"{data.name}.log"
        self._pg_ctl(data, "-l", str(log), "-w", "-t", "60", "start")
        _wait_ready(self.primary_url() if port == self.primary_port else self.replica_url())

    def _stop(self, data: Path) -> None:
        if not (data / "postmaster.pid").exists():
            return
        done = self._pg_ctl(data, "-m", "fast", "-w", "-t", "30", "stop", check=False)
        if done.returncode != 0:
            self._pg_ctl(data, "-m", "immediate", "-w", "-t", "30", "stop", check=False)

    def stop_standby(self) -> None:
        """Stop the standby (fast shutdown): its port stops answering, as a lost replica does."""
        self._stop(self.standby_dir)

    def start_standby(self) -> None:
        """Start the standby again; it reconnects to the primary and replays what it missed."""
        self._start(self.standby_dir, self.standby_port)

    def standby_running(self) -> bool:
        return (self.standby_dir / "postmaster.pid").exists()

    def wait_caught_up(self, timeout: float = 30) -> None:
        """Until the standby has replayed everything the primary had written when called."""
        import psycopg

        with psycopg.connect(self.primary_url(), autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        target = row[0] if row else "0/0"
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.replica_url(), autocommit=True, connect_timeout=5) as conn:
            while True:
                done = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [target]).fetchone()
                if done and done[0]:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby did not replay up to {target} within {timeout:.0f} s")
                time.sleep(0.05)


def _as_postgres() -> dict:
    if os.geteuid() != 0:
        return {}
    account = pwd.getpwnam(RUN_AS)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        # A neutral working folder: the postgres user may not be able to read the caller's.
        cwd="/",
        env={**os.environ, "LC_ALL": "C.UTF-8", "PGTZ": "UTC"},
        **_as_postgres(),
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done


def _wait_ready(url: str, timeout: float = 30) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.Error:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no server answered at {url} within {timeout:.0f} s") from None
            time.sleep(0.1)


def _server_options(port: int) -> str:
    return "\n".join(
        [
            f"port = {port}",
            f"listen_addresses = '{HOST}'",
            # No Unix socket: two pairs on one machine must not share a path.
            "unix_socket_directories = ''",
            "wal_level = replica",
            "max_wal_senders = 4",
            "hot_standby = on",
            # The standby's queries are short reads: a replayed change waits for none of them.
            "max_standby_streaming_delay = 1s",
            # Small, for a 2-core machine shared with others.
            "max_connections = 120",
            "shared_buffers = 32MB",
            "fsync = off",
            "full_page_writes = off",
            "wal_keep_size = 256MB",
            "log_min_messages = warning",
            "",
        ]
    )


@contextlib.contextmanager
def streaming_pair(workdir: Path | str | None = None) -> Iterator[Pair]:
    """A started primary and standby; both stopped and their folder removed on exit."""
    binaries = bin_dir()
    if binaries is None:
        raise RuntimeError(
            "PostgreSQL's server binaries are missing (initdb under /usr/lib/postgresql/*/bin):"
            " run `make postgresql-server` (Debian's postgresql package)"
        )
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="decisionflow-streaming-", dir=workdir))
    os.chmod(folder, 0o755)
    if os.geteuid() == 0:
        account = pwd.getpwnam(RUN_AS)
        os.chown(folder, account.pw_uid, account.pw_gid)
    pair = Pair(folder=folder, bin=binaries, primary_port=free_port(), standby_port=free_port())
    try:
        _run(
            [
                str(binaries / "initdb"),
                "-D",
                str(pair.primary_dir),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-instructions",
            ]
        )
        with open(pair.primary_dir / "postgresql.conf", "a") as conf:
            conf.write(_server_options(pair.primary_port))
        with open(pair.primary_dir / "pg_hba.conf", "w") as hba:
            hba.write(f"host all all {HOST}/32 trust\nhost replication all {HOST}/32 trust\n")
        pair._start(pair.primary_dir, pair.primary_port)
        _run(
            [
                str(binaries / "pg_basebackup"),
                "-h",
                HOST,
                "-p",
                str(pair.primary_port),
                "-U",
                SUPERUSER,
                "-D",
                str(pair.standby_dir),
                "-R",
                "-X",
                "stream",
                "--checkpoint=fast",
            ]
        )
        # The copy carries the primary's settings; the standby listens on its own port.
        with open(pair.standby_dir / "postgresql.conf", "a") as conf:
            conf.write(f"port = {pair.standby_port}\n")
        pair.start_standby()
        yield pair
    finally:
        pair.stop_standby()
        pair._stop(pair.primary_dir)
        shutil.rmtree(folder, ignore_errors=True)


def add_replica_option(parser) -> None:
    """``--replica`` for a harness that can run its hosts on a private pair (``server_for``)."""
    parser.add_argument(
        "--replica",
        action="store_true",
        help="Run on a private streaming pair (reliability/streaming.py): the database on its primary and the"
        " hosts' DATABASE_REPLICA_URL its standby, so that the router's reads go there.",
    )


@contextlib.contextmanager
def server_for(admin_url: str, replica: bool) -> Iterator[tuple[str, Pair | None]]:
    """Where a harness creates its database: ``admin_url``'s server, or with ``replica`` the
    primary of a private pair, yielded with the pair (its standby for the hosts to read)."""
    if not replica:
        yield admin_url, None
        return
    with streaming_pair() as pair:
        yield pair.primary_url(), pair


def main() -> None:
    import psycopg

    started = time.monotonic()
    with streaming_pair() as pair:
        print(f"primary {pair.primary_url()}  standby {pair.replica_url()}  ({time.monotonic() - started:.1f} s)")
        with psycopg.connect(pair.primary_url(), autocommit=True) as conn:
            conn.execute("CREATE TABLE probe (n int)")
            conn.execute("INSERT INTO probe VALUES (1)")
        pair.wait_caught_up()
        with psycopg.connect(pair.replica_url(), autocommit=True) as conn:
            rows = conn.execute("SELECT count(*), pg_is_in_recovery() FROM probe").fetchone()
        print(f"standby sees {rows[0] if rows else 0} row(s), in recovery: {rows[1] if rows else None}")
        pair.stop_standby()
        with psycopg.connect(pair.primary_url(), autocommit=True) as conn:
            conn.execute("INSERT INTO probe VALUES (2)")
        pair.start_standby()
        pair.wait_caught_up()
        with psycopg.connect(pair.replica_url(), autocommit=True) as conn:
            rows = conn.execute("SELECT count(*) FROM probe").fetchone()
        print(f"after a stop and a start, the standby sees {rows[0] if rows else 0} row(s)")
    print(f"stopped and removed ({time.monotonic() - started:.1f} s in all)")


if __name__ == "__main__":
    main()
