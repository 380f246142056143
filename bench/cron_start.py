"""Cron start: `manage.py reconcile --all` on an empty database vs `django-admin check` of a
bare Django project (the contrib apps only) on the same database.

The bare project is made at bench time in a temporary directory with `django-admin
startproject`; its settings point at the same database URL (through django-environ, which
the project already pins). The two commands run paired and interleaved (A B, B A, ...), and
the ratio is taken pair by pair, so a noisy neighbour slows both sides of a pair alike.

    .venv/bin/python -m bench.cron_start --database-url sqlite:////tmp/x.sqlite3 --runs 7
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.env import PY, ROOT, env_for

BARE_SETTINGS_TAIL = """
# Appended by bench/cron_start.py: the same database as the project's run.
import environ as _environ
DATABASES = {"default": _environ.Env().db("DATABASE_URL")}
"""


def make_bare_project(directory: Path) -> Path:
    """A fresh `django-admin startproject bare` in ``directory``; returns its folder."""
    django_admin = Path(PY).with_name("django-admin")
    subprocess.run([str(django_admin), "startproject", "bare", str(directory)], check=True)
    settings = directory / "bare" / "settings.py"
    settings.write_text(settings.read_text() + BARE_SETTINGS_TAIL)
    return directory


def _timed(cmd: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    """The process's wall time, and the CPU time it used (user + system, from ``os.wait4``:
    on a loaded machine the CPU time varies far less than the wall time)."""
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} exited {code}: {err.read().decode(errors='replace')[-400:]}")
    return elapsed, usage.ru_utime + usage.ru_stime


def _wall(cmd: list[str], cwd: Path, env: dict) -> float:
    return _timed(cmd, cwd, env)[0]


def bench_cron_start(env: dict, *, runs: int) -> dict:
    """``env`` carries DATABASE_URL (an empty, migrated database) and the project's settings."""
    res = {
        "key": "cron_start",
        "title": "14. cron start: `manage.py reconcile --all`, empty database",
        "subject": "`python manage.py reconcile --all` (no cases)",
        "baseline": "`django-admin check` of a bare Django project (contrib apps only), same database",
        "kind": "cost",
        "unit": "ms",
        "goal": ("≤", 1.3),
        "note": "",
        "subject_values": [],
        "baseline_values": [],
        "ratios": [],
        "vendor": "postgresql" if env["DATABASE_URL"].startswith("postgres") else "sqlite",
        "agent_framework_imported": None,
        "cpu_ratios": [],
    }
    # As deployed, both sides run from bytecode: a host writes it on the first run (or at install,
    # `python -m compileall`). A PYTHONDONTWRITEBYTECODE inherited from the shell would make every
    # timed run recompile this project's ~75 modules (~40 ms) and not the bare project's two.
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory(prefix="decisionflow-bare-") as tmp:
        bare = make_bare_project(Path(tmp))
        bare_env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
        bare_env |= {"DJANGO_SETTINGS_MODULE": "bare.settings", "PYTHONPATH": str(bare)}
        django_admin = str(Path(PY).with_name("django-admin"))
        subject = ([PY, "manage.py", "reconcile", "--all"], ROOT, env)
        baseline = ([django_admin, "check"], bare, bare_env)
        # Warm the page cache and both projects' .pyc files.
        _wall(*subject)
        _wall(*baseline)
        for i in range(runs):
            order = [("s", subject), ("b", baseline)]
            if i % 2:
                order.reverse()
            got = {which: _timed(*cmd) for which, cmd in order}
            res["subject_values"].append(got["s"][0] * 1000)
            res["baseline_values"].append(got["b"][0] * 1000)
            res["ratios"].append(got["s"][0] / got["b"][0])
            res["cpu_ratios"].append(got["s"][1] / got["b"][1])
    # What the command imported, once, outside the timed runs.
    probe = subprocess.run(
        [PY, "-X", "importtime", "manage.py", "reconcile", "--all"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    res["agent_framework_imported"] = "agent_framework" in probe.stderr
    return res


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True, help="an empty database, migrated first")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    env = env_for(args.database_url)
    subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    print(json.dumps(bench_cron_start(env, runs=args.runs), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
