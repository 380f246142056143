"""A row of one raw statement that joins several tables, read back as the models it joins.

The API's per-request reads join a case with its proposal, policy, parent and author, or an
operation's decision with its effect, delivery and pending review, in one statement. They
are written as SQL because compiling the equivalent ``select_related`` queryset costs several
times what running it does, on every request (docs/PERFORMANCE.md, "third pass"). Turning
the row into models is left to the ORM's own parts, as ``raw()`` uses them for one model:
each column is the field's ``Col`` compiled by Django's SQL compiler, each value goes through
the converters that compiler applies to every queryset row (``get_converters``,
``apply_converters``: JSON from text, on SQLite dates from text), and ``Model.from_db`` makes
the instance. Fields left out are deferred.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.db import connection
from django.db.models import Model
from django.db.models.expressions import Col
from django.db.models.sql import Query


class Part(NamedTuple):
    """One model's columns in a joined row, each the field's ``Col`` on the table's alias."""

    model: type[Model]
    cols: tuple[Col, ...]

    @classmethod
    def of(cls, model: type[Model], alias: str, names: tuple[str, ...] | None = None) -> Part:
        """``model``'s concrete fields (those whose attribute is in ``names``, if given)."""
        fields = [f for f in model._meta.concrete_fields if names is None or f.attname in names]
        return cls(model, tuple(Col(alias, f) for f in fields))


class Joined:
    """The parts of one statement's rows: its SELECT list, and each row read back as one
    instance per part (None for a part whose primary key is NULL: a LEFT JOIN that found
    nothing). Made once per statement: the converters are looked up here, not per row."""

    def __init__(self, *parts: Part):
        self._compiler = connection.ops.compiler("SQLCompiler")(Query(None), connection, connection.alias)
        cols: list[Any] = [col for part in parts for col in part.cols]
        self.sql = ", ".join(self._compiler.compile(col)[0] for col in cols)
        self._converters = self._compiler.get_converters(cols)
        self._slices: list[tuple[type[Model], list[str], int, int, int]] = []
        start = 0
        for part in parts:
            names = [col.target.attname for col in part.cols]
            self._slices.append(
                (part.model, names, start, start + len(names), names.index(part.model._meta.pk.attname))
            )
            start += len(names)

    def __len__(self) -> int:
        return self._slices[-1][3]

    def instances(self, row) -> list:
        (values,) = self._compiler.apply_converters([row], self._converters)
        return [
            None if values[start + pk] is None else model.from_db(connection.alias, names, values[start:end])
            for model, names, start, end, pk in self._slices
        ]
