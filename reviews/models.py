"""Proposals and decisions (both write-once), pending reviews, and workflow checkpoints."""

from __future__ import annotations

import functools
import operator
from typing import Any

from django.conf import settings
from django.db import models

from core.append_only import AppendOnlyModel
from core.chain import PrevHashField, RowHashField
from core.identity import short


class Origin(models.TextChoices):
    PREPARED = "prepared", "Prepared"
    HUMAN_EDIT = "human_edit", "Human edit"
    EVIDENCE_CHANGE = "evidence_change", "Evidence change"
    # A new policy version was published: same body and evidence, the new policy. Like a
    # prepared proposal it has no human author (the publisher did not write the text).
    POLICY_CHANGE = "policy_change", "Policy change"
    # The pipeline sent a new draft, evidence or findings for the case (docs/INTAKE.md,
    # Re-drafts). No human author either: the pipeline's text, not a person's.
    PIPELINE_REDRAFT = "pipeline_redraft", "Pipeline re-draft"


class Channel(models.TextChoices):
    """Where an action came from: the admin, the API or a command (the CLI)."""

    ADMIN = "admin", "admin"
    API = "api", "API"
    COMMAND = "command", "CLI"
    SERVICE = "service", "service"


class DeclineReason(models.TextChoices):
    """Why a proposal was declined: the one vocabulary of decline reasons (docs/QUEUE.md).

    ``expired`` and ``withdrawn`` are reserved for the system actors (``SYSTEM_DECLINE_REASONS``):
    a person cannot give them, and a database constraint on ``ReviewDecision`` allows each
    only with its system actor.
    """

    WRONG_FACTS = "wrong_facts", "Wrong facts"
    POLICY = "policy", "Against policy"
    TONE = "tone", "Tone"
    EVIDENCE = "evidence", "Evidence does not support it"
    OTHER = "other", "Other"
    EXPIRED = "expired", "Expired (declined by the system)"
    WITHDRAWN = "withdrawn", "Withdrawn by the pipeline"


class SystemActor(models.TextChoices):
    """The named system actors that may make a decision without a person (docs/QUEUE.md,
    docs/INTAKE.md). Each only declines, and only with its own reason."""

    SLA_EXPIRY = "sla-expiry", "SLA expiry (fail closed)"
    # The pipeline withdrew the review (the ticket was closed elsewhere); the decision's
    # reviewer is the pipeline's service user who asked, so the history names it.
    PIPELINE_WITHDRAW = "pipeline-withdraw", "Pipeline withdrawal"


# The one reason each system actor declines with.
SYSTEM_DECLINE_REASONS: dict[str, str] = {
    SystemActor.SLA_EXPIRY: DeclineReason.EXPIRED,
    SystemActor.PIPELINE_WITHDRAW: DeclineReason.WITHDRAWN,
}

# The reasons a person may give; the system actors' reasons are theirs alone.
HUMAN_DECLINE_REASONS = tuple(r.value for r in DeclineReason if r not in SYSTEM_DECLINE_REASONS.values())


