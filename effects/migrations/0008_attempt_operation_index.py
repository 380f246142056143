"""The attempt log's operation index without its ``varchar_pattern_ops`` twin.

``db_index=True`` on a CharField gives PostgreSQL two indexes: the plain one, and a
``_like`` one for ``LIKE 'prefix%'``. Nothing searches attempts by prefix (the admin's
search is ``=operation_id``; every other read is an equality or a join), while every
attempt row, one per click and replay, paid for both. The plain index is kept and renamed
(no rebuild on PostgreSQL); the ``_like`` one is dropped. See docs/PERFORMANCE.md.

SeparateDatabaseAndState: an AlterField would make SQLite rebuild the table, and a
rebuilt table loses its append-only triggers.
"""

from django.db import migrations, models

OLD = "effects_commitattempt_operation_id_5b5a012f"
NEW = "attempt_operation"
TABLE = "effects_commitattempt"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {OLD}_like")
        schema_editor.execute(f"ALTER INDEX {OLD} RENAME TO {NEW}")
    else:
        schema_editor.execute(f"DROP INDEX {OLD}")
        schema_editor.execute(f"CREATE INDEX {NEW} ON {TABLE} (operation_id)")


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER INDEX {NEW} RENAME TO {OLD}")
        schema_editor.execute(f"CREATE INDEX {OLD}_like ON {TABLE} (operation_id varchar_pattern_ops)")
    else:
        schema_editor.execute(f"DROP INDEX {NEW}")
        schema_editor.execute(f"CREATE INDEX {OLD} ON {TABLE} (operation_id)")


class Migration(migrations.Migration):
    dependencies = [("effects", "0007_delivery_view_permissions")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[
                migrations.AlterField(
                    model_name="commitattempt",
                    name="operation_id",
                    field=models.CharField(max_length=200),
                ),
                migrations.AddIndex(
                    model_name="commitattempt",
                    index=models.Index(fields=["operation_id"], name=NEW),
                ),
            ],
        ),
    ]
