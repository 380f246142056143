"""Assignment and hand-over (docs/QUEUE.md, "Assignment"): the pending review's assignee, the
moves' history, out of office, and the "assign reviews" permission for the support leads."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def grant_assign_review(apps, schema_editor):
    # Permissions are normally created after all migrations; create them now.
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    assign = Permission.objects.get(content_type__app_label="reviews", codename="assign_review")
    leads, _ = Group.objects.get_or_create(name="Support leads")
    leads.permissions.add(assign)


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("cases", "0007_source_versions"),
        ("reviews", "0013_chain"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ReviewAssignment",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("operation_id", models.CharField(max_length=80)),
                (
                    "kind",
                    models.CharField(
                        choices=[("assigned", "Assigned"), ("handed_over", "Handed over"), ("escalated", "Escalated")],
                        max_length=20,
                    ),
                ),
                ("to_group", models.CharField(blank=True, default="", max_length=150)),
                ("note", models.TextField(blank=True, default="")),
                ("at", models.DateTimeField()),
            ],
            options={
                "ordering": ["-at", "-id"],
                "permissions": [("assign_review", "Can assign reviews to a person or a group")],
            },
        ),
        migrations.CreateModel(
            name="ReviewerAway",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("until", models.DateTimeField()),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "verbose_name": "out of office",
                "verbose_name_plural": "out of office",
            },
        ),
        migrations.AddField(
            model_name="pendingreview",
            name="assigned_group",
            field=models.ForeignKey(
                blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="+", to="auth.group"
            ),
        ),
        migrations.AddField(
            model_name="pendingreview",
            name="assigned_to",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddIndex(
            model_name="pendingreview",
            index=models.Index(
                condition=models.Q(("assigned_to__isnull", False), ("status", "pending")),
                fields=["assigned_to"],
                name="pending_review_assignees",
            ),
        ),
        migrations.AddField(
            model_name="reviewassignment",
            name="by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="reviewassignment",
            name="case",
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="+", to="cases.case"),
        ),
        migrations.AddField(
            model_name="reviewassignment",
            name="meant_for",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="reviewassignment",
            name="pending_review",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="assignments", to="reviews.pendingreview"
            ),
        ),
        migrations.AddField(
            model_name="reviewassignment",
            name="to_user",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="revieweraway",
            name="substitute",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="+", to=settings.AUTH_USER_MODEL
            ),
        ),
        migrations.AddField(
            model_name="revieweraway",
            name="user",
            field=models.OneToOneField(
                on_delete=django.db.models.deletion.CASCADE, related_name="+", to=settings.AUTH_USER_MODEL
            ),
        ),
        migrations.AddIndex(
            model_name="reviewassignment",
            index=models.Index(fields=["case", "at"], name="assignment_by_case"),
        ),
        migrations.AddConstraint(
            model_name="reviewassignment",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("to_user__isnull", False), ("to_group", "")),
                    models.Q(("to_user__isnull", True), models.Q(("to_group", ""), _negated=True)),
                    _connector="OR",
                ),
                name="assignment_one_target",
            ),
        ),
        migrations.RunPython(grant_assign_review, migrations.RunPython.noop),
    ]
