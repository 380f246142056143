"""Write-once rows: no update and no delete through the ORM.

The database enforces the same rule with triggers (see the migrations); this layer gives a
clear Python error before the query is even sent. Note that ``QuerySet.update()`` and
``QuerySet.delete()`` skip ``Model.save()``/``Model.delete()``, so the queryset refuses too.
"""

from __future__ import annotations

from django.db import models


class AppendOnlyError(Exception):
    pass


class AppendOnlyQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AppendOnlyError(f"{self.model.__name__} rows are write-once and cannot be updated")

    def delete(self):
        raise AppendOnlyError(f"{self.model.__name__} rows are write-once and cannot be deleted")

    def bulk_update(self, objs, fields, batch_size=None):
        raise AppendOnlyError(f"{self.model.__name__} rows are write-once and cannot be updated")

    def update_or_create(self, *args, **kwargs):
        raise AppendOnlyError(f"{self.model.__name__} rows are write-once and cannot be updated")


class AppendOnlyModel(models.Model):
    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise AppendOnlyError(f"{type(self).__name__} rows are write-once and cannot be updated")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError(f"{type(self).__name__} rows are write-once and cannot be deleted")


def append_only_trigger_sql(table: str) -> tuple[str, str]:
    """PostgreSQL: refuse UPDATE and DELETE on ``table`` even from raw SQL (as pghistory does).

    TRUNCATE is left alone on purpose: it is an owner's maintenance operation (test
    database flushes use it), not something an application code path issues.
    """
    function = f"{table}_append_only"
    forward = f"""
        CREATE OR REPLACE FUNCTION {function}() RETURNS trigger AS $$
        BEGIN
            RAISE EXCEPTION '% on {table} is refused: rows are append-only', TG_OP
                USING ERRCODE = 'integrity_constraint_violation';
        END;
        $$ LANGUAGE plpgsql;
        CREATE TRIGGER {function}
            BEFORE UPDATE OR DELETE ON {table}
            FOR EACH ROW EXECUTE FUNCTION {function}();
    """
    reverse = f"DROP TRIGGER IF EXISTS {function} ON {table}; DROP FUNCTION IF EXISTS {function}();"
    return forward, reverse


def append_only_triggers(tables: list[str]):
    """A migration operation adding the triggers to ``tables`` on PostgreSQL and SQLite.

    SQLite refuses UPDATE only: its test-database flush deletes rows with DELETE, which a
    DELETE trigger would block; the ORM layer above still refuses deletes there.
    """
    from django.db import migrations

    def forward(apps, schema_editor):
        for table in tables:
            if schema_editor.connection.vendor == "postgresql":
                # params=None: the PL/pgSQL '%' must not be read as a query placeholder.
                schema_editor.execute(append_only_trigger_sql(table)[0], params=None)
            elif schema_editor.connection.vendor == "sqlite":
                schema_editor.execute(
                    f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, 'UPDATE on {table} is refused: rows are append-only'); END;"
                )

    def backward(apps, schema_editor):
        for table in tables:
            if schema_editor.connection.vendor == "postgresql":
                schema_editor.execute(append_only_trigger_sql(table)[1], params=None)
            elif schema_editor.connection.vendor == "sqlite":
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_update")

    return migrations.RunPython(forward, backward)
