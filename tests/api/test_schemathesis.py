"""schemathesis against /api/openapi.json, in-process over WSGI, authenticated as a reviewer.

It must find no 5xx and no response that breaks the schema. The lost-receipt fault is off
here (the fault header is ignored), so any 5xx is a bug. Bounded: a few dozen examples per
operation keep the run well under a minute.
"""

from __future__ import annotations

import json
import re

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

MAX_EXAMPLES = 30


@pytest.fixture
def keep_test_connection():
    """A real WSGI request closes "old" database connections when it ends, which would close
    the test's transaction under it; Django's test client unhooks the same signal."""
    from django.core import signals
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def _load_schema():
    # Loaded at collection, over WSGI like every request below (no database needed for the
    # schema). schemathesis 4.32's lazy `from_fixture` loader does not run on pytest 9.
    from django.core.wsgi import get_wsgi_application

    return schemathesis.openapi.from_wsgi("/api/openapi.json", get_wsgi_application())


schema = _load_schema()


def _schema_valid_edit(case, component: str = "EditIn") -> bool:
    """Whether the published schema itself accepts this edit (or decision) request (path and body)."""
    import jsonschema_rs

    from api.api import api

    components = api.get_openapi_schema()["components"]["schemas"]
    body_schema = {**components[component], "$defs": components}
    case_id = case.path_parameters.get("case_id")
    body = case.body
    if isinstance(body, bytes | bytearray):
        # Schemathesis also sends raw bytes; as a document they are JSON or they are not.
        try:
            body = json.loads(body)
        except ValueError:
            return False
    return (
        isinstance(case_id, str)
        and len(case_id) <= 100
        and case.media_type == "application/json"
        and jsonschema_rs.validator_for(body_schema).is_valid(body)
    )


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_api_conforms(case, keep_test_connection, proposal, reviewer_token, settings):
    settings.DECISIONFLOW_FAULT_INJECTION = False
    headers = {"Authorization": f"Bearer {reviewer_token}"}
    if case.path.endswith("/decision"):
        # A decline's note passes the text policy, which the schema describes in words only
        # (as for an edit's body below).
        response = case.call(headers=headers)
        case.validate_response(response, headers=headers, excluded_checks=[checks.positive_data_acceptance])
        if response.status_code == 400 and _schema_valid_edit(case, "DecisionIn"):
            message = response.json()["message"]
            if re.match(r"^note: U\+[0-9A-F]{4,6} .* is refused", message):
                return
            assert not re.match(r"^(body|path|query|header)\b", message), (message, case.body)
        return
    if not case.path.endswith("/edits"):
        case.call_and_validate(headers=headers)
        return
    # An edit can be schema-valid and still name a source version that does not exist or
    # no longer holds the quotation; the review core refuses those with 400, which no
    # schema can foresee. So for edits a 400 must be such a refusal, never a validation
    # error of a request the schema allows (those messages start with "body." / "path.").
    response = case.call(headers=headers)
    case.validate_response(response, headers=headers, excluded_checks=[checks.positive_data_acceptance])
    if response.status_code == 400 and _schema_valid_edit(case):
        message = response.json()["message"]
        # The text policy's refusals (docs/TEXT.md) name the field and the code point; the
        # schema describes the rule in words only (JSON Schema's regex dialect has no way
        # to name astral code points that every client reads alike).
        if re.match(r"^body: U\+[0-9A-F]{4,6} .* is refused", message):
            return
        assert not re.match(r"^(body|path|query|header)\b", message), (message, case.body)
