"""The write-once effect store and the append-only log of commit attempts."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from core.append_only import AppendOnlyModel
from core.chain import PrevHashField, RowHashField
from core.errors import RefusalReason
from core.identity import short
from core.outcomes import DecisionOutcome
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
    # The chain (core/chain.py): after its decision, which ``prev_hash`` names (the decision's
    # id is not hashed: the commit's statement gives it, after the hash is computed).
    prev_hash = PrevHashField()
    row_hash = RowHashField()

    CHAIN_FIELDS = (
        "operation_id",
        "case_id",
        "proposal_id",
        "action",
        "body",
        "evidence_id",
        "source_versions",
        "policy_id",
        "policy_snapshot",
        "reviewer_id",
        "recorded_at",
    )

    class Meta:
        ordering = ["-recorded_at", "-id"]
        constraints = [
            # The idempotency lives entirely in this key: a retry finds the row, never adds one.
            models.UniqueConstraint(fields=["operation_id"], name="effect_unique_operation"),
        ]

    def __str__(self):
        return f"{self.action} {short(self.operation_id)}"

    def chain_link(self) -> str:
        return self.decision.row_hash or ""


# The channel of the attempt reconcile --repair writes: no person's channel (reviews.Channel)
# asked for it. The attempt list's channel filter offers both.
REPAIR_CHANNEL = "repair"


class CommitAttempt(AppendOnlyModel):
    """Every call to commit and how it ended, refusals and failures included.

    This is the history support leads browse: every click and every retry is a row.
    """

    Outcome = DecisionOutcome

    # Indexed in Meta, not with db_index: that would add a varchar_pattern_ops twin on
    # PostgreSQL, for LIKE searches nothing makes (migration 0008).
    operation_id = models.CharField(max_length=200)
    # The case and the reviewer are references the database does not check (db_constraint
    # False, migration 0009): a checked one locks the referenced row FOR KEY SHARE on every
    # click, and made a refusal's row wait behind the lock it reports. Every writer takes them
    # from rows it has just read; PROTECT still refuses to delete a case or user with attempts.
    case = models.ForeignKey(
        "cases.Case",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="commit_attempts",
        db_constraint=False,
    )
    # None when the request did not carry a real boolean: an omitted decision is not consent.
    approved = models.BooleanField(null=True)
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        db_constraint=False,
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
    # Its hash only: an attempt links to no row (a refusal must never wait for its case), it
    # joins the trail through the seals (docs/AUDIT.md, "How refusals join").
    row_hash = RowHashField()

    CHAIN_FIELDS = (
        "operation_id",
        "case_id",
        "approved",
        "reviewer_id",
        "outcome",
        "channel",
        "reason",
        "detail",
        "decline_reason",
        "decline_note",
        "attempted_at",
    )

    class Meta:
        ordering = ["-attempted_at", "-id"]
        indexes = [
            # Equality only: reconcile, the case list's last attempt, the admin's =operation_id.
            models.Index(fields=["operation_id"], name="attempt_operation"),
        ]

    # A refused edit's row: on the operation the editor named, no decision asked (approved
    # None), and its detail starts with this; the history calls it an edit.
    EDIT_DETAIL = "edit refused, "

    def __str__(self):
        return f"{self.outcome} {short(self.operation_id)}"

    @property
    def refused_edit(self) -> bool:
        return self.detail.startswith(self.EDIT_DETAIL)


class DeliveryState(models.TextChoices):
    """Where the approved reply stands on the remote helpdesk (docs/DELIVERY.md).

    Forward only: Queued -> Sending -> Delivered | Rejected | Unknown. Sending goes back to
    Queued only when the try proves the helpdesk stored nothing (it answered 503 or 429, a
    bad token or URL, or the connection was refused before a byte was sent; see
    effects.delivery.NOT_STORED_STATUSES), and only when it was not Unknown before. Unknown (a request went out and no
    answer came back) never goes back to Queued: it is settled by a lookup (Delivered) or
    by a resend with the same key (Sending). Once a delivery has been Unknown, only positive
    evidence settles it: a permanent refusal of the resend cannot say that the earlier
    request was not stored, so it is NeedsCheck (a person looks at the ticket), never
    Rejected. Delivered and Rejected are final; NeedsCheck is left to a person, and nothing
    automatic moves it. The database enforces the same table (migrations 0006 and 0010).
    """

    QUEUED = "queued", "Queued"
    SENDING = "sending", "Sending"
    UNKNOWN = "unknown", "Unknown"
    DELIVERED = "delivered", "Delivered"
    REJECTED = "rejected", "Rejected"
    # A token, as reconcile prints it (delivery=NeedsCheck); the pages say it in words.
    NEEDS_CHECK = "needs_check", "NeedsCheck"


# The transitions the database allows (migrations 0006 and 0010 carry their own frozen copy); staying
# in a state (a new lease, a later retry time) is always allowed except in a final state.
DELIVERY_TRANSITIONS: dict[str, frozenset[str]] = {
    DeliveryState.QUEUED: frozenset({DeliveryState.SENDING}),
    DeliveryState.SENDING: frozenset(
        {
            DeliveryState.QUEUED,
            DeliveryState.UNKNOWN,
            DeliveryState.DELIVERED,
            DeliveryState.REJECTED,
            DeliveryState.NEEDS_CHECK,
        }
    ),
    DeliveryState.UNKNOWN: frozenset({DeliveryState.SENDING, DeliveryState.DELIVERED, DeliveryState.REJECTED}),
    DeliveryState.DELIVERED: frozenset(),
    DeliveryState.REJECTED: frozenset(),
    DeliveryState.NEEDS_CHECK: frozenset(),
}
DELIVERY_FINAL = frozenset({DeliveryState.DELIVERED, DeliveryState.REJECTED})


class Delivery(models.Model):
    """The second effect of an approval: its reply posted to the customer's ticket.

    Written by the commit statement, in the transaction that writes the decision and the
    local effect, and only for a new approval while a helpdesk is configured: an approval
    without its delivery is impossible, a decline never has one. Its identity (operation,
    case, decision, effect) is write-once; its state moves only forward (DeliveryState).
    The operation identity is also the Idempotency-Key of every request to the helpdesk.
    """

    operation_id = models.CharField(max_length=80)
    case = models.ForeignKey("cases.Case", on_delete=models.PROTECT, related_name="deliveries")
    decision = models.OneToOneField("reviews.ReviewDecision", on_delete=models.PROTECT, related_name="delivery")
    effect = models.OneToOneField(EffectRecord, on_delete=models.PROTECT, related_name="delivery")
    state = models.CharField(max_length=20, choices=DeliveryState.choices, default=DeliveryState.QUEUED)
    # Claims so far (each a lookup and/or a send): the backoff grows with it, and a worker
    # writes its outcome only while the count is still its own claim's (the fence).
    tries = models.PositiveIntegerField(default=0)
    # A worker may take it from then on (backoff after a failed try; now when queued).
    next_try_at = models.DateTimeField()
    # While Sending: the worker that holds it, and until when. Past the lease the sweep turns
    # it Unknown (the worker may have died after the helpdesk committed).
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    # The helpdesk's own reference of the stored reply (Delivered), or why it refused
    # (Rejected, NeedsCheck).
    reference = models.CharField(max_length=200, blank=True)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    # The approval's trace context (W3C traceparent), written with the row when tracing is on:
    # a try enqueued again by the sweep or a repair joins the approval's trace with it.
    # Nullable with no default so that adding it is an ALTER TABLE on SQLite: a table rebuild
    # would drop the forward-only trigger.
    traceparent = models.CharField(max_length=55, null=True, blank=True)  # noqa: DJ001

    class Meta:
        verbose_name_plural = "deliveries"
        ordering = ["-created_at", "-id"]
        indexes = [
            # The workers' and the sweep's query: what is due, in order.
            models.Index(fields=["state", "next_try_at"], name="delivery_due"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["operation_id"], name="delivery_unique_operation"),
            models.CheckConstraint(condition=models.Q(state__in=DeliveryState.values), name="delivery_state_known"),
            # Delivered names the helpdesk's reference; Rejected says why.
            models.CheckConstraint(
                condition=~models.Q(state=DeliveryState.DELIVERED) | ~models.Q(reference=""),
                name="delivery_delivered_has_reference",
            ),
            models.CheckConstraint(
                condition=~models.Q(state=DeliveryState.REJECTED) | ~models.Q(reason=""),
                name="delivery_rejected_has_reason",
            ),
            # NeedsCheck says what the helpdesk answered, for the person who looks.
            models.CheckConstraint(
                condition=~models.Q(state=DeliveryState.NEEDS_CHECK) | ~models.Q(reason=""),
                name="delivery_needs_check_has_reason",
            ),
            models.CheckConstraint(
                condition=~models.Q(state=DeliveryState.SENDING) | models.Q(lease_until__isnull=False),
                name="delivery_sending_has_lease",
            ),
        ]

    def __str__(self):
        return f"delivery {short(self.operation_id)} {self.state}"

    @property
    def final(self) -> bool:
        return self.state in DELIVERY_FINAL


class DeliveryTry(AppendOnlyModel):
    """One request to the helpdesk and how it ended: append-only, every try a row."""

    class Kind(models.TextChoices):
        SEND = "send", "Send (POST)"
        LOOKUP = "lookup", "Lookup (GET)"

    class Outcome(models.TextChoices):
        DELIVERED = "delivered", "Delivered"  # 201/200 with a reference, or found by lookup
        REJECTED = "rejected", "Rejected"  # a permanent 4xx
        NOT_STORED = "not_stored", "Not stored"  # 503/429, or refused before sending
        NOT_FOUND = "not_found", "Not found"  # a lookup's 404: settles nothing by itself
        UNKNOWN = "unknown", "Unknown"  # sent, and no usable answer came back

    delivery = models.ForeignKey(Delivery, on_delete=models.PROTECT, related_name="try_rows")
    operation_id = models.CharField(max_length=80)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    worker = models.CharField(max_length=200, blank=True)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    # The chain (core/chain.py): after the delivery's previous try; the first, after the effect.
    prev_hash = PrevHashField()
    row_hash = RowHashField()

    CHAIN_FIELDS = (
        "delivery_id",
        "operation_id",
        "kind",
        "outcome",
        "worker",
        "http_status",
        "error",
        "latency_ms",
        "started_at",
    )

    class Meta:
        verbose_name = "delivery try"
        verbose_name_plural = "delivery tries"
        ordering = ["-started_at", "-id"]

    def __str__(self):
        return f"{self.kind} {short(self.operation_id)} {self.outcome}"

    def chain_link(self) -> str:
        """The hash of the delivery's latest try, or of its effect before the first: the
        delivery's claim (its ``tries`` fence) lets one worker at a time write a try."""
        previous = DeliveryTry.objects.filter(delivery_id=self.delivery_id).order_by("-id").values_list("row_hash")
        for (found,) in previous[:1]:
            return found or ""
        effect = EffectRecord.objects.filter(delivery__id=self.delivery_id).values_list("row_hash", flat=True)
        return next(iter(effect), None) or ""
