from django.db import migrations


# Frozen here on purpose: a migration must keep doing what it did when it was written, so it
# carries its own copy of the trigger SQL instead of importing live application code.
def _append_only(tables):
    """Refuse UPDATE and DELETE on PostgreSQL (as pghistory does), and UPDATE on SQLite.

    SQLite refuses UPDATE only: its test-database flush deletes rows with DELETE, which a
    DELETE trigger would block; the ORM layer still refuses deletes there.
    """

    def forward(apps, schema_editor):
        for table in tables:
            if schema_editor.connection.vendor == "postgresql":
                # params=None: the PL/pgSQL '%' must not be read as a query placeholder.
                schema_editor.execute(
                    f"""
                    CREATE OR REPLACE FUNCTION {table}_append_only() RETURNS trigger AS $$
                    BEGIN
                        RAISE EXCEPTION '% on {table} is refused: rows are append-only', TG_OP
                            USING ERRCODE = 'integrity_constraint_violation';
                    END;
                    $$ LANGUAGE plpgsql;
                    CREATE TRIGGER {table}_append_only
                        BEFORE UPDATE OR DELETE ON {table}
                        FOR EACH ROW EXECUTE FUNCTION {table}_append_only();
                    """,
                    params=None,
                )
            elif schema_editor.connection.vendor == "sqlite":
                schema_editor.execute(
                    f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, 'UPDATE on {table} is refused: rows are append-only'); END;"
                )

    def backward(apps, schema_editor):
        for table in tables:
            if schema_editor.connection.vendor == "postgresql":
                schema_editor.execute(
                    f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}; "
                    f"DROP FUNCTION IF EXISTS {table}_append_only();",
                    params=None,
                )
            elif schema_editor.connection.vendor == "sqlite":
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_update")

    return migrations.RunPython(forward, backward)


# The groups as they stood when this migration was written (reviews/groups.py may change
# later; this copy must not).
_VIEW = [
    ("cases", "case"),
    ("cases", "source"),
    ("cases", "sourceversion"),
    ("cases", "policy"),
    ("reviews", "proposal"),
    ("reviews", "reviewdecision"),
    ("reviews", "pendingreview"),
    ("reviews", "workflowcheckpoint"),
    ("effects", "effectrecord"),
    ("effects", "commitattempt"),
]


def _ensure_review_groups(Group, Permission):
    view = [Permission.objects.get(content_type__app_label=app, codename=f"view_{model}") for app, model in _VIEW]
    review = Permission.objects.get(content_type__app_label="reviews", codename="review_proposal")
    reviewers, _ = Group.objects.get_or_create(name="Reviewers")
    reviewers.permissions.add(*view, review)
    leads, _ = Group.objects.get_or_create(name="Support leads")
    leads.permissions.add(*view)


def add_groups(apps, schema_editor):
    # Permissions are normally created after all migrations; create them now.
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, verbosity=0)
        app_config.models_module = None
    _ensure_review_groups(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"))


class Migration(migrations.Migration):
    dependencies = [
        ("reviews", "0001_initial"),
        ("effects", "0001_initial"),
        ("cases", "0002_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        _append_only(["reviews_proposal", "reviews_reviewdecision"]),
        migrations.RunPython(add_groups, migrations.RunPython.noop),
    ]
