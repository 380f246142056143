"""Who is asking: a Bearer API token, or the admin session (with CSRF kept for unsafe methods).

Reads follow the admin's permissions: they need the view permission on cases
(``cases.view_case``, which the Reviewers and Support leads groups have), as every admin
page does. ``is_staff`` is not needed: it only opens the admin's login. Unsafe methods need
the review permission, but for the pipeline's intake and withdrawal, a policy's publish and
an assignment, which need their own. Checking both here, before the body is parsed, means a caller
without the permission learns nothing from validation errors and the services are never
reached; a refused decision is still recorded as a commit attempt.
"""

from __future__ import annotations

import json
import re

from django.conf import settings
from django.http import HttpRequest
from ninja.errors import AuthenticationError, AuthorizationError
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from api.services import token_authenticate
from cases.models import Case
from cases.services import can_publish
from core import identity
from core.errors import PermissionRefused
from effects.services import REVIEW_PERMISSION
from reviews.groups import INTAKE_PERMISSION, WITHDRAW_PERMISSION, can_intake
from reviews.models import Channel
from workflow.assignment import assign_refusal, can_assign
from workflow.decide import refusal_record

SAFE_METHODS = {"GET", "HEAD", "OPTIONS", "TRACE"}
VIEW_PERMISSION = "cases.view_case"
PUBLISH_PATH = "/policies/publish"
# The pipeline's acts need the intake permission (the Pipeline group), not the review one:
# a pipeline token brings cases in, re-drafts them and adds source versions, but never
# decides one (docs/INTAKE.md).
INTAKE_PATH = re.compile(r"/api/(cases(/[^/]+/drafts)?|sources/[^/]+/versions)/?$")
# A withdrawal needs the withdraw permission, not the review one (docs/INTAKE.md, "Withdrawals").
WITHDRAW_PATH = re.compile(r"/api/cases/[^/]+/withdraw/?$")
# An assignment needs the assign permission (support leads), not the review one.
ASSIGN_PATH = re.compile(r"/api/cases/[^/]+/assignment/?$")


def _permitted(request: HttpRequest, user):
    if request.method in SAFE_METHODS:
        if not user.has_perm(VIEW_PERMISSION):
            raise AuthorizationError(
                message=f"{user.get_username()} does not have the view permission on cases ({VIEW_PERMISSION})"
            )
    elif request.path.endswith(PUBLISH_PATH):
        # Publishing a policy version needs its own permission, not the review one: support
        # leads have it, reviewers do not (docs/API.md). The service checks it again.
        if not can_publish(user):
            raise AuthorizationError(message=f"{user.get_username()} does not have the publish policy permission")
    elif INTAKE_PATH.search(request.path):
        if not can_intake(user):
            raise AuthorizationError(
                message=f"{user.get_username()} does not have the intake permission ({INTAKE_PERMISSION}, "
                "the Pipeline group)"
            )
    elif WITHDRAW_PATH.search(request.path):
        if not user.has_perm(WITHDRAW_PERMISSION):
            message = (
                f"{user.get_username()} does not have the withdraw permission ({WITHDRAW_PERMISSION}, "
                "the Pipeline group)"
            )
            _record_refused_call(request, user, message)
            raise AuthorizationError(message=message)
    elif ASSIGN_PATH.search(request.path):
        if not can_assign(user):
            raise AuthorizationError(message=assign_refusal(user).message)
    elif not user.has_perm(REVIEW_PERMISSION):
        message = f"{user.get_username()} does not have the review permission"
        _record_refused_call(request, user, message)
        raise AuthorizationError(message=message)
    return user


def _record_refused_call(request: HttpRequest, user, message: str) -> None:
    """The attempt row of a decision, a withdrawal or an edit refused for want of the permission.

    Only for ``POST /api/cases/{id}/decision``, ``…/withdraw`` and ``…/edits`` of a case
    that exists. The operation (and the decision) are read from the body for the record
    only, never answered: a body that names no operation is recorded against the case's
    current one. A withdrawal is recorded as the decline it would have been.
    """
    match = request.resolver_match
    edit = request.path.endswith("/edits")
    withdraw = WITHDRAW_PATH.search(request.path) is not None
    if match is None or not (edit or withdraw or request.path.endswith("/decision")) or "case_id" not in match.kwargs:
        return
    case = Case.objects.select_related("current_proposal").filter(case_id=match.kwargs["case_id"]).first()
    if case is None:
        return
    try:
        body = json.loads(request.body)
    except Exception:  # noqa: BLE001 - any unreadable body: record without it
        body = None
    body = body if isinstance(body, dict) else {}
    named = body.get("expected_operation_id" if edit else "operation_id")
    if not (isinstance(named, str) and identity.is_operation_id(named)):
        named = case.current_proposal.operation_id if case.current_proposal is not None else ""
    approved = None if edit else False if withdraw else body.get("approved")
    refusal_record(
        case=case,
        operation_id=named,
        approved=approved if isinstance(approved, bool) else None,
        reviewer=user,
        channel=Channel.API,
        error=PermissionRefused(message),
        edit=edit,
    )


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
