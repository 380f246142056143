"""The case list at any size: index order, a fixed number of queries, no full
count, search by part of a case ID, and (on PostgreSQL) index plans, not sequential scans.

The timings at 10,000 and 1,000,000 cases are `make bench BENCH_ARGS="--only pages"`'s
(docs/PERFORMANCE.md, 9); these tests check the properties the timings rest on.
"""

from __future__ import annotations

from unittest import mock

import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cases.models import Case
from tests.admin.test_changelists import make_cases
from workplace import listing

pytestmark = pytest.mark.django_db

URL = "/admin/cases/case/"


@pytest.fixture
def small_pages():
    """Ten cases per page, so that 50 cases make five pages."""
    with mock.patch.object(admin.site._registry[Case], "list_per_page", 10):
        yield


def queries_of(client, url: str) -> tuple[int, object]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, url
    return len(ctx.captured_queries), response


def listed(response) -> list[str]:
    return [c.case_id for c in response.context["cl"].result_list]


def test_queries_are_the_same_at_5_and_at_50_cases(admin_client, reviewer, small_pages):
    make_cases(0, 5, reviewer)
    at_5 = {url: queries_of(admin_client, url)[0] for url in (URL, f"{URL}?q=T-50", f"{URL}?status=pending_review")}
    make_cases(5, 45, reviewer)
    for url, count in at_5.items():
        assert queries_of(admin_client, url)[0] == count, url
    # A deep page, a search over several pages and a filtered list cost the same too.
    first = at_5[URL]
    assert queries_of(admin_client, f"{URL}?p=5")[0] == first
    assert queries_of(admin_client, f"{URL}?q=T-50&p=2")[0] == at_5[f"{URL}?q=T-50"]
    # No full COUNT: one count (or estimate) query, and the page's rows in one query.
    with CaptureQueriesContext(connection) as ctx:
        admin_client.get(f"{URL}?p=3")
    case_queries = [q["sql"] for q in ctx.captured_queries if "cases_case" in q["sql"]]
    assert len(case_queries) == 2, case_queries
    assert sum("COUNT(*)" in sql.upper() for sql in case_queries) <= 1


def test_pages_follow_the_index_order(admin_client, reviewer, small_pages):
    make_cases(0, 35, reviewer)
    expected = list(Case.objects.order_by("-created_at", "case_id").values_list("case_id", flat=True))
    shown = []
    for page in (1, 2, 3, 4):
        _, response = queries_of(admin_client, f"{URL}?p={page}")
        shown += listed(response)
    assert shown == expected and len(shown) == 36  # T-4999 (the template) and 35 more
    # The page's ids come from a subquery in the list order, the order case_list_order has.
    with CaptureQueriesContext(connection) as ctx:
        admin_client.get(f"{URL}?p=2")
    page_sql = next(q["sql"] for q in ctx.captured_queries if "IN (SELECT" in q["sql"])
    assert 'ORDER BY V0."created_at" DESC, V0."case_id" ASC LIMIT 10 OFFSET 10' in page_sql.replace("U0", "V0")
    (index,) = Case._meta.indexes
    assert index.name == "case_list_order" and index.fields[:2] == ["-created_at", "case_id"]
    assert Case._meta.ordering == ["-created_at", "case_id"]


def test_search_by_part_of_a_case_id(admin_client, reviewer, case):
    make_cases(0, 12, reviewer)
    assert listed(admin_client.get(f"{URL}?q=1042")) == ["T-1042"]
    assert sorted(listed(admin_client.get(f"{URL}?q=501"))) == ["T-5010", "T-5011"]
    assert listed(admin_client.get(f"{URL}?q=t-5003")) == ["T-5003"]
    assert listed(admin_client.get(f"{URL}?q=9999")) == []
    page = admin_client.get(f"{URL}?q=501").content.decode()
    assert "2 results" in page


def test_a_long_filtered_list_counts_only_a_few_pages_ahead(admin_client, reviewer, small_pages):
    make_cases(0, 50, reviewer)
    with mock.patch.object(listing, "COUNT_AT_LEAST", 20), mock.patch.object(listing, "PAGES_AHEAD", 1):
        _, response = queries_of(admin_client, f"{URL}?q=T-")
        paginator = response.context["cl"].paginator
        # Counted up to two pages (the first and one ahead) and one row more: a lower bound.
        assert paginator.count == 21 and paginator.count_is_lower_bound
        assert paginator.count_label == "more than 20"
        text = response.content.decode()
        assert "more than 20 results" in text and "more than 20 cases" in text
        assert list(paginator.get_elided_page_range(1))[-1] == paginator.ELLIPSIS
        # Further pages are reached step by step: the count moves ahead with the page.
        _, response = queries_of(admin_client, f"{URL}?q=T-&p=3")
        assert len(listed(response)) == 10 and response.context["cl"].paginator.count_cap == 40
        _, response = queries_of(admin_client, f"{URL}?q=T-&p=6")
        paginator = response.context["cl"].paginator
        assert listed(response) == ["T-4999"] and paginator.count == 51 and not paginator.count_is_lower_bound


