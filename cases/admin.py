"""Cases in the admin: the changelist by review status, bulk Approve/Decline, history.

Cases, sources and policies come from the pipeline's import (``load_case``) and are never
edited here; what changes is the proposal, through the review page.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from decisionflow import identity
from decisionflow.admin_base import ViewOnlyAdmin, op_html, pre_html, when
from decisionflow.errors import DecisionflowError
from reviews.admin import can_review, outcome_message, review_url
from reviews.models import Proposal, ReviewDecision
from reviews.workplace import proposal_decide

from . import selectors
from .models import Case, Policy, Source, SourceVersion

admin.site.site_header = "decisionflow review"
admin.site.site_title = "decisionflow"
admin.site.index_title = "Reviews, cases and the effect store"

DECIDE_ACTIONS = ("approve_selected", "decline_selected")


class StatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return selectors.STATUS_CHOICES

    def queryset(self, request, queryset):
        if self.value() in selectors.STATUS_LABELS:
            return queryset.filter(review_status=self.value())
        return queryset


class ReviewerFilter(admin.SimpleListFilter):
    """Cases where this person decided any proposal (one query for the choices)."""

    title = "reviewer"
    parameter_name = "reviewer"

    def lookups(self, request, model_admin):
        users = (
            get_user_model()
            .objects.filter(Exists(ReviewDecision.objects.filter(reviewer_id=OuterRef("pk"))))
            .order_by("username")
        )
        return [(str(u.pk), u.get_username()) for u in users]

    def queryset(self, request, queryset):
        value = self.value()
        if value and value.isdigit():
            return queryset.filter(
                Exists(ReviewDecision.objects.filter(proposal__case_id=OuterRef("pk"), reviewer_id=int(value)))
            )
        return queryset


@admin.register(Case)
class CaseAdmin(ViewOnlyAdmin):
    list_display = ("case_link", "subject", "status", "current_operation", "reviewer", "decided")
    list_display_links = None
    list_filter = (StatusFilter, ReviewerFilter, ("created_at", admin.DateFieldListFilter))
    search_fields = ("=case_id", "subject")
    list_per_page = 100
    actions = ["approve_selected", "decline_selected"]
    fields = (
        "case_id",
        "subject",
        "customer_message_pre",
        "action",
        "policy",
        "draft_pre",
        "current_operation",
        "created_at",
    )
    readonly_fields = ("customer_message_pre", "draft_pre", "current_operation")

    def get_queryset(self, request):
        return (
            selectors.cases_with_status(super().get_queryset(request))
            .select_related("policy")
            .defer("draft", "customer_message", "import_digest")
        )

    # --- columns -----------------------------------------------------------------------

    @admin.display(description="case", ordering="case_id")
    def case_link(self, obj):
        return format_html(
            '<a href="{}" class="df-case-link">{}</a><br><a href="{}" class="df-small">history</a>',
            reverse("admin:cases_case_review", args=[obj.pk]),
            obj.case_id,
            reverse("admin:cases_case_history", args=[obj.pk]),
        )

    @admin.display(description="status", ordering="review_status")
    def status(self, obj):
        return format_html(
            '<span class="df-status df-status-{}">{}</span>',
            obj.review_status,
            selectors.STATUS_LABELS[obj.review_status],
        )

    @admin.display(description="current operation")
    def current_operation(self, obj):
        return op_html(getattr(obj, "current_operation_id", None))

    @admin.display(description="reviewer", ordering="decision_reviewer")
    def reviewer(self, obj):
        return obj.decision_reviewer or "-"

    @admin.display(description="decided", ordering="decision_at")
    def decided(self, obj):
        return when(obj.decision_at) if obj.decision_at else "-"

    @admin.display(description="customer message")
    def customer_message_pre(self, obj):
        return pre_html(obj.customer_message)

    @admin.display(description="draft as imported")
    def draft_pre(self, obj):
        return pre_html(obj.draft)

    # --- urls --------------------------------------------------------------------------

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("<int:pk>/review/", wrap(self.review_view), name="cases_case_review"),
            path("<int:pk>/begin/", wrap(self.begin_view), name="cases_case_begin"),
            path("<int:object_id>/history/", wrap(self.history_view), name="cases_case_history"),
        ] + super().get_urls()

    def review_view(self, request, pk):
        """The case's current review page; a case never begun offers "Start review"."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        case = get_object_or_404(Case, pk=pk)
        if case.current_proposal_id:
            return HttpResponseRedirect(review_url(case.current_proposal_id))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "case": case,
            "is_nav_sidebar_enabled": False,
            "title": f"Review {case.case_id}",
            "can_review": can_review(request.user),
            "history_url": reverse("admin:cases_case_history", args=[case.pk]),
        }
        return TemplateResponse(request, "admin/cases/case/not_started.html", context)

    def begin_view(self, request, pk):
        from decisionflow.workflow import review_begin

        if not can_review(request.user):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        case = get_object_or_404(Case, pk=pk)
        try:
            begun = review_begin(case=case, actor=request.user)
        except DecisionflowError as exc:
            self.message_user(request, f"refused: {exc.message}", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:cases_case_review", args=[pk]))
        case.refresh_from_db(fields=["current_proposal"])
        self.message_user(
            request,
            format_html(
                "Review begun for {}: {} is waiting for your decision.", case.case_id, op_html(begun.operation_id)
            ),
            messages.SUCCESS,
        )
        return HttpResponseRedirect(reverse("admin:cases_case_review", args=[pk]))

    def history_view(self, request, object_id, extra_context=None):
        """The timeline support leads read; view permission is enough, nothing here writes."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        case = get_object_or_404(Case.objects.select_related("policy"), pk=object_id)
        history = selectors.case_history(case)
        status = (
            selectors.cases_with_status(Case.objects.filter(pk=case.pk)).values_list("review_status", flat=True).first()
        )
        # The case row was just read, and every case has a status (the Conditional has a default).
        assert status is not None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "case": case,
            "is_nav_sidebar_enabled": False,
            "title": f"History of {case.case_id}",
            "subtitle": case.subject,
            "history": history,
            "status": status,
            "status_label": selectors.STATUS_LABELS[status],
            "can_review": can_review(request.user),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/cases/case/history.html", context)

    # --- bulk Approve / Decline --------------------------------------------------------

    def has_review_permission(self, request):
        return can_review(request.user)

    def changelist_view(self, request, extra_context=None):
        # Without the permission the actions are not offered; a forged POST naming one is
        # refused outright instead of falling back to "no action selected".
        if (
            request.method == "POST"
            and request.POST.get("action") in DECIDE_ACTIONS
            and not self.has_review_permission(request)
        ):
            raise PermissionDenied
        # Seven columns and the filters need the width more than the nav does.
        return super().changelist_view(request, {"is_nav_sidebar_enabled": False, **(extra_context or {})})

    @admin.action(description="Approve selected", permissions=["review"])
    def approve_selected(self, request, queryset):
        return self._decide_selected(request, queryset, approved=True)

    @admin.action(description="Decline selected", permissions=["review"])
    def decline_selected(self, request, queryset):
        return self._decide_selected(request, queryset, approved=False)

    def _decide_selected(self, request, queryset, *, approved: bool):
        if not self.has_review_permission(request):
            raise PermissionDenied
        verb = "approve" if approved else "decline"
        cases = list(queryset.order_by("case_id"))
        if request.POST.get("post") == "yes":
            return self._act(request, cases, approved=approved)
        bodies = dict(
            Proposal.objects.filter(pk__in=[c.current_proposal_id for c in cases if c.current_proposal_id]).values_list(
                "pk", "body"
            )
        )
        rows = []
        for case in cases:
            body = bodies.get(case.current_proposal_id, "")
            rows.append(
                {
                    "case": case,
                    "operation_id": case.current_operation_id,
                    "short_operation_id": identity.short(case.current_operation_id)
                    if case.current_operation_id
                    else None,
                    "first_line": body.split("\n", 1)[0] if body else "",
                    "status_label": selectors.STATUS_LABELS[case.review_status],
                    "review_url": review_url(case.current_proposal_id) if case.current_proposal_id else None,
                }
            )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"{verb.capitalize()} {len(cases)} selected case{'s' if len(cases) != 1 else ''}?",
            "verb": verb,
            "action": f"{verb}_selected",
            "rows": rows,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/cases/case/decide_selected_confirmation.html", context)

    def _act(self, request, cases, *, approved: bool):
        """Each row on its own: a row whose shown identity is no longer current is skipped."""
        done = skipped = 0
        for case in cases:
            operation_id = request.POST.get(f"operation_id_{case.pk}", "")
            prefix = f"{case.case_id}: "
            if not operation_id:
                skipped += 1
                self.message_user(
                    request,
                    f"{prefix}skipped: no operation identity was shown for it (no review begun), nothing was written.",
                    messages.WARNING,
                )
                continue
            outcome = proposal_decide(case=case, operation_id=operation_id, approved=approved, reviewer=request.user)
            if outcome.kind in ("committed", "declined", "replay"):
                done += 1
            else:
                skipped += 1
            for level, text in outcome_message(outcome, prefix=prefix):
                self.message_user(request, text, level)
        verb = "approve" if approved else "decline"
        self.message_user(
            request,
            f"{verb} selected: {done} done, {skipped} skipped or refused.",
            messages.SUCCESS if not skipped else messages.WARNING,
        )
        return None


@admin.register(Source)
class SourceAdmin(ViewOnlyAdmin):
    list_display = ("source_id", "title")
    search_fields = ("=source_id", "title")
    list_per_page = 100


@admin.register(SourceVersion)
class SourceVersionAdmin(ViewOnlyAdmin):
    list_display = ("source_id", "version", "source_title")
    list_select_related = ("source",)
    search_fields = ("=source__source_id",)
    list_per_page = 100
    fields = ("source", "version", "text_pre")
    readonly_fields = ("text_pre",)

    def get_queryset(self, request):
        # Full texts are read only on the detail page.
        return super().get_queryset(request).defer("text")

    @admin.display(description="source", ordering="source__source_id")
    def source_id(self, obj):
        return obj.source.source_id

    @admin.display(description="title")
    def source_title(self, obj):
        return obj.source.title

    @admin.display(description="full text")
    def text_pre(self, obj):
        return pre_html(obj.text)


@admin.register(Policy)
class PolicyAdmin(ViewOnlyAdmin):
    list_display = ("name", "label", "parameters", "policy")
    list_per_page = 100

    @admin.display(description="policy identity")
    def policy(self, obj):
        return format_html('<code title="{}">{}</code>', obj.policy_id, identity.short(obj.policy_id))
