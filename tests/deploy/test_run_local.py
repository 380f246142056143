"""`make run` (deploy/run-local.sh) starts the server, the reference helpdesk and one task
worker with the delivery settings pointing at the helpdesk, says what it started, and Ctrl-C
stops all three: nothing is left running."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.any_database  # make run is on its own SQLite file

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "run-local.sh"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def children(pid: int) -> set[int]:
    """Every descendant of pid, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def answers(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except OSError:
        return None


def sigint_as_from_a_terminal() -> None:
    """In the child, before exec: SIGINT delivered, with its default action, as a terminal
    starts `make run`. The suite may have inherited it ignored (`make test &`, nohup, a script's
    background job) or blocked (some CI runners); both survive fork and exec, and bash can
    neither trap nor reset a signal ignored at its start, so Ctrl-C would reach neither the
    script's trap nor runserver."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def sigint_ignored_and_blocked():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        # Unblocked while still ignored: a SIGINT that came meanwhile is dropped, not raised here.
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, previous)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
def test_make_run_starts_the_helpdesk_and_a_worker_and_ctrl_c_stops_everything(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DECISIONFLOW_", "HELPDESK_"))}
    env.update(
        DATABASE_URL=f"sqlite:///{tmp_path / 'run.sqlite3'}",
        DEBUG="1",
        PY=sys.executable,
        SERVER_PORT=str(free_port()),
        HELPDESK_PORT=str(free_port()),
        RUN_DIR=str(tmp_path),
    )
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    # Started from a suite that inherited SIGINT at its worst, as the script must work all the same.
    with sigint_ignored_and_blocked():
        proc = subprocess.Popen(
            [str(SCRIPT)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=sigint_as_from_a_terminal,
        )
    out: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while not any(line.startswith("Serving the admin") for line in out):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(out)
            if select.select([proc.stdout], [], [], 0.5)[0]:
                out.append(proc.stdout.readline().decode())
        said = "".join(out)
        helpdesk = f"http://127.0.0.1:{env['HELPDESK_PORT']}"
        assert f"Reference helpdesk: {helpdesk} " in said
        assert "Task worker: manage.py db_worker" in said
        assert answers(helpdesk + "/healthz") == 200
        server = f"http://127.0.0.1:{env['SERVER_PORT']}/admin/login/"
        while answers(server) != 200:
            assert time.monotonic() < deadline, "the server did not answer"
            time.sleep(0.2)
        started = children(proc.pid)
        commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") for pid in started}
        assert any(b"-m helpdesk" in c for c in commands.values()), commands
        worker = [pid for pid, c in commands.items() if b"db_worker" in c]
        assert worker, commands
        # The worker was told where the helpdesk is.
        environ = Path(f"/proc/{worker[0]}/environ").read_bytes().split(b"\0")
        assert f"DECISIONFLOW_DELIVERY_URL={helpdesk}".encode() in environ
        # Ctrl-C in the terminal: SIGINT to the whole foreground process group.
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        assert "stopped the server, the task worker and the reference helpdesk" in rest.decode()
        time.sleep(0.2)
        assert not [pid for pid in started if alive(pid)], commands
        assert answers(helpdesk + "/healthz") is None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