def test_the_unfiltered_count_is_exact_when_small(admin_client, reviewer):
    make_cases(0, 3, reviewer)
    _, response = queries_of(admin_client, URL)
    paginator = response.context["cl"].paginator
    assert paginator.count == 4 and not paginator.count_is_estimate and paginator.count_label == "4"
    assert "4 cases" in response.content.decode()


def test_the_reviewer_filter_lists_who_decided(admin_client, reviewer, make_user):
    make_user("never-decided")
    make_cases(0, 4, reviewer)
    _, response = queries_of(admin_client, URL)
    (spec,) = [s for s in response.context["cl"].filter_specs if getattr(s, "parameter_name", "") == "reviewer"]
    assert spec.lookup_choices == [(str(reviewer.pk), "reviewer")]


def plans_of(client, url: str) -> list[str]:
    """EXPLAIN of each query on the case table the page runs (the planner as configured)."""
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    plans = []
    with connection.cursor() as cursor:
        for query in ctx.captured_queries:
            if '"cases_case"' in query["sql"] and "pg_class" not in query["sql"]:
                cursor.execute("EXPLAIN " + query["sql"])
                plans.append("\n".join(row[0] for row in cursor.fetchall()))
    assert plans, url
    return plans


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_first_page_and_search_use_indexes_not_a_sequential_scan(admin_client):
    """On 20,000 cases loaded as the benchmark loads them, with fresh statistics: the planner
    reads the first page, a deep page and the search on indexes, never the whole table."""
    from bench.bigdata import load_operations
    from bench.data import raw_connect

    with raw_connect() as conn:
        load_operations(conn, 20_000)  # ends with VACUUM ANALYZE
    for url in (URL, f"{URL}?p=150"):
        (page,) = plans_of(admin_client, url)
        assert "Seq Scan on cases_case" not in page, page
        assert "case_list_order" in page, page
    count, page = plans_of(admin_client, f"{URL}?q=1042")
    for plan in (count, page):
        assert "Seq Scan on cases_case" not in plan, plan
        assert "case_id_trgm" in plan and "case_subject_trgm" in plan, plan
    assert listed(admin_client.get(f"{URL}?q=0001042")) == ["L-0001042"]
    # Above the threshold the unfiltered list shows the planner's estimate, in one query.
    with mock.patch.object(listing, "EXACT_COUNT_BELOW", 10_000):
        queries, response = queries_of(admin_client, URL)
    paginator = response.context["cl"].paginator
    assert paginator.count_is_estimate and 19_000 <= paginator.count <= 21_000
    assert f"about {paginator.count:,} cases" in response.content.decode()
    assert queries == queries_of(admin_client, URL)[0]  # the exact count below it: as many queries


def estimated_page_plans(admin_client, page_url: str, table: str):
    """One page of a large list above the exact-count threshold (20,000 rows here, 50,000
    shipped): the count is the planner's estimate (one pg_class query, no COUNT of the
    table); returns the response and the plans of the queries that read the table."""
    with mock.patch.object(listing, "EXACT_COUNT_BELOW", 10_000), CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(page_url)
    assert response.status_code == 200
    sql = [q["sql"] for q in ctx.captured_queries if f'"{table}"' in q["sql"]]
    pages = [s for s in sql if "pg_class" not in s]
    assert len(sql) - len(pages) == 1 and not any("COUNT(" in s.upper() for s in pages), sql
    assert response.context["cl"].paginator.count_is_estimate
    plans = []
    with connection.cursor() as cursor:
        for s in pages:
            cursor.execute("EXPLAIN " + s)
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
    return response, plans


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_proposal_list_reads_its_index_and_counts_nothing_whole(admin_client):
    """20,000 proposals as the benchmark loads them: the changelist's pages are read on
    ``proposal_list_order`` (the stock list sorted every proposal, and counted them twice)."""
    from bench.bigdata import load_operations
    from bench.data import raw_connect

    with raw_connect() as conn:
        load_operations(conn, 20_000)
    url = "/admin/reviews/proposal/"
    for page_url in (url, f"{url}?p=150"):
        response, plans = estimated_page_plans(admin_client, page_url, "reviews_proposal")
        assert any("proposal_list_order" in p for p in plans), plans
        assert not any("Seq Scan on reviews_proposal" in p for p in plans), plans
    assert len(response.context["cl"].result_list) == 100


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_attempt_list_reads_the_primary_key_newest_first_and_counts_nothing_whole(admin_client):
    """20,000 attempts as the benchmark loads them: the commit-attempt changelist reads its
    pages newest first on the primary key (the stock list sorted every attempt by its time,
    and counted them all: 1.7 s at 1,000,000), with the planner's estimate for the count."""
    from bench.bigdata import load_operations, load_page_extras
    from bench.data import raw_connect

    with raw_connect() as conn:
        load_operations(conn, 20_000)
        load_page_extras(conn, 20_000)
    url = "/admin/effects/commitattempt/"
    for page_url in (url, f"{url}?p=150"):
        response, plans = estimated_page_plans(admin_client, page_url, "effects_commitattempt")
        assert any("effects_commitattempt_pkey" in p for p in plans), plans
        assert not any("Seq Scan on effects_commitattempt" in p for p in plans), plans
    ids = [attempt.pk for attempt in response.context["cl"].result_list]
    assert len(ids) == 100 and ids == sorted(ids, reverse=True)
