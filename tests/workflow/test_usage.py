"""--help for every workflow command, usage errors (exit 1, nothing written), and the demo."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from effects.models import CommitAttempt
from reviews.models import PendingReview, Proposal, ReviewDecision
from tests.conftest import http_server
from tests.workflow.conftest import manage_argv

COMMANDS = {
    "begin": "python manage.py begin CASE_ID",
    "resume": "--operation-id OP (--approve | --decline)",
    "edit": "--expected-operation-id OP (--body-file FILE | --source SOURCE=VERSION ...)",
    "redraft": "--expected-operation-id OP --file FILE",
    "reconcile": "Run from cron",
    "demo": "lost-receipt story",
    "withdraw": "python manage.py withdraw CASE_ID --operation-id OP --user PIPELINE_USER",
}


@pytest.mark.any_database
def test_every_command_has_help():
    env = {**os.environ, "DEBUG": "1"}
    procs = {
        name: subprocess.Popen(
            manage_argv(name, "--help"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name in COMMANDS
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert COMMANDS[name] in " ".join(out.split()), out  # argparse wraps lines


def test_reconcile_help_starts_with_cron_usage():
    from effects.management.commands.reconcile import Command

    assert Command.help.startswith("Run from cron")
    assert "*/5 * * * *" in Command.help and "--repair" in Command.help


def _refused(*args, code=1, match="", audited=0):
    """``audited``: the attempt rows the refusal appends (an edit the edit service refused)."""
    before = (
        Proposal.objects.count(),
        ReviewDecision.objects.count(),
        PendingReview.objects.count(),
        CommitAttempt.objects.count() + audited,
    )
    with pytest.raises(CommandError, match=match) as error:
        call_command(*args)
    assert error.value.returncode == code
    assert (
        Proposal.objects.count(),
        ReviewDecision.objects.count(),
        PendingReview.objects.count(),
        CommitAttempt.objects.count(),
    ) == before


def test_usage_errors_exit_1_and_write_nothing(case, reviewer, settings, capsys):
    from workflow.begin import review_begin

    op = review_begin(case=case).operation_id
    _refused(
        "resume",
        "T-1042",
        "--operation-id",
        op,
        "--reviewer",
        "reviewer",
        match="one of the arguments --approve --decline is required",
    )
    _refused(
        "resume",
        "T-1042",
        "--operation-id",
        op,
        "--approve",
        "--decline",
        "--reviewer",
        "reviewer",
        match="not allowed with",
    )
    _refused("resume", "T-1042", "--operation-id", op, "--approve", match="DECISIONFLOW_REVIEWER")
    _refused("resume", "T-1042", "--operation-id", op, "--approve", "--reviewer", "nobody", match="no user")
    _refused("resume", "T-9999", "--operation-id", op, "--approve", "--reviewer", "reviewer", match="no case")
    settings.DECISIONFLOW_FAULT_INJECTION = True
    _refused(
        "resume",
        "T-1042",
        "--operation-id",
        op,
        "--approve",
        "--reviewer",
        "reviewer",
        "--fault",
        "explode",
        match="unknown fault 'explode'",
    )
    settings.DECISIONFLOW_FAULT_INJECTION = False
    _refused(
        "resume",
        "T-1042",
        "--operation-id",
        op,
        "--approve",
        "--reviewer",
        "reviewer",
        "--fault",
        "lose-receipt",
        match="DECISIONFLOW_FAULT_INJECTION=1",
    )
    _refused("edit", "T-1042", "--expected-operation-id", op, "--editor", "reviewer", match="--body-file")
    _refused(
        "edit",
        "T-1042",
        "--expected-operation-id",
        op,
        "--source",
        "HOLD-7",
        "--editor",
        "reviewer",
        match="SOURCE=VERSION",
    )
    _refused(
        "edit",
        "T-1042",
        "--expected-operation-id",
        op,
        "--source",
        "HOLD-7=9",
        "--editor",
        "reviewer",
        match="HOLD-7 has no version 9",
        audited=1,
    )
    _refused("reconcile", match="CASE_IDs, or --all")
    _refused("reconcile", "T-1042", "--all", match="not both")
    _refused("reconcile", "T-9999", match="no case")
    _refused("begin", "T-9999", match="no case")
    _refused("demo", "--helpdesk-port", "70000", match="is not a port")
    _refused("demo", "--helpdesk-port", "http", match="is not a port")
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.any_database
def test_the_demo_tells_the_whole_story(tmp_path):
    """SQLite only: the demo makes its own scratch SQLite database (about 30 child processes).

    Run as from the shell of a configured host (a webhook, an event log, a metrics folder):
    it prints each line as it goes, and none of the story reaches those settings."""
    hooks: list[str] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's hook name)
            hooks.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    metrics, events = tmp_path / "metrics", tmp_path / "events.jsonl"
    metrics.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PYTHONUNBUFFERED")}
    with http_server(Hook) as hook_url:
        env.update(
            DEBUG="1",
            PROMETHEUS_MULTIPROC_DIR=str(metrics),
            DECISIONFLOW_EVENT_LOG_FILE=str(events),
            DECISIONFLOW_NOTIFY_WEBHOOK_URL=f"{hook_url}/hook",
        )
        proc = subprocess.Popen(
            manage_argv("demo"),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        first = proc.stdout.readline()
        # Printed as it goes, into a pipe: the scratch folder this line names still exists
        # (the demo deletes it as it ends, so a line held back until then would find none).
        scratch = re.match(r"demo: scratch database (\S+) ", first)
        assert scratch and Path(scratch.group(1)).parent.is_dir(), first
        # Read on through the same stream: communicate() would read the pipe itself and
        # lose what readline() has already buffered. The demo writes one stderr line at most.
        rest, err = proc.stdout.read(), proc.stderr.read()
        proc.wait(timeout=60)
    assert proc.returncode == 0, first + rest + err
    out = first + rest
    assert out.splitlines()[1] == "demo: migrating the scratch database and loading the demo cases (two processes)"
    assert re.search(r"^demo: \d+ processes in \d+\.\d s$", out, re.M), out
    assert "demo: starting the reference helpdesk on 127.0.0.1, a free port" in out
    # Nothing of the story left the scratch folder: no notification went to the shell's
    # webhook, no decision event to its log, no count to its metrics folder (the demo's own
    # process aside, which decides nothing).
    assert hooks == []
    assert not events.exists() or events.read_text() == ""
    assert all(name.endswith(f"_{proc.pid}.db") for name in os.listdir(metrics)), os.listdir(metrics)
    assert "begin: status=PendingRequests op=op-v1-e3976ac9e004… checkpoints=1" in out
    assert "approve: resumed status=PendingRequests requestBound=True" in out
    uncertain = "outcome uncertain: the commit step failed after it may have written (LostReceipt)"
    lost = [line for line in out.splitlines() if line.startswith(uncertain)]
    assert len(lost) == 2 and all("(exit 42) <- " in line for line in lost), out  # the story and the control
    assert "reconcile: case=T-1042 op=op-v1-e3976ac9e004… state=Committed effects=1" in out
    assert out.count('result={"Status":"Committed","Replay":true,"EffectCount":1}') == 2
    assert 'decline (another case): result={"Status":"Declined","Replay":false,"EffectCount":0}' in out
    assert 'approve (that case): result={"Status":"ConflictingDecision","Replay":false,"EffectCount":0}' in out
    assert 'naive key (control): result={"Status":"Committed","Replay":false,"EffectCount":2}' in out
    # The remote chapter: the helpdesk stores the reply and drops the answer; the delivery is
    # Unknown; reconcile finds it by its key: Delivered, one reply. The naive key makes two.
    remote = out[out.index("remote: ") :]
    assert re.search(r"^helpdesk: http://127\.0\.0\.1:\d+ ", remote, re.M), remote
    assert re.search(r"^delivery: case=T-1150 op=\S+ state=Unknown tries=1 last=send:unknown \(", remote, re.M)
    assert re.search(
        r"^delivery: case=T-1150 op=\S+ state=Delivered tries=2 reference=HD-\d+ last=lookup:delivered", remote, re.M
    )
    assert re.search(r"^reconcile: case=T-1150 op=\S+ state=Committed effects=1 delivery=Unknown ", remote, re.M)
    assert re.search(
        r"^repaired: case=T-1150 op=\S+ state=Committed effects=1 delivery=Delivered reference=HD-\d+ ", remote, re.M
    )
    assert remote.count("helpdesk: case=T-1150 replies=1 ") == 3 and "case=T-1150 replies=2" not in remote
    assert re.search(r"^delivery: case=T-1151 op=\S+ state=Delivered tries=2 .*last=send:delivered", remote, re.M)
    assert "helpdesk: case=T-1151 replies=2 " in remote
    assert "UNEXPECTED" not in out and out.rstrip().endswith("demo: every step behaved as expected")


@pytest.mark.any_database
def test_the_demo_starts_the_helpdesk_on_the_port_it_is_given():
    """SQLite only. A port held here: the helpdesk the demo starts on it cannot listen, and the
    demo says so with the helpdesk's own line naming that port (exit 1, nothing left running)."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run(
            manage_argv("demo", "--helpdesk-port", str(port)),
            env={**env, "DEBUG": "1"},
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"demo: starting the reference helpdesk on 127.0.0.1, port {port}" in proc.stdout
    assert "UNEXPECTED: the reference helpdesk exited 1 within 15 s" in proc.stdout
    assert re.search(rf"^  \| \S+ helpdesk: cannot start on 127\.0\.0\.1:{port} ", proc.stdout, re.M), proc.stdout
    assert proc.stderr.strip() == "demo: 1 step(s) did not behave as expected"
