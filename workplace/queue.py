"""The review queue in the admin (docs/QUEUE.md), and the claim buttons' endpoints.

A channel like the rest of the admin: it parses the request, calls ``queue.py`` and shows
the result. The list reads its pages in the order of the partial index
``pending_review_queue`` (pending reviews, oldest first) with the case list's paginator
(listing.py): a fixed number of queries per page, no COUNT over the whole table.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Q, Subquery
from django.http import HttpResponseNotAllowed, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.decorators import method_decorator
from django.utils.html import format_html, format_html_join

from cases.models import ASSIGNEE_ONLY, REVIEWER_GROUPS, Policy, reviewer_groups
from cases.selectors import case_text_fields
from core import text as text_policy
from core.errors import ClaimHeld, DecisionflowError, InvalidInput
from core.replicas import replica_reads
from reviews.models import EscalationStep, Origin, PendingReview, ReviewAssignment, ReviewEscalation
from reviews.selectors import proposal_text_fields
from workflow import assignment, queue
from workflow.reviewer_groups import may_decide, member_of
from workplace.display import ViewOnlyAdmin, marked_html, op_html, when, when_html
from workplace.links import can_review, review_url
from workplace.listing import LargeListAdminMixin

VIEW_PENDING = "reviews.view_pendingreview"


def age_label(age: timedelta) -> str:
    """``3d 4h``, ``2h 05m``, ``7m``, ``45s``: the two largest units, for a list column;
    seconds under a minute, so that a short wait or target never reads ``0m``."""
    seconds = max(0, int(age.total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes = seconds // 60
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m"


def target_label(target: timedelta) -> str:
    """A target as set: ``4h``, ``90m``, ``2d``, ``20s``; ``age_label`` when it is not whole."""
    seconds = int(target.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return age_label(target)


class SlaFilter(admin.SimpleListFilter):
    title = "SLA state"
    parameter_name = "sla"

    def lookups(self, request, model_admin):
        return queue.SlaState.choices

    def queryset(self, request, queryset):
        value = self.value()
        if value is not None and value in queue.SlaState.values:
            return queryset.filter(queue.sla_q(value, timezone.now()))
        return queryset


class ClaimantFilter(admin.SimpleListFilter):
    """Unclaimed, mine, or a person holding a live claim (one query for the choices, on the
    partial index of claimed pending reviews)."""

    title = "claimed by"
    parameter_name = "claimant"

    def lookups(self, request, model_admin):
        holders = (
            PendingReview.objects.filter(
                status=PendingReview.Status.PENDING, claimed_by__isnull=False, claim_expires_at__gt=timezone.now()
            )
            .order_by()
            .values("claimed_by")
        )
        users = get_user_model().objects.filter(pk__in=holders).order_by("username")
        return [("none", "Nobody (unclaimed or lapsed)"), ("me", "Me")] + [(str(u.pk), u.get_username()) for u in users]

    def queryset(self, request, queryset):
        value, now = self.value(), timezone.now()
        if value == "none":
            return queryset.filter(Q(claimed_by__isnull=True) | Q(claim_expires_at__lte=now))
        if value == "me":
            return queryset.filter(claimed_by=request.user, claim_expires_at__gt=now)
        if value and value.isdigit():
            return queryset.filter(claimed_by_id=int(value), claim_expires_at__gt=now)
        return queryset


class GroupFilter(admin.SimpleListFilter):
    """Whose reviews: assigned to me; my groups' (moved to one of my groups, or still on the
    groups its policy names, one of them mine); nobody's (neither moved nor under a policy
    that names groups: every reviewer's). Which policies name which group is read from the
    policy versions (few rows), and the queue filtered on its proposals' policy identities."""

    title = "assigned to"
    parameter_name = "groups"
    ME = "me"
    MINE = "mine"
    ANYONE = "anyone"

    def lookups(self, request, model_admin):
        return [(self.ME, "Me"), (self.MINE, "My groups"), (self.ANYONE, "Any reviewer (no group)")]

    def queryset(self, request, queryset):
        if self.value() == self.ME:
            return queryset.filter(assigned_to=request.user)
        if self.value() not in (self.MINE, self.ANYONE):
            return queryset
        grouped = {
            policy_id: reviewer_groups(parameters)
            for policy_id, parameters in Policy.objects.filter(parameters__has_key=REVIEWER_GROUPS).values_list(
                "policy_id", "parameters"
            )
        }
        unmoved = Q(assigned_to__isnull=True, assigned_group__isnull=True)
        if self.value() == self.MINE:
            mine = member_of(request.user)
            ids = [policy_id for policy_id, groups in grouped.items() if mine & set(groups)]
            return queryset.filter(
                Q(assigned_to__isnull=True, assigned_group__name__in=mine) | unmoved & Q(proposal__policy_id__in=ids)
            )
        return queryset.filter(unmoved).exclude(proposal__policy_id__in=list(grouped))


