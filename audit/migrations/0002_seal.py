"""The seals of the audit chain (docs/AUDIT.md, "Seals"), append-only like the rows they seal:
no UPDATE, DELETE or TRUNCATE on PostgreSQL, no UPDATE or DELETE on SQLite, with the same
triggers as reviews 0002 and effects 0004 and the test suite's flush the one way past."""

from django.db import migrations, models

# Frozen here on purpose (as in reviews 0002 and effects 0004): a migration carries its own
# copy of the trigger SQL.
TABLE = "audit_seal"
SETTING = "decisionflow.maintenance_flush"
SQLITE_FUNCTION = "decisionflow_maintenance_flush"


def triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(
            f"""
            CREATE OR REPLACE FUNCTION {TABLE}_append_only() RETURNS trigger AS $$
            BEGIN
                RAISE EXCEPTION '% on {TABLE} is refused: rows are append-only', TG_OP
                    USING ERRCODE = 'integrity_constraint_violation';
            END;
            $$ LANGUAGE plpgsql;
            CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE}
                FOR EACH ROW EXECUTE FUNCTION {TABLE}_append_only();
            CREATE OR REPLACE FUNCTION {TABLE}_refuse_truncate() RETURNS trigger AS $$
            BEGIN
                IF current_setting('{SETTING}', true) = 'on' AND current_database() LIKE 'test\\_%' THEN
                    RETURN NULL;
                END IF;
                RAISE EXCEPTION 'TRUNCATE on % is refused: rows are append-only', TG_TABLE_NAME
                    USING ERRCODE = 'integrity_constraint_violation';
            END;
            $$ LANGUAGE plpgsql;
            CREATE TRIGGER {TABLE}_no_truncate BEFORE TRUNCATE ON {TABLE}
                FOR EACH STATEMENT EXECUTE FUNCTION {TABLE}_refuse_truncate();
            """,
            params=None,
        )
    elif vendor == "sqlite":
        schema_editor.execute(
            f"CREATE TRIGGER {TABLE}_no_update BEFORE UPDATE ON {TABLE} "
            f"BEGIN SELECT RAISE(ABORT, 'UPDATE on {TABLE} is refused: rows are append-only'); END;"
        )
        schema_editor.execute(
            f"CREATE TRIGGER {TABLE}_no_delete BEFORE DELETE ON {TABLE} WHEN NOT {SQLITE_FUNCTION}() "
            f"BEGIN SELECT RAISE(ABORT, 'DELETE on {TABLE} is refused: rows are append-only'); END;"
        )


def triggers_dropped(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(
            f"DROP TRIGGER IF EXISTS {TABLE}_append_only ON {TABLE}; DROP FUNCTION IF EXISTS {TABLE}_append_only(); "
            f"DROP TRIGGER IF EXISTS {TABLE}_no_truncate ON {TABLE}; DROP FUNCTION IF EXISTS {TABLE}_refuse_truncate();",
            params=None,
        )
    elif vendor == "sqlite":
        for kind in ("no_update", "no_delete"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_{kind}")


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="Seal",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("number", models.PositiveIntegerField()),
                ("sealed_at", models.DateTimeField()),
                ("covers", models.JSONField()),
                ("previous", models.CharField(blank=True, max_length=80)),
                ("seal_hash", models.CharField(max_length=80)),
                ("key_id", models.CharField(max_length=64)),
                ("signature", models.CharField(max_length=128)),
            ],
            options={
                "ordering": ["-number"],
                "constraints": [
                    models.UniqueConstraint(fields=("number",), name="seal_unique_number"),
                    models.UniqueConstraint(fields=("previous",), name="seal_unique_previous"),
                    models.CheckConstraint(condition=models.Q(("number__gte", 1)), name="seal_number_positive"),
                ],
            },
        ),
        migrations.RunPython(triggers, triggers_dropped),
    ]
