"""Cases, their evidence sources with immutable numbered versions, and policies."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from core.append_only import AppendOnlyModel

# The policy parameter that names the groups whose members may decide its proposals: one
# ``str:`` value, the group names sorted by code point and joined by commas ("Billing
# reviewers" or "Billing reviewers,Support leads"). Absent: every reviewer may decide, and the
# policy's identity is what it was before groups existed (docs/PROTOCOL.md).
REVIEWER_GROUPS = "reviewer_groups"
GROUP_SEPARATOR = ","
# The policy parameter that lets only a review's assignee decide it (``bool:true``). Absent:
# "assignee first", the default: others may decide too, and it is shown.
ASSIGNEE_ONLY = "assignee_only"

# The policy parameter that asks for that many distinct approvers (``int:2`` and up). Absent:
# one, and the policy's identity is what it was before two-person approval existed.
APPROVALS_REQUIRED = "approvals_required"
MOST_APPROVALS = 9


def approvals_required(parameters) -> int:
    """How many distinct reviewers must approve under a policy's parameters (or a proposal's
    policy snapshot's): 1 unless the policy says more."""
    value = (parameters or {}).get(APPROVALS_REQUIRED)
    return value if type(value) is int and value > 1 else 1


def reviewer_groups(parameters) -> tuple[str, ...]:
    """The group names a policy's parameters (or a proposal's policy snapshot's) name; () for none."""
    value = (parameters or {}).get(REVIEWER_GROUPS)
    if not isinstance(value, str) or not value:
        return ()
    return tuple(value.split(GROUP_SEPARATOR))


def reviewer_groups_value(names) -> str:
    """The one canonical parameter value for a set of group names."""
    return GROUP_SEPARATOR.join(sorted(set(names)))


class Policy(models.Model):
    """One version of a policy: what governed the AI work.

    ``policy_id`` covers name and parameters, not the label. The versions of a policy are
    its rows with the same ``name``; the current one is the last published (a row that came
    with an imported case and was never published has no ``published_at``). Publishing
    (``manage.py publish_policy``, workflow/publishing.py) moves the undecided
    cases onto a new version.
    """

    name = models.CharField(max_length=200)
    label = models.CharField(max_length=100, help_text="Display only; not part of the identity.")
    parameters = models.JSONField(default=dict)
    policy_id = models.CharField(max_length=80, db_index=True)
    # Set by each publish that makes this version the current one (the last published);
    # None for a version that came with a case file and was never published.
    published_at = models.DateTimeField(null=True, blank=True)
    published_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        verbose_name_plural = "policies"
        permissions = [("publish_policy", "Can publish a new policy version")]
        constraints = [models.UniqueConstraint(fields=["policy_id", "label"], name="policy_unique_identity_label")]

    def __str__(self):
        return f"{self.name} {self.label}"

    @property
    def reviewer_groups(self) -> tuple[str, ...]:
        """The groups whose members may decide this version's proposals; () for every reviewer."""
        return reviewer_groups(self.parameters)


class Source(models.Model):
    source_id = models.CharField(max_length=100, unique=True)
    title = models.CharField(max_length=500)

    class Meta:
        ordering = ["source_id"]

    def __str__(self):
        return f"{self.source_id}: {self.title}"


class SourceVersion(models.Model):
    """One immutable version of a source document; edits to a source add a version."""

    source = models.ForeignKey(Source, on_delete=models.PROTECT, related_name="versions")
    version = models.PositiveIntegerField()
    text = models.TextField()

    class Meta:
        ordering = ["source__source_id", "version"]
        constraints = [models.UniqueConstraint(fields=["source", "version"], name="source_version_unique")]

    def __str__(self):
        return f"{self.source.source_id} v{self.version}"


