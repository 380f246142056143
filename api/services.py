"""API token writes, and the test-only fault header. Decisions and edits call the workflow's services."""

from __future__ import annotations

import functools
import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from api.models import ApiToken
from api.rows import Joined, Part
from core import faults
from core.errors import InvalidInput, NotFound, PermissionRefused
from effects.services import REVIEW_PERMISSION

TOKEN_PREFIX = "dft_"
# last_used_at is advisory: writing it at most once a minute keeps busy clients (and the
# concurrency tests) from queueing on one token row.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def token_hash(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8", "surrogatepass")).hexdigest()


def token_create(*, user, name: str) -> tuple[ApiToken, str]:
    """Issue a token for ``user``; returns the row and the plaintext, which is never stored.

    The caller shows the plaintext once. Losing it means revoking and issuing another.
    """
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, name=name, token_hash=token_hash(plaintext), prefix=plaintext[: len(TOKEN_PREFIX) + 6]
    )
    return token, plaintext


def token_revoke(*, token: ApiToken) -> bool:
    """Revoke a token from now on; False if it was already revoked (revoking twice is harmless)."""
    now = timezone.now()
    revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now)
    if revoked:
        token.revoked_at = now
    return bool(revoked)


# Self-service: a reviewer's own tokens ---------------------------------------------------

# Who may hold and manage their own tokens: whoever may decide through the API.
SELF_SERVICE_PERMISSION = REVIEW_PERMISSION
TOKEN_NAME_MAX = ApiToken._meta.get_field("name").max_length or 100


def can_self_serve(user) -> bool:
    return bool(user.is_active and user.has_perm(SELF_SERVICE_PERMISSION))


def _self_service_check(user) -> None:
    if not can_self_serve(user):
        raise PermissionRefused(
            f"{user.get_username()} does not have the review permission (group Reviewers); "
            "an administrator can issue a token instead"
        )


def token_self_create(*, user, name: str) -> tuple[ApiToken, str]:
    """``user`` issues a token for themselves; returns the row and the plaintext (shown once).

    Needs the review permission. The name says what the token is for: not blank, at most
    100 characters. Refused input writes nothing.
    """
    _self_service_check(user)
    name = (name or "").strip()
    if not name:
        raise InvalidInput(
            "give the token a name that says what it is for, e.g. 'retry loop on host X'; nothing was created"
        )
    if len(name) > TOKEN_NAME_MAX:
        raise InvalidInput(
            f"the token's name is {len(name)} characters long; at most {TOKEN_NAME_MAX}; nothing was created"
        )
    return token_create(user=user, name=name)


def token_self_revoke(*, user, token_id: int) -> tuple[ApiToken, bool]:
    """``user`` revokes one of their own tokens; the row and whether this call revoked it.

    Someone else's token is NotFound, exactly as a token that does not exist: the page does
    not tell anyone which token IDs are taken. Revoking twice is harmless (False).
    """
    _self_service_check(user)
    token = ApiToken.objects.filter(pk=token_id, user=user).first()
    if token is None:
        raise NotFound(f"you have no API token {token_id}; nothing changed")
    return token, token_revoke(token=token)


MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


