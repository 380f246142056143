from django.db import migrations

from decisionflow.append_only import append_only_trigger_sql

TABLES = ["effects_effectrecord", "effects_commitattempt"]


def add_triggers(apps, schema_editor):
    for table in TABLES:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(append_only_trigger_sql(table)[0], params=None)
        elif schema_editor.connection.vendor == "sqlite":
            schema_editor.execute(
                f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} "
                f"BEGIN SELECT RAISE(ABORT, 'UPDATE on {table} is refused: rows are append-only'); END;"
            )


def drop_triggers(apps, schema_editor):
    for table in TABLES:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(append_only_trigger_sql(table)[1], params=None)
        elif schema_editor.connection.vendor == "sqlite":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_update")


class Migration(migrations.Migration):
    dependencies = [("effects", "0001_initial")]

    operations = [migrations.RunPython(add_triggers, drop_triggers)]
