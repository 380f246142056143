"""Fixtures of the decisionflow project-level tests."""

from tests.otlp import collector  # noqa: F401 (a fixture, used by the tracing import tests)