@functools.cache
def _token_sql() -> str:
    """One statement: the token's user, one row per permission the user holds.

    Permissions come from the user's own grants and from their groups: the two sets Django's
    ModelBackend reads with two more queries per request. Each row also says whether the
    token's advisory last-used stamp is stale. Table and column names come from the models.
    """
    user = get_user_model()
    own = user._meta.get_field("user_permissions")
    member = user._meta.get_field("groups")
    granted = Group._meta.get_field("permissions")

    def q(name: str | None) -> str:
        return connection.ops.quote_name(str(name))

    u_pk = q(user._meta.pk.column)
    permission_joins = (
        f"JOIN {q(Permission._meta.db_table)} x ON x.{q(Permission._meta.pk.column)} = {{link}} "
        f"JOIN {q(ContentType._meta.db_table)} c "
        f"ON c.{q(ContentType._meta.pk.column)} = x.{q(Permission._meta.get_field('content_type').column)}"
    )
    user_columns = _user_row().sql
    return f"""
        SELECT {user_columns}, t.{q(ApiToken._meta.pk.column)} AS token_pk,
               CASE WHEN t.{q("last_used_at")} IS NULL OR t.{q("last_used_at")} < %s THEN 1 ELSE 0 END
                   AS stamp_stale,
               p.app_label AS perm_app, p.codename AS perm_codename, p.source AS perm_source
        FROM {q(ApiToken._meta.db_table)} t
        JOIN {q(user._meta.db_table)} u ON u.{u_pk} = t.{q(ApiToken._meta.get_field("user").column)}
        LEFT JOIN (
            SELECT o.{q(own.m2m_column_name())} AS user_id, c.{q("app_label")} AS app_label,
                   x.{q("codename")} AS codename, 'user' AS source
            FROM {q(own.m2m_db_table())} o
            {permission_joins.format(link=f"o.{q(own.m2m_reverse_name())}")}
            UNION ALL
            SELECT m.{q(member.m2m_column_name())}, c.{q("app_label")}, x.{q("codename")}, 'group'
            FROM {q(member.m2m_db_table())} m
            JOIN {q(granted.m2m_db_table())} g ON g.{q(granted.m2m_column_name())} = m.{q(member.m2m_reverse_name())}
            {permission_joins.format(link=f"g.{q(granted.m2m_reverse_name())}")}
        ) p ON p.user_id = u.{u_pk}
        WHERE t.{q("token_hash")} = %s AND t.{q("revoked_at")} IS NULL AND u.{q("is_active")}
    """


@functools.cache
def _user_row() -> Joined:
    """The user's columns in ``_token_sql``, read back as the user."""
    return Joined(Part.of(get_user_model(), "u"))


def token_authenticate(plaintext: str):
    """The active user holding this unrevoked token, or None: one query (two when the
    advisory last-used stamp is due).

    The user comes back with Django's permission caches filled from that one statement,
    exactly as ModelBackend fills them, so every ``has_perm`` of this request (the API's own
    check, the decision service's) reads no more rows. Only under the default backend and
    for a non-superuser: a superuser holds every permission, which ModelBackend reads
    itself, and another backend has rules of its own.
    """
    if not plaintext or len(plaintext) > 200:
        return None
    now = timezone.now()
    stale = now - LAST_USED_RESOLUTION
    params = [connection.ops.adapt_datetimefield_value(stale), token_hash(plaintext)]
    # A plain cursor, not ``objects.raw()``: on every API request, RawQuerySet's per-query
    # set-up (column mapping, converters, model init order) cost more than the statement.
    columns = _user_row()
    with connection.cursor() as cursor:
        cursor.execute(_token_sql(), params)
        rows = cursor.fetchall()
    if not rows:
        return None
    width = len(columns)
    (user,) = columns.instances(rows[0][:width])
    # The statement's own columns after the user's: token, stamp, then one permission a row.
    token_pk, stamp_stale = rows[0][width], rows[0][width + 1]
    if settings.AUTHENTICATION_BACKENDS == [MODEL_BACKEND] and not user.is_superuser:
        own = {f"{app}.{codename}" for *_, app, codename, source in rows if source == "user"}
        groups = {f"{app}.{codename}" for *_, app, codename, source in rows if source == "group"}
        # ModelBackend's own cache attributes: its has_perm reads these before any query.
        vars(user).update(_user_perm_cache=own, _group_perm_cache=groups, _perm_cache=own | groups)
    # Only a stale stamp is written: an UPDATE, even one that matches nothing, takes SQLite's
    # write lock and would make every request wait behind any writer. The filter repeats the
    # check so that concurrent requests still write it once.
    if stamp_stale:
        ApiToken.objects.filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=stale), pk=token_pk).update(
            last_used_at=now
        )
    return user


# Decisions and edits --------------------------------------------------------------------

FAULT_HEADER = "X-Decisionflow-Fault"


def fault_requested(request) -> str | None:
    """The test-only fault a request asks for, honoured only with DECISIONFLOW_FAULT_INJECTION on.

    With fault injection off (production) the header is ignored entirely, so no client can
    make a real server fail on purpose. An unknown fault is refused by the decision service.
    """
    value = request.headers.get(FAULT_HEADER)
    if not value or not faults.enabled():
        return None
    return value[:50]
