"""The pipeline's permissions, and the Pipeline group that holds them (docs/INTAKE.md).

A pipeline service user brings cases in, re-drafts and withdraws them, and reads them back;
it does not have the review permission, so a pipeline token never approves a proposal.
"""

from django.db import migrations


def add_pipeline_group(apps, schema_editor):
    # Permissions are normally created after all migrations; create them now.
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    acts = Permission.objects.filter(content_type__app_label="cases", codename__in=["intake_case", "withdraw_case"])
    view = Permission.objects.get(content_type__app_label="cases", codename="view_case")
    pipeline, _ = Group.objects.get_or_create(name="Pipeline")
    pipeline.permissions.add(*acts, view)


class Migration(migrations.Migration):
    dependencies = [
        ("cases", "0004_policy_versions"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="case",
            options={
                "ordering": ["-created_at", "case_id"],
                "permissions": [
                    ("intake_case", "Can bring cases in and re-draft them (the pipeline)"),
                    ("withdraw_case", "Can withdraw a case's pending review (the pipeline)"),
                ],
            },
        ),
        migrations.RunPython(add_pipeline_group, migrations.RunPython.noop),
    ]
