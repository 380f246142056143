"""The attempt log's case and reviewer are references the database no longer checks.

Each foreign key of an attempt row ran a check at COMMIT that took ``FOR KEY SHARE`` on the
referenced row: on every click and every replay, two trigger calls, and a lock (with its WAL
record) on the reviewer's user row that every commit of that reviewer shares. The case's
also made a refusal's audit row wait behind the very lock being reported, which attempt_record had to dodge with SKIP LOCKED, losing the case from the row.

What the constraint guaranteed is kept another way: every writer takes the case from a row
it has just read (the commit statement from the proposal it locked, attempt_record from a
Case), and the reviewer is the authenticated user; Django's ``on_delete=PROTECT`` still
refuses to delete a case or a user that has attempts, and the rows themselves stay
append-only (their triggers are untouched). The decision and the effect keep their foreign
keys: they are the record, the attempt is the audit of the click. See docs/RELIABILITY.md.

PostgreSQL only: on SQLite (no row locks) dropping a constraint means rebuilding the table,
which would lose its append-only triggers; the constraint stays there and costs nothing.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

TABLE = "effects_commitattempt"
CONSTRAINTS = {
    "effects_commitattempt_case_id_5f83df23_fk_cases_case_id": ("case_id", "cases_case"),
    "effects_commitattempt_reviewer_id_91c61a0a_fk_auth_user_id": ("reviewer_id", "auth_user"),
}


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in CONSTRAINTS:
        schema_editor.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS {name}")


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, (column, target) in CONSTRAINTS.items():
        schema_editor.execute(
            f"ALTER TABLE {TABLE} ADD CONSTRAINT {name} FOREIGN KEY ({column}) REFERENCES {target} (id) "
            "DEFERRABLE INITIALLY DEFERRED"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("effects", "0008_attempt_operation_index"),
        ("cases", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[
                migrations.AlterField(
                    model_name="commitattempt",
                    name="case",
                    field=models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="commit_attempts",
                        to="cases.case",
                    ),
                ),
                migrations.AlterField(
                    model_name="commitattempt",
                    name="reviewer",
                    field=models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
        ),
    ]
