"""Who exported what, and the signature of each export (docs/AUDIT.md, "From the admin")."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class SignedExport(models.Model):
    """One export, written when it starts and completed with its signature when its last byte
    is out. The admin streams the file before the signature exists, so the ``.sig`` is served
    from here afterwards; a row without ``finished_at`` is an export that never ended (the
    download was cut off) and has no signature."""

    class Channel(models.TextChoices):
        ADMIN = "admin", "Admin"
        COMMAND = "command", "Command"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=20)
    format = models.CharField(max_length=10)
    filters = models.CharField(max_length=500, blank=True)
    file_name = models.CharField(max_length=200)
    channel = models.CharField(max_length=10, choices=Channel.choices)
    exported_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    size = models.BigIntegerField(null=True, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    key_id = models.CharField(max_length=32, blank=True)
    signature = models.TextField(blank=True, help_text="The .sig file's text.")

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["-started_at"], name="signed_export_started")]

    def __str__(self):
        return self.file_name
