"""Origin ``policy_change``, and the "publish policy" permission for the support leads.

Support leads get it (they own the team's rules); reviewers do not: the people who approve
proposals under a policy are not the ones who change it (docs/ADMIN.md).
"""

from django.db import migrations, models


def grant_publish_policy(apps, schema_editor):
    # Permissions are normally created after all migrations; create them now.
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    publish = Permission.objects.get(content_type__app_label="cases", codename="publish_policy")
    leads, _ = Group.objects.get_or_create(name="Support leads")
    leads.permissions.add(publish)


class Migration(migrations.Migration):
    dependencies = [
        ("reviews", "0004_checkpoint_retention"),
        ("cases", "0004_policy_versions"),
    ]

    operations = [
        migrations.AlterField(
            model_name="proposal",
            name="origin",
            field=models.CharField(
                choices=[
                    ("prepared", "Prepared"),
                    ("human_edit", "Human edit"),
                    ("evidence_change", "Evidence change"),
                    ("policy_change", "Policy change"),
                ],
                max_length=20,
            ),
        ),
        migrations.RunPython(grant_publish_policy, migrations.RunPython.noop),
    ]
