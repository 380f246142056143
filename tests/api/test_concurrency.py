"""16 threads post the same approval to a live server: one effect, one replay=false.

Each request is a real HTTP request to pytest-django's live server, which serves each on
its own thread with its own database connection. PostgreSQL only: SQLite serialises
writers, so a race there proves nothing.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from tests.api.conftest import DEMO_OP

THREADS = 16


def _post(url, token, payload, barrier, results, index):
    from django.db import connections

    try:
        request = urllib.request.Request(
            url,
            data=json.dumps(payload).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        barrier.wait(timeout=30)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                results[index] = (response.status, json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            results[index] = (exc.code, json.loads(exc.read() or b"{}"))
    except Exception as exc:  # recorded, so the assertion below shows it
        results[index] = ("error", repr(exc))
    finally:
        connections.close_all()


def _race(live_server, token, payload):
    url = f"{live_server.url}/api/cases/T-1042/decision"
    barrier = threading.Barrier(THREADS)
    results = [None] * THREADS
    threads = [threading.Thread(target=_post, args=(url, token, payload, barrier, results, i)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    return results


def _assert_one_effect(results):
    from effects.models import CommitAttempt, EffectRecord
    from reviews.models import ReviewDecision

    assert all(status == 200 for status, _ in results), results
    bodies = [body for _, body in results]
    assert all(
        b["status"] == "Committed" and b["effect_count"] == 1 and b["operation_id"] == DEMO_OP for b in bodies
    ), bodies
    assert sorted(b["replay"] for b in bodies) == [False] + [True] * (THREADS - 1)
    assert sorted(b["outcome"] for b in bodies) == ["committed"] + ["replay"] * (THREADS - 1)
    assert EffectRecord.objects.filter(operation_id=DEMO_OP).count() == 1
    assert ReviewDecision.objects.filter(operation_id=DEMO_OP).count() == 1
    outcomes = sorted(CommitAttempt.objects.filter(operation_id=DEMO_OP).values_list("outcome", flat=True))
    assert outcomes == ["committed"] + ["replay"] * (THREADS - 1)


@pytest.mark.postgres
def test_sixteen_threads_same_approval(transactional_db, live_server, proposal, reviewer, reviewer_token):
    from workflow.begin import review_begin

    review_begin(case=proposal.case, actor=reviewer)
    _assert_one_effect(_race(live_server, reviewer_token, {"operation_id": DEMO_OP, "approved": True}))


@pytest.mark.postgres
def test_sixteen_threads_same_approval_never_begun(transactional_db, live_server, case, reviewer_token):
    """The review was never begun: the requests race to begin it too; still one pending review, one effect."""
    from reviews.models import PendingReview, Proposal

    _assert_one_effect(_race(live_server, reviewer_token, {"operation_id": DEMO_OP, "approved": True}))
    assert Proposal.objects.filter(case=case).count() == 1
    assert PendingReview.objects.filter(operation_id=DEMO_OP).count() == 1