class Proposal(AppendOnlyModel):
    """Exactly what a reviewer approves, bound to one ``operation_id``. Never updated.

    ``body`` is the canonical body (LF line endings): what the reviewer sees is what was
    hashed. ``passages``, ``findings`` and ``policy_snapshot`` are snapshots, so later
    changes to a source or a policy cannot change what an old proposal says.
    """

    case = models.ForeignKey("cases.Case", on_delete=models.PROTECT, related_name="proposals")
    action = models.CharField(max_length=100)
    body = models.TextField()
    # [{"source_id", "version", "quotation"}] in the order shown to the reviewer.
    passages = models.JSONField()
    # [{"finding", "licensed_clause", "source_id", "version"}]
    findings = models.JSONField()
    # {"name", "label", "parameters"}
    policy_snapshot = models.JSONField()
    evidence_id = models.CharField(max_length=80)
    policy_id = models.CharField(max_length=80)
    operation_id = models.CharField(max_length=80)
    origin = models.CharField(max_length=20, choices=Origin.choices)
    parent = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="children")
    # The person who made a human change; None for a proposal the pipeline prepared (rows
    # written before this rule may still name whoever began the review: ``human_author``).
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    # Sentences a person wrote that are not in the prepared draft. The licensed-clause checks
    # that covered the prepared text say nothing about these.
    unchecked_sentences = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The chain (core/chain.py, docs/AUDIT.md): after its parent; a prepared proposal is a root.
    prev_hash = PrevHashField()
    row_hash = RowHashField()

    # The hashed columns, in order (rh-v1): frozen, so that a column added later changes no
    # old row's hash.
    CHAIN_FIELDS = (
        "case_id",
        "action",
        "body",
        "passages",
        "findings",
        "policy_snapshot",
        "evidence_id",
        "policy_id",
        "operation_id",
        "origin",
        "parent_id",
        "author_id",
        "unchecked_sentences",
        "created_at",
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        # The admin's list order, so that a page is read on the index (workplace/listing.py).
        indexes = [models.Index(fields=["-created_at", "-id"], name="proposal_list_order")]
        permissions = [("review_proposal", "Can approve, decline and edit proposals")]
        constraints = [
            models.UniqueConstraint(fields=["operation_id"], name="proposal_unique_operation"),
            models.CheckConstraint(
                condition=models.Q(operation_id__startswith="op-v1-"),
                name="proposal_operation_id_format",
            ),
            models.CheckConstraint(
                condition=models.Q(origin="prepared", parent__isnull=True)
                | (~models.Q(origin="prepared") & models.Q(parent__isnull=False)),
                name="proposal_parent_matches_origin",
            ),
        ]

    def __str__(self):
        return f"{self.case_id and self.case.case_id} {short(self.operation_id)}"

    @property
    def short_operation_id(self) -> str:
        return short(self.operation_id)

    @property
    def is_human_edit(self) -> bool:
        return self.origin == Origin.HUMAN_EDIT

    @property
    def human_author(self):
        """The person who changed what the pipeline prepared; None for a prepared proposal."""
        return None if self.origin == Origin.PREPARED else self.author

    def chain_link(self) -> str:
        parent = self.parent if self.parent_id is not None else None
        return (parent.row_hash or "") if parent is not None else ""

    def under_policy(self, policy_id: str) -> bool:
        """Whether this proposal was prepared under policy version ``policy_id``. A publish
        switches a case onto the new version before it prepares the case again: until then
        the case's current proposal is not under the case's policy and cannot be decided."""
        return self.policy_id == policy_id


class ReviewDecision(AppendOnlyModel):
    """A reviewer's approval or decline of one operation. One per operation, never updated.

    The same decision again is a replay; the opposite decision is a conflict, never an update.
    """

    operation_id = models.CharField(max_length=80)
    proposal = models.ForeignKey(Proposal, on_delete=models.PROTECT, related_name="decisions")
    approved = models.BooleanField()
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    decided_at = models.DateTimeField(auto_now_add=True)
    # Why it was declined (None for an approval, and for declines recorded before reasons
    # existed or given without one). Nullable so that adding them is a plain ADD COLUMN.
    decline_reason = models.CharField(  # noqa: DJ001
        max_length=20, choices=DeclineReason.choices, null=True, blank=True
    )
    decline_note = models.TextField(null=True, blank=True)  # noqa: DJ001
    # Set only when no person decided: the named system actor (``reviewer`` is then its
    # dedicated, inactive user row).
    system_actor = models.CharField(  # noqa: DJ001
        max_length=20, choices=SystemActor.choices, null=True, blank=True
    )
    # The chain (core/chain.py): after its proposal.
    prev_hash = PrevHashField()
    row_hash = RowHashField()

    CHAIN_FIELDS = (
        "operation_id",
        "proposal_id",
        "approved",
        "reviewer_id",
        "decided_at",
        "decline_reason",
        "decline_note",
        "system_actor",
    )

    class Meta:
        ordering = ["-decided_at", "-id"]
        constraints = [
            # The atomic step of commit: a second decision for an operation cannot be inserted.
            models.UniqueConstraint(fields=["operation_id"], name="decision_unique_operation"),
            # An approval carries no decline reason.
            models.CheckConstraint(
                condition=models.Q(approved=False) | models.Q(decline_reason__isnull=True, decline_note__isnull=True),
                name="decision_reason_only_on_decline",
            ),
            # The only automatic decisions the database allows: a system actor's decline for
            # its own reason. A person never gives a system reason; a system actor gives nothing else.
            models.CheckConstraint(
                # (Each column compared is also said NOT NULL: a NULL would make the whole
                # check unknown, which a CHECK lets through.)
                condition=functools.reduce(
                    operator.or_,
                    (
                        models.Q(
                            system_actor=actor,
                            system_actor__isnull=False,
                            approved=False,
                            decline_reason=reason,
                            decline_reason__isnull=False,
                        )
                        for actor, reason in SYSTEM_DECLINE_REASONS.items()
                    ),
                )
                | (
                    models.Q(system_actor__isnull=True)
                    & (models.Q(decline_reason__isnull=True) | models.Q(decline_reason__in=HUMAN_DECLINE_REASONS))
                ),
                name="decision_system_reason_iff_system_actor",
            ),
        ]

    def __str__(self):
        return f"{'approved' if self.approved else 'declined'} {short(self.operation_id)}"

    def chain_link(self) -> str:
        return self.proposal.row_hash or ""

    @property
    def withdrawn(self) -> bool:
        """The pipeline withdrew this review: a later approval is refused as ``Withdrawn``."""
        return self.system_actor == SystemActor.PIPELINE_WITHDRAW


# How far the approvals of an operation are, in the one wording every channel shows.
APPROVALS_SHOWN = "{} of {} approvals"


def approvals_shown(approvals: int, required: int) -> str | None:
    """``APPROVALS_SHOWN`` for a policy that needs several approvers; None otherwise."""
    if required <= 1:
        return None
    return APPROVALS_SHOWN.format(approvals, required)


class Approval(AppendOnlyModel):
    """One reviewer's approval of one operation, under a policy that needs more than one
    (``approvals_required``, docs/QUEUE.md "Two-person approval"). Never updated.

    The approvals before the last one write no decision: the ``ReviewDecision`` is written
    with the Nth, in the same statement, so a decision still means the whole decision. Keyed
    by the operation identity, so an edit, a re-draft or a policy change (a new operation)
    starts again from none.
    """

    operation_id = models.CharField(max_length=80)
    proposal = models.ForeignKey(Proposal, on_delete=models.PROTECT, related_name="approvals")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    # Which approval this is (1 .. required): unique per operation, so two approvals that read
    # the same count cannot both be written; the one refused reads again.
    ordinal = models.PositiveSmallIntegerField()
    # How many the operation's policy needs: fixed by the operation identity, kept here so
    # that a reader of this table alone (reconcile) can say "1 of 2".
    required = models.PositiveSmallIntegerField()
    channel = models.CharField(max_length=20)
    approved_at = models.DateTimeField(auto_now_add=True)
    # The chain (core/chain.py): after its proposal.
    prev_hash = PrevHashField()
    row_hash = RowHashField()

    CHAIN_FIELDS = ("operation_id", "proposal_id", "reviewer_id", "ordinal", "required", "channel", "approved_at")

    class Meta:
        ordering = ["operation_id", "ordinal"]
        constraints = [
            # One approval per reviewer per operation: the same reviewer again is a replay.
            models.UniqueConstraint(fields=["operation_id", "reviewer"], name="approval_unique_reviewer"),
            # The atomic step of a partial approval (and the index reconcile counts by).
            models.UniqueConstraint(fields=["operation_id", "ordinal"], name="approval_unique_ordinal"),
            models.CheckConstraint(
                condition=models.Q(ordinal__gte=1, required__gte=2, ordinal__lte=models.F("required")),
                name="approval_ordinal_within_required",
            ),
        ]

    def __str__(self):
        return f"{self.shown} of {short(self.operation_id)}"

    @property
    def shown(self) -> str | None:
        """Where this approval stood when it was given: "1 of 2 approvals"."""
        return approvals_shown(self.ordinal, self.required)

    def chain_link(self) -> str:
        return self.proposal.row_hash or ""


class PendingReview(models.Model):
    """A workflow paused at the human step: where to resume it, and for which operation."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        COMPLETED = "completed", "Completed"
        SUPERSEDED = "superseded", "Superseded"

    # Not a column: whether the deciding user made a human change in this case, read by the
    # decision service in the same query as the review (four eyes). True until known, so a
    # review loaded any other way is always checked.
    reviewer_changed_case: bool = True
    # Not a column either: the proposal's policy snapshot, read in that same query (the
    # reviewer groups of the policy it was prepared under). None: not read.
    policy_snapshot: dict | None = None
    # Not a column: the groups its policy named when it was begun, for the history.
    begun_groups: list[str] | None = None
    # Not a column: the commit's read of the operation, made in that same query on PostgreSQL
    # (effects.store.ReadAhead). None: the commit reads for itself.
    read_ahead: Any = None

    case = models.ForeignKey("cases.Case", on_delete=models.PROTECT, related_name="pending_reviews")
    proposal = models.ForeignKey(Proposal, on_delete=models.PROTECT, related_name="pending_reviews")
    operation_id = models.CharField(max_length=80)
    workflow_session_id = models.CharField(max_length=100)
    checkpoint_id = models.CharField(max_length=100)
    # When the pause checkpoint was taken (its row's created_at), copied here at write time:
    # checkpoint rows are pruned (reviews/retention.py) and the history must stay whole.
    checkpoint_at = models.DateTimeField(null=True, blank=True)
    workflow_version = models.CharField(max_length=40)
    # The graph fingerprint (engine/messages.py: executor ids, edges, message
    # schemas) of the code that took the pause; "" for a pause recorded before it was kept.
    # A pause of another fingerprint is not resumed (`manage.py drain_workflow` moves it on).
    graph_fingerprint = models.CharField(max_length=64, default="", blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    # Who began the review, and through which channel: beginning is not authorship (the
    # pipeline prepared the proposal). None: a command run without a user.
    begun_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    # None for reviews begun before this was recorded.
    begun_channel = models.CharField(max_length=20, choices=Channel.choices, null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # The advisory claim (docs/QUEUE.md): who is reviewing it now, and until when the claim
    # holds unless renewed. A claim past ``claim_expires_at`` has lapsed, whoever it names.
    # The history of claims is ``ReviewClaimEvent``.
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    claimed_at = models.DateTimeField(null=True, blank=True)
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    # Whose it is (docs/QUEUE.md, "Assignment"), when a move said so: a person, or a group.
    # Neither: the groups its policy names (as begun), or nobody. The moves are
    # ``ReviewAssignment`` rows; these columns are the last one's result.
    assigned_to = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    assigned_group = models.ForeignKey("auth.Group", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # `begin` twice for one operation finds the first pause instead of making another.
            models.UniqueConstraint(fields=["operation_id"], name="pending_review_unique_operation"),
        ]
        indexes = [
            # Pruning asks, per checkpoint, whether a pending review still needs it.
            models.Index(fields=["checkpoint_id"], name="pending_review_checkpoint"),
            # The review queue reads pending reviews oldest first, a page at a time, from this
            # partial index alone: completed reviews (the million) are not in it.
            models.Index(
                fields=["created_at", "id"],
                condition=models.Q(status="pending"),
                name="pending_review_queue",
            ),
            # The queue's "claimed by" filter lists who holds a claim now: the few claimed
            # pending reviews, not every pending one.
            models.Index(
                fields=["claimed_by"],
                condition=models.Q(status="pending", claimed_by__isnull=False),
                name="pending_review_claims",
            ),
            # The queue's "assigned to me": the few pending reviews moved to a person.
            models.Index(
                fields=["assigned_to"],
                condition=models.Q(status="pending", assigned_to__isnull=False),
                name="pending_review_assignees",
            ),
        ]

    def __str__(self):
        return f"{self.case} {short(self.operation_id)} ({self.status})"


class ReviewQueueItem(PendingReview):
    """The review queue's admin page (workplace/review.py): pending reviews only,
    oldest first. A proxy: no table of its own."""

    class Meta:
        proxy = True
        verbose_name = "review queue"
        verbose_name_plural = "review queue"


class ReviewClaimEvent(AppendOnlyModel):
    """One claim or release of a pending review: the claims' history, never updated.

    Renewals are not events (a page open for an hour would write one every few minutes);
    they only move ``PendingReview.claim_expires_at``. A lapse is not an event either: it is
    the absence of a renewal, shown from ``expires_at``.
    """

    class Kind(models.TextChoices):
        CLAIMED = "claimed", "Claimed"
        RELEASED = "released", "Released"

    pending_review = models.ForeignKey(PendingReview, on_delete=models.PROTECT, related_name="claim_events")
    case = models.ForeignKey("cases.Case", on_delete=models.PROTECT, related_name="+")
    operation_id = models.CharField(max_length=80)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    at = models.DateTimeField()
    # For a claim: when it lapses unless renewed (as first granted).
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["case", "at"], name="claim_event_by_case")]

    def __str__(self):
        return f"{self.kind} {short(self.operation_id)}"


class AssignmentKind(models.TextChoices):
    """How a review moved to someone (docs/QUEUE.md, "Assignment")."""

    ASSIGNED = "assigned", "Assigned"  # by a support lead
    HANDED_OVER = "handed_over", "Handed over"  # by a reviewer who may decide it
    ESCALATED = "escalated", "Escalated"  # by the SLA escalation, at risk or breached


class ReviewAssignment(AppendOnlyModel):
    """One move of a pending review to a person or a group: who moved it, to whom, when, why.
    Never updated; the pending review's ``assigned_to``/``assigned_group`` are the last move's.

    ``meant_for``: the person the move named when they were away (out of office); ``to_user``
    is then their substitute. ``by`` is None for the SLA escalation (the system).
    """

    pending_review = models.ForeignKey(PendingReview, on_delete=models.PROTECT, related_name="assignments")
    case = models.ForeignKey("cases.Case", on_delete=models.PROTECT, related_name="+")
    operation_id = models.CharField(max_length=80)
    kind = models.CharField(max_length=20, choices=AssignmentKind.choices)
    by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    to_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    # The group's name as it was (a group renamed or deleted later does not rewrite history).
    to_group = models.CharField(max_length=150, blank=True, default="")
    meant_for = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    note = models.TextField(blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at", "-id"]
        permissions = [("assign_review", "Can assign reviews to a person or a group")]
        indexes = [models.Index(fields=["case", "at"], name="assignment_by_case")]
        constraints = [
            # A move names exactly one person or one group.
            models.CheckConstraint(
                condition=(models.Q(to_user__isnull=False) & models.Q(to_group=""))
                | (models.Q(to_user__isnull=True) & ~models.Q(to_group="")),
                name="assignment_one_target",
            ),
        ]

    def __str__(self):
        return f"{self.kind} {short(self.operation_id)} to {self.to_group or self.to_user_id}"


class ReviewerAway(models.Model):
    """Out of office: ``user`` is away until ``until``, and new assignments meant for them go
    to ``substitute`` (workflow/assignment.py). One row per user; an ended absence is simply
    past, or removed when they say they are back."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    until = models.DateTimeField()
    substitute = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "out of office"
        verbose_name_plural = "out of office"

    def __str__(self):
        return f"{self.user_id} away until {self.until:%Y-%m-%d %H:%M}"


class EscalationStep(models.TextChoices):
    """When a pending review escalates (docs/QUEUE.md, "Escalation"): its SLA states past within."""

    AT_RISK = "at_risk", "At risk"
    BREACHED = "breached", "Breached"


class EscalationAction(models.TextChoices):
    """What an escalation step does. Never an approval."""

    NOTIFY = "notify", "Notify a group"
    REASSIGN = "reassign", "Reassign to a group"
    EXPIRE = "expire", "Decline as expired (fail closed)"


class ReviewEscalation(AppendOnlyModel):
    """One escalation step of one pending review, written once: (operation, step) is unique,
    and the row is inserted in the transaction that does the step (workflow/escalation.py),
    so two runs at once escalate once. ``outcome``: done, or refused with why (``detail``)."""

    class Outcome(models.TextChoices):
        DONE = "done", "Done"
        REFUSED = "refused", "Refused"

    pending_review = models.ForeignKey(PendingReview, on_delete=models.PROTECT, related_name="escalations")
    case = models.ForeignKey("cases.Case", on_delete=models.PROTECT, related_name="+")
    operation_id = models.CharField(max_length=80)
    step = models.CharField(max_length=20, choices=EscalationStep.choices)
    action = models.CharField(max_length=20, choices=EscalationAction.choices)
    group = models.CharField(max_length=150, blank=True, default="")
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    detail = models.TextField(blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at", "-id"]
        constraints = [
            # The atomic step: a second escalation of one review at one step cannot be inserted.
            models.UniqueConstraint(fields=["operation_id", "step"], name="escalation_unique_operation_step"),
        ]
        indexes = [models.Index(fields=["case", "at"], name="escalation_by_case")]

    def __str__(self):
        return f"{self.step} {self.action} {short(self.operation_id)}"


class WorkflowCheckpoint(models.Model):
    """One agent-framework checkpoint, stored as JSON only (nothing is ever unpickled).

    The one table with a documented deletion path: ``manage.py prune_checkpoints`` deletes
    the rows no pending review needs any more (reviews/retention.py). A pending review's
    pause checkpoint is never deleted.

    ``digest`` is the SHA-256 of ``payload`` as stored; a load whose payload no longer
    matches is refused as tampered or corrupt.
    """

    checkpoint_id = models.CharField(max_length=100)
    workflow_name = models.CharField(max_length=200)
    graph_signature_hash = models.CharField(max_length=128)
    # The engine's own None (a first checkpoint) is kept apart from an empty id.
    previous_checkpoint_id = models.CharField(max_length=100, null=True, blank=True)  # noqa: DJ001
    iteration_count = models.IntegerField(default=0)
    payload = models.TextField()
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["workflow_name", "created_at"], name="checkpoint_by_workflow")]
        constraints = [
            models.UniqueConstraint(fields=["checkpoint_id"], name="checkpoint_unique_id"),
        ]

    def __str__(self):
        return self.checkpoint_id


