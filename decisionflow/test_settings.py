"""Settings for the test suite, chosen by pytest (pyproject.toml); never used to serve.

Everything comes from ``settings``; only what the tests need differs here.
"""

import os

# Tests run with the development secret unless the environment names one.
os.environ.setdefault("DEBUG", "1")

from .settings import *  # noqa: E402, F403
from .settings import DATABASES, env  # noqa: E402

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Tests that start manage.py subprocesses need a file the children can open; the pid
    # keeps parallel test runs on one machine apart.
    DATABASES["default"]["TEST"] = {
        "NAME": env.str("DECISIONFLOW_SQLITE_TEST_NAME", default=f"/tmp/decisionflow-test-{os.getpid()}.sqlite3")
    }

# Real hashers cost about a second per user on these machines; tests need no strength.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
