"""Intake throughput: new cases per second through ``POST /api/cases``, against the same
cases imported and begun by the services in-process, one thread, in the same run.

- **in-process** (the baseline): ``workflow.intake.case_intake`` for ``--n`` fresh case files,
  one after another, in one process: the import, the identity check and the review begun;
- **API, 1 client** and **API, 8 clients**: gunicorn with the shipped config
  (deploy/gunicorn.conf.py, its default workers and threads, DEBUG=0) on the same database,
  and ``--n`` fresh case files posted by 1 or 8 client threads (httpx, one keep-alive
  connection each), each with its own Idempotency-Key and the operation identity the
  reference client computes (docs/intake_client.py), as a pipeline sends them.

Rounds alternate in-process, 1 client, 8 clients; a ratio is the API's rate ÷ the in-process
rate of the same round, and the report gives the median over rounds. The goal is ≥ 0.5 at 8
clients (issue 27).

    .venv/bin/python -m bench.intake --database-url postgres://…/scratch [--n 200] [--rounds 3] [--json out.json]

The database is migrated here and gets the cases; use a scratch database.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CLIENTS = (1, 8)


def _env(database_url: str, tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DECISIONFLOW_", "GUNICORN_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="decisionflow.settings",
        DATABASE_URL=database_url,
        DEBUG="0",
        PYTHONPATH=str(ROOT),
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="127.0.0.1",
        STATIC_ROOT=str(tmp / "static"),
        # Its own metrics folder: the shipped config empties the one it is given at start.
        PROMETHEUS_MULTIPROC_DIR=str(tmp / "metrics"),
        GUNICORN_ACCESSLOG=str(tmp / "access.log"),
        GUNICORN_ERRORLOG=str(tmp / "error.log"),
    )
    return env


def _files(tag: str, n: int) -> list[dict]:
    data = json.loads((ROOT / "cases" / "demo" / "t1042.json").read_text())
    return [{**data, "case_id": f"I-{tag}-{i}"} for i in range(n)]


def inprocess(tag: str, n: int) -> float:
    """In a child process with the bench settings: n case files through the intake service."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from reviews.models import Channel
    from workflow.intake import case_intake

    actor = get_user_model().objects.get(username="bench-pipeline")
    files = _files(tag, n)
    started = time.perf_counter()
    for data in files:
        result = case_intake(data=data, actor=actor, channel=Channel.SERVICE)
        assert result.created and result.begun is not None
    return n / (time.perf_counter() - started)


def _client():
    spec = importlib.util.spec_from_file_location("intake_client", ROOT / "docs" / "intake_client.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def over_api(url: str, token: str, tag: str, n: int, clients: int) -> float:
    import httpx

    identity = _client().operation_id
    files = _files(tag, n)
    bodies = [{**data, "operation_id": identity(data)} for data in files]  # computed before the clock starts
    chunks = [bodies[i::clients] for i in range(clients)]
    failures: list[str] = []
    barrier = threading.Barrier(clients + 1)

    def send(chunk):
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            barrier.wait()
            for body in chunk:
                # As behind the TLS proxy (production's SECURE_SSL_REDIRECT; docs/DEPLOY.md).
                headers = {
                    "Authorization": f"Bearer {token}",
                    "Idempotency-Key": str(uuid.uuid4()),
                    "X-Forwarded-Proto": "https",
                }
                answer = client.post(f"{url}/api/cases", json=body, headers=headers)
                if answer.status_code != 201 or not answer.json()["review_begun"]:
                    failures.append(f"{answer.status_code} {answer.text[:300]}")

    threads = [threading.Thread(target=send, args=(chunk,)) for chunk in chunks]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} intake requests failed, e.g. {failures[0]}")
    return n / seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"gunicorn never became ready: {log.read_text()[-2000:]}")


def bench_intake(database_url: str, n: int, rounds: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="decisionflow-bench-") as tmp_name:
        tmp = Path(tmp_name)
        env = _env(database_url, tmp)
        (tmp / "metrics").mkdir()
        subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
        subprocess.run([PY, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
        made = subprocess.run(
            [PY, "manage.py", "pipeline_user", "bench-pipeline"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        token = made.stdout.strip().rsplit("token=", 1)[1]
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        with open(tmp / "gunicorn.out", "w") as out:
            proc = subprocess.Popen(
                [PY, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py"],
                cwd=ROOT,
                env={**env, "GUNICORN_BIND": f"127.0.0.1:{port}"},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_ready(url, proc, tmp / "error.log")
            over_api(url, token, "warm", 8, 1)  # the workers' first requests (imports, connections)
            rates: dict[str, list[float]] = {"inprocess": [], **{f"api_{c}": [] for c in CLIENTS}}
            for r in range(rounds):
                child = subprocess.run(
                    [PY, "-m", "bench.intake", "--inprocess", f"r{r}", "--n", str(n)],
                    cwd=ROOT,
                    env=env,
                    check=True,
                    capture_output=True,
                    text=True,
                )
                rates["inprocess"].append(float(child.stdout.strip().splitlines()[-1]))
                for clients in CLIENTS:
                    rates[f"api_{clients}"].append(over_api(url, token, f"r{r}c{clients}", n, clients))
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    ratios = {c: [a / b for a, b in zip(rates[f"api_{c}"], rates["inprocess"], strict=True)] for c in CLIENTS}
    return {
        "key": "intake",
        "kind": "intake",
        "bench": "intake",
        "database": database_url.split(":", 1)[0],
        "n": n,
        "rounds": rounds,
        "rates": {k: [round(v, 1) for v in vs] for k, vs in rates.items()},
        "median": {k: round(statistics.median(vs), 1) for k, vs in rates.items()},
        "ratio": {str(c): round(statistics.median(rs), 3) for c, rs in ratios.items()},
        "ratio_range": {str(c): [round(min(rs), 3), round(max(rs), 3)] for c, rs in ratios.items()},
        "goal": 0.5,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--inprocess", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inprocess:
        print(inprocess(args.inprocess, args.n))
        return 0
    if not args.database_url:
        parser.error("--database-url: a scratch PostgreSQL database (gunicorn's workers share it)")
    result = bench_intake(args.database_url, args.n, args.rounds)
    print(
        f"intake: in-process {result['median']['inprocess']}/s; API 1 client {result['median']['api_1']}/s "
        f"(ratio {result['ratio']['1']}), 8 clients {result['median']['api_8']}/s (ratio {result['ratio']['8']})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
