"""Running real ``manage.py`` child processes against the test database.

The children must see committed data, so these fixtures use ``transactional_db``, and each
child gets ``DATABASE_URL`` pointing at the test database the parent is using.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, database_url


def child_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DECISIONFLOW_CRASH_AT", "DECISIONFLOW_REVIEWER")}
    env.update(
        DATABASE_URL=database_url(),
        DEBUG="1",
        DECISIONFLOW_FAULT_INJECTION="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def manage_argv(*argv: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), *argv]


@pytest.fixture
def manage(transactional_db):
    """Run one ``manage.py`` command in a child process; returns the CompletedProcess."""

    def run(*argv: str, input: str | None = None, **env):
        return subprocess.run(
            manage_argv(*argv),
            env=child_env(**env),
            capture_output=True,
            text=True,
            timeout=120,
            input=input,
            cwd=ROOT,
        )

    return run


@pytest.fixture
def spawn(transactional_db):
    """Start several ``manage.py`` children at once (for the concurrency tests)."""

    def start(*argv: str, **env):
        return subprocess.Popen(
            manage_argv(*argv),
            env=child_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )

    return start


@pytest.fixture
def committed_case(transactional_db, t1042_data, reviewer):
    """T-1042 imported and a reviewer, committed so that child processes see them."""
    from cases.services import case_import

    return case_import(data=t1042_data).case


@pytest.fixture(autouse=True)
def _fresh_resume_workflow():
    """Each test starts without its thread's reused resume workflow (engine.resume_workflow),
    so that a test that patches an executor class gets a graph built from the patched class."""
    from engine import graph as engine

    engine._RESUME.workflow = None
    yield
    engine._RESUME.workflow = None
