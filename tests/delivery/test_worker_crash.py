"""The worker killed (SIGKILL) at each crash point of a delivery, through the real task
worker (`manage.py db_worker`, django-tasks-db) and the reference helpdesk: the delivery is
left Sending, the next worker's sweep turns it Unknown once the lease ran out, and a lookup
(or a resend with the same key) settles it with exactly one reply on the helpdesk."""

from __future__ import annotations

import time

import pytest

from effects.models import Delivery, DeliveryState
from effects.services import effect_commit

DB_TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "point, posts, settled_by",
    [
        ("deliver-before-send", 1, ["lookup", "send"]),
        ("deliver-before-read", 1, ["lookup"]),
        ("deliver-after-send", 1, ["lookup"]),
    ],
)
def test_a_worker_killed_mid_delivery_leaves_unknown_then_one_reply(
    proposal, reviewer, delivering, settings, manage, point, posts, settled_by
):
    settings.TASKS = DB_TASKS
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    env = {
        "DECISIONFLOW_DELIVERY_URL": delivering.url,
        "DECISIONFLOW_DELIVERY_TOKEN": "t",
        "DECISIONFLOW_DELIVERY_LEASE": "1s",
        "DECISIONFLOW_DELIVERY_BACKOFF": "0",
    }
    crashed = manage("db_worker", "--batch", "--no-startup-delay", DECISIONFLOW_CRASH_AT=point, **env)
    assert crashed.returncode == -9, crashed.stderr
    left = Delivery.objects.get()
    assert left.state == DeliveryState.SENDING and left.tries == 1
    assert list(left.try_rows.values_list("kind", flat=True)) == []
    time.sleep(1.1)  # past the lease
    done = manage("db_worker", "--batch", "--no-startup-delay", **env)
    assert done.returncode == 0, done.stderr
    settled = Delivery.objects.get()
    assert settled.state == DeliveryState.DELIVERED, settled.reason
    assert list(settled.try_rows.order_by("id").values_list("kind", flat=True)) == settled_by
    stats = delivering.stats()
    assert (stats["replies"], stats["duplicate_replies"], stats["posts"]) == (1, 0, posts)
    assert settled.reference == delivering.lookup(proposal.operation_id).json["reference"]
