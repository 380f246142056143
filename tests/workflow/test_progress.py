"""The bulk commands show a progress bar on a terminal, and in cron (a pipe)
or with --json one summary line instead, with no bar."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import termios
import time

import pytest

from cases.services import case_import
from reviews.models import PendingReview
from tests.conftest import ROOT, load_fixture
from tests.workflow.conftest import child_env, manage_argv
from workflow.begin import review_begin

BAR = "━"  # rich's bar


def on_a_terminal(*argv: str) -> tuple[int, str]:
    """Run manage.py with its stdout (and stdin) on a pseudo-terminal, 120 columns wide."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    child = subprocess.Popen(
        manage_argv(*argv),
        env=child_env(TERM="xterm-256color", COLUMNS="120"),
        stdin=follower,
        stdout=follower,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif child.poll() is not None:
            break
    child.wait(timeout=30)
    os.close(leader)
    return child.returncode, b"".join(chunks).decode("utf-8", "replace")


@pytest.fixture
def three_cases(transactional_db):
    """Three cases, each paused; recorded by review-v1, so drain has work to do."""
    for name in ("t1042.json", "t1077.json", "t1150.json"):
        review_begin(case=case_import(data=load_fixture(name)).case)
    PendingReview.objects.update(workflow_version="review-v1")


@pytest.fixture
def case_files(tmp_path):
    files = []
    for n in range(4):
        path = tmp_path / f"case-{n}.json"
        path.write_text(json.dumps(dict(load_fixture(), case_id=f"T-90{n}")))
        files.append(str(path))
    return files


COMMANDS = {
    "reconcile": ("reconcile", "--all"),
    "drain_workflow": ("drain_workflow", "--from", "review-v1", "--apply"),
    "prune_checkpoints": ("prune_checkpoints", "--older-than", "1m", "--apply"),
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_terminal_shows_a_bar_with_rate_and_time_left(three_cases, name):
    code, screen = on_a_terminal(*COMMANDS[name])
    assert code == 0, screen
    assert BAR in screen and "/s" in screen and "time left" in screen, screen
    if name != "prune_checkpoints":  # nothing old enough to prune: a bar at 0/0
        assert "3/3" in screen, screen


def test_load_case_of_many_files_shows_a_bar_on_a_terminal(transactional_db, case_files):
    code, screen = on_a_terminal("load_case", *case_files)
    assert code == 0 and BAR in screen and "4/4" in screen and "files/s" in screen, screen
    assert screen.count("imported") == 5  # four lines, and the summary


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_cron_gets_one_summary_line_and_no_bar(three_cases, manage, name):
    run = manage(*COMMANDS[name])
    assert run.returncode == 0, run.stderr
    assert BAR not in run.stdout and "\x1b" not in run.stdout and "time left" not in run.stdout
    last = run.stdout.splitlines()[-1]
    expected = {
        "reconcile": "reconcile: summary: 3 operation(s) of 3 case(s) in ",
        "drain_workflow": "drain_workflow: re-begun 3 of 3 pending review(s) on review-v3",
        "prune_checkpoints": "prune_checkpoints: deleted 0 checkpoint(s)",
    }[name]
    assert last.startswith(expected), run.stdout
    assert len([line for line in run.stdout.splitlines() if "summary" in line or "re-begun" in line]) <= 1


def test_json_on_a_terminal_has_no_bar_and_ends_with_a_json_summary(three_cases):
    code, screen = on_a_terminal("reconcile", "--all", "--json")
    assert code == 0 and BAR not in screen
    rows = [json.loads(line) for line in screen.splitlines() if line.strip()]
    assert [row["state"] for row in rows[:-1]] == ["Pending"] * 3
    assert rows[-1]["summary"] == "reconcile" and rows[-1]["states"] == {"Pending": 3}


def test_load_case_of_many_files_in_a_pipe_ends_with_a_summary(manage, case_files, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    run = manage("load_case", *case_files[:2], str(bad), case_files[2])
    lines = run.stdout.splitlines()
    assert run.returncode != 0 and BAR not in run.stdout
    assert lines[:3] == [f"load_case: case=T-90{n} imported" for n in range(3)]
    assert lines[3].startswith("load_case: summary: 4 file(s) in ") and lines[3].endswith(
        ": 3 imported, 0 unchanged, 1 refused"
    )
    assert "bad.json" in run.stderr
    one = manage("load_case", case_files[0])
    assert one.stdout == "load_case: case=T-900 unchanged\n"  # one file: the one line, as before
