"""Two-person approval (docs/QUEUE.md, "Two-person approval"): the append-only approvals of
an operation whose policy needs more than one approver, with the same triggers as the other
append-only tables (reviews 0002 and 0013, effects 0004): no UPDATE, DELETE or TRUNCATE on
PostgreSQL, no UPDATE or DELETE on SQLite, the test suite's flush the one way past."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


# Frozen here on purpose (as in reviews 0002 and effects 0004): a migration carries its own
# copy of the trigger SQL.
TABLE = "reviews_approval"
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
    dependencies = [
        ("reviews", "0016_assignment_notification"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Approval",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("operation_id", models.CharField(max_length=80)),
                ("ordinal", models.PositiveSmallIntegerField()),
                ("required", models.PositiveSmallIntegerField()),
                ("channel", models.CharField(max_length=20)),
                ("approved_at", models.DateTimeField(auto_now_add=True)),
                ("prev_hash", models.CharField(blank=True, editable=False, max_length=70, null=True)),
                ("row_hash", models.CharField(blank=True, editable=False, max_length=70, null=True)),
                (
                    "proposal",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="approvals", to="reviews.proposal"
                    ),
                ),
                (
                    "reviewer",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="+", to=settings.AUTH_USER_MODEL
                    ),
                ),
            ],
            options={
                "ordering": ["operation_id", "ordinal"],
                "constraints": [
                    models.UniqueConstraint(fields=("operation_id", "reviewer"), name="approval_unique_reviewer"),
                    models.UniqueConstraint(fields=("operation_id", "ordinal"), name="approval_unique_ordinal"),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("ordinal__gte", 1), ("ordinal__lte", models.F("required")), ("required__gte", 2)
                        ),
                        name="approval_ordinal_within_required",
                    ),
                ],
            },
        ),
        migrations.RunPython(triggers, triggers_dropped),
    ]
