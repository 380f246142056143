"""The reference helpdesk (helpdesk/, its own process) and the settings that deliver to it."""

from __future__ import annotations

import pytest
from django_tasks import default_task_backend

from helpdesk.testing import running_helpdesk
from tests.otlp import collector, spans  # noqa: F401 (fixtures, used by the tracing tests)
from tests.workflow.conftest import manage  # noqa: F401 (a fixture, used by the worker tests)

DUMMY = {"default": {"BACKEND": "django_tasks.backends.dummy.DummyBackend"}}


@pytest.fixture
def helpdesk(tmp_path):
    with running_helpdesk(tmp_path / "helpdesk", faults=True, token="t") as running:
        yield running


@pytest.fixture
def delivering(settings, helpdesk):
    """Deliveries on, to the test's helpdesk, with short timeouts and no backoff (a failed
    try is due again at once, so a test can run the next try right away). Enqueued tasks go
    to the dummy backend: the test runs each try itself."""
    settings.DECISIONFLOW_DELIVERY_URL = helpdesk.url
    settings.DECISIONFLOW_DELIVERY_TOKEN = "t"
    settings.DECISIONFLOW_DELIVERY_CONNECT_TIMEOUT = 1.0
    settings.DECISIONFLOW_DELIVERY_READ_TIMEOUT = 1.0
    settings.DECISIONFLOW_DELIVERY_WRITE_TIMEOUT = 1.0
    settings.DECISIONFLOW_DELIVERY_POOL_TIMEOUT = 1.0
    settings.DECISIONFLOW_DELIVERY_BACKOFF = 0.0
    settings.TASKS = DUMMY
    default_task_backend.clear()
    yield helpdesk
    if hasattr(default_task_backend, "clear"):  # a test may have switched to another backend
        default_task_backend.clear()
