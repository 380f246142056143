"""The export's SQL: CSV of a flat export through PostgreSQL's ``COPY … TO STDOUT``.

psycopg's own mechanism for reading many rows fast; the bytes are those
``audit.exports.python_chunks`` writes (tests/audit/test_exports.py runs both on one set of
rows). Each value is rendered as ``audit.formats.csv_text`` does: NULL and '' as an empty
cell, booleans ``true``/``false``, times in UTC with microseconds, and a text that starts
with one of ``FORMULA_START`` behind a ``'``. The rows are the export's own queryset
(the ORM's filters and joins), read as a subquery.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from django.db import connection
from django.db.models import F, QuerySet
from psycopg import sql

from audit import formats
from audit.formats import Column


def _rendered(kind: str, column: sql.Composable) -> sql.Composable:
    if kind == formats.INT:
        return sql.SQL("{}::text").format(column)
    if kind == formats.BOOL:
        return sql.SQL("CASE WHEN {c} THEN 'true' WHEN NOT {c} THEN 'false' END").format(c=column)
    if kind == formats.TIME:
        return sql.SQL("to_char({} AT TIME ZONE 'UTC', {})").format(
            column, sql.Literal('YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
        )
    starts = sql.SQL(", ").join(sql.Literal(ch) for ch in formats.FORMULA_START)
    return sql.SQL("CASE WHEN left({c}, 1) IN ({starts}) THEN {mark} || {c} ELSE NULLIF({c}, '') END").format(
        c=sql.SQL("{}::text").format(column), starts=starts, mark=sql.Literal(formats.NEUTRALISER)
    )


def copy_statement(columns: tuple[Column, ...], queryset: QuerySet) -> tuple[sql.Composed, tuple]:
    """``COPY (SELECT <each column rendered> FROM (<the rows>) q ORDER BY q.o) TO STDOUT``."""
    inner = formats.flat_values(columns, queryset).annotate(o=F("pk")).order_by()
    inner_sql, params = inner.query.sql_with_params()
    rendered = sql.SQL(", ").join(_rendered(c.kind, sql.Identifier("q", f"c{i}")) for i, c in enumerate(columns))
    statement = sql.SQL("COPY (SELECT {columns} FROM ({inner}) AS q ORDER BY q.o) TO STDOUT WITH (FORMAT csv)").format(
        columns=rendered, inner=sql.SQL(inner_sql)
    )
    return statement, tuple(params)


def copy_csv_chunks(columns: tuple[Column, ...], queryset: QuerySet, counter: Callable[[int], None]) -> Iterator[bytes]:
    """The CSV records, about ``CHUNK_BYTES`` at a time: COPY hands one row per read, and a
    chunk per row would cost a hash update, a write and a response chunk each."""
    statement, params = copy_statement(columns, queryset)
    connection.ensure_connection()
    with connection.cursor() as cursor, cursor.copy(statement, params) as copy:
        pending: list[bytes] = []
        size = count = 0
        for row in copy:
            pending.append(bytes(row))
            size += len(row)
            count += 1
            if size >= formats.CHUNK_BYTES:
                counter(count)
                yield b"".join(pending)
                pending, size, count = [], 0, 0
        if pending:
            counter(count)
            yield b"".join(pending)
