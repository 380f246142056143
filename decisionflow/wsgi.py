import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

from decisionflow.health import pooler_check_at_start

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "decisionflow.settings")
application = get_wsgi_application()

# The URLs bring the admin pages and through them the engine (SimpleAdminConfig, see
# settings): load them as the worker starts, so that no reviewer's first request waits.
get_resolver().url_patterns  # noqa: B018 - loading is the point

# One log line at start-up when the database sits behind a pooler mode this code cannot run
# behind (docs/DEPLOY.md); /readyz answers 503 for the same reason.
pooler_check_at_start()
