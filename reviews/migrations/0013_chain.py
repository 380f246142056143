"""The tamper-evident chain (docs/AUDIT.md): ``prev_hash`` and ``row_hash`` on proposals and
decisions, and the append-only notification events, with the same triggers as the other
append-only tables (reviews 0002, effects 0004): no UPDATE, DELETE or TRUNCATE on PostgreSQL,
no UPDATE or DELETE on SQLite, the test suite's flush the one way past.

The hash columns are nullable (a plain ADD COLUMN, which keeps SQLite's triggers): the rows
written before this migration keep NULL, and the first seal covers them by their content.
"""

import django.db.models.deletion
from django.db import migrations, models

# Frozen here on purpose (as in reviews 0002 and effects 0004): a migration carries its own
# copy of the trigger SQL.
TABLE = "reviews_notificationevent"
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
        ("cases", "0007_source_versions"),
        ("reviews", "0012_proposal_list_order"),
    ]

    operations = [
        migrations.AddField(
            model_name="proposal",
            name="prev_hash",
            field=models.CharField(blank=True, editable=False, max_length=70, null=True),
        ),
        migrations.AddField(
            model_name="proposal",
            name="row_hash",
            field=models.CharField(blank=True, editable=False, max_length=70, null=True),
        ),
        migrations.AddField(
            model_name="reviewdecision",
            name="prev_hash",
            field=models.CharField(blank=True, editable=False, max_length=70, null=True),
        ),
        migrations.AddField(
            model_name="reviewdecision",
            name="row_hash",
            field=models.CharField(blank=True, editable=False, max_length=70, null=True),
        ),
        migrations.CreateModel(
            name="NotificationEvent",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("operation_id", models.CharField(max_length=80)),
                (
                    "kind",
                    models.CharField(
                        choices=[("review_begun", "Review begun"), ("at_risk", "At risk"), ("breached", "Breached")],
                        max_length=20,
                    ),
                ),
                (
                    "outcome",
                    models.CharField(
                        choices=[
                            ("sent", "Sent"),
                            ("retry", "Failed, retried later"),
                            ("failed", "Failed, tries used up"),
                        ],
                        max_length=10,
                    ),
                ),
                ("attempt", models.PositiveIntegerField()),
                ("accepted", models.CharField(blank=True, default="", max_length=40)),
                ("error", models.TextField(blank=True, default="")),
                ("at", models.DateTimeField(auto_now_add=True)),
                ("prev_hash", models.CharField(blank=True, editable=False, max_length=70, null=True)),
                ("row_hash", models.CharField(blank=True, editable=False, max_length=70, null=True)),
                (
                    "case",
                    models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="+", to="cases.case"),
                ),
                (
                    "notification",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="events", to="reviews.notification"
                    ),
                ),
            ],
            options={
                "ordering": ["-at", "-id"],
                "indexes": [models.Index(fields=["notification", "id"], name="notification_event_order")],
            },
        ),
        migrations.RunPython(triggers, triggers_dropped),
    ]
