"""How an export writes its values: the columns, the CSV and JSON Lines text, formula
neutralisation. Shared by the Python writer (audit/exports.py) and the COPY writer
(audit/store.py), which must write the same bytes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import F, QuerySet

CHUNK_ROWS = 2000
CHUNK_BYTES = 1 << 16
# A spreadsheet runs a cell that starts with one of these as a formula (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
NEUTRALISER = "'"

TEXT, INT, BOOL, TIME = "text", "int", "bool", "time"


class Format:
    CSV = "csv"
    JSONL = "jsonl"
    ALL = (CSV, JSONL)
    CONTENT_TYPE = {CSV: "text/csv; charset=utf-8", JSONL: "application/x-ndjson; charset=utf-8"}


def neutralised(text: str) -> str:
    """``text`` as a spreadsheet shows it and never runs it."""
    return NEUTRALISER + text if text[:1] in FORMULA_START else text


def _time_text(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def csv_text(kind: str, value: Any) -> str:
    """A value as a CSV cell's text: '' for none, ``true``/``false``, UTC times with
    microseconds, formulas neutralised. ``audit.store`` renders the same in SQL."""
    if value is None or value == "":
        return ""
    if kind == BOOL:
        return "true" if value else "false"
    if kind == TIME:
        return _time_text(value)
    if kind == INT:
        return str(value)
    return neutralised(str(value))


def json_value(kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == TIME:
        return _time_text(value)
    return value


def csv_line(cells: Iterable[str]) -> str:
    """One CSV record as PostgreSQL's COPY writes it: quoted only when a cell holds a comma, a
    quote, CR or LF (quotes doubled), LF at the end. Python's csv module leaves a lone CR
    unquoted, so it is not used: every row of an export must read back as one record."""
    return ",".join(f'"{c.replace(chr(34), chr(34) * 2)}"' if _needs_quotes(c) else c for c in cells) + "\n"


def _needs_quotes(cell: str) -> bool:
    return "," in cell or '"' in cell or "\n" in cell or "\r" in cell


@dataclass(frozen=True)
class Column:
    name: str
    path: str  # the ORM lookup (values()), or the history row's key
    kind: str
    meaning: str


def flat_values(columns: tuple[Column, ...], queryset: QuerySet) -> QuerySet:
    """The rows as ``c0…cn`` values, in the queryset's order."""
    return queryset.values(**{f"c{i}": F(c.path) for i, c in enumerate(columns)})
