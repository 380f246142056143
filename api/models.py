"""API tokens: a per-user bearer credential, stored only as its SHA-256."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    """One bearer token of one user. The plaintext is shown once at creation and never stored.

    ``token_hash`` is the lowercase hex SHA-256 of the plaintext: a token is long and random,
    so a plain hash (no salt, no slow KDF) is enough and lets a request find its row with one
    indexed lookup. Revoking sets ``revoked_at``; the row stays, so the admin keeps a history
    of who held which token when.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. 'retry loop on host X'.")
    token_hash = models.CharField(max_length=64, editable=False)
    # The first characters of the plaintext, so a person can tell tokens apart; not a secret.
    prefix = models.CharField(max_length=16, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"
        constraints = [
            models.UniqueConstraint(fields=["token_hash"], name="api_token_unique_hash"),
            # A SHA-256 in lowercase hex, nothing else: a plaintext can never land here by mistake.
            models.CheckConstraint(
                condition=models.Q(token_hash__regex=r"^[0-9a-f]{64}$"), name="api_token_hash_format"
            ),
        ]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
