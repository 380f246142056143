"""Who is asking: a Bearer API token, or the admin session (with CSRF kept for unsafe methods).

Unsafe methods also need the review permission. Checking it here, before the body is read,
means a caller without the permission learns nothing from validation errors and the
services are never reached.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest
from ninja.errors import AuthenticationError, AuthorizationError
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from effects.services import REVIEW_PERMISSION

from .services import token_authenticate

SAFE_METHODS = {"GET", "HEAD", "OPTIONS", "TRACE"}


def _permitted(request: HttpRequest, user):
    if request.method not in SAFE_METHODS and not user.has_perm(REVIEW_PERMISSION):
        raise AuthorizationError(message=f"{user.get_username()} does not have the review permission")
    return user


class TokenAuth(HttpBearer):
    """``Authorization: Bearer <token>``. A bad token is a 401 at once, never a fall-through to the session."""

    def authenticate(self, request: HttpRequest, token: str):
        user = token_authenticate(token.strip())
        if user is None:
            raise AuthenticationError(message="the API token is unknown or revoked")
        return _permitted(request, user)


class SessionAuth(APIKeyCookie):
    """The admin session. Unsafe methods must pass Django's CSRF check, exactly as a form would."""

    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self):
        # ninja's own cookie CSRF check runs before it knows whether anyone is logged in,
        # which would answer 403 where "no credentials" (401) is the truth; we check below.
        super().__init__(csrf=False)

    def __call__(self, request: HttpRequest):
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        if request.method not in SAFE_METHODS and check_csrf(request) is not None:
            raise AuthorizationError(message="CSRF check failed: send the csrftoken cookie and the X-CSRFToken header")
        return _permitted(request, user)

    def authenticate(self, request, key):  # pragma: no cover - __call__ does the work
        return None


AUTH = [TokenAuth(), SessionAuth()]
