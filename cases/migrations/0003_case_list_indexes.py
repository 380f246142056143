"""Indexes for the case list at a million cases (workplace/listing.py).

- ``case_list_order``: the list's order, ``created_at DESC, case_id``, then ``id``: a page
  finds its rows' ids on the index alone (an index-only scan), instead of sorting the table.
- On PostgreSQL, trigram (``pg_trgm``) GIN indexes on ``UPPER(case_id)`` and
  ``UPPER(subject)``: the admin's search is ``UPPER(col::text) LIKE UPPER('%term%')``, and
  these indexes serve it for terms of three characters or more, where a B-tree cannot.
  ``CREATE EXTENSION pg_trgm`` needs a role that may create it (pg_trgm is a trusted
  extension: the database owner may, since PostgreSQL 13). Where it cannot be created the
  migration says so and goes on without these two indexes: the search still works, by a
  sequential scan. Run ``CREATE EXTENSION pg_trgm`` as a superuser and migrate back to 0002
  and forward again to add them later. SQLite has no trigram indexes: nothing to do there.

Each index is built in the migration's transaction, which blocks writes to the case table
while it builds (seconds per million cases on this project's benchmark machine).
"""

import sys

from django.db import DatabaseError, migrations, models, transaction

TRIGRAM_INDEXES = {
    "case_id_trgm": "case_id",
    "case_subject_trgm": "subject",
}


def trigram_indexes_add(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    try:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except DatabaseError as exc:
        sys.stderr.write(
            f"\n  NOTE: the trigram indexes for the case search were not created ({str(exc).strip()}). "
            "The search works without them, by a sequential scan. To add them: CREATE EXTENSION pg_trgm "
            "as a superuser, then `manage.py migrate cases 0002` and `manage.py migrate`.\n"
        )
        return
    with connection.cursor() as cursor:
        for name, column in TRIGRAM_INDEXES.items():
            cursor.execute(
                f"CREATE INDEX IF NOT EXISTS {name} ON cases_case USING gin (UPPER(({column})::text) gin_trgm_ops)"
            )


def trigram_indexes_remove(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for name in TRIGRAM_INDEXES:
            cursor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("cases", "0002_initial"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="case",
            index=models.Index(fields=["-created_at", "case_id", "id"], name="case_list_order"),
        ),
        migrations.RunPython(trigram_indexes_add, trigram_indexes_remove, elidable=False),
    ]
