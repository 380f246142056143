"""Model rows read with raw SQL: for the API's per-request reads, where compiling the ORM's
query cost several times what the statement does (docs/PERFORMANCE.md, "third pass")."""

from __future__ import annotations

from django.db import connection


class Columns:
    """Some concrete fields of a model as raw SQL columns, and the rows read back as model
    instances: the backend's and each field's converters applied, as the ORM applies them
    (JSON from text; on SQLite, dates from text). Fields left out are deferred."""

    def __init__(self, model, alias: str, names: tuple[str, ...] | None = None):
        self.model = model
        self.fields = [f for f in model._meta.concrete_fields if names is None or f.attname in names]
        self.names = [f.attname for f in self.fields]
        self.sql = ", ".join(f"{alias}.{connection.ops.quote_name(f.column)}" for f in self.fields)
        self.converters = []
        for i, f in enumerate(self.fields):
            col = f.get_col(alias)
            found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if found:
                self.converters.append((i, found))
        self.pk = self.names.index(model._meta.pk.attname)

    def build(self, values):
        """The instance, or None when the row's primary key is NULL (a LEFT JOIN found none)."""
        if values[self.pk] is None:
            return None
        values = list(values)
        for i, converters in self.converters:
            for convert in converters:
                values[i] = convert(values[i], None, connection)
        return self.model.from_db(connection.alias, self.names, values)
