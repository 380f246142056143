"""Start-up refuses to run in production without a secret."""

import os
import subprocess
import sys

from tests.conftest import POSTGRES_ONLY, ROOT


def _run(env_overrides, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG", "DATABASE_URL")}
    env.update(env_overrides)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_missing_secret_key_with_debug_off_fails_clearly(tmp_path):
    result = _run({"DEBUG": "0"}, "check")
    assert result.returncode != 0
    assert "SECRET_KEY is not set" in result.stderr


def test_debug_off_with_secret_key_starts():
    result = _run({"DEBUG": "0", "SECRET_KEY": "x" * 60, "ALLOWED_HOSTS": "decisionflow.internal"}, "check")
    assert result.returncode == 0, result.stderr


def test_database_url_selects_the_backend():
    from django.conf import settings

    # django-prometheus's wrappers of Django's two backends (they count queries for /metrics).
    assert settings.DATABASES["default"]["ENGINE"] in (
        "django_prometheus.db.backends.sqlite3",
        "django_prometheus.db.backends.postgresql",
    )


def test_pytest_runs_on_the_test_settings_module():
    from django.conf import settings

    assert settings.SETTINGS_MODULE == "decisionflow.test_settings"


def test_production_settings_carry_no_test_configuration():
    # The served settings must not know about the suite: no test database, no weak hasher.
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print('TEST' in s.DATABASES['default'] and bool(s.DATABASES['default']['TEST'].get('NAME')), "
        "'MD5' in s.PASSWORD_HASHERS[0])"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    env.update({"DJANGO_SETTINGS_MODULE": "decisionflow.settings", "DEBUG": "1"})
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_the_postgres_skip_reason_is_true_during_make_test_too():
    # Printed by the SQLite run, also while `make test` runs the PostgreSQL suite beside it:
    # it says which database this run is on and what `make test` does, not to go and run it.
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "TEST_POSTGRES_URL ?=" in makefile and "TEST_POSTGRES_URL" in POSTGRES_ONLY
    assert "this run is on SQLite" in POSTGRES_ONLY
