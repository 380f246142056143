"""Decisions, pending reviews and checkpoints in the admin, view-only.

The proposals' review pages (Approve, Decline, Edit) belong to the review workplace in
``workplace/review.py``.
"""

from __future__ import annotations

from django.contrib import admin

from reviews.models import PendingReview
from workplace.display import ViewOnlyAdmin, op_html, pre_html
from workplace.exports import EXPORT_ACTIONS

# Large columns no changelist shows; deferring them keeps a page of 100 rows light.
PROPOSAL_BIG_FIELDS = ("body", "passages", "findings", "policy_snapshot", "unchecked_sentences")


class ReviewDecisionAdmin(ViewOnlyAdmin):
    list_display = ("operation", "case", "approved", "reviewer", "decided_at")
    list_select_related = ("proposal__case", "reviewer")
    list_filter = ("approved", "decided_at")
    actions = [*EXPORT_ACTIONS]
    search_fields = ("=operation_id", "=proposal__case__case_id", "reviewer__username")
    list_per_page = 100

    def get_queryset(self, request):
        return super().get_queryset(request).defer(*(f"proposal__{f}" for f in PROPOSAL_BIG_FIELDS))

    @admin.display(description="operation", ordering="operation_id")
    def operation(self, obj):
        return op_html(obj.operation_id)

    @admin.display(description="case", ordering="proposal__case__case_id")
    def case(self, obj):
        return obj.proposal.case.case_id


class PendingStatusFilter(admin.SimpleListFilter):
    """Status, pending by default: the list is where reviewers look for work still waiting.

    Completed and superseded rows are history; "All" shows them too.
    """

    title = "status"
    parameter_name = "status"
    ALL = "all"

    def lookups(self, request, model_admin):
        return [*PendingReview.Status.choices, (self.ALL, "All")]

    def queryset(self, request, queryset):
        value = self.value()
        if value == self.ALL:
            return queryset
        if value in PendingReview.Status.values:
            return queryset.filter(status=value)
        return queryset.filter(status=PendingReview.Status.PENDING)

    def choices(self, changelist):
        # No Django "All" entry (it would mean "no parameter", which is the pending default).
        current = self.value() or PendingReview.Status.PENDING
        for value, label in self.lookup_choices:
            yield {
                "selected": current == value,
                "query_string": changelist.get_query_string({self.parameter_name: value}),
                "display": label,
            }


class PendingReviewAdmin(ViewOnlyAdmin):
    list_display = (
        "operation",
        "case",
        "status",
        "begun_by",
        "begun_channel",
        "workflow_version",
        "checkpoint_id",
        "created_at",
    )
    list_select_related = ("case", "begun_by")
    list_filter = (PendingStatusFilter, "begun_channel", "workflow_version", "created_at")
    search_fields = ("=operation_id", "=case__case_id")
    list_per_page = 100

    @admin.display(description="operation", ordering="operation_id")
    def operation(self, obj):
        return op_html(obj.operation_id)


class WorkflowCheckpointAdmin(ViewOnlyAdmin):
    list_display = ("checkpoint_id", "workflow_name", "iteration_count", "previous_checkpoint_id", "created_at")
    list_filter = ("workflow_name", "created_at")
    search_fields = ("=checkpoint_id",)
    list_per_page = 100
    fields = (
        "checkpoint_id",
        "workflow_name",
        "graph_signature_hash",
        "previous_checkpoint_id",
        "iteration_count",
        "digest",
        "created_at",
        "payload_pre",
    )
    readonly_fields = ("payload_pre",)

    def get_queryset(self, request):
        # The payload is the whole engine state; only the detail page reads it (one more query).
        return super().get_queryset(request).defer("payload")

    @admin.display(description="payload (JSON)")
    def payload_pre(self, obj):
        return pre_html(obj.payload)


class NotificationAdmin(ViewOnlyAdmin):
    """What the task workers sent, are sending, or could not send (docs/QUEUE.md)."""

    list_display = ("operation", "case", "kind", "channels", "state", "attempts", "last_error", "created_at", "sent_at")
    list_select_related = ("case",)
    list_filter = ("state", "kind")
    search_fields = ("=operation_id", "=case__case_id")
    list_per_page = 100

    @admin.display(description="operation", ordering="operation_id")
    def operation(self, obj):
        return op_html(obj.operation_id)
