"""API tokens: issued by an admin, shown once, stored only as a hash, revocable."""

from __future__ import annotations

import hashlib
import re

import pytest
from django.urls import reverse

from tests.api.conftest import Api, assert_error


def test_only_the_hash_is_stored(reviewer):
    from api.models import ApiToken
    from api.services import token_create

    token, plaintext = token_create(user=reviewer, name="retry loop")
    assert plaintext.startswith("dft_") and len(plaintext) > 40
    row = ApiToken.objects.filter(pk=token.pk).values().get()
    assert row["token_hash"] == hashlib.sha256(plaintext.encode()).hexdigest()
    assert not any(plaintext in str(v) for v in row.values())
    assert row["prefix"] == plaintext[:10]
    # Two tokens are never the same.
    assert token_create(user=reviewer, name="again")[1] != plaintext


def test_hash_must_be_a_sha256(reviewer):
    from django.core.exceptions import ValidationError
    from django.db import IntegrityError

    from api.models import ApiToken

    with pytest.raises(ValidationError):
        ApiToken(user=reviewer, name="x", token_hash="dft_plaintext", prefix="dft_").full_clean()
    with pytest.raises(IntegrityError):
        ApiToken.objects.create(user=reviewer, name="x", token_hash="dft_plaintext", prefix="dft_")


def test_revoke_and_last_used(client, reviewer, proposal):
    from api.services import token_create, token_revoke

    token, plaintext = token_create(user=reviewer, name="t")
    api = Api(client, plaintext)
    assert token.last_used_at is None
    assert api.get("/api/cases/T-1042").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None

    assert token_revoke(token=token) is True
    assert token_revoke(token=token) is False  # twice is harmless
    assert_error(api.get("/api/cases/T-1042"), 401, "unauthorized")


@pytest.fixture
def admin_user(make_user):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_superuser("boss", password="pw-boss-test")


def test_admin_issues_a_token_and_shows_it_once(client, admin_user, reviewer, proposal):
    from api.models import ApiToken

    client.force_login(admin_user)
    form = client.get(reverse("admin:api_apitoken_add"))
    assert form.status_code == 200
    assert 'name="user"' in form.content.decode() and 'name="name"' in form.content.decode()
    response = client.post(
        reverse("admin:api_apitoken_add"), {"user": reviewer.pk, "name": "nightly retry"}, follow=True
    )
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"]]
    plaintext = re.search(r"(dft_[A-Za-z0-9_-]+)", " ".join(shown)).group(1)
    token = ApiToken.objects.get()
    assert token.user == reviewer and token.name == "nightly retry"
    assert token.token_hash == hashlib.sha256(plaintext.encode()).hexdigest()

    # The change page never shows it again.
    page = client.get(reverse("admin:api_apitoken_change", args=[token.pk]))
    assert page.status_code == 200
    assert plaintext not in page.content.decode()

    # It works as a bearer token for that user.
    assert Api(client, plaintext).get("/api/cases/T-1042").status_code == 200

    # Revoking from the changelist stops it.
    changelist = reverse("admin:api_apitoken_changelist")
    listing = client.get(changelist).content.decode()
    assert token.prefix in listing and plaintext not in listing
    response = client.post(changelist, {"action": "revoke", "_selected_action": [token.pk]}, follow=True)
    assert "Revoked 1 token" in " ".join(str(m) for m in response.context["messages"])
    token.refresh_from_db()
    assert token.revoked_at is not None
    client.logout()
    assert_error(Api(client, plaintext).get("/api/cases/T-1042"), 401, "unauthorized")
    # Tokens are not deleted (the history stays) and not edited.
    client.force_login(admin_user)
    assert client.get(reverse("admin:api_apitoken_delete", args=[token.pk])).status_code == 403
