from django.db import migrations

from decisionflow.append_only import append_only_trigger_sql
from reviews.groups import ensure_review_groups

TABLES = ["reviews_proposal", "reviews_reviewdecision"]


def add_triggers(apps, schema_editor):
    for table in TABLES:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(append_only_trigger_sql(table)[0], params=None)
        elif schema_editor.connection.vendor == "sqlite":
            # SQLite: refuse UPDATE only. Its test-database flush deletes rows with DELETE,
            # which a DELETE trigger would block; the ORM still refuses deletes.
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


def add_groups(apps, schema_editor):
    # Permissions are normally created after all migrations; create them now.
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, verbosity=0)
        app_config.models_module = None
    ensure_review_groups(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"))


class Migration(migrations.Migration):
    dependencies = [
        ("reviews", "0001_initial"),
        ("effects", "0001_initial"),
        ("cases", "0002_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(add_triggers, drop_triggers),
        migrations.RunPython(add_groups, migrations.RunPython.noop),
    ]
