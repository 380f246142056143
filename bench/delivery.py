"""Deliveries per second by one task worker, against the reference helpdesk's raw accept rate.

Both measured in the same run, against the same helpdesk process (helpdesk/, no fault switch set):

- **raw**: one client posting ``--n`` new replies back to back (httpx, one keep-alive
  connection, the worker's own timeouts): what the helpdesk accepts from one sender;
- **one worker**: ``--n`` approvals committed first (each writes its queued delivery and
  enqueues its task), then one ``manage.py db_worker --batch`` drains them. Its rate is taken
  from the tables (the first try's start to the last settlement), so the process start is
  not counted; each delivery is a claim, a POST, a try row and the settling UPDATE, plus the
  task queue's own claim and result rows.

The ratio (worker / raw) is what the sending side costs over the wire itself.

    .venv/bin/python -m bench.delivery [--database-url URL] [--n 300] [--json out.json]

Without --database-url it uses a temporary SQLite file. The database is migrated here and
gets N generated cases; use a scratch database.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _env(database_url: str, helpdesk_url: str) -> dict:
    return dict(
        os.environ,
        DATABASE_URL=database_url,
        DEBUG="0",
        PYTHONPATH=str(ROOT),
        SECRET_KEY=f"bench-only-{os.urandom(16).hex()}",
        DECISIONFLOW_DELIVERY_URL=helpdesk_url,
        DECISIONFLOW_DELIVERY_TOKEN="bench",
        DECISIONFLOW_TASKS_BACKEND="django_tasks_db.DatabaseBackend",
    )


def raw_rate(url: str, n: int) -> float:
    import httpx

    body = {"body": "raw", "evidence_id": "ev", "policy_id": "pol", "source_versions": {"S": 1}}
    with httpx.Client(timeout=httpx.Timeout(5.0), trust_env=False) as client:
        started = time.perf_counter()
        for i in range(n):
            key = "op-v1-" + hashlib.sha256(f"raw-{i}-{started}".encode()).hexdigest()
            answer = client.post(
                f"{url}/replies",
                json={**body, "case_id": f"RAW-{i}", "operation_id": key},
                headers={"Authorization": "Bearer bench", "Idempotency-Key": key},
            )
            assert answer.status_code == 201, answer.text
        return n / (time.perf_counter() - started)


def approve(n: int) -> None:
    """In a child process with the bench settings: n fresh cases, each approved once."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission

    from cases.services import case_import
    from effects.services import effect_commit
    from reviews.groups import REVIEWERS, ensure_review_groups
    from reviews.services import proposal_create

    ensure_review_groups(Group, Permission)
    user = get_user_model().objects.create_user(f"bench-{os.getpid()}", password=None)
    user.groups.add(Group.objects.get(name=REVIEWERS))
    user = get_user_model().objects.get(pk=user.pk)
    data = json.loads((ROOT / "cases" / "demo" / "t1042.json").read_text())
    for i in range(n):
        case = case_import(data={**data, "case_id": f"B-{os.getpid()}-{i}"}).case
        proposal = proposal_create(case=case)
        effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=user)


def measured() -> dict:
    import django

    django.setup()
    from django.db.models import Max, Min

    from effects.models import Delivery, DeliveryTry

    states = dict.fromkeys(Delivery.objects.values_list("state", flat=True).distinct(), 0)
    for state in states:
        states[state] = Delivery.objects.filter(state=state).count()
    span = DeliveryTry.objects.aggregate(first=Min("started_at"))
    last = Delivery.objects.aggregate(last=Max("settled_at"))
    seconds = (last["last"] - span["first"]).total_seconds()
    return {"states": states, "seconds": seconds, "tries": DeliveryTry.objects.count()}


def bench_delivery(database_url: str, n: int) -> dict:
    from helpdesk.testing import running_helpdesk

    with (
        tempfile.TemporaryDirectory(prefix="decisionflow-bench-") as tmp,
        running_helpdesk(Path(tmp) / "helpdesk", faults=True, token="bench") as helpdesk,
    ):
        env = _env(database_url, helpdesk.url)
        subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
        raw = raw_rate(helpdesk.url, n)
        subprocess.run([PY, "-m", "bench.delivery", "--approve", str(n)], cwd=ROOT, env=env, check=True)
        subprocess.run(
            [PY, "manage.py", "db_worker", "--batch", "--no-startup-delay", "--no-reload", "-v0"],
            cwd=ROOT,
            env=env,
            check=True,
        )
        out = subprocess.run(
            [PY, "-m", "bench.delivery", "--measure"], cwd=ROOT, env=env, check=True, capture_output=True
        )
        found = json.loads(out.stdout)
        stats = helpdesk.stats()
    delivered = found["states"].get("delivered", 0)
    worker = delivered / found["seconds"] if found["seconds"] > 0 else 0.0
    return {
        "key": "delivery",
        "kind": "delivery",
        "bench": "delivery",
        "database": database_url.split(":", 1)[0],
        "n": n,
        "raw_per_s": round(raw, 1),
        "worker_per_s": round(worker, 1),
        "ratio": round(worker / raw, 3) if raw else None,
        "delivered": delivered,
        "states": found["states"],
        "tries": found["tries"],
        "duplicate_replies": stats["duplicate_replies"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--json")
    parser.add_argument("--approve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "decisionflow.settings")
    if args.approve:
        approve(args.approve)
        return 0
    if args.measure:
        print(json.dumps(measured()))
        return 0
    with tempfile.TemporaryDirectory(prefix="decisionflow-bench-") as tmp:
        url = args.database_url or f"sqlite:///{tmp}/delivery.sqlite3"
        result = bench_delivery(url, args.n)
    print(
        f"delivery: one worker {result['worker_per_s']}/s vs the helpdesk's raw accept {result['raw_per_s']}/s "
        f"(ratio {result['ratio']}) over {result['n']} deliveries; delivered {result['delivered']}, "
        f"duplicate replies {result['duplicate_replies']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["delivered"] == args.n and result["duplicate_replies"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