class PolicyFilter(admin.SimpleListFilter):
    title = "policy"
    parameter_name = "policy"

    def lookups(self, request, model_admin):
        names = Policy.objects.order_by("name").values_list("name", flat=True).distinct()
        return [(name, name) for name in names]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(case__policy__name=self.value())
        return queryset


class ReviewQueueAdmin(LargeListAdminMixin, ViewOnlyAdmin):
    """Pending reviews, oldest first, with their age, SLA state, claim, and what to watch for."""

    list_display = (
        "case_link",
        "subject",
        "age",
        "sla",
        "escalated",
        "policy",
        "assignee",
        "claim",
        "human_edit",
        "text_warnings",
    )
    list_display_links = None
    list_filter = (SlaFilter, ClaimantFilter, GroupFilter, PolicyFilter)
    # The index order only: a sortable column would sort a million rows.
    sortable_by = ()
    ordering = ("created_at", "id")
    list_per_page = 50

    def get_queryset(self, request):
        return (
            queue.review_queue()
            .select_related("case__policy", "proposal", "claimed_by", "assigned_to", "assigned_group")
            # The last escalation step (docs/QUEUE.md, "Escalation"), in the page's own query.
            .annotate(
                **{
                    f"escalation_{name}": Subquery(
                        ReviewEscalation.objects.filter(operation_id=OuterRef("operation_id"))
                        .order_by("-at", "-id")
                        .values(name)[:1]
                    )
                    for name in ("step", "action", "group", "outcome")
                }
            )
            # The texts the warnings column checks are read; the case's draft is not.
            .defer("case__draft", "case__import_digest")
        )

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.has_perm(VIEW_PENDING)

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    def get_model_perms(self, request):
        return {"view": self.has_view_permission(request)}

    @method_decorator(replica_reads)
    def changelist_view(self, request, extra_context=None):
        self._now = timezone.now()  # one clock for every row of the page
        context = {
            "is_nav_sidebar_enabled": False,
            "title": "Review queue: pending reviews, oldest first",
            "sla_default": target_label(queue.sla_default()),
            "at_risk_percent": round((1 - queue.at_risk_fraction()) * 100),
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def _clock(self):
        return getattr(self, "_now", None) or timezone.now()

    @admin.display(description="case")
    def case_link(self, obj):
        return format_html(
            '<a href="{}" class="df-queue-case">{}</a> {}',
            review_url(obj.proposal_id),
            obj.case.case_id,
            op_html(obj.operation_id),
        )

    @admin.display(description="subject")
    def subject(self, obj):
        return marked_html(obj.case.subject)

    @admin.display(description="waiting")
    def age(self, obj):
        return format_html(
            '<span class="df-age" title="begun {}">{}</span>',
            when(obj.created_at),
            age_label(self._clock() - obj.created_at),
        )

    @admin.display(description="SLA")
    def sla(self, obj):
        target = queue.sla_target(obj.case.policy.name)
        state = queue.sla_state(age=self._clock() - obj.created_at, target=target)
        return format_html(
            '<span class="df-sla df-sla-{}">{}</span> <span class="df-muted">of {}</span>',
            state.value,
            state.label,
            target_label(target),
        )

    @admin.display(description="policy")
    def policy(self, obj):
        return obj.case.policy.name

    @admin.display(description="escalated")
    def escalated(self, obj):
        step = getattr(obj, "escalation_step", None)
        if not step:
            return ""
        done = {"notify": "notified", "reassign": "reassigned to", "expire": "expired"}[obj.escalation_action]
        return format_html(
            '<span class="df-escalated df-escalated-{}">{}: {}{}{}</span>',
            obj.escalation_outcome,
            EscalationStep(step).label.lower(),
            done,
            f" {obj.escalation_group}" if obj.escalation_group else "",
            " (refused)" if obj.escalation_outcome == ReviewEscalation.Outcome.REFUSED else "",
        )

    @admin.display(description="assigned to")
    def assignee(self, obj):
        if obj.assigned_to_id is not None:
            return format_html('<span class="df-assignee">{}</span>', obj.assigned_to.get_username())
        if obj.assigned_group_id is not None:
            return format_html('<span class="df-group">{}</span>', obj.assigned_group.name)
        named = reviewer_groups(obj.proposal.policy_snapshot.get("parameters"))
        if not named:
            return format_html('<span class="df-muted">{}</span>', "any reviewer")
        return format_html_join(", ", '<span class="df-group">{}</span>', ((name,) for name in named))

    @admin.display(description="claimed by")
    def claim(self, obj):
        held = queue.live_claim(obj, self._clock())
        if held is None:
            return format_html('<span class="df-muted">{}</span>', "lapsed" if obj.claimed_by_id else "-")
        return format_html(
            '<span class="df-claim">being reviewed by <strong>{}</strong> since {}</span>',
            held.username,
            when_html(held.since),
        )

    @admin.display(description="edit")
    def human_edit(self, obj):
        if obj.proposal.origin == Origin.HUMAN_EDIT:
            return format_html('<span class="df-human-edit">{}</span>', "Human edit")
        return ""

    @admin.display(description="warnings")
    def text_warnings(self, obj):
        found = text_policy.warnings(case_text_fields(obj.case) + proposal_text_fields(obj.proposal))
        if not found:
            return ""
        total = found.total
        return format_html(
            '<span class="df-text-warnings" title="{}">{} warning{}</span>',
            format_html_join("; ", "{}", ((w["message"],) for w in found[:10])),
            total,
            "" if total == 1 else "s",
        )

    # --- claims: the review page's buttons and its renewal ping ---------------------------

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("<int:pk>/claim/", wrap(self.claim_view), name="reviews_reviewqueueitem_claim"),
            path("<int:pk>/claim/renew/", wrap(self.renew_view), name="reviews_reviewqueueitem_renew"),
            path("<int:pk>/claim/release/", wrap(self.release_view), name="reviews_reviewqueueitem_release"),
            path("<int:pk>/assign/", wrap(self.assign_view), name="reviews_reviewqueueitem_assign"),
            path("<int:pk>/handover/", wrap(self.handover_view), name="reviews_reviewqueueitem_handover"),
            path("away/", wrap(self.away_view), name="reviews_reviewqueueitem_away"),
        ] + super().get_urls()

    def _pending(self, request, pk) -> PendingReview:
        if not can_review(request.user):
            raise PermissionDenied
        return get_object_or_404(PendingReview.objects.select_related("claimed_by"), pk=pk)

    def claim_view(self, request, pk):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        pending = self._pending(request, pk)
        try:
            claimed = queue.review_claim(pending=pending, user=request.user)
        except ClaimHeld as exc:
            self.message_user(request, exc.message, messages.WARNING)
        except DecisionflowError as exc:
            self.message_user(request, exc.message, messages.ERROR)
        else:
            self.message_user(
                request,
                f"You are reviewing {pending.case.case_id} until {when(claimed.claim.until)}; "
                "the claim is renewed while this page is open.",
                messages.SUCCESS,
            )
        return HttpResponseRedirect(review_url(pending.proposal_id))

    def renew_view(self, request, pk):
        """The page's ping: JSON, so the page can say when the claim was lost."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        pending = self._pending(request, pk)
        try:
            claimed = queue.review_claim(pending=pending, user=request.user)
        except DecisionflowError as exc:
            return JsonResponse({"code": exc.code, "message": exc.message}, status=exc.http_status)
        return JsonResponse({"claimed_by": claimed.claim.username, "until": claimed.claim.until.isoformat()})

    def release_view(self, request, pk):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        pending = self._pending(request, pk)
        if queue.review_claim_release(pending=pending, user=request.user):
            self.message_user(request, f"Released your claim on {pending.case.case_id}.", messages.SUCCESS)
        else:
            self.message_user(request, "You held no claim on this review; nothing was written.", messages.INFO)
        return HttpResponseRedirect(review_url(pending.proposal_id))

    # --- assignment: the review page's forms, and out of office ---------------------------

    def _chosen(self, request, pending: PendingReview):
        """The person and group a form names, among those it offered (anything else: None)."""
        snapshot = pending.proposal.policy_snapshot
        user_pk, group_pk = request.POST.get("to_user", ""), request.POST.get("to_group", "")
        to_user = assignment.assignable_people(snapshot).filter(pk=user_pk).first() if user_pk.isdigit() else None
        to_group = assignment.assignable_groups(snapshot).filter(pk=group_pk).first() if group_pk.isdigit() else None
        if user_pk and to_user is None or group_pk and to_group is None:
            raise InvalidInput("that person or group cannot take this review; nothing was written")
        return to_user, to_group

    def _moved(self, request, pending: PendingReview, act) -> HttpResponseRedirect:
        try:
            move = act()
        except DecisionflowError as exc:
            self.message_user(request, exc.message, messages.ERROR)
        else:
            to = move.to_user.get_username() if move.to_user else f"group {move.to_group}"
            away = f" ({move.meant_for.get_username()} is away: their substitute takes it)" if move.meant_for else ""
            self.message_user(request, f"{pending.case.case_id} is now assigned to {to}{away}.", messages.SUCCESS)
        return HttpResponseRedirect(review_url(pending.proposal_id))

    def _assignable(self, request, pk) -> PendingReview:
        if not (can_review(request.user) or assignment.can_assign(request.user)):
            raise PermissionDenied
        return get_object_or_404(PendingReview.objects.select_related("case", "proposal"), pk=pk)

    def assign_view(self, request, pk):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not assignment.can_assign(request.user):
            raise PermissionDenied
        pending = self._assignable(request, pk)

        def act():
            to_user, to_group = self._chosen(request, pending)
            return assignment.review_assign(
                pending=pending, by=request.user, to_user=to_user, to_group=to_group, note=request.POST.get("note", "")
            )

        return self._moved(request, pending, act)

    def handover_view(self, request, pk):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not can_review(request.user):
            raise PermissionDenied
        pending = self._assignable(request, pk)

        def act():
            to_user, _group = self._chosen(request, pending)
            return assignment.review_hand_over(
                pending=pending, by=request.user, to_user=to_user, note=request.POST.get("note", "")
            )

        return self._moved(request, pending, act)

    def away_view(self, request):
        """Out of office: until when, and who takes the new assignments meanwhile."""
        if not can_review(request.user):
            raise PermissionDenied
        if request.method == "POST":
            try:
                if "back" in request.POST:
                    ended = assignment.away_clear(user=request.user)
                    said = "Welcome back: new assignments come to you again." if ended else "You were not away."
                else:
                    until = parse_datetime(request.POST.get("until", ""))
                    if until is None:
                        raise InvalidInput("away until: give a date and time; nothing was written")
                    if timezone.is_naive(until):
                        until = timezone.make_aware(until)
                    pk = request.POST.get("substitute", "")
                    substitute = get_user_model().objects.filter(pk=pk).first() if pk.isdigit() else None
                    away = assignment.away_set(user=request.user, until=until, substitute=substitute)
                    said = (
                        f"You are away until {when(away.until)}; new assignments go to "
                        f"{away.substitute.get_username()}."
                    )
            except DecisionflowError as exc:
                self.message_user(request, exc.message, messages.ERROR)
            else:
                self.message_user(request, said, messages.SUCCESS)
            return HttpResponseRedirect(reverse("admin:reviews_reviewqueueitem_away"))
        context = {
            **self.admin_site.each_context(request),
            "title": "Out of office",
            "is_nav_sidebar_enabled": False,
            "opts": self.model._meta,
            "away": assignment.away_of(request.user),
            "people": assignment.assignable_people({}).exclude(pk=request.user.pk),
        }
        return TemplateResponse(request, "admin/reviews/reviewqueueitem/away.html", context)


def assignment_context(pending: PendingReview | None, request) -> dict:
    """What the review page shows about whose the review is, and the forms to move it."""
    if pending is None or pending.status != PendingReview.Status.PENDING:
        return {"assign_pending": None}
    user = request.user
    pending = PendingReview.objects.select_related("proposal", "assigned_to", "assigned_group").get(pk=pending.pk)
    snapshot = pending.proposal.policy_snapshot
    last = (
        ReviewAssignment.objects.filter(pending_review=pending)
        .select_related("by", "to_user", "meant_for")
        .order_by("-at", "-id")
        .first()
    )
    groups = reviewer_groups(snapshot.get("parameters"))
    can_hand_over = (
        can_review(user)
        and may_decide(groups=groups, user=user)
        and assignment.assignee_refusal(pending=pending, policy_snapshot=snapshot, reviewer=user) is None
    )
    lead = assignment.can_assign(user)
    people = list(assignment.assignable_people(snapshot)) if lead or can_hand_over else []
    # A hand-over goes to somebody else who could decide it: no form when there is nobody.
    others = [person for person in people if person.pk != user.pk]
    return {
        "assign_pending": pending,
        "assignee": assignment.assignee_of(pending, snapshot),
        "assignee_only": snapshot.get("parameters", {}).get(ASSIGNEE_ONLY) is True,
        "yours": assignment.is_assignee(pending=pending, user=user) is True,
        "last_move": last,
        "can_assign": lead,
        "can_hand_over": can_hand_over and bool(others),
        "people": people,
        "others": others,
        "groups": list(assignment.assignable_groups(snapshot)) if lead else [],
        "assign_url": reverse("admin:reviews_reviewqueueitem_assign", args=[pending.pk]),
        "handover_url": reverse("admin:reviews_reviewqueueitem_handover", args=[pending.pk]),
    }


def claim_context(pending: PendingReview | None, user) -> dict:
    """What the review page shows about the claim on its pending review (claim.html)."""
    if pending is None or pending.status != PendingReview.Status.PENDING:
        return {"claim_pending": None}
    held = queue.live_claim(pending)
    lapsed = pending.claimed_by if pending.claimed_by_id is not None and held is None else None
    return {
        "claim_pending": pending,
        "claim": held,
        "claim_mine": held is not None and held.user_pk == user.pk,
        "claim_can": can_review(user),
        "claim_lapsed_name": lapsed.get_username() if lapsed is not None else None,
        "claim_url": reverse("admin:reviews_reviewqueueitem_claim", args=[pending.pk]),
        "renew_url": reverse("admin:reviews_reviewqueueitem_renew", args=[pending.pk]),
        "release_url": reverse("admin:reviews_reviewqueueitem_release", args=[pending.pk]),
        # Renewed at a third of the lease: two pings may be lost before the claim lapses.
        "renew_every_ms": int(queue.claim_lease().total_seconds() * 1000 / 3),
    }


def queue_summary() -> dict:
    """The admin index's line: pending and breached counts, each counted at most to a cap."""
    cap = 10_000
    pending = queue.review_queue().order_by().values("pk")[: cap + 1].count()
    breached = (
        queue.review_queue().filter(queue.sla_q(queue.SlaState.BREACHED, timezone.now())).order_by().values("pk")
    )[: cap + 1].count()

    def label(n: int) -> str:
        return f"more than {cap:,}" if n > cap else f"{n:,}"

    return {"pending": label(pending), "breached": label(breached), "breached_any": breached > 0}
