"""Settings for the test suite, chosen by pytest (pyproject.toml); never used to serve.

Everything comes from ``settings``; only what the tests need differs here.
"""

import os

# Tests run with the development secret unless the environment names one.
os.environ.setdefault("DEBUG", "1")

# Metrics on, in multiprocess mode as under gunicorn: a folder of this test process (children
# it starts inherit it, as cron commands share the web's). Set before prometheus_client loads.
# Under pytest-xdist each worker is a test run of its own, with its own folder: the counters a
# test reads must not move with another worker's tests.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("DECISIONFLOW_TEST_METRICS_OF", "") != _worker:
    os.environ["DECISIONFLOW_TEST_METRICS_OF"] = _worker
    import atexit
    import shutil
    import tempfile

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="decisionflow-metrics-")
    atexit.register(shutil.rmtree, os.environ["PROMETHEUS_MULTIPROC_DIR"], True)

# A signing key of this test run only (core/signing.py), in the environment so that the
# manage.py children a test starts sign with it too; never the development key in var/.
if not os.environ.get("DECISIONFLOW_AUDIT_SIGNING_KEY") and not os.environ.get("DECISIONFLOW_AUDIT_SIGNING_KEY_FILE"):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    os.environ["DECISIONFLOW_AUDIT_SIGNING_KEY"] = (
        Ed25519PrivateKey.generate()
        .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        .decode()
    )

from decisionflow.settings import *  # noqa: E402, F403
from decisionflow.settings import DATABASES, env  # noqa: E402

if DATABASES["default"]["ENGINE"].endswith(".sqlite3"):
    # Tests that start manage.py subprocesses need a file the children can open; the pid
    # keeps parallel test runs on one machine apart.
    DATABASES["default"]["TEST"] = {
        "NAME": env.str("DECISIONFLOW_SQLITE_TEST_NAME", default=f"/tmp/decisionflow-test-{os.getpid()}.sqlite3")
    }
else:
    # pytest-django drops and recreates the test database when it finds one of its name, so a
    # name shared by two runs on one server (a developer's and a CI clone, two worktrees, two
    # terminals) lets one destroy the other's mid-run. The pid keeps them apart, as for SQLite;
    # a run killed outright (SIGKILL) leaves its test_*_<pid> database behind.
    DATABASES["default"]["TEST"] = {
        "NAME": env.str("DECISIONFLOW_POSTGRES_TEST_NAME", default=f"test_{DATABASES['default']['NAME']}_{os.getpid()}")
    }

# Real hashers cost about a second per user on these machines; tests need no strength.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Tests never run collectstatic: plain static storage (the manifest one needs its manifest).
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # noqa: F405
# Nor is there a STATIC_ROOT to serve (WhiteNoise would warn about the missing folder).
STATIC_ROOT = None

# The read replica's alias as a mirror of the test database (no second copy), with its router
# and middleware, off until a test sets DATABASE_REPLICA_URL (tests/decisionflow/test_replicas.py).
if "replica" not in DATABASES:
    DATABASES["replica"] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}
    DATABASE_ROUTERS = ["core.replicas.ReplicaRouter"]
    MIDDLEWARE = [*MIDDLEWARE, "core.replicas.OwnWritesMiddleware"]  # noqa: F405
