"""A delivery's state NeedsCheck: a person looks at the ticket (docs/DELIVERY.md).

A delivery that was Unknown (a request went out and no answer came back) and whose resend
with the same key the helpdesk refused with a 4xx: the earlier request may have been
stored, so it is not Rejected. Sending -> needs_check is allowed, and nothing leaves it.

The database's own rules follow: the state check lists the new value, NeedsCheck carries
the helpdesk's answer as its reason, and the forward-only trigger of effects 0006 gets the
new transition table. On SQLite a changed check constraint rebuilds the table, which drops
its triggers; the last step creates them again (and the first, going backwards).
"""

from django.db import migrations, models

# Frozen here on purpose (a migration never imports application code): the transition table
# of effects.models.DELIVERY_TRANSITIONS before and after this migration.
BEFORE = {
    "queued": ["sending"],
    "sending": ["queued", "unknown", "delivered", "rejected"],
    "unknown": ["sending", "delivered", "rejected"],
    "delivered": [],
    "rejected": [],
}
AFTER = {
    **BEFORE,
    "sending": ["queued", "unknown", "delivered", "rejected", "needs_check"],
    "needs_check": [],
}
IDENTITY = ["operation_id", "case_id", "decision_id", "effect_id", "created_at"]
DELIVERY = "effects_delivery"
SQLITE_FUNCTION = "decisionflow_maintenance_flush"


def _allowed_sql(transitions, old, new):
    # "staying" is allowed except in a state nothing leaves; otherwise the pair must be in the table.
    pairs = [f"({old} = '{a}' AND {new} = '{b}')" for a, bs in transitions.items() for b in bs]
    stays = [f"({old} = '{a}' AND {new} = '{a}')" for a, bs in transitions.items() if bs]
    return " OR ".join(pairs + stays)


def _install(schema_editor, transitions):
    """The delivery table's triggers of effects 0006, with ``transitions``."""
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        changed_identity = " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in IDENTITY)
        # The trigger of 0006 calls this function by name: replacing its body is enough.
        schema_editor.execute(
            f"""
            CREATE OR REPLACE FUNCTION {DELIVERY}_forward_only() RETURNS trigger AS $$
            BEGIN
                IF TG_OP = 'DELETE' THEN
                    RAISE EXCEPTION 'DELETE on {DELIVERY} is refused: deliveries are never removed'
                        USING ERRCODE = 'integrity_constraint_violation';
                END IF;
                IF {changed_identity} THEN
                    RAISE EXCEPTION 'the identity of delivery % is write-once', OLD.operation_id
                        USING ERRCODE = 'integrity_constraint_violation';
                END IF;
                IF NOT ({_allowed_sql(transitions, "OLD.state", "NEW.state")}) THEN
                    RAISE EXCEPTION 'delivery % cannot move from % to %', OLD.operation_id, OLD.state, NEW.state
                        USING ERRCODE = 'integrity_constraint_violation';
                END IF;
                RETURN NEW;
            END;
            $$ LANGUAGE plpgsql;
            """,
            params=None,
        )
    elif vendor == "sqlite":
        changed_identity = " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in IDENTITY)
        for name in (f"{DELIVERY}_identity", f"{DELIVERY}_forward_only", f"{DELIVERY}_no_delete"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")
        schema_editor.execute(
            f"CREATE TRIGGER {DELIVERY}_identity BEFORE UPDATE ON {DELIVERY} WHEN {changed_identity} "
            f"BEGIN SELECT RAISE(ABORT, 'the identity of a delivery is write-once'); END;"
        )
        schema_editor.execute(
            f"CREATE TRIGGER {DELIVERY}_forward_only BEFORE UPDATE ON {DELIVERY} "
            f"WHEN NOT ({_allowed_sql(transitions, 'OLD.state', 'NEW.state')}) "
            f"BEGIN SELECT RAISE(ABORT, 'a delivery cannot move to that state from its own'); END;"
        )
        schema_editor.execute(
            f"CREATE TRIGGER {DELIVERY}_no_delete BEFORE DELETE ON {DELIVERY} WHEN NOT {SQLITE_FUNCTION}() "
            f"BEGIN SELECT RAISE(ABORT, 'DELETE on {DELIVERY} is refused'); END;"
        )


def install_after(apps, schema_editor):
    _install(schema_editor, AFTER)


def install_before(apps, schema_editor):
    _install(schema_editor, BEFORE)


class Migration(migrations.Migration):
    # Only the previous one: a later dependency would reorder the plan past the reviews
    # migrations that re-create effects 0004's SQLite triggers (see effects 0006).
    dependencies = [
        ("effects", "0009_attempt_references_unconstrained"),
    ]

    operations = [
        # Backwards, this runs last: after the rebuilds below have dropped the triggers.
        migrations.RunPython(migrations.RunPython.noop, install_before),
        migrations.RemoveConstraint(
            model_name="delivery",
            name="delivery_state_known",
        ),
        migrations.AlterField(
            model_name="delivery",
            name="state",
            field=models.CharField(
                choices=[
                    ("queued", "Queued"),
                    ("sending", "Sending"),
                    ("unknown", "Unknown"),
                    ("delivered", "Delivered"),
                    ("rejected", "Rejected"),
                    ("needs_check", "NeedsCheck"),
                ],
                default="queued",
                max_length=20,
            ),
        ),
        migrations.AddConstraint(
            model_name="delivery",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("state__in", ["queued", "sending", "unknown", "delivered", "rejected", "needs_check"])
                ),
                name="delivery_state_known",
            ),
        ),
        migrations.AddConstraint(
            model_name="delivery",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("state", "needs_check"), _negated=True),
                    models.Q(("reason", ""), _negated=True),
                    _connector="OR",
                ),
                name="delivery_needs_check_has_reason",
            ),
        ),
        migrations.RunPython(install_after, migrations.RunPython.noop),
    ]
