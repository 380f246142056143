"""The review queue: claims, decline reasons, the system actor, the queue index.

The two CHECK constraints on ``reviews_reviewdecision`` make Django rebuild that table on
SQLite (copy, drop, rename), which drops its append-only triggers; the last step puts them
back, with the same SQL as reviews/0002 and effects/0004. PostgreSQL adds a constraint in
place and keeps its triggers.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


# Frozen here on purpose (as in 0002): a migration carries its own copy of the trigger SQL.
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
        ("cases", "0003_case_list_indexes"),
        ("reviews", "0006_pending_review_graph_fingerprint"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ReviewClaimEvent",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("operation_id", models.CharField(max_length=80)),
                ("kind", models.CharField(choices=[("claimed", "Claimed"), ("released", "Released")], max_length=20)),
                ("at", models.DateTimeField()),
                ("expires_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "ordering": ["-at", "-id"],
            },
        ),
        migrations.AddField(
            model_name="pendingreview",
            name="claim_expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="pendingreview",
            name="claimed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="pendingreview",
            name="claimed_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="reviewdecision",
            name="decline_note",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
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
                ],
                max_length=20,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="reviewdecision",
            name="system_actor",
            field=models.CharField(
                blank=True, choices=[("sla-expiry", "SLA expiry (fail closed)")], max_length=20, null=True
            ),
        ),
        migrations.AddIndex(
            model_name="pendingreview",
            index=models.Index(
                condition=models.Q(("status", "pending")), fields=["created_at", "id"], name="pending_review_queue"
            ),
        ),
        migrations.AddConstraint(
            model_name="reviewdecision",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("approved", False),
                    models.Q(("decline_note__isnull", True), ("decline_reason__isnull", True)),
                    _connector="OR",
                ),
                name="decision_reason_only_on_decline",
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
                        ("system_actor__in", ("sla-expiry",)),
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
                name="decision_expired_iff_system_actor",
            ),
        ),
        migrations.AddField(
            model_name="reviewclaimevent",
            name="case",
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="+", to="cases.case"),
        ),
        migrations.AddField(
            model_name="reviewclaimevent",
            name="pending_review",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="claim_events", to="reviews.pendingreview"
            ),
        ),
        migrations.AddField(
            model_name="reviewclaimevent",
            name="user",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="+", to=settings.AUTH_USER_MODEL
            ),
        ),
        migrations.AddIndex(
            model_name="reviewclaimevent",
            index=models.Index(fields=["case", "at"], name="claim_event_by_case"),
        ),
        # Last: after every operation that may rebuild reviews_reviewdecision on SQLite.
        migrations.RunPython(sqlite_triggers_back, migrations.RunPython.noop),
    ]
