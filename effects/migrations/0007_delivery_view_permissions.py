"""Reviewers and support leads may read the deliveries and their tries (docs/DELIVERY.md):
the review and history pages show them, and so does the view-only deliveries list."""

from django.db import migrations


def grant_view_deliveries(apps, schema_editor):
    # Permissions are normally created after all migrations; create them now.
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    view = list(
        Permission.objects.filter(content_type__app_label="effects", codename__in=["view_delivery", "view_deliverytry"])
    )
    for name in ("Reviewers", "Support leads"):
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*view)


class Migration(migrations.Migration):
    dependencies = [
        ("effects", "0006_delivery"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        # Names only (the admin's "deliveries", not "deliverys"): no change to the tables.
        migrations.AlterModelOptions(
            name="delivery",
            options={"ordering": ["-created_at", "-id"], "verbose_name_plural": "deliveries"},
        ),
        migrations.AlterModelOptions(
            name="deliverytry",
            options={
                "ordering": ["-started_at", "-id"],
                "verbose_name": "delivery try",
                "verbose_name_plural": "delivery tries",
            },
        ),
        migrations.RunPython(grant_view_deliveries, migrations.RunPython.noop),
    ]
