from django.db import migrations

from decisionflow.append_only import append_only_triggers
from reviews.groups import ensure_review_groups


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
        append_only_triggers(["reviews_proposal", "reviews_reviewdecision"]),
        migrations.RunPython(add_groups, migrations.RunPython.noop),
    ]
