"""Benchmark 9: admin pages over a large table: query count (constant in table size) and p50.

Runs inside the PostgreSQL benchmark process, after bench.run bulk-loaded the cases. The
pages are rendered through Django's test client (no HTTP server), logged in as a
superuser, so the figure is the view's own cost: queries, ORM and templates.
"""

from __future__ import annotations

import time

from .stats import summary

QUERY_GOAL = 12


def _client(user):
    from django.test import Client

    client = Client(SERVER_NAME="localhost")
    client.force_login(user)
    return client


def _measure(client, url: str, requests: int) -> dict:
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    # The request_started signal empties the query log; start from empty so the captured
    # slice is exactly this request's queries.
    reset_queries()
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    # Read now: captured_queries re-reads the live log, which the next request empties.
    count = len(queries.captured_queries)
    if response.status_code != 200:
        raise AssertionError(f"GET {url} answered {response.status_code}")
    times = []
    for _ in range(requests):
        t = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - t) * 1000)
        if response.status_code != 200:
            raise AssertionError(f"GET {url} answered {response.status_code}")
    return {"url": url, "queries": count, "ms": summary(times), "bytes": len(response.content)}


def bench_admin(*, requests: int) -> dict:
    """The case changelist (first and a deep page) and the review page of a paused case."""
    from django.contrib.auth import get_user_model
    from django.urls import NoReverseMatch, reverse

    from cases.models import Case

    from .data import make_cases, run_token
    from .measures import workflow_available

    total = Case.objects.count()
    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = _client(user)
    pages = []
    changelist = reverse("admin:cases_case_changelist")
    pages.append(("case changelist, first page", changelist))
    pages.append(("case changelist, page 100", f"{changelist}?p=100"))
    pages.append(("case changelist, search by case ID", f"{changelist}?q=L-0000777"))
    # Not one of the two pages; shown for context, without the goal.
    context_only = {"case history page", "proposal changelist"}
    missing = []
    (case,) = make_cases(1, prefix=f"{run_token()}-adm", proposals=False)
    if workflow_available():
        from decisionflow.workflow.services import review_begin

        review_begin(case=case)
    case.refresh_from_db()
    # The case's review URL redirects to its current proposal's review page: measure that.
    for name, label, pk in (
        ("admin:reviews_proposal_review", "review page (paused case)", case.current_proposal_id),
        ("admin:cases_case_history", "case history page", case.pk),
    ):
        try:
            if pk is None:
                raise NoReverseMatch("the case has no proposal (workflow not available)")
            pages.append((label, reverse(name, args=[pk])))
        except NoReverseMatch:
            missing.append(f"{name} (not available)")
    try:
        pages.append(("proposal changelist", reverse("admin:reviews_proposal_changelist")))
    except NoReverseMatch:
        missing.append("admin:reviews_proposal_changelist")
    measured = []
    for label, url in pages:
        try:
            row = _measure(client, url, requests)
        except Exception as exc:  # a page that fails is reported, not hidden
            row = {"url": url, "error": f"{type(exc).__name__}: {exc}"[:300]}
        row["label"] = label
        row["goal"] = label not in context_only
        measured.append(row)
    return {
        "key": "admin",
        "kind": "admin",
        "cases": total,
        "requests": requests,
        "pages": measured,
        "missing": missing,
        "query_goal": QUERY_GOAL,
    }
