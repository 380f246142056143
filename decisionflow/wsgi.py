import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "decisionflow.settings")
application = get_wsgi_application()

# One log line at start-up when the database sits behind a pooler mode this code cannot run
# behind (docs/DEPLOY.md); /readyz answers 503 for the same reason.
from decisionflow.health import pooler_check_at_start  # noqa: E402

pooler_check_at_start()
