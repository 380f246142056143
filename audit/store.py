"""The export's SQL: CSV of a flat export through PostgreSQL's ``COPY … TO STDOUT``.

psycopg's own mechanism for reading many rows fast; the bytes are those
``audit.exports.python_chunks`` writes (tests/audit/test_exports.py runs both on the same
rows). The statement is the export's own queryset (the ORM's filters, joins and order), with
each column rendered to its CSV text by the ORM's expressions, as ``audit.formats.csv_text``
renders it: NULL and '' as an empty cell, booleans ``true``/``false``, times in UTC with
microseconds, and a text whose first character is one of ``FORMULA_START`` behind a ``'``
(``ascii()`` of the first character: cheaper than taking it as a text, 1.9 s against 2.3 s
for a million attempts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from django.db import connection, transaction
from django.db.models import Case, F, Func, IntegerField, QuerySet, TextField, Value, When
from django.db.models.functions import Cast, Concat, NullIf
from django.db.models.lookups import In
from psycopg import sql

from audit import formats
from audit.formats import Column

# Rows per chunk handed on: COPY gives one row per read, and the chunk is what is hashed,
# written and sent (about 170 KB for an attempt export).
ROWS_PER_CHUNK = 1000
_TEXT = TextField()


def rendered(column: Column):
    """The column as its CSV cell's text (NULL for an empty cell), as an ORM expression."""
    value = F(column.path)
    if column.kind == formats.INT:
        return Cast(value, _TEXT)
    if column.kind == formats.BOOL:
        return Case(
            When(**{column.path: True}, then=Value("true")),
            When(**{column.path: False}, then=Value("false")),
            output_field=_TEXT,
        )
    if column.kind == formats.TIME:
        return Func(
            value,
            template="to_char(%(expressions)s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
            output_field=_TEXT,
        )
    # A text column as it is (no cast: varchar and text are both PostgreSQL texts).
    first = Func(value, function="ascii", output_field=IntegerField())
    return Case(
        When(
            In(first, [ord(ch) for ch in formats.FORMULA_START]),
            then=Concat(Value(formats.NEUTRALISER), value, output_field=_TEXT),
        ),
        default=NullIf(value, Value("")),
        output_field=_TEXT,
    )


def copy_statement(columns: tuple[Column, ...], queryset: QuerySet) -> tuple[sql.Composed, tuple]:
    """``COPY (<the export's queryset, each column rendered>) TO STDOUT WITH (FORMAT csv)``."""
    inner = queryset.values(**{f"c{i}": rendered(c) for i, c in enumerate(columns)})
    inner_sql, params = inner.query.sql_with_params()
    statement = sql.SQL("COPY ({}) TO STDOUT WITH (FORMAT csv)").format(sql.SQL(inner_sql))
    return statement, tuple(params)


def copy_csv_chunks(columns: tuple[Column, ...], queryset: QuerySet, counter: Callable[[int], None]) -> Iterator[bytes]:
    """The CSV records, ``ROWS_PER_CHUNK`` at a time."""
    statement, params = copy_statement(columns, queryset)
    with transaction.atomic(), connection.cursor() as cursor:
        # JIT-compiling the rendering took longer than running it, as for reconcile's COPY
        # (docs/PERFORMANCE.md, 8 and 20); the setting ends with this transaction.
        cursor.execute("SET LOCAL jit = off")
        # psycopg's own copy(): it binds the parameters (Django's debug cursor's takes none).
        with cursor.cursor.copy(statement, params) as copy:
            pending: list = []
            append, read = pending.append, copy.read
            # Each row is a memoryview of libpq's buffer, which it keeps alive: joined as it is.
            # read() straight: Copy.__iter__ is a generator around it, one more call per row.
            while row := read():
                append(row)
                if len(pending) == ROWS_PER_CHUNK:
                    counter(ROWS_PER_CHUNK)
                    yield b"".join(pending)
                    pending.clear()
            if pending:
                counter(len(pending))
                yield b"".join(pending)
