"""The effect store and the commit log in the admin: read-only, as the tables are write-once."""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from decisionflow.core import text
from decisionflow.core.admin_base import ViewOnlyAdmin, op_html

from .models import CommitAttempt, EffectRecord


@admin.register(EffectRecord)
class EffectRecordAdmin(ViewOnlyAdmin):
    list_display = ("operation", "case", "action", "reviewer", "recorded_at")
    list_select_related = ("case", "reviewer")
    list_filter = ("action", "recorded_at")
    search_fields = ("=operation_id", "=case__case_id")
    list_per_page = 100
    fields = (
        "operation_id",
        "case",
        "action",
        "reviewer",
        "recorded_at",
        "body_pre",
        "evidence_id",
        "source_versions",
        "policy_id",
        "policy_snapshot",
        "decision",
        "proposal",
    )
    readonly_fields = ("body_pre",)

    def get_queryset(self, request):
        # The reviewed body is read only on the detail page.
        return super().get_queryset(request).defer("body", "policy_snapshot", "source_versions")

    @admin.display(description="operation", ordering="operation_id")
    def operation(self, obj):
        return op_html(obj.operation_id)

    @admin.display(description="reviewed body")
    def body_pre(self, obj):
        # The text policy's markers, where they stand, and how many (docs/TEXT.md).
        found = text.markers(obj.body or "")
        count = format_html(
            '<div class="df-banner df-banner-warn df-text-banner" id="df-text-markers" data-count="{}">'
            "<strong>{} hidden or look-alike character{} in this body</strong>, marked where {} stand{}.</div>",
            len(found),
            len(found),
            "s" if len(found) != 1 else "",
            "they" if len(found) != 1 else "it",
            "" if len(found) != 1 else "s",
        )
        return format_html(
            '{}<pre class="df-pre" id="df-effect-body">{}</pre>', count if found else "", text.marked_html(obj.body)
        )


@admin.register(CommitAttempt)
class CommitAttemptAdmin(ViewOnlyAdmin):
    list_display = (
        "operation",
        "case",
        "outcome",
        "reason",
        "approved",
        "reviewer",
        "channel",
        "attempted_at",
        "detail",
    )
    list_select_related = ("case", "reviewer")
    list_filter = ("outcome", "reason", "channel", "attempted_at")
    search_fields = ("=operation_id", "=case__case_id")
    list_per_page = 100

    @admin.display(description="operation", ordering="operation_id")
    def operation(self, obj):
        return op_html(obj.operation_id)
