"""Write-once rows: no update and no delete through the ORM.

The database enforces the same rule with triggers (see the 0002 migrations of reviews and effects); this layer gives a
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
