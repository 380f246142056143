"""Self-service API tokens: a reviewer creates, lists and revokes their own on an admin page."""

from __future__ import annotations

import re
import threading

import pytest
from django.db import connections
from django.test import Client
from django.urls import reverse

from api.models import ApiToken
from api.services import token_create, token_self_create

pytestmark = pytest.mark.django_db

MINE = "/admin/api/apitoken/mine/"


@pytest.fixture
def reviewer_client(reviewer):
    client = Client()
    client.force_login(reviewer)
    return client


def secret_of(response) -> str:
    match = re.search(r'id="df-token-secret" value="(dft_[^"]+)"', response.content.decode())
    assert match, response.content.decode()[:2000]
    return match.group(1)


def test_the_page_is_where_the_docs_say(reviewer):
    assert reverse("admin:api_apitoken_mine") == MINE


def test_a_reviewer_creates_a_token_sees_it_once_and_it_works(reviewer_client, client, reviewer):
    response = reviewer_client.post(MINE, {"action": "create", "name": "retry loop"})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    secret = secret_of(response)
    token = ApiToken.objects.get()
    assert (token.user, token.name, token.revoked_at) == (reviewer, "retry loop", None)
    assert secret not in token.token_hash and secret.startswith(token.prefix)
    # Listed afterwards, by its prefix, never again in full.
    listing = reviewer_client.get(MINE).content.decode()
    assert "retry loop" in listing and token.prefix in listing and secret not in listing
    # It authenticates as the reviewer.
    api = client.get("/api/cases/NOPE", headers={"Authorization": f"Bearer {secret}"})
    assert api.status_code == 404 and api.json()["code"] == "not_found"


def test_a_reviewer_revokes_their_token_and_it_is_refused(reviewer_client, client, reviewer):
    secret = secret_of(reviewer_client.post(MINE, {"action": "create", "name": "cron"}))
    token = ApiToken.objects.get()
    for _ in range(2):  # twice: the second changes nothing
        response = reviewer_client.post(MINE, {"action": "revoke", "token_id": token.pk}, follow=True)
        assert response.status_code == 200
    said = [str(m) for m in response.context["messages"]]
    assert any("already revoked" in m for m in said), said
    token.refresh_from_db()
    assert token.revoked_at is not None
    refused = client.get("/api/cases/T-1042", headers={"Authorization": f"Bearer {secret}"})
    assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
    assert "revoked" in reviewer_client.get(MINE).content.decode()


def test_nobody_revokes_or_sees_someone_elses_token(reviewer_client, make_user):
    other = make_user("other-reviewer")
    theirs, _ = token_create(user=other, name="their secret job")
    response = reviewer_client.post(MINE, {"action": "revoke", "token_id": theirs.pk}, follow=True)
    said = [str(m) for m in response.context["messages"]]
    assert said == [f"you have no API token {theirs.pk}; nothing changed"]
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    assert "their secret job" not in reviewer_client.get(MINE).content.decode()


@pytest.mark.parametrize("name", ["", "   ", "x" * 101])
def test_a_bad_name_is_refused_and_nothing_is_created(reviewer_client, name):
    response = reviewer_client.post(MINE, {"action": "create", "name": name})
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="df-token-error"' in page and "df-token-secret" not in page
    # The refusal's own words, which say that nothing was created.
    assert page.count("nothing was created") == 1 and response.context["name_error"].endswith("; nothing was created")
    assert ApiToken.objects.count() == 0


def test_without_the_review_permission_the_page_is_403_and_nothing_is_created(lead):
    client = Client()
    client.force_login(lead)
    assert client.get(MINE).status_code == 403
    assert client.post(MINE, {"action": "create", "name": "x"}).status_code == 403
    assert ApiToken.objects.count() == 0


def test_reviewers_do_not_get_the_all_tokens_pages_but_admins_still_do(reviewer_client, admin_client, reviewer):
    token_create(user=reviewer, name="mine")
    assert reviewer_client.get(reverse("admin:api_apitoken_changelist")).status_code == 403
    listing = admin_client.get(reverse("admin:api_apitoken_changelist"))
    assert listing.status_code == 200 and "mine" in listing.content.decode()
    # A superuser has every permission, the review one included: their own page works too.
    assert admin_client.get(MINE).status_code == 200


def test_the_user_tools_link_to_the_page_for_reviewers_only(reviewer_client, lead):
    assert f'href="{MINE}"' in reviewer_client.get("/admin/").content.decode()
    client = Client()
    client.force_login(lead)
    assert f'href="{MINE}"' not in client.get("/admin/").content.decode()


def test_two_creates_at_once_make_two_distinct_tokens(transactional_db, reviewer):
    secrets, errors = [], []

    def create():
        try:
            secrets.append(token_self_create(user=reviewer, name="parallel")[1])
        except Exception as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=create) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(set(secrets)) == 2
    assert ApiToken.objects.filter(user=reviewer).count() == 2
