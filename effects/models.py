"""The write-once effect store and the append-only log of commit attempts."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from decisionflow.core.append_only import AppendOnlyModel
from decisionflow.core.errors import RefusalReason
from decisionflow.core.identity import short
from reviews.models import DeclineReason


class EffectRecord(AppendOnlyModel):
    """The ``record_support_review`` effect: keyed by the operation identity, written once.

    It holds the reviewed content itself, so the record stands on its own even if the
    proposal it came from were ever unreadable. No email, no external call.
    """

    operation_id = models.CharField(max_length=80)
    decision = models.OneToOneField("reviews.ReviewDecision", on_delete=models.PROTECT, related_name="effect")
    case = models.ForeignKey("cases.Case", on_delete=models.PROTECT, related_name="effects")
    proposal = models.ForeignKey("reviews.Proposal", on_delete=models.PROTECT, related_name="+")
    action = models.CharField(max_length=100)
    body = models.TextField()
    evidence_id = models.CharField(max_length=80)
    # {"HOLD-7": 2, "KB-311": 3}
    source_versions = models.JSONField()
    policy_id = models.CharField(max_length=80)
    policy_snapshot = models.JSONField()
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-recorded_at", "-id"]
        constraints = [
            # The idempotency lives entirely in this key: a retry finds the row, never adds one.
            models.UniqueConstraint(fields=["operation_id"], name="effect_unique_operation"),
        ]

    def __str__(self):
        return f"{self.action} {short(self.operation_id)}"


class CommitAttempt(AppendOnlyModel):
    """Every call to commit and how it ended, refusals and failures included.

    This is the history support leads browse: every click and every retry is a row.
    """

    class Outcome(models.TextChoices):
        COMMITTED = "committed", "Committed"
        REPLAY = "replay", "Replay"
        DECLINED = "declined", "Declined"
        CONFLICT = "conflict", "Conflicting decision"
        STALE = "stale", "Stale"
        REFUSED = "refused", "Refused"
        FAILED = "failed", "Failed"

    operation_id = models.CharField(max_length=200, db_index=True)
    case = models.ForeignKey(
        "cases.Case", on_delete=models.PROTECT, null=True, blank=True, related_name="commit_attempts"
    )
    # None when the request did not carry a real boolean: an omitted decision is not consent.
    approved = models.BooleanField(null=True)
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    channel = models.CharField(max_length=20, default="service")
    # Why a refused or failed attempt did not commit; None for committed, declined, replay
    # and conflict (the commit statement's raw INSERT leaves the column out). Nullable also
    # so that adding it is a plain ADD COLUMN: SQLite would rebuild a NOT NULL column's table
    # and lose its append-only triggers.
    reason = models.CharField(max_length=20, choices=RefusalReason.choices, null=True, blank=True)  # noqa: DJ001
    detail = models.TextField(blank=True)
    # The decline reason this call asked for (None otherwise). A replay keeps its own here
    # while the decision keeps the first; nullable: a plain ADD COLUMN (see ``reason``).
    decline_reason = models.CharField(  # noqa: DJ001
        max_length=20, choices=DeclineReason.choices, null=True, blank=True
    )
    decline_note = models.TextField(null=True, blank=True)  # noqa: DJ001
    attempted_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-attempted_at", "-id"]

    def __str__(self):
        return f"{self.outcome} {short(self.operation_id)}"
