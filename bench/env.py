"""Where the benchmarks run from, and the environment every benchmark process gets.

Shared by the runner (bench/run.py) and the parts that start processes of their own
(bench/cron_start.py), so that none of them imports another for it.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
EVENT_LOG = ROOT / "var" / "bench" / "events.jsonl"
# The benchmark's own collectstatic: with DEBUG off every admin page needs the manifest
# (ManifestStaticFilesStorage), and a fresh clone has none.
STATIC_ROOT = ROOT / "var" / "bench" / "static"


def env_for(database_url: str) -> dict:
    """Production-like settings (DEBUG off: no query log), on the benchmark's own database.
    The secret is a throwaway: benchmark processes serve no one."""
    EVENT_LOG.parent.mkdir(parents=True, exist_ok=True)  # a fresh clone has no var/bench
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        DEBUG="0",
        PYTHONPATH=str(ROOT),
        SECRET_KEY=f"bench-only-{os.urandom(16).hex()}",
        SECURE_SSL_REDIRECT="0",
        ALLOWED_HOSTS="localhost,127.0.0.1",
        # Every decision still logs its JSON event line (part of what is measured), into a
        # file instead of the report's stderr, where hundreds of them hid the progress lines.
        DECISIONFLOW_EVENT_LOG_FILE=str(EVENT_LOG),
        STATIC_ROOT=str(STATIC_ROOT),
    )
    env.pop("DECISIONFLOW_FAULT_INJECTION", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


@functools.cache
def static_collected() -> Path:
    """``collectstatic`` into the benchmark's STATIC_ROOT, once per process: the pages a
    benchmark renders with DEBUG off then find their manifest. Fails loudly, never skipped."""
    env = env_for("sqlite:///:memory:")  # collectstatic reads no table
    subprocess.run([PY, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    return STATIC_ROOT
