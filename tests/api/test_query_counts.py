"""What one API request costs in queries, asserted so that it cannot quietly grow back.

Authentication reads the token, its user and every permission the user holds in ONE
statement and fills Django's permission caches from it, so no ``has_perm`` of the request
(the API's own check, the decision service's) reads another row. The caches must hold
exactly what ModelBackend would have read itself: a test compares them.

The per-request totals below are ceilings, measured when this file was written (docs/
PERFORMANCE.md, "load"): lowering one is welcome, raising one needs a reason.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.api.conftest import DEMO_OP

pytestmark = pytest.mark.django_db


def fresh_permissions(user):
    """What ModelBackend reads for ``user`` with empty caches (its own two queries)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.backends import ModelBackend

    again = get_user_model().objects.get(pk=user.pk)
    backend = ModelBackend()
    return backend.get_user_permissions(again), backend.get_group_permissions(again)


def test_a_token_is_authenticated_with_its_permissions_in_one_query(reviewer, reviewer_token):
    from django.contrib.auth.models import Permission

    from api.auth import VIEW_PERMISSION
    from api.services import token_authenticate
    from effects.services import REVIEW_PERMISSION

    # A permission of the user's own, beside those of their group: both sets must come back.
    reviewer.user_permissions.add(Permission.objects.get(codename="view_apitoken"))
    token_authenticate(reviewer_token)  # writes the advisory last-used stamp (its own UPDATE)
    with CaptureQueriesContext(connection) as queries:
        user = token_authenticate(reviewer_token)
        assert user.pk == reviewer.pk and user.get_username() == "reviewer" and user.is_active is True
        assert user.has_perm(REVIEW_PERMISSION) and user.has_perm(VIEW_PERMISSION)
        assert not user.has_perm("cases.publish_policy")
    assert len(queries) == 1, [q["sql"][:120] for q in queries.captured_queries]
    own, groups = fresh_permissions(reviewer)
    assert "api.view_apitoken" in own and REVIEW_PERMISSION in groups
    assert user.get_user_permissions() == own
    assert user.get_group_permissions() == groups
    assert user.get_all_permissions() == own | groups
    # The user is a proper model instance: fields typed as the ORM would type them.
    assert user.date_joined == type(reviewer).objects.get(pk=reviewer.pk).date_joined
    assert not hasattr(user, "perm_codename") and not hasattr(user, "token_pk")


def test_a_user_without_permissions_comes_back_with_empty_sets(make_user):
    from api.services import token_authenticate, token_create

    nobody = make_user("nobody", group=None)
    user = token_authenticate(token_create(user=nobody, name="t")[1])
    assert user.pk == nobody.pk
    assert user.get_all_permissions() == set()


def test_a_superuser_keeps_every_permission(db):
    from django.contrib.auth import get_user_model

    from api.services import token_authenticate, token_create

    root = get_user_model().objects.create_superuser("root", password="pw-root-1042")
    user = token_authenticate(token_create(user=root, name="t")[1])
    assert user.is_superuser and user.has_perm("cases.publish_policy") and user.has_perm("anything.at_all")


def test_revoked_unknown_and_inactive_tokens_authenticate_no_one(reviewer, reviewer_token):
    from api.models import ApiToken
    from api.services import token_authenticate, token_create, token_revoke

    other = token_create(user=reviewer, name="second")
    assert token_authenticate(other[1]) is not None
    token_revoke(token=other[0])
    assert token_authenticate(other[1]) is None
    assert token_authenticate("dft_" + "x" * 43) is None
    type(reviewer).objects.filter(pk=reviewer.pk).update(is_active=False)
    assert token_authenticate(reviewer_token) is None
    assert ApiToken.objects.filter(revoked_at__isnull=True).count() == 1


def test_the_last_used_stamp_is_written_once_a_minute(reviewer, reviewer_token):
    from datetime import timedelta

    from api.models import ApiToken
    from api.services import token_authenticate

    with CaptureQueriesContext(connection) as first:
        token_authenticate(reviewer_token)
    stamped = ApiToken.objects.get().last_used_at
    assert stamped is not None and len(first) == 2  # the read, then the stamp
    with CaptureQueriesContext(connection) as second:
        token_authenticate(reviewer_token)
    assert len(second) == 1 and ApiToken.objects.get().last_used_at == stamped
    ApiToken.objects.update(last_used_at=stamped - timedelta(minutes=2))
    token_authenticate(reviewer_token)
    assert ApiToken.objects.get().last_used_at > stamped - timedelta(minutes=1)


def count(api, method, path, body=None) -> tuple[int, int]:
    api.get("/api/cases/NO-SUCH-CASE")  # the stamp is written now, not inside a measured request
    with CaptureQueriesContext(connection) as queries:
        response = api.get(path) if method == "GET" else api.post(path, body)
    return response.status_code, len(queries)


# (what, ceiling) per backend: PostgreSQL commits in one statement (effects/services.py);
# SQLite keeps the ORM path. Counted as Django logs them (SAVEPOINTs, and on PostgreSQL BEGIN
# and COMMIT, included), inside the test transaction. A case's GET reads the case with its
# proposal, parent, author and policy in one statement, and the decision, effect, delivery
# and pending review in another (docs/PERFORMANCE.md, "third pass"); an edit answers with
# the pending review its begin returned. The ceilings are the counts themselves: one more
# query anywhere fails.
CEILINGS = {
    "postgresql": {"get_unbegun": 3, "get_begun": 3, "approve_begins": 12, "replay": 6, "edit": 34, "stale": 9},
    "sqlite": {"get_unbegun": 3, "get_begun": 3, "approve_begins": 24, "replay": 11, "edit": 32, "stale": 14},
}


def test_requests_stay_within_their_query_counts(api, case):
    ceiling = CEILINGS[connection.vendor]
    path = "/api/cases/T-1042"
    status, n = count(api, "GET", path)
    assert status == 200 and n <= ceiling["get_unbegun"], n
    approve = {"operation_id": DEMO_OP, "approved": True}
    status, n = count(api, "POST", path + "/decision", approve)
    assert status == 200 and n <= ceiling["approve_begins"], n
    status, n = count(api, "POST", path + "/decision", approve)
    assert status == 200 and n <= ceiling["replay"], n
    status, n = count(api, "GET", path)
    assert status == 200 and n <= ceiling["get_begun"], n


def test_an_edit_and_a_stale_decision_stay_within_their_query_counts(api, case):
    from reviews.services import proposal_create
    from workflow.begin import review_begin

    review_begin(case=case)
    old = proposal_create(case=case).operation_id
    ceiling = CEILINGS[connection.vendor]
    edit = {"expected_operation_id": old, "body": "Hello,\n\nEdited.\n\nSupport"}
    status, n = count(api, "POST", "/api/cases/T-1042/edits", edit)
    assert status == 201 and n <= ceiling["edit"], n
    status, n = count(api, "POST", "/api/cases/T-1042/decision", {"operation_id": old, "approved": True})
    assert status == 409 and n <= ceiling["stale"], n
    assert json.loads(api.get("/api/cases/T-1042").content)["operation_id"] != old
