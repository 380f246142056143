"""Who exported what, and the signature of each export (docs/AUDIT.md, "From the admin"); the
seals of the audit chain (docs/AUDIT.md, "Seals"), append-only, one per run of ``manage.py
audit_seal``, each signed with the audit key."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from core.append_only import AppendOnlyModel


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


class Seal(AppendOnlyModel):
    """What was in the chained tables at one moment, signed: per table, the highest id
    covered, the ids missing below it, the count, and a digest over every row up to it.

    ``number`` counts from 1 and ``previous`` is the seal before's ``seal_hash`` ("" for
    the first): the unique keys on both make a second seal of the same turn impossible,
    whoever writes it. ``seal_hash`` is the SHA-256 of the signed statement
    (audit/seals.py), ``signature`` its Ed25519 signature (base64) by the key ``key_id``.
    """

    number = models.PositiveIntegerField()
    sealed_at = models.DateTimeField()
    # {"reviews.proposal": {"through": 41, "count": 40, "missing": [[7, 7]], "digest": "…"}, …}
    covers = models.JSONField()
    previous = models.CharField(max_length=80, blank=True)
    seal_hash = models.CharField(max_length=80)
    key_id = models.CharField(max_length=64)
    signature = models.CharField(max_length=128)

    class Meta:
        ordering = ["-number"]
        constraints = [
            models.UniqueConstraint(fields=["number"], name="seal_unique_number"),
            models.UniqueConstraint(fields=["previous"], name="seal_unique_previous"),
            models.CheckConstraint(condition=models.Q(number__gte=1), name="seal_number_positive"),
        ]

    def __str__(self) -> str:
        return f"seal {self.number}"
