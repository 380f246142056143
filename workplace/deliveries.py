"""The deliveries to the helpdesk in the admin (docs/DELIVERY.md): a view-only list, and each
delivery's page with its tries, newest first.

Here rather than in workplace/effects.py for one reason: the list uses the case list's paginator
(listing.py, this layer), so that a page costs the same at a million deliveries as at ten:
rows read in primary-key order, newest first, and no COUNT over the whole table. The workers
and ``reconcile --repair`` write these rows; nobody edits them here.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from effects.models import Delivery, DeliveryState, DeliveryTry
from effects.selectors import NEEDS_CHECK_ADVICE, STATE_SENTENCES
from workplace.display import ViewOnlyAdmin, op_html, when, when_html
from workplace.exports import EXPORT_ACTIONS
from workplace.listing import LargeListAdminMixin


def state_badge(delivery: Delivery):
    return format_html(
        '<span class="df-delivery-badge df-delivery-{}">{}</span>', delivery.state, delivery.get_state_display()
    )


class DeliveryTryInline(admin.TabularInline):
    """Every request to the helpdesk and how it ended: append-only, shown, never edited."""

    model = DeliveryTry
    fk_name = "delivery"
    fields = ("started", "worker", "kind", "outcome", "http_status", "error", "latency")
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ("-started_at", "-id")
    verbose_name = "try"
    verbose_name_plural = "tries, newest first"

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="time")
    def started(self, obj):
        return when(obj.started_at)

    @admin.display(description="latency")
    def latency(self, obj):
        return "-" if obj.latency_ms is None else f"{obj.latency_ms} ms"


class DeliveryAdmin(LargeListAdminMixin, ViewOnlyAdmin):
    list_display = ("operation", "case_link", "state_badge", "outcome", "tries", "created", "settled")
    list_display_links = ("operation",)
    list_select_related = ("case",)
    list_filter = ("state",)
    actions = [*EXPORT_ACTIONS]
    # The operation identity or the case ID, whole: both are unique indexes.
    search_fields = ("=operation_id", "=case__case_id")
    # The index order only (newest first): a sortable column would sort every delivery.
    sortable_by = ()
    ordering = ("-id",)
    # Counts per state would count every delivery: the list never shows them.
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 100
    inlines = [DeliveryTryInline]
    fields = (
        "operation_id",
        "case_link",
        "state_line",
        "reference",
        "reason",
        "tries",
        "next_try_at",
        "lease_owner",
        "lease_until",
        "created_at",
        "updated_at",
        "settled_at",
        "decision",
        "effect",
    )
    readonly_fields = ("case_link", "state_line")

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {"is_nav_sidebar_enabled": False, **(extra_context or {})})

    @admin.display(description="operation")
    def operation(self, obj):
        return op_html(obj.operation_id)

    @admin.display(description="case")
    def case_link(self, obj):
        return format_html(
            '<a href="{}">{}</a>', reverse("admin:cases_case_history", args=[obj.case_id]), obj.case.case_id
        )

    @admin.display(description="state")
    def state_badge(self, obj):
        return state_badge(obj)

    @admin.display(description="state")
    def state_line(self, obj):
        return format_html("{} {}", state_badge(obj), STATE_SENTENCES[DeliveryState(obj.state)])

    @admin.display(description="reference or reason")
    def outcome(self, obj):
        if obj.state == DeliveryState.DELIVERED:
            return format_html("<code>{}</code>", obj.reference)
        if obj.state == DeliveryState.REJECTED:
            return format_html('<span class="df-delivery-reason">{}</span>', obj.reason)
        if obj.state == DeliveryState.NEEDS_CHECK:
            return format_html(
                '<span class="df-delivery-reason">{}</span> <span class="df-delivery-next">{}</span>',
                obj.reason,
                NEEDS_CHECK_ADVICE,
            )
        if obj.state == DeliveryState.UNKNOWN:
            return "may have been received: reconcile --repair settles it"
        return "-"

    @admin.display(description="queued")
    def created(self, obj):
        return when_html(obj.created_at)

    @admin.display(description="settled")
    def settled(self, obj):
        return when_html(obj.settled_at)
