"""Benchmark 9: the admin's pages at two table sizes: query count and p50.

Runs inside a benchmark process on a database bench.run bulk-loaded (10,000 cases, then
1,000,000 in another). The pages are rendered through Django's test client (no HTTP
server), logged in as a superuser, so the figure is the view's own cost: queries, ORM and
templates.
"""

from __future__ import annotations

import json
import time

from bench.stats import summary


def _client(user):
    from django.test import Client

    client = Client(SERVER_NAME="localhost")
    client.force_login(user)
    return client


def _measure(client, url: str, requests: int, post: dict | None = None) -> dict:
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    def get():
        return client.get(url) if post is None else client.post(url, post)

    # The request_started signal empties the query log; start from empty so the captured
    # slice is exactly this request's queries.
    reset_queries()
    with CaptureQueriesContext(connection) as queries:
        response = get()
    # Read now: captured_queries re-reads the live log, which the next request empties.
    count = len(queries.captured_queries)
    if response.status_code != 200:
        raise AssertionError(f"GET {url} answered {response.status_code}")
    times = []
    for _ in range(requests):
        t = time.perf_counter()
        response = get()
        times.append((time.perf_counter() - t) * 1000)
        if response.status_code != 200:
            raise AssertionError(f"GET {url} answered {response.status_code}")
    return {"url": url, "queries": count, "ms": summary(times), "times_ms": times, "bytes": len(response.content)}


# --- 9. the same pages at two sizes (bench.run's "pages" part) --------------------------

# A part of a case ID that names one case at every size the benchmark loads ("L-0001042"
# without its prefix), and a shorter one that matches more cases the more there are.
SEARCH_ONE = "0001042"
# A term more than 100 cases match at every size (111 at 10,000, 11,111 at 1,000,000: "bulk 42",
# "bulk 420", ... in their subjects), so that both pages show a full list. Searched in quotes,
# as the admin searches a phrase (unquoted, it is two words, each anywhere).
SEARCH_MANY = "bulk 42"
PAGES_CASE_PREFIX = "BENCH-PAGES"
HISTORY_CASE_PREFIX = "BENCH-HISTORY"
HISTORY_EVENTS = 1000
DEEP_PAGE = 1000
# The publish preview: a new version of the policy every loaded case is under, so that every
# undecided case is affected (6,000 at 10,000 cases, 600,000 at 1,000,000).
PUBLISH_PREVIEW = {"name": "support-reply", "label": "v4", "parameters": {"allowance_units": 10}}


def _pages_case():
    """The paused case whose review and history pages are measured: made once per database
    and kept, so that every round and both sizes measure the same kind of case."""
    from bench.data import make_cases
    from cases.models import Case
    from workflow.begin import review_begin

    case = Case.objects.filter(case_id__startswith=f"{PAGES_CASE_PREFIX}-").first()
    if case is None:
        (case,) = make_cases(1, prefix=PAGES_CASE_PREFIX, proposals=False)
        review_begin(case=case)
        case.refresh_from_db()
    return case


def _history_case():
    """A case with ``HISTORY_EVENTS`` events in its history (refused attempts, as a reviewer
    retrying from a stale tab makes them), made once per database and kept."""
    from bench.data import make_cases
    from cases.models import Case
    from core.errors import RefusalReason
    from effects.models import CommitAttempt

    case = Case.objects.filter(case_id__startswith=f"{HISTORY_CASE_PREFIX}-").first()
    if case is None:
        (case,) = make_cases(1, prefix=HISTORY_CASE_PREFIX, proposals=True)
        case.refresh_from_db()
        operation_id = case.current_proposal.operation_id
        CommitAttempt.objects.bulk_create(
            CommitAttempt(
                operation_id=operation_id,
                case=case,
                approved=True,
                outcome=CommitAttempt.Outcome.STALE,
                reason=RefusalReason.STALE,
                channel="admin",
                detail=f"bench: refusal {n}",
            )
            for n in range(HISTORY_EVENTS)
        )
    return case


def bench_pages(*, requests: int) -> dict:
    """The issue's pages, each timed ``requests`` times after one untimed request that counts
    its queries. Raw times are kept so that bench.run can pool its alternating rounds."""
    from django.contrib.auth import get_user_model
    from django.urls import reverse

    from cases.models import Case
    from workplace.review import CaseAdmin

    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = _client(user)
    case = _pages_case()
    total = Case.objects.count()
    per_page = CaseAdmin.list_per_page
    # Pages that exist at every size are full pages: the last full one where there are fewer.
    last_page = max(1, total // per_page)
    changelist = reverse("admin:cases_case_changelist")
    review = (
        reverse("admin:reviews_proposal_review", args=[case.current_proposal_id]) if case.current_proposal_id else None
    )
    pages = [
        ("first", "case changelist, first page", changelist),
        ("page100", "case changelist, page 100", f"{changelist}?p={min(100, last_page)}"),
        (
            "deep",
            f"case changelist, page {DEEP_PAGE:,} (the last full page where there are fewer)",
            f"{changelist}?p={min(DEEP_PAGE, last_page)}",
        ),
        (
            "search_one",
            f"search by part of a case ID, `{SEARCH_ONE}` (one match)",
            f"{changelist}?q={SEARCH_ONE}",
        ),
        (
            "search_many",
            f"search by part of a subject, `{SEARCH_MANY}` (a full page at both sizes, more matches at more cases)",
            f"{changelist}?q=%22{SEARCH_MANY.replace(' ', '+')}%22",  # quoted: one phrase, not two words
        ),
        ("review", "review page (paused case)", review),
        ("history", "case history page", reverse("admin:cases_case_history", args=[case.pk])),
        ("proposals", "proposal changelist, first page", reverse("admin:reviews_proposal_changelist")),
        ("attempts", "commit-attempt changelist, first page", reverse("admin:effects_commitattempt_changelist")),
        ("deliveries", "deliveries list, first page", reverse("admin:effects_delivery_changelist")),
        (
            "queue",
            "review queue, first page (a tenth of the cases pending: 1,000 and 100,000)",
            reverse("admin:reviews_reviewqueueitem_changelist"),
        ),
        (
            "history_1000",
            f"history page of a case with {HISTORY_EVENTS:,} events",
            reverse("admin:cases_case_history", args=[_history_case().pk]),
        ),
        (
            "publish_preview",
            "policy publish preview (every undecided case affected: 6,000 and 600,000)",
            reverse("admin:cases_policy_publish"),
        ),
    ]
    posts = {"publish_preview": {"policy": json.dumps(PUBLISH_PREVIEW)}}
    measured = []
    # Every page has the goal (bench.run.pages_combine): none is measured for context only.
    for key, label, url in pages:
        row = {"key": key, "label": label, "url": url}
        if url is None:
            row["error"] = "no review page: the paused case has no current proposal"
        else:
            try:
                row.update(_measure(client, url, requests, posts.get(key)))
            except Exception as exc:  # a page that fails is reported, not hidden
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        measured.append(row)
    return {"key": "pages", "kind": "pages", "cases": total, "last_page": last_page, "pages": measured}