class Case(models.Model):
    """A support case and the AI pipeline's prepared work for it.

    ``current_proposal`` moves only by compare-and-swap in ``proposal_revise``: an UPDATE
    guarded by the expected previous value, so two concurrent edits cannot both win.
    """

    case_id = models.CharField("case ID", max_length=100, unique=True)
    subject = models.CharField(max_length=500)
    customer_message = models.TextField()
    action = models.CharField(max_length=100, default="record_support_review")
    policy = models.ForeignKey(Policy, on_delete=models.PROTECT, related_name="cases")
    draft = models.TextField(help_text="The prepared draft as imported (canonical LF line endings).")
    # The policy parameters this case's findings depend on (the case file's optional
    # ``depends_on``). None: not declared, so every policy change flags every finding.
    depends_on = models.JSONField(null=True, blank=True)
    # The canonical JSON of the imported file, so a re-import can tell "identical" from "changed".
    import_digest = models.CharField(max_length=64)
    current_proposal = models.ForeignKey(
        "reviews.Proposal",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    # The operation of the current proposal that a new source version left without one of
    # its quotations or licensed clauses (an ``EvidenceChange`` says which): not approvable
    # until a re-draft or an edit makes another proposal current. "" when none. On the case
    # row because the commit's guard holds that row as read (effects/store.py): a mark that
    # commits between an approval's read and its write makes the write find the row changed.
    evidence_hold = models.CharField(max_length=80, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "case_id"]
        # The case list reads its pages in this order, on this index, and takes each page's
        # ids from it alone (``id`` last: an index-only scan; workplace/listing.py).
        # On PostgreSQL, migration 0003 also adds trigram indexes for the search by part of a
        # case ID or subject; they are not declared here because SQLite has none.
        indexes = [models.Index(fields=["-created_at", "case_id", "id"], name="case_list_order")]
        # The pipeline's acts (docs/INTAKE.md): the Pipeline group has these and not the
        # review permission, so a pipeline token brings cases in but never approves one.
        permissions = [
            ("intake_case", "Can bring cases in and re-draft them (the pipeline)"),
            ("withdraw_case", "Can withdraw a case's pending review (the pipeline)"),
        ]

    def __str__(self):
        return self.case_id


class SelectedPassage(models.Model):
    """A passage the pipeline selected as evidence: an exact quotation of one source version."""

    case = models.ForeignKey(Case, on_delete=models.CASCADE, related_name="passages")
    source_version = models.ForeignKey(SourceVersion, on_delete=models.PROTECT, related_name="+")
    quotation = models.TextField()
    position = models.PositiveIntegerField()

    class Meta:
        ordering = ["case", "position"]
        constraints = [models.UniqueConstraint(fields=["case", "source_version"], name="passage_unique_version")]

    def __str__(self):
        return f"{self.case_id} passage {self.position}"


class Finding(models.Model):
    """An accepted finding with the clause of a selected source version that licenses it."""

    case = models.ForeignKey(Case, on_delete=models.CASCADE, related_name="findings")
    finding = models.TextField()
    licensed_clause = models.TextField()
    source_version = models.ForeignKey(SourceVersion, on_delete=models.PROTECT, related_name="+")
    position = models.PositiveIntegerField()

    class Meta:
        ordering = ["case", "position"]

    def __str__(self):
        return f"{self.case_id} finding {self.position}"


class IntakeRequest(models.Model):
    """One pipeline request sent with an ``Idempotency-Key`` (docs/INTAKE.md), and its answer.

    Scoped to the token's user: ``(user, key)`` is unique. ``digest`` is the SHA-256 of the
    endpoint and the request's canonical JSON, so the same key with another request is
    refused. ``status`` is None while the first request runs; then it and ``response`` are the
    answer every retry gets again. Kept for ``DECISIONFLOW_IDEMPOTENCY_KEEP`` and pruned by
    ``manage.py prune_checkpoints``.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    endpoint = models.CharField(max_length=300)
    digest = models.CharField(max_length=64)
    status = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_index=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="intake_request_unique_key")]

    def __str__(self):
        return f"{self.key} ({self.endpoint})"


class EvidenceChange(AppendOnlyModel):
    """A proposal found to cite a passage or licensed clause that a newer version of its
    source no longer contains verbatim (``add_source_version``, workflow/sources.py).

    Written once per (operation, source version) and never changed (the ORM refuses an
    update or a delete; there are no database triggers, as there are on proposals); the case's
    ``evidence_hold`` names the operation while it is current. The proposal itself is
    append-only, so the mark is a row of its own, tied to the operation: a re-draft or an
    edit makes a new operation current, and that one carries no mark.
    """

    case = models.ForeignKey(Case, on_delete=models.CASCADE, related_name="evidence_changes")
    operation_id = models.CharField(max_length=80, db_index=True)
    source_version = models.ForeignKey(SourceVersion, on_delete=models.PROTECT, related_name="+")
    reason = models.TextField()
    marked_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operation_id", "source_version"], name="evidence_change_unique_version")
        ]

    def __str__(self):
        return f"{self.operation_id[:19]}: {self.reason}"


class SourceVersionJob(models.Model):
    """One run of bringing undecided proposals onto a new source version, started by
    ``POST /api/sources/{id}/versions`` and run by a task worker; ``GET /api/jobs/{id}``
    shows it. The counts are the run's own; the cases' state is in their proposals."""

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    source_version = models.ForeignKey(SourceVersion, on_delete=models.PROTECT, related_name="+")
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    total = models.PositiveIntegerField(default=0)  # the plan's count when the run began
    done = models.PositiveIntegerField(default=0)
    moved = models.PositiveIntegerField(default=0)
    marked = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"job {self.pk}: {self.source_version} {self.state}"
