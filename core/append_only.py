"""Write-once rows: no update and no delete through the ORM.

The database enforces the same rule with triggers (the 0002 migrations of reviews and effects:
UPDATE and DELETE; effects 0003: TRUNCATE on PostgreSQL, DELETE on SQLite); this layer gives a
clear Python error before the query is even sent. Note that ``QuerySet.update()`` and
``QuerySet.delete()`` skip ``Model.save()``/``Model.delete()``, so the queryset refuses too.
"""

from __future__ import annotations

from django.db import models

# The SQL function the SQLite DELETE triggers ask (effects/migrations/0003): "is this the
# test suite's flush?". Every connection the application opens answers no; only the test
# suite's flush (tests/conftest.py) re-registers it to answer yes while it empties tables.
SQLITE_MAINTENANCE_FLUSH = "decisionflow_maintenance_flush"


def _never() -> int:
    return 0


def sqlite_guard_install(sender, connection, **kwargs) -> None:
    """Register the DELETE triggers' question on a new SQLite connection, answered "no".

    Connected to ``connection_created`` (effects/apps.py). Without it the triggers would
    still refuse (with SQLite's "no such function"); with it they refuse with their own
    message.
    """
    if connection.vendor == "sqlite":
        connection.connection.create_function(SQLITE_MAINTENANCE_FLUSH, 0, _never)


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
