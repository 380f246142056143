"""The effect store and the commit log in the admin: read-only, as the tables are write-once."""

from __future__ import annotations

from django.contrib import admin
from django.template.loader import render_to_string
from django.utils.html import format_html

from core import text
from core.outcomes import RETURNED, DecisionOutcome
from effects.models import REPAIR_CHANNEL
from reviews.models import Channel
from workplace.display import ViewOnlyAdmin, marked_html, op_html, when
from workplace.exports import EXPORT_ACTIONS
from workplace.listing import LargeListAdminMixin
from workplace.templatetags.text_markers import banner_context


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
        banner = render_to_string(
            "admin/decisionflow/text_banner.html",
            banner_context(text.warnings([("body", obj.body or "")]), "in this body"),
        )
        return format_html('{}<pre class="df-pre" id="df-effect-body">{}</pre>', banner, marked_html(obj.body))


# Outcomes where the decision asked for did not take effect: shown in red, never with a tick.
REFUSED_OUTCOMES = frozenset(DecisionOutcome) - frozenset(RETURNED)


class AskedFilter(admin.SimpleListFilter):
    """The decision asked for, in the words of the "asked" column (not Yes/No/Unknown)."""

    title = "decision asked"
    parameter_name = "asked"
    VALUES = {"approve": True, "decline": False, "neither": None}

    def lookups(self, request, model_admin):
        return [(value, value) for value in self.VALUES]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None or value not in self.VALUES:
            return queryset
        approved = self.VALUES[value]
        return queryset.filter(approved__isnull=True) if approved is None else queryset.filter(approved=approved)


class ChannelFilter(admin.SimpleListFilter):
    """The channels from the vocabulary, not from the rows: the stock filter read every
    attempt's channel (SELECT DISTINCT, a scan of a million rows) to list four values."""

    title = "channel"
    parameter_name = "channel"

    def lookups(self, request, model_admin):
        return [*Channel.choices, (REPAIR_CHANNEL, "reconcile --repair")]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset if value is None else queryset.filter(channel=value)


class CommitAttemptAdmin(LargeListAdminMixin, ViewOnlyAdmin):
    # "asked" is what the caller asked for; "outcome" is what happened. An approval that was
    # refused as stale is "approve" + "Stale", never a green tick.
    # Newest first by id, on the primary key's own index: ids follow the order the rows were
    # written (an attempted time can differ from it by the milliseconds between taking the
    # time and inserting), and an index on the time would cost every attempt's insert, the
    # commit's and each refusal's, for one page. The case list's paginator: no COUNT of a
    # million rows (docs/PERFORMANCE.md, 9).
    ordering = ("-id",)
    list_display = ("operation", "case", "asked", "outcome_badge", "by", "attempted", "detail_text")
    list_select_related = ("case", "reviewer")
    list_filter = ("outcome", "reason", AskedFilter, ChannelFilter, "attempted_at")
    actions = [*EXPORT_ACTIONS]
    search_fields = ("=operation_id", "=case__case_id")
    list_per_page = 100

    def changelist_view(self, request, extra_context=None):
        # Seven columns and the filters need the width more than the nav does (detail at 1280 px).
        return super().changelist_view(request, {"is_nav_sidebar_enabled": False, **(extra_context or {})})

    @admin.display(description="operation", ordering="operation_id")
    def operation(self, obj):
        return op_html(obj.operation_id)

    @admin.display(description="asked", ordering="approved")
    def asked(self, obj):
        if obj.approved is None:
            return format_html(
                '<span class="df-asked df-asked-none" title="{}">{}</span>', "not a yes or no", "neither"
            )
        return format_html(
            '<span class="df-asked df-asked-{}">{}</span>',
            "approve" if obj.approved else "decline",
            "approve" if obj.approved else "decline",
        )

    @admin.display(description="outcome", ordering="outcome")
    def outcome_badge(self, obj):
        kind = "bad" if obj.outcome in REFUSED_OUTCOMES else "ok"
        badge = format_html(
            '<span class="df-outcome df-outcome-{} df-outcome-{}">{}</span>',
            kind,
            obj.outcome,
            obj.get_outcome_display(),
        )
        if not obj.reason:
            return badge
        # Why it was refused, under the outcome (a column of its own would push detail off 1280 px).
        return format_html('{}<div class="df-small df-muted df-reason">{}</div>', badge, obj.get_reason_display())

    @admin.display(description="by", ordering="reviewer__username")
    def by(self, obj):
        # Who, and through which channel (admin, api, cli): one column, so the detail keeps the width.
        who = obj.reviewer.get_username() if obj.reviewer else "(nobody)"
        return format_html('{} <span class="df-muted">via {}</span>', who, obj.channel)

    @admin.display(description="attempted", ordering="id")
    def attempted(self, obj):
        return when(obj.attempted_at)

    @admin.display(description="detail")
    def detail_text(self, obj):
        return format_html('<span class="df-detail">{}</span>', obj.detail) if obj.detail else "-"
