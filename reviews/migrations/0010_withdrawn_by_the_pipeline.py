"""The pipeline's withdrawal: the decline reason ``withdrawn`` and the system actor
``pipeline-withdraw``, each allowed only with the other (the CHECK constraint, renamed for
what it now says).

Replacing a CHECK constraint makes Django rebuild ``reviews_reviewdecision`` on SQLite,
which drops its append-only triggers; the last step puts them back, with the same SQL as
reviews/0007. PostgreSQL replaces the constraint in place and keeps its triggers.
"""

from django.conf import settings
from django.db import migrations, models

# Frozen here on purpose (as in 0002 and 0007): a migration carries its own copy of the trigger SQL.
TABLE = "reviews_reviewdecision"
SQLITE_FUNCTION = "decisionflow_maintenance_flush"


def sqlite_triggers_back(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    schema_editor.execute(
        f"CREATE TRIGGER IF NOT EXISTS {TABLE}_no_update BEFORE UPDATE ON {TABLE} "
        f"BEGIN SELECT RAISE(ABORT, 'UPDATE on {TABLE} is refused: rows are append-only'); END;"
    )
    schema_editor.execute(
        f"CREATE TRIGGER IF NOT EXISTS {TABLE}_no_delete BEFORE DELETE ON {TABLE} "
        f"WHEN NOT {SQLITE_FUNCTION}() "
        f"BEGIN SELECT RAISE(ABORT, 'DELETE on {TABLE} is refused: rows are append-only'); END;"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("reviews", "0009_notifications"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="reviewdecision",
            name="decision_expired_iff_system_actor",
        ),
        migrations.AlterField(
            model_name="reviewdecision",
            name="decline_reason",
            field=models.CharField(
                blank=True,
                choices=[
                    ("wrong_facts", "Wrong facts"),
                    ("policy", "Against policy"),
                    ("tone", "Tone"),
                    ("evidence", "Evidence does not support it"),
                    ("other", "Other"),
                    ("expired", "Expired (declined by the system)"),
                    ("withdrawn", "Withdrawn by the pipeline"),
                ],
                max_length=20,
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="reviewdecision",
            name="system_actor",
            field=models.CharField(
                blank=True,
                choices=[("sla-expiry", "SLA expiry (fail closed)"), ("pipeline-withdraw", "Pipeline withdrawal")],
                max_length=20,
                null=True,
            ),
        ),
        migrations.AddConstraint(
            model_name="reviewdecision",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(
                        ("approved", False),
                        ("decline_reason", "expired"),
                        ("decline_reason__isnull", False),
                        ("system_actor", "sla-expiry"),
                        ("system_actor__isnull", False),
                    ),
                    models.Q(
                        ("approved", False),
                        ("decline_reason", "withdrawn"),
                        ("decline_reason__isnull", False),
                        ("system_actor", "pipeline-withdraw"),
                        ("system_actor__isnull", False),
                    ),
                    models.Q(
                        ("system_actor__isnull", True),
                        models.Q(
                            ("decline_reason__isnull", True),
                            ("decline_reason__in", ("wrong_facts", "policy", "tone", "evidence", "other")),
                            _connector="OR",
                        ),
                    ),
                    _connector="OR",
                ),
                name="decision_system_reason_iff_system_actor",
            ),
        ),
        # Last: after every operation that may rebuild reviews_reviewdecision on SQLite.
        migrations.RunPython(sqlite_triggers_back, migrations.RunPython.noop),
    ]
