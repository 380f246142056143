import os

import django
from django.core.handlers.wsgi import WSGIHandler
from django.urls import get_resolver

from core.tracing import tracing_start
from decisionflow.health import pooler_check_at_start

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "decisionflow.settings")
# get_wsgi_application(), with tracing set up in between (when it is on: docs/DEPLOY.md,
# "Tracing"), because its Django instrumentation adds a middleware the handler must load.
django.setup(set_prefix=False)
tracing_start(service="decisionflow-web", django=True)
application = WSGIHandler()

# The URLs bring the admin pages and through them the engine (SimpleAdminConfig, see
# settings): load them as the worker starts, so that no reviewer's first request waits.
get_resolver().url_patterns  # noqa: B018 - loading is the point

# One log line at start-up when the database sits behind a pooler mode this code cannot run
# behind (docs/DEPLOY.md); /readyz answers 503 for the same reason.
pooler_check_at_start()
