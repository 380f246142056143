"""The case list at any size: pages read in index order, statuses for the shown rows only,
and no COUNT over the whole table.

At a million cases the stock changelist paid, on every page (docs/PERFORMANCE.md, 9):

- the status of every row it skipped: a deep page (OFFSET) computed the status subqueries
  of ``cases_with_status`` for each row before it, and their estimated cost made PostgreSQL
  JIT-compile the query, which alone took longer than the page. Here a page first reads its
  case ids on the index that matches the list order (``case_list_order`` in cases), and only
  those rows get their statuses: one query, its cost that of the page, whatever the table's
  size;
- two COUNTs (the filtered one and the full one). Here there is none over the whole table:
  the unfiltered list shows the planner's estimate (exact below ``EXACT_COUNT_BELOW``), a
  filtered or searched one counts at most ``COUNT_AT_LEAST`` rows, or a few pages past the
  one shown, and says "more than" beyond that.

The search by part of a case ID or subject is a ``LIKE '%...%'`` that trigram indexes serve
on PostgreSQL (cases migration 0003); see CaseAdmin.search_fields.
"""

from __future__ import annotations

from django.core.paginator import Page, Paginator
from django.db import connections
from django.db.models import QuerySet
from django.db.models.expressions import RawSQL
from django.utils.functional import cached_property

# Below this many rows (as the planner estimates them) the unfiltered list is counted
# exactly: the count is cheap there, and reviewers see the exact number.
EXACT_COUNT_BELOW = 50_000
# A filtered or searched list counts at least this many rows, and as far as PAGES_AHEAD
# pages past the one asked for, so that "next" always leads somewhere known. Ten pages: a
# broad search at a million cases counted 10,000 matches in 20 ms, more than the page.
COUNT_AT_LEAST = 1_000
PAGES_AHEAD = 10


def page_hint(request) -> int:
    """The page the request asks for (the admin's ``p``), or 1; the admin validates it."""
    value = request.GET.get("p", "1")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def _estimated_count(queryset: QuerySet) -> tuple[int, bool]:
    """The table's row count as the planner estimates it (the relation's size times the
    rows per page its last ANALYZE saw), or the exact count where that is small or unknown,
    in one query; and whether it is an estimate."""
    connection = connections[queryset.db]
    table = queryset.model._meta.db_table
    with connection.cursor() as cursor:
        # The count(*) is an InitPlan: PostgreSQL runs it only when the CASE needs it.
        cursor.execute(
            f"""
            SELECT CASE WHEN e.n < %s THEN (SELECT count(*) FROM {connection.ops.quote_name(table)}) ELSE e.n END,
                   e.n >= %s
            FROM (
                SELECT CASE WHEN c.relpages > 0 AND c.reltuples >= 0
                            THEN (c.reltuples / c.relpages
                                  * (pg_relation_size(c.oid) / current_setting('block_size')::int))::bigint
                            ELSE -1 END AS n
                FROM pg_class c WHERE c.oid = %s::regclass
            ) e
            """,
            [EXACT_COUNT_BELOW, EXACT_COUNT_BELOW, table],
        )
        count, estimated = cursor.fetchone()
    return int(count), bool(estimated)


class LargeListPaginator(Paginator):
    """A paginator for a large, index-ordered list: a bounded count, and pages whose rows
    are chosen by primary key first (see the module's docstring)."""

    def __init__(self, object_list: QuerySet, per_page, orphans=0, allow_empty_first_page=True, *, page_hint: int = 1):
        super().__init__(object_list, per_page, orphans, allow_empty_first_page)
        self.queryset = object_list
        self.page_hint = page_hint
        self.count_is_estimate = False
        self.count_is_lower_bound = False

    @cached_property
    def count(self) -> int:
        queryset = self.queryset
        unfiltered = not queryset.query.where and not queryset.query.distinct
        if unfiltered and connections[queryset.db].vendor == "postgresql":
            count, self.count_is_estimate = _estimated_count(queryset)
            return count
        if unfiltered:
            return queryset.order_by().values("pk").count()
        cap = self.count_cap
        count = queryset.order_by().values("pk")[: cap + 1].count()
        self.count_is_lower_bound = count > cap
        return count

    @property
    def count_cap(self) -> int:
        return max(COUNT_AT_LEAST, (self.page_hint + PAGES_AHEAD) * self.per_page)

    @property
    def count_label(self) -> str:
        """The count as the list shows it: "about 1,000,000", "more than 1,100" or "42"."""
        if self.count_is_lower_bound:
            return f"more than {self.count_cap:,}"
        if self.count_is_estimate:
            return f"about {self.count:,}"
        return f"{self.count:,}"

    def page(self, number):
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        # One query: the page's ids in list order on the index (a LIMIT/OFFSET subquery that
        # selects no status), then those rows with their statuses, in the same order.
        ids = self.queryset.values("pk")[bottom:top]
        return Page(self.queryset.filter(pk__in=ids), number, self)

    def get_elided_page_range(self, number=1, *, on_each_side=3, on_ends=2):
        pages = super().get_elided_page_range(number, on_each_side=on_each_side, on_ends=on_ends)
        if not self.count_is_lower_bound:
            yield from pages
            return
        # The last page is not known: end with the pages around this one, then an ellipsis.
        number = self.validate_number(number)
        shown: list = []
        for page in pages:
            if isinstance(page, int) and page > number + on_each_side:
                break
            shown.append(page)
        while shown and not isinstance(shown[-1], int):
            shown.pop()
        yield from shown
        yield self.ELLIPSIS


class LargeListAdminMixin:
    """The case changelist's paging (CaseAdmin): the paginator above, told which page the
    request asks for, and no second COUNT for the "N total" of a filtered list."""

    show_full_result_count = False

    def get_paginator(self, request, queryset, per_page, orphans=0, allow_empty_first_page=True):
        return LargeListPaginator(queryset, per_page, orphans, allow_empty_first_page, page_hint=page_hint(request))


# The reviewers who decided anything, for the list's "reviewer" filter: one index probe per
# reviewer (a loose index scan), where EXISTS per user or DISTINCT read every decision's
# index entry (40 ms at 400,000 decisions). Valid on PostgreSQL and SQLite alike.
_DECIDED_REVIEWER_IDS = """
    WITH RECURSIVE r(id) AS (
        SELECT min(reviewer_id) FROM reviews_reviewdecision
        UNION ALL
        SELECT (SELECT min(d.reviewer_id) FROM reviews_reviewdecision d WHERE d.reviewer_id > r.id)
        FROM r WHERE r.id IS NOT NULL
    )
    SELECT id FROM r WHERE id IS NOT NULL
"""


def reviewers_with_decisions(users: QuerySet) -> QuerySet:
    """``users`` narrowed to those who recorded at least one decision (one query when read)."""
    return users.filter(pk__in=RawSQL(_DECIDED_REVIEWER_IDS, []))
