from django.apps import AppConfig
from django.db.backends.signals import connection_created


class EffectsConfig(AppConfig):
    name = "effects"
    verbose_name = "Effects and reconciliation"

    def ready(self):
        # Imported here: append_only defines a model base class, which needs the app registry.
        from core.append_only import sqlite_guard_install
        from core.poolers import prepared_statements_guard

        # The append-only DELETE triggers on SQLite (migration 0003) call a function that
        # must exist on every connection; dispatch_uid keeps it to one registration.
        connection_created.connect(sqlite_guard_install, dispatch_uid="decisionflow-append-only-guard")
        connection_created.connect(prepared_statements_guard, dispatch_uid="decisionflow-prepared-statements-guard")
