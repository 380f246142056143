"""API tokens are issued and revoked by an admin; the plaintext is shown once, as a message."""

from __future__ import annotations

from django.contrib import admin, messages

from .models import ApiToken
from .services import token_create, token_revoke


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
