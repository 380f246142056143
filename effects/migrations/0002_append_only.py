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


class Migration(migrations.Migration):
    dependencies = [("effects", "0001_initial")]

    operations = [_append_only(["effects_effectrecord", "effects_commitattempt"])]
