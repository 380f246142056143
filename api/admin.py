"""API tokens in the admin.

- Administrators (the token permissions, or a superuser) issue and revoke anyone's tokens
  on the model pages; the plaintext is shown once, as a message.
- Every user with the review permission manages their own on "Your API tokens"
  (``/admin/api/apitoken/mine/``): create, list, revoke. The plaintext is shown once, on
  the page that answers the create, and never stored.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from api import selectors
from api.models import ApiToken
from api.services import can_self_serve, token_create, token_revoke, token_self_create, token_self_revoke
from core.errors import DecisionflowError
from core.text import when


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["user"]
    search_fields = ["name", "user__username", "prefix"]
    actions = ["revoke"]
    autocomplete_fields = []
    readonly = ["user", "name", "prefix", "created_at", "last_used_at", "revoked_at"]

    def get_fields(self, request, obj=None):
        return ["user", "name"] if obj is None else self.readonly

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.readonly

    def has_change_permission(self, request, obj=None):
        # Viewing is fine; a token's owner and name never change (revoke and issue another).
        return False

    def has_delete_permission(self, request, obj=None):
        # Revoked tokens stay, so the history of who could call the API stays too.
        return False

    def save_model(self, request, obj, form, change):
        if change:  # pragma: no cover - change is not permitted
            return
        token, plaintext = token_create(user=obj.user, name=obj.name)
        # The admin goes on with `obj` (log entry, redirect): make it the row just created.
        obj.__dict__.update({f.attname: getattr(token, f.attname) for f in token._meta.concrete_fields})
        obj._state.adding = False
        obj._state.db = token._state.db
        self.message_user(
            request,
            f"API token for {obj.user.get_username()}: {plaintext} — copy it now. Only its hash is "
            f"stored; it will not be shown again.",
            messages.WARNING,
        )

    @admin.action(description="Revoke selected API tokens", permissions=["revoke"])
    def revoke(self, request, queryset):
        revoked = sum(token_revoke(token=token) for token in queryset)
        self.message_user(
            request, f"Revoked {revoked} token(s); {queryset.count() - revoked} were already revoked.", messages.SUCCESS
        )

    def has_revoke_permission(self, request):
        return request.user.has_perm("api.change_apitoken")

    # --- "Your API tokens": self-service for reviewers ----------------------------------

    def get_urls(self):
        return [
            path("mine/", self.admin_site.admin_view(self.mine_view), name="api_apitoken_mine"),
        ] + super().get_urls()

    def mine_view(self, request):
        """List, create and revoke the signed-in user's own tokens; each POST calls one service."""
        if not can_self_serve(request.user):
            raise PermissionDenied(
                "Your API tokens: creating and revoking your own tokens needs the review permission (group Reviewers)."
            )
        url = reverse("admin:api_apitoken_mine")
        created = plaintext = None
        name_error = None
        if request.method == "POST":
            try:
                if request.POST.get("action") == "revoke":
                    token_id = request.POST.get("token_id", "")
                    token, revoked = token_self_revoke(
                        user=request.user, token_id=int(token_id) if token_id.isdigit() else 0
                    )
                    self.message_user(
                        request,
                        f"Revoked {token}: requests with it are refused (401) from now on."
                        if revoked
                        else f"{token} was already revoked; nothing changed.",
                        messages.SUCCESS if revoked else messages.INFO,
                    )
                    return HttpResponseRedirect(url)
                created, plaintext = token_self_create(user=request.user, name=request.POST.get("name", ""))
            except DecisionflowError as exc:
                if request.POST.get("action") == "revoke":
                    self.message_user(request, exc.message, messages.ERROR)
                    return HttpResponseRedirect(url)
                name_error = exc.message
        tokens = [
            {
                "token": token,
                "created": when(token.created_at),
                "last_used": when(token.last_used_at) if token.last_used_at else "never",
                "revoked": when(token.revoked_at) if token.revoked_at else None,
            }
            for token in selectors.tokens_of(request.user)
        ]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Your API tokens",
            "tokens": tokens,
            "created": created,
            "plaintext": plaintext,
            "name_error": name_error,
            "name_value": request.POST.get("name", "") if name_error else "",
            "example_url": request.build_absolute_uri("/api/cases/T-1042"),
            "docs_url": request.build_absolute_uri("/api/docs"),
            "manage_all_url": reverse("admin:api_apitoken_changelist") if self.has_view_permission(request) else None,
        }
        response = TemplateResponse(request, "admin/api/apitoken/mine.html", context)
        if plaintext is not None:
            # The secret is on this page only: no browser or proxy cache may keep a copy.
            response["Cache-Control"] = "no-store"
        return response
