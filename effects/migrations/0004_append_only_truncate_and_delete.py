"""Append-only, completely: TRUNCATE refused on PostgreSQL, DELETE refused on SQLite.

The 0002 row triggers refuse UPDATE and DELETE on PostgreSQL, but row triggers never fire on
TRUNCATE (and `TRUNCATE reviews_reviewdecision CASCADE` wiped decisions and effects); on
SQLite only UPDATE was refused. This adds the missing triggers on the four append-only
tables, the reviews ones included.

The one bypass is for the test suite's own flush (tests/conftest.py), which empties every
table between transactional tests: with TRUNCATE on PostgreSQL, with DELETE on SQLite.
- PostgreSQL: the trigger lets a TRUNCATE through only when the session setting
  `decisionflow.maintenance_flush` is 'on' AND the database's name starts with `test_` (a
  Django test database). The application never sets it (tests/effects/test_append_only.py).
- SQLite: the DELETE trigger asks the SQL function `decisionflow_maintenance_flush()`.
  The application registers it on every connection answering 0
  (core/append_only.py); only the test suite's flush re-registers it to answer
  1 for the length of the flush. A connection that never registered it (the sqlite3 shell)
  fails with "no such function": refused as well.
"""

from django.db import migrations

# Frozen here on purpose: a migration must keep doing what it did when it was written, so it
# carries its own copy of the names and the trigger SQL instead of importing live code.
TABLES = ["reviews_proposal", "reviews_reviewdecision", "effects_effectrecord", "effects_commitattempt"]
SETTING = "decisionflow.maintenance_flush"
SQLITE_FUNCTION = "decisionflow_maintenance_flush"


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        # params=None: the PL/pgSQL '%' must not be read as a query placeholder. The second
        # argument of current_setting() makes an unset setting NULL instead of an error.
        schema_editor.execute(
            f"""
            CREATE OR REPLACE FUNCTION decisionflow_refuse_truncate() RETURNS trigger AS $$
            BEGIN
                IF current_setting('{SETTING}', true) = 'on' AND current_database() LIKE 'test\\_%' THEN
                    RETURN NULL;
                END IF;
                RAISE EXCEPTION 'TRUNCATE on % is refused: rows are append-only', TG_TABLE_NAME
                    USING ERRCODE = 'integrity_constraint_violation';
            END;
            $$ LANGUAGE plpgsql;
            """,
            params=None,
        )
        for table in TABLES:
            schema_editor.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION decisionflow_refuse_truncate();",
                params=None,
            )
    elif vendor == "sqlite":
        for table in TABLES:
            schema_editor.execute(
                f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} "
                f"WHEN NOT {SQLITE_FUNCTION}() "
                f"BEGIN SELECT RAISE(ABORT, 'DELETE on {table} is refused: rows are append-only'); END;"
            )


def backward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        for table in TABLES:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table};", params=None)
        schema_editor.execute("DROP FUNCTION IF EXISTS decisionflow_refuse_truncate();", params=None)
    elif vendor == "sqlite":
        for table in TABLES:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_no_delete")


class Migration(migrations.Migration):
    dependencies = [
        ("effects", "0003_attempt_reason"),
        ("reviews", "0002_append_only_and_groups"),
    ]

    operations = [migrations.RunPython(forward, backward)]