class NotificationKind(models.TextChoices):
    """What a notification tells (docs/QUEUE.md, Notifications)."""

    REVIEW_BEGUN = "review_begun", "Review begun"
    AT_RISK = "at_risk", "At risk"
    BREACHED = "breached", "Breached"
    ASSIGNED = "assigned", "Assigned"  # one per move, to whom it moved (docs/QUEUE.md)


class NotificationState(models.TextChoices):
    """Forward only: Queued -> Sending -> Sent; Sending -> Queued (a failed try, retried) or
    Failed (tries used up); Sending -> Unknown (a worker died after it began sending: the
    message may or may not have been accepted) -> Sending (one more try)."""

    QUEUED = "queued", "Queued"
    SENDING = "sending", "Sending"
    SENT = "sent", "Sent"
    UNKNOWN = "unknown", "Unknown"
    FAILED = "failed", "Failed"


class Notification(models.Model):
    """One notification per (operation, kind), or per move for ``assigned``: the key that keeps
    a retry or a second worker from starting a second send. The task worker moves its state
    (reviews/notifications.py)."""

    operation_id = models.CharField(max_length=80)
    kind = models.CharField(max_length=20, choices=NotificationKind.choices)
    case = models.ForeignKey("cases.Case", on_delete=models.CASCADE, related_name="notifications")
    state = models.CharField(max_length=10, choices=NotificationState.choices, default=NotificationState.QUEUED)
    # Where it goes, fixed when the row is written: "email", "webhook" or "email,webhook".
    channels = models.CharField(max_length=40)
    # The group whose members' addresses the email goes to, when an escalation named one
    # (workflow/escalation.py); "": the policy's reviewer groups, else the configured list.
    group = models.CharField(max_length=150, blank=True, default="")
    # The move an ``assigned`` notification tells of: its person (or their substitute) or its
    # group's members get the email. Every other kind has none.
    assignment = models.ForeignKey(ReviewAssignment, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    # The channels that accepted it already, so a retry after a partial failure skips them.
    accepted = models.CharField(max_length=40, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # When the current try began (the lease of a Sending row starts here).
    sending_since = models.DateTimeField(null=True, blank=True)
    # A failed try is retried no earlier than this.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # A review has many moves, so an ``assigned`` notification is once per move instead.
            models.UniqueConstraint(
                fields=["operation_id", "kind"],
                condition=models.Q(assignment__isnull=True),
                name="notification_unique_operation_kind",
            ),
            models.UniqueConstraint(fields=["assignment"], name="notification_unique_assignment"),
            models.CheckConstraint(
                condition=models.Q(kind="assigned", assignment__isnull=False)
                | (~models.Q(kind="assigned") & models.Q(assignment__isnull=True)),
                name="notification_assignment_iff_assigned",
            ),
            models.CheckConstraint(
                condition=models.Q(kind__in=NotificationKind.values), name="notification_kind_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=NotificationState.values), name="notification_state_valid"
            ),
        ]
        indexes = [models.Index(fields=["state", "sending_since"], name="notification_state")]

    def __str__(self) -> str:
        return f"{self.kind} {short(self.operation_id)} ({self.state})"


class NotificationEvent(AppendOnlyModel):
    """One send of a notification and how it ended: the append-only record of a row that
    changes state in place (``Notification``), so that the audit chain covers its sends.
    Written by the task worker after each try (reviews/notifications.py)."""

    class Outcome(models.TextChoices):
        SENT = "sent", "Sent"
        RETRY = "retry", "Failed, retried later"
        FAILED = "failed", "Failed, tries used up"

    notification = models.ForeignKey(Notification, on_delete=models.PROTECT, related_name="events")
    case = models.ForeignKey("cases.Case", on_delete=models.PROTECT, related_name="+")
    operation_id = models.CharField(max_length=80)
    kind = models.CharField(max_length=20, choices=NotificationKind.choices)
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    # The notification's try this was (1 for the first), and the channels that had accepted
    # it when the try ended.
    attempt = models.PositiveIntegerField()
    accepted = models.CharField(max_length=40, blank=True, default="")
    error = models.TextField(blank=True, default="")
    at = models.DateTimeField(auto_now_add=True)
    # The chain (core/chain.py): after the notification's previous event.
    prev_hash = PrevHashField()
    row_hash = RowHashField()

    CHAIN_FIELDS = (
        "notification_id",
        "case_id",
        "operation_id",
        "kind",
        "outcome",
        "attempt",
        "accepted",
        "error",
        "at",
    )

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["notification", "id"], name="notification_event_order")]

    def __str__(self) -> str:
        return f"{self.kind} {short(self.operation_id)} {self.outcome}"

    def chain_link(self) -> str:
        """The hash of the notification's latest event: its claim (Sending) lets one worker
        at a time end a try."""
        previous = NotificationEvent.objects.filter(notification_id=self.notification_id).order_by("-id")
        for (found,) in previous.values_list("row_hash")[:1]:
            return found or ""
        return ""
