"""API fixtures: tokens for a reviewer and for a user without the review permission.

The snapshot of what a refusal must leave alone is ``tests.conftest.snapshot``."""

from __future__ import annotations

import json

import pytest

DEMO_OP = "op-v1-e3976ac9e004f816de8a7695aa8b5bf99b16b3f893063045153b2a114922fbfc"


@pytest.fixture
def reviewer_token(reviewer):
    from api.services import token_create

    return token_create(user=reviewer, name="tests")[1]


@pytest.fixture
def lead_token(lead):
    from api.services import token_create

    return token_create(user=lead, name="tests")[1]


class Api:
    """A thin JSON client over Django's test client, with a bearer token."""

    def __init__(self, client, token=None):
        self.client = client
        self.token = token

    def headers(self, extra=None):
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        headers.update(extra or {})
        return headers

    def get(self, path, **kw):
        return self.client.get(path, headers=self.headers(kw.pop("headers", None)), **kw)

    def post(self, path, data=None, *, raw=None, headers=None, content_type="application/json"):
        body = raw if raw is not None else json.dumps(data)
        return self.client.post(path, body, content_type=content_type, headers=self.headers(headers))


@pytest.fixture
def pipeline_api(client, pipeline):
    from api.services import token_create

    return Api(client, token_create(user=pipeline, name="intake")[1])


@pytest.fixture
def demo_case(db):
    """T-1042 with its review begun."""
    from cases.services import case_import
    from tests.conftest import load_fixture
    from workflow.begin import review_begin

    case = case_import(data=load_fixture("t1042.json")).case
    review_begin(case=case)
    case.refresh_from_db()
    return case


@pytest.fixture
def api(client, reviewer_token):
    return Api(client, reviewer_token)


@pytest.fixture
def lead_api(client, lead_token):
    return Api(client, lead_token)


@pytest.fixture
def anon_api(client):
    return Api(client)


def assert_error(response, status, code):
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["code"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    return body
