"""The broker-backed task backend (django-tasks-rq on a private redis-server): the enqueue
waits for the commit that wrote the delivery, a rolled-back one enqueues nothing, and two
``manage.py rqworker`` processes given the same delivery twice send it once.

redis-server comes from `make redis`; without it these tests skip, or fail when
``DECISIONFLOW_REQUIRE_POSTGRES=1`` (CI). The long form with kill -9 is
``reliability/broker.py`` (`make reliability`).
"""

from __future__ import annotations

import os
import subprocess
import sys

import django_rq
import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from effects.models import Delivery, DeliveryState
from effects.services import effect_commit
from effects.tasks import deliver, delivery_enqueue
from reliability import redis_server
from tests.conftest import ROOT
from tests.reliability.conftest import child_env

pytestmark = pytest.mark.django_db(transaction=True)

RQ_TASKS = {"default": {"BACKEND": "django_tasks_rq.RQBackend"}}


@pytest.fixture
def redis(settings, delivering):
    if redis_server.binary() is None:
        message = "redis-server is not installed: `make redis` installs Debian's package (as root)"
        if os.environ.get("DECISIONFLOW_REQUIRE_POSTGRES") == "1":
            pytest.fail(message + ", and DECISIONFLOW_REQUIRE_POSTGRES=1 requires it")
        pytest.skip(message)
    with redis_server.RedisServer() as server:
        settings.TASKS = RQ_TASKS
        settings.RQ_QUEUES = {"default": {"URL": server.url}}
        yield server


def queued() -> list[tuple[list, dict]]:
    return [(list(job.args), dict(job.kwargs)) for job in django_rq.get_queue("default").jobs]


def rqworker(redis, delivering) -> subprocess.Popen:
    env = child_env(
        DECISIONFLOW_TASKS_BACKEND=RQ_TASKS["default"]["BACKEND"],
        DECISIONFLOW_TASKS_REDIS_URL=redis.url,
        DECISIONFLOW_DELIVERY_URL=delivering.url,
        DECISIONFLOW_DELIVERY_TOKEN="t",
    )
    argv = [sys.executable, "manage.py", "rqworker", "--burst"]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_enqueue_waits_for_the_commit_and_two_workers_send_once(proposal, reviewer, delivering, redis):
    operation_id = proposal.operation_id
    effect_commit(operation_id=operation_id, approved=True, reviewer=reviewer)
    assert queued() == [([operation_id], {})]  # its own transaction committed: enqueued at once

    with transaction.atomic():
        delivery_enqueue(operation_id)
        assert len(queued()) == 1  # not in the broker while the transaction may still roll back
    assert len(queued()) == 2
    with pytest.raises(RuntimeError), transaction.atomic():
        delivery_enqueue(operation_id)
        raise RuntimeError("rolled back")
    assert len(queued()) == 2  # a rolled-back transaction enqueued nothing

    # The same delivery twice, two workers at once: one claims and sends, the other's try
    # finds it claimed or delivered.
    workers = [rqworker(redis, delivering), rqworker(redis, delivering)]
    # A burst run ends once the queue is empty: within seconds, not after the minute RQ's
    # command-channel thread could sleep on the way out (workflow's TaskWorker.subscribe).
    outputs = [worker.communicate(timeout=30)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], outputs
    assert queued() == []
    done = Delivery.objects.get()
    assert (done.state, done.tries) == (DeliveryState.DELIVERED, 1)
    stats = delivering.stats()
    assert (stats["replies"], stats["duplicate_replies"]) == (1, 0)
    finished = django_rq.get_queue("default").finished_job_registry.get_job_ids()
    results = [deliver.get_result(job_id).return_value for job_id in finished]
    assert sorted(results) == ["delivered", "not_claimed"]


def test_rqworker_refuses_another_backend():
    with pytest.raises(CommandError, match="run `manage.py db_worker`"):
        call_command("rqworker", "--burst")  # the suite's backend is the database's


def test_a_broker_that_does_not_answer_loses_the_enqueue_not_the_approval(proposal, reviewer, delivering, settings):
    from reliability.pooler import free_port
    from reviews import notifications

    settings.TASKS = RQ_TASKS
    settings.RQ_QUEUES = {"default": {"URL": f"redis://127.0.0.1:{free_port()}/0"}}  # nothing listens
    committed = effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert committed.status == "Committed" and Delivery.objects.get().state == DeliveryState.QUEUED
    notifications.enqueue(12345)  # nor does a notification's enqueue raise: the sweeps find both


def test_help(capsys):
    with pytest.raises(SystemExit) as exc:
        call_command("rqworker", "--help")
    assert exc.value.code == 0 and "DECISIONFLOW_TASKS_REDIS_URL" in capsys.readouterr().out
