"""The review workplace in the admin: the case list, the review page, Approve/Decline, Edit.

These are channels: they parse the request, call one service in ``services.py`` and show
the result. Approve and Decline (on the review page and in bulk) call
``decision_record``, the service ``manage.py resume`` and the API call too; Edit calls
``review_edit``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from functools import partial

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import Exists, OuterRef
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.decorators import method_decorator
from django.utils.html import format_html, format_html_join

from audit.verify import case_chain
from cases.models import Case, SourceVersion, approvals_required
from cases.selectors import case_text_fields
from core import identity
from core import text as text_policy
from core.errors import (
    DecisionflowError,
    DecisionOmitted,
    EvidenceChanged,
    FourEyesRefused,
    InvalidInput,
    NotInGroup,
    OutcomeUncertain,
    PermissionRefused,
    StaleProposal,
)
from core.outcomes import DecisionOutcome, OperationState
from core.replicas import replica_reads
from effects.models import EffectRecord
from effects.selectors import case_delivery_panels, delivery_for, delivery_panel
from effects.services import operation_reconcile
from reviews.models import Approval, Channel, PendingReview, Proposal, ReviewDecision, approvals_shown
from reviews.selectors import RECHECK_FLAG, evidence_moves, policy_change, proposal_diff, proposal_text_fields
from workflow import selectors
from workflow.begin import review_begin
from workflow.decide import DecisionResult, decision_record, refusal_record
from workflow.edit import review_edit
from workflow.four_eyes import four_eyes_refusal
from workflow.reviewer_groups import group_refusal, member_of
from workflow.selectors import decidable_operation_id
from workplace import picture as workflow_picture
from workplace.display import ViewOnlyAdmin, op_html, pre_html, proposal_body_html, when, when_html
from workplace.exports import EXPORT_ACTIONS, history_export_links, history_export_view
from workplace.forms import APPROVE, DECLINE, DECLINE_REASON_CHOICES, DecisionForm, ProposalEditForm
from workplace.links import can_review, review_url
from workplace.listing import LargeListAdminMixin, reviewers_with_decisions
from workplace.records import PROPOSAL_BIG_FIELDS

log = logging.getLogger(__name__)


def current_proposal_link(operation_id: str | None):
    """A link to the review page of the proposal with this identity (stale refusals)."""
    if not operation_id:
        return "(none)"
    pk = Proposal.objects.filter(operation_id=operation_id).values_list("pk", flat=True).first()
    if pk is None:
        return op_html(operation_id)
    return format_html('<a href="{}" class="df-current-link">{}</a>', review_url(pk), identity.short(operation_id))


def _reconciled(operation_id: str) -> tuple[int, str]:
    """After an uncertain outcome: what the effect store says now, read, never guessed."""
    op = identity.short(operation_id)
    try:
        # The fault may have been the connection itself: a fresh one reads the truth. Never
        # inside a transaction (ATOMIC_REQUESTS): closing would throw the caller's away.
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()
        row = operation_reconcile(operation_id)
    except Exception as exc:  # noqa: BLE001 - the database itself may be what failed
        log.exception("reconciling %s after an uncertain decision also failed", operation_id)
        return messages.WARNING, format_html(
            "the effect store could not be read either ({}: {}); run `manage.py reconcile` for op {} before "
            "trying again",
            type(exc).__name__,
            exc,
            op,
        )
    if row is None:
        return messages.WARNING, format_html("reconciled from the effect store: op {} is unknown", op)
    # A decision that stands is news; Pending or a missing effect needs the reader's action.
    settled = row.state in (OperationState.COMMITTED, OperationState.DECLINED)
    level = messages.INFO if settled else messages.WARNING
    return level, format_html("reconciled from the effect store: op {} state={} effects={}", op, row.state, row.effects)


def _uncertain(operation_id: str, said: str) -> list[tuple[int, str]]:
    """The uncertain outcome as it was said, then what reconcile reads."""
    return [(messages.WARNING, said), _reconciled(operation_id)]


def _refused(case, exc: DecisionflowError) -> str:
    """The refusal in the error's own words; a stale one links the proposal to review instead."""
    if isinstance(exc, StaleProposal):
        current = current_proposal_link(exc.current_operation_id or decidable_operation_id(case))
        return format_html("{} (open the current proposal: {})", exc.message, current)
    return exc.message


def _receipt_html(decided: DecisionResult):
    """The operation and the commit's receipt as the CLI and the API give it, one click
    away: a <details> the reader opens, after the sentence that says what happened."""
    return format_html(
        ' <details class="df-receipt"><summary>Receipt</summary>op <code title="{}">{}</code> '
        "receipt=<code>{}</code></details>",
        decided.operation_id,
        identity.short(decided.operation_id),
        json.dumps(decided.commit.receipt(), separators=(",", ":")),
    )


def _committed(decided: DecisionResult) -> str:
    operation_id = decided.operation_id
    effect = EffectRecord.objects.filter(operation_id=operation_id).values_list("pk", flat=True).first()
    record = format_html(
        '<a href="{}" class="df-effect-link">support review record</a>',
        reverse("admin:effects_effectrecord_change", args=[effect]) if effect else "#",
    )
    # The commit writes the delivery with the effect when a helpdesk is configured.
    sent = (
        "the reply is queued for the helpdesk"
        if delivery_for(operation_id) is not None
        else "no helpdesk is configured, so nothing is sent"
    )
    return format_html("Approved: the {} was written; {}.{}", record, sent, _receipt_html(decided))


def _declined(decided: DecisionResult) -> str:
    decision = decided.commit.decision
    why = decision.get_decline_reason_display() if decision and decision.decline_reason else None
    return format_html(
        "Declined: the decision was recorded{}; a decline writes no support review record and sends nothing.{}",
        format_html(" (reason: {})", why) if why else "",
        _receipt_html(decided),
    )


def _awaiting(decided: DecisionResult) -> str:
    return format_html(
        "Approval recorded: {}; another reviewer must approve before the reply is approved, "
        "and nothing is written or sent until then.{}",
        decided.commit.approvals_shown,
        _receipt_html(decided),
    )


def _replayed(decided: DecisionResult) -> str:
    decision = decided.commit.decision
    if decision is None:
        # The same reviewer's approval again, before the others the policy needs.
        return format_html(
            "Already approved by you: nothing new was written ({}; another reviewer must approve).{}",
            decided.commit.approvals_shown,
            _receipt_html(decided),
        )
    verb = "approved" if decision.approved else "declined"
    text = format_html(
        "Already {}: nothing new was written ({} by {} at {}",
        verb,
        verb,
        decision.reviewer.get_username(),
        when(decision.decided_at),
    )
    if decision.decline_reason:
        text = format_html("{}; the reason that stands: {}", text, decision.get_decline_reason_display())
    return format_html("{}).{}", text, _receipt_html(decided))


# What the admin says for each outcome the decision service returns, and at which level.
SAID = {
    DecisionOutcome.COMMITTED: (messages.SUCCESS, _committed),
    DecisionOutcome.DECLINED: (messages.SUCCESS, _declined),
    DecisionOutcome.REPLAY: (messages.INFO, _replayed),
    DecisionOutcome.AWAITING_APPROVAL: (messages.SUCCESS, _awaiting),
}


def decide(
    *, case, operation_id: str, approved: bool, user, prefix: str = "", decline: dict | None = None
) -> tuple[bool, list[tuple[int, str]]]:
    """Call the one decision service; whether it acted, and what happened as (level, safe HTML) pairs.

    A refusal is shown in its error's own words (``exc.message``); an uncertain outcome says
    so and shows what reconcile reads, never a guess. Every value is escaped.
    """
    try:
        decided = decision_record(
            case=case,
            operation_id=operation_id,
            approved=approved,
            reviewer=user,
            channel=Channel.ADMIN,
            **(decline or {}),
        )
    except OutcomeUncertain as exc:
        return False, _prefixed(prefix, _uncertain(operation_id, exc.message))
    except DecisionflowError as exc:
        return False, _prefixed(prefix, [(messages.ERROR, _refused(case, exc))])
    except Exception as exc:  # noqa: BLE001 - anything unexpected: the effect store decides, not the exception
        log.exception("admin decision on %s failed; reconciling", operation_id)
        said = f"outcome uncertain: reconciling ({type(exc).__name__}: {exc})"
        return False, _prefixed(prefix, _uncertain(operation_id, said))
    level, say = SAID[decided.outcome]
    return True, _prefixed(prefix, [(level, say(decided))])


def _prefixed(prefix: str, said: list[tuple[int, str]]) -> list[tuple[int, str]]:
    # The bulk action names the case before each line; the review page names none.
    return [(level, format_html("{}{}", prefix, text)) for level, text in said]


def _four_eyes_sentence(refusal: FourEyesRefused | None):
    """What the person who changed the proposal is told before clicking (nothing was tried)."""
    if refusal is None:
        return None
    return format_html(
        "You made the {} {} in this proposal, so another reviewer must approve it. You may decline it.",
        refusal.details["change"],
        identity.short(refusal.details["changed_operation_id"]),
    )


def _evidence_changed_sentence(refusal: EvidenceChanged | None):
    """What a reviewer is told instead of Approve on a proposal a new source version marked."""
    if refusal is None:
        return None
    return format_html(
        "{}. Approval waits for a re-draft or an edit of this proposal. You may decline it.",
        refusal.details["reason"][:1].upper() + refusal.details["reason"][1:],
    )


def _not_in_group_sentence(refusal: NotInGroup | None):
    """What a reviewer outside the policy's groups is told instead of Approve and Decline."""
    if refusal is None:
        return None
    groups = refusal.details["groups"]
    return format_html(
        "This policy is decided by the members of {} only, and you are not one. Ask a support lead to hand "
        "it to a member, or to add you to the group.",
        format_html_join(" or ", "<strong>{}</strong>", ((name,) for name in groups)),
    )


def _four_eyes_message(case, user):
    if not case.current_proposal_id:
        return None
    return _four_eyes_sentence(four_eyes_refusal(proposal_pk=case.current_proposal_id, reviewer=user, case_pk=case.pk))


class ProposalAdmin(LargeListAdminMixin, ViewOnlyAdmin):
    # Paged in the order of its index (reviews migration 0012, ``proposal_list_order``), with
    # no COUNT over the whole table: at a million proposals the stock list sorted them all
    # and counted them twice on every page (docs/PERFORMANCE.md, 9).
    list_display = ("operation", "case_link", "origin", "author", "created_at", "review_link")
    list_display_links = None
    list_select_related = ("case", "author")
    list_filter = ("origin", "created_at")
    actions = [*EXPORT_ACTIONS]
    search_fields = ("=operation_id", "=case__case_id")
    list_per_page = 100

    def get_queryset(self, request):
        return super().get_queryset(request).defer(*PROPOSAL_BIG_FIELDS)

    @method_decorator(replica_reads)
    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, extra_context)

    @admin.display(description="operation", ordering="operation_id")
    def operation(self, obj):
        return op_html(obj.operation_id)

    @admin.display(description="case", ordering="case__case_id")
    def case_link(self, obj):
        return obj.case.case_id

    @admin.display(description="review")
    def review_link(self, obj):
        return format_html('<a href="{}">Review page</a>', review_url(obj.pk))

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("<int:pk>/review/", wrap(self.review_view), name="reviews_proposal_review"),
            path("<int:pk>/decide/", wrap(self.decide_view), name="reviews_proposal_decide"),
            path("<int:pk>/edit/", wrap(self.edit_view), name="reviews_proposal_edit"),
        ] + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # One page per proposal: the review page shows everything the detail view would.
        if str(object_id).isdigit():
            return HttpResponseRedirect(review_url(object_id))
        return super().change_view(request, object_id, form_url, extra_context)

    # --- the review page ---------------------------------------------------------------

    def _context(self, request, proposal, **extra):
        return {
            **self.admin_site.each_context(request),
            # The page is read top to bottom; the full width is worth more than the nav.
            "is_nav_sidebar_enabled": False,
            "opts": self.model._meta,
            "proposal": proposal,
            "case": proposal.case,
            **extra,
        }

    def review_view(self, request, pk):
        if not self.has_view_permission(request):
            raise PermissionDenied
        proposal = get_object_or_404(Proposal.objects.select_related("case__policy", "parent", "author"), pk=pk)
        case = proposal.case
        is_current = case.current_proposal_id == proposal.pk
        current_op = None
        if not is_current and case.current_proposal_id:
            current_op = (
                Proposal.objects.filter(pk=case.current_proposal_id).values_list("operation_id", flat=True).first()
            )
        decision = ReviewDecision.objects.select_related("reviewer").filter(operation_id=proposal.operation_id).first()
        effect = EffectRecord.objects.filter(operation_id=proposal.operation_id).only("id", "recorded_at").first()
        pending = PendingReview.objects.filter(operation_id=proposal.operation_id).first()

        cited = {(p["source_id"], p["version"]) for p in proposal.passages + proposal.findings}
        version_pks = {
            (source_id, version): pk
            for pk, source_id, version in SourceVersion.objects.filter(
                source__source_id__in={s for s, _ in cited}
            ).values_list("pk", "source__source_id", "version")
        }

        def with_link(item):
            pk = version_pks.get((item["source_id"], item["version"]))
            url = reverse("admin:cases_sourceversion_change", args=[pk]) if pk else None
            return {**item, "url": url}

        policy = proposal.policy_snapshot
        parameters = [
            {"key": key, "value": value, "typed": identity.typed_value(value)}
            for key, value in sorted(policy.get("parameters", {}).items())
        ]
        reviewer_ok = can_review(request.user)
        # No button that can only fail: a publish has switched the case onto a new policy
        # version and is preparing it again; a decision on this proposal would be stale.
        switched = is_current and decision is None and not proposal.under_policy(case.policy.policy_id)
        if switched:
            is_current = False
        # No button that can only fail: the person who changed this proposal sees why they
        # cannot approve it instead of Approve (Decline stays).
        four_eyes = (
            four_eyes_refusal(proposal_pk=proposal.pk, reviewer=request.user, case_pk=case.pk)
            if reviewer_ok and is_current and decision is None
            else None
        )
        # Reviewer groups: who is in none of the policy's groups sees why instead of Approve
        # and Decline (the groups say who decides, either way).
        not_in_group = (
            group_refusal(policy_snapshot=policy, reviewer=request.user, operation_id=proposal.operation_id)
            if reviewer_ok and is_current and decision is None
            else None
        )
        # Two-person approval: the approvals so far (no query under a policy of one approver).
        required = approvals_required(policy.get("parameters"))
        approvals = (
            list(Approval.objects.filter(operation_id=proposal.operation_id).select_related("reviewer"))
            if required > 1
            else []
        )
        # Who approved already sees that instead of Approve (another approval is a replay).
        approved_by_you = decision is None and any(a.reviewer_id == request.user.pk for a in approvals)
        # The same for a proposal a new source version has marked: the reason, not Approve.
        evidence_changed = (
            selectors.evidence_changed_refusal(case, proposal) if is_current and decision is None else None
        )
        context = self._context(
            request,
            proposal,
            title=f"Review {case.case_id}",
            subtitle=proposal.short_operation_id,
            is_current=is_current,
            policy_switched={"policy": case.policy, "from_label": policy.get("label", "")} if switched else None,
            current_link=current_proposal_link(current_op) if current_op else None,
            decision=decision,
            decided_at=when(decision.decided_at) if decision else None,
            effect=effect,
            # Where the approved reply stands on the helpdesk (none: no panel at all).
            delivery_panels=[
                panel
                for panel in [
                    delivery_panel(operation_id=proposal.operation_id, approved=decision.approved if decision else None)
                ]
                if panel is not None
            ],
            pending=pending,
            passages=[with_link(p) for p in proposal.passages],
            findings=[with_link(f) for f in proposal.findings],
            policy=policy,
            parameters=parameters,
            diff=proposal_diff(proposal),
            moves=evidence_moves(proposal),
            policy_change=policy_change(proposal, case.depends_on),
            recheck_flag=RECHECK_FLAG,
            body_html=proposal_body_html(proposal),
            text_warnings=text_policy.warnings(case_text_fields(case) + proposal_text_fields(proposal)),
            can_review=reviewer_ok,
            # Decided means decided: a decided proposal offers no Approve or Decline.
            show_decide=reviewer_ok and is_current and decision is None,
            four_eyes=_four_eyes_sentence(four_eyes),
            not_in_group=_not_in_group_sentence(not_in_group),
            approvals=approvals,
            approvals_required=required,
            approvals_shown=approvals_shown(len(approvals), required),
            approved_by_you=approved_by_you,
            evidence_changed=_evidence_changed_sentence(evidence_changed),
            show_edit=reviewer_ok and is_current and decision is None,
            decline_reasons=DECLINE_REASON_CHOICES,
            history_url=reverse("admin:cases_case_history", args=[case.pk]),
            picture=workflow_picture.picture_for(case, workflow_picture.case_path(case), proposal.pk),
        )
        return TemplateResponse(request, "admin/reviews/proposal/review.html", context)

    # --- Approve / Decline -------------------------------------------------------------

    def _refused_click(self, request, pk, error: DecisionflowError) -> None:
        """The attempt row for a click refused before the decision service (403, no decision)."""
        proposal = Proposal.objects.select_related("case").only("id", "operation_id", "case").filter(pk=pk).first()
        if proposal is None:
            return  # no case or operation to name
        named = request.POST.get("operation_id", "")
        choice = request.POST.get("decision")
        refusal_record(
            case=proposal.case,
            operation_id=named if identity.is_operation_id(named) else proposal.operation_id,
            approved={APPROVE: True, DECLINE: False}.get(choice),
            reviewer=request.user,
            channel=Channel.ADMIN,
            error=error,
        )

    def decide_view(self, request, pk):
        # Permission before anything else: a forged POST by a support lead gets 403 (and an
        # attempt row: a refused decision is audited like any other).
        if not can_review(request.user):
            if request.method == "POST":
                self._refused_click(
                    request, pk, PermissionRefused(f"{request.user.get_username()} does not have the review permission")
                )
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        proposal = get_object_or_404(Proposal.objects.select_related("case").only("id", "case"), pk=pk)
        form = DecisionForm(request.POST)
        if not form.is_valid():
            refusal = (DecisionOmitted if "decision" in form.errors else InvalidInput)(
                "; ".join(str(e) for errors in form.errors.values() for e in errors)
            )
            self._refused_click(request, pk, refusal)
            self.message_user(request, refusal.message, messages.ERROR)
            return HttpResponseRedirect(review_url(pk))
        _acted, said = decide(
            case=proposal.case,
            operation_id=form.cleaned_data["operation_id"],
            approved=form.approved,
            user=request.user,
            decline=form.decline(),
        )
        for level, text in said:
            self.message_user(request, text, level)
        return HttpResponseRedirect(review_url(pk))

    # --- Edit --------------------------------------------------------------------------

    def _refused_edit(self, request, proposal: Proposal, error: DecisionflowError) -> None:
        """The attempt row of an edit refused before the edit service (the permission, the form)."""
        named = request.POST.get("expected_operation_id", "")
        refusal_record(
            case=proposal.case,
            operation_id=named if identity.is_operation_id(named) else proposal.operation_id,
            approved=None,
            reviewer=request.user,
            channel=Channel.ADMIN,
            error=error,
            edit=True,
        )

    def edit_view(self, request, pk):
        if not can_review(request.user):
            # A forged POST is audited like any other refused edit.
            if request.method == "POST":
                proposal = Proposal.objects.select_related("case").filter(pk=pk).first()
                if proposal is not None:
                    refusal = PermissionRefused(f"{request.user.get_username()} does not have the review permission")
                    self._refused_edit(request, proposal, refusal)
            raise PermissionDenied
        proposal = get_object_or_404(Proposal.objects.select_related("case"), pk=pk)
        case = proposal.case
        if request.method == "POST":
            form = ProposalEditForm(request.POST, proposal=proposal)
            if not form.is_valid():
                errors = "; ".join(f"{name}: {' '.join(str(m) for m in e)}" for name, e in form.errors.items())
                self._refused_edit(request, proposal, InvalidInput(f"the edit form was refused: {errors}"))
            else:
                expected = form.cleaned_data["expected_operation_id"]
                try:
                    edited = review_edit(
                        case=case,
                        expected_operation_id=expected,
                        body=form.cleaned_data["body"],
                        source_versions=form.source_versions(),
                        editor=request.user,
                        channel=Channel.ADMIN,
                    )
                except InvalidInput as exc:
                    # The service's refusal of the text (the policy, the body limit) is the
                    # field's error, in its own words.
                    if exc.details.get("field") in form.fields:
                        form.add_error(exc.details["field"], exc.message)
                    else:
                        self.message_user(request, exc.message, messages.ERROR)
                except DecisionflowError as exc:
                    self.message_user(request, _refused(case, exc), messages.ERROR)
                else:
                    new = edited.revision.proposal
                    if not edited.revision.changed:
                        self.message_user(
                            request,
                            f"no change: the edit is identical to {new.short_operation_id} once line endings "
                            "are normalized, so no new proposal was made.",
                            messages.INFO,
                        )
                    elif edited.begin_error is not None:
                        # The revision is saved and current; only its review could not begin.
                        self.message_user(
                            request,
                            format_html(
                                "Saved as a new proposal {}, but beginning its review failed: {}. "
                                "The first Approve or Decline on it begins the review again.",
                                op_html(new.operation_id),
                                edited.begin_error.message,
                            ),
                            messages.WARNING,
                        )
                    else:
                        self.message_user(
                            request,
                            format_html(
                                "Saved as a new proposal {} ({}), replacing {}; its review has begun.",
                                op_html(new.operation_id),
                                new.get_origin_display(),
                                identity.short(expected),
                            ),
                            messages.SUCCESS,
                        )
                    return HttpResponseRedirect(review_url(new.pk))
        else:
            form = ProposalEditForm(
                initial={"expected_operation_id": proposal.operation_id, "body": proposal.body},
                proposal=proposal,
            )
        context = self._context(
            request,
            proposal,
            title=f"Edit {case.case_id}",
            subtitle=proposal.short_operation_id,
            form=form,
            is_current=case.current_proposal_id == proposal.pk,
        )
        return TemplateResponse(request, "admin/reviews/proposal/edit.html", context)


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
        users = reviewers_with_decisions(get_user_model().objects.all()).order_by("username")
        return [(str(u.pk), u.get_username()) for u in users]

    def queryset(self, request, queryset):
        value = self.value()
        if value and value.isdigit():
            return queryset.filter(
                Exists(ReviewDecision.objects.filter(proposal__case_id=OuterRef("pk"), reviewer_id=int(value)))
            )
        return queryset


class CaseAdmin(LargeListAdminMixin, ViewOnlyAdmin):
    # "created" carries the list's first sort key (newest first), so the sort indicator shows
    # the order the rows are really in, not only the tie-breaker "case".
    list_display = ("case_link", "subject", "status", "current_operation", "reviewer", "decided", "created")
    list_display_links = None
    list_filter = (StatusFilter, ReviewerFilter, ("created_at", admin.DateFieldListFilter))
    # Part of a case ID ("1042" finds T-1042) or of the subject; trigram indexes serve both
    # on PostgreSQL (cases migration 0003). Paging and counting: listing.LargeListAdminMixin.
    search_fields = ("case_id", "subject")
    list_per_page = 100
    actions = ["approve_selected", "decline_selected", *EXPORT_ACTIONS]
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
        return when_html(obj.decision_at)

    @admin.display(description="created", ordering="created_at")
    def created(self, obj):
        return when_html(obj.created_at)

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
            path(
                "<int:object_id>/history/export/",
                wrap(replica_reads(partial(history_export_view, self))),
                name="cases_case_history_export",
            ),
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

        if not can_review(request.user):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        case = get_object_or_404(Case, pk=pk)
        try:
            begun = review_begin(case=case, actor=request.user, channel=Channel.ADMIN)
        except DecisionflowError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return HttpResponseRedirect(reverse("admin:cases_case_review", args=[pk]))
        case.refresh_from_db(fields=["current_proposal"])
        if begun.decision is not None:
            # Decided means decided: begin created nothing; say what stands instead.
            self.message_user(
                request,
                format_html(
                    "{} is already {} by {} at {} ({}); nothing new was created.",
                    case.case_id,
                    "approved" if begun.decision.approved else "declined",
                    begun.decision.reviewer.get_username(),
                    when(begun.decision.decided_at),
                    op_html(begun.operation_id),
                ),
                messages.INFO,
            )
            return HttpResponseRedirect(reverse("admin:cases_case_review", args=[pk]))
        self.message_user(
            request,
            format_html(
                "Review begun for {}: {} is waiting for your decision.", case.case_id, op_html(begun.operation_id)
            ),
            messages.SUCCESS,
        )
        return HttpResponseRedirect(reverse("admin:cases_case_review", args=[pk]))

    @method_decorator(replica_reads)
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
            "export_links": history_export_links(case.pk),
            "signed_exports_url": reverse("admin:audit_signedexport_changelist"),
            "status": status,
            "status_label": selectors.STATUS_LABELS[status],
            "can_review": can_review(request.user),
            "picture": workflow_picture.picture_for(case, workflow_picture.path_from_history(history)),
            "chain": case_chain(case.pk),
            "delivery_panels": case_delivery_panels(
                case_pk=case.pk,
                decisions={
                    ev.obj.operation_id: ev.obj.approved for ev in history.events if isinstance(ev.obj, ReviewDecision)
                },
            ),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/cases/case/history.html", context)

    # --- bulk Approve / Decline --------------------------------------------------------

    def has_review_permission(self, request):
        return can_review(request.user)

    @method_decorator(replica_reads)
    def changelist_view(self, request, extra_context=None):
        # Without the permission the actions are not offered; a forged POST naming one is
        # refused outright instead of falling back to "no action selected".
        if (
            request.method == "POST"
            and request.POST.get("action") in DECIDE_ACTIONS
            and not self.has_review_permission(request)
        ):
            if request.POST.get("post") == "yes":
                self._refused_bulk(request)
            raise PermissionDenied
        # Seven columns and the filters need the width more than the nav does.
        return super().changelist_view(request, {"is_nav_sidebar_enabled": False, **(extra_context or {})})

    def _refused_bulk(self, request) -> None:
        """The attempt rows of a confirmed bulk decision refused for want of the permission:
        one per row that named an operation, as the same clicks one by one would leave."""
        approved = request.POST.get("action") == "approve_selected"
        pks = [pk for pk in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME) if pk.isdigit()][:1000]
        error = PermissionRefused(f"{request.user.get_username()} does not have the review permission")
        for case in Case.objects.filter(pk__in=pks).order_by("case_id"):
            named = request.POST.get(f"operation_id_{case.pk}", "")
            if identity.is_operation_id(named):
                refusal_record(
                    case=case,
                    operation_id=named,
                    approved=approved,
                    reviewer=request.user,
                    channel=Channel.ADMIN,
                    error=error,
                )

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
        plan = selectors.bulk_decision_plan(cases, approved=approved)
        # Reviewer groups: a row of a policy this reviewer may not decide is not offered.
        snapshots = dict(
            Proposal.objects.filter(pk__in=[c.current_proposal_id for c in cases if c.current_proposal_id]).values_list(
                "pk", "policy_snapshot"
            )
        )
        mine = None
        for index, row in enumerate(plan):
            snapshot = snapshots.get(row.case.current_proposal_id or 0)
            if not row.acts or snapshot is None or row.operation_id is None:
                continue
            mine = member_of(request.user) if mine is None else mine
            refusal = group_refusal(
                policy_snapshot=snapshot, reviewer=request.user, operation_id=row.operation_id, member_names=mine
            )
            if refusal is not None:
                plan[index] = dataclasses.replace(row, acts=False, reason=refusal.message)
        if approved:
            # Four eyes: a row this reviewer changed is not offered; the button never counts
            # a row the service would refuse (the reviewer may still decline it).
            plan = [
                dataclasses.replace(row, acts=False, reason=f"four eyes: {sentence}")
                if row.acts and (sentence := _four_eyes_message(row.case, request.user))
                else row
                for row in plan
            ]
        acting = sum(row.acts for row in plan)
        current = {
            p.pk: p
            for p in Proposal.objects.filter(
                pk__in=[c.current_proposal_id for c in cases if c.current_proposal_id]
            ).only("pk", "body", "passages", "findings", "policy_snapshot", "unchecked_sentences")
        }
        rows = []
        for row in plan:
            proposal = current.get(row.case.current_proposal_id or 0)
            # The text policy's markers of everything the row approves (docs/TEXT.md).
            fields = [("subject", row.case.subject)] + (proposal_text_fields(proposal) if proposal else [])
            rows.append(
                {
                    "plan": row,
                    "case": row.case,
                    "operation_id": row.operation_id,
                    "status_label": row.status_label,
                    "text_warnings": text_policy.warnings(fields),
                    # What a person wrote is not covered by the pipeline's checks: read it here.
                    "person_written": proposal.unchecked_sentences if proposal and row.human_edit else [],
                    "review_url": review_url(row.case.current_proposal_id) if row.case.current_proposal_id else None,
                }
            )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "is_nav_sidebar_enabled": False,
            "title": f"{verb.capitalize()} {len(cases)} selected case{'s' if len(cases) != 1 else ''}?",
            "verb": verb,
            "action": f"{verb}_selected",
            "rows": rows,
            "acting": acting,
            "skipping": len(plan) - acting,
            # Counts only the rows that will act, in plain English: "Approve 1 proposal".
            "button_label": f"{verb.capitalize()} {acting} proposal{'s' if acting != 1 else ''}",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/cases/case/decide_selected_confirmation.html", context)

    def _act(self, request, cases, *, approved: bool):
        """Each row on its own: a row whose shown identity is not the case's current one is refused.

        A row refused by four eyes goes through decide() like any other: the service refuses
        it, records the attempt, and the message is the refusal's own.
        """
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
            acted, said = decide(
                case=case, operation_id=operation_id, approved=approved, user=request.user, prefix=prefix
            )
            if acted:
                done += 1
            else:
                skipped += 1
            for level, text in said:
                self.message_user(request, text, level)
        verb = "approve" if approved else "decline"
        self.message_user(
            request,
            f"{verb} selected: {done} done, {skipped} skipped or refused.",
            messages.SUCCESS if not skipped else messages.WARNING,
        )
        return None
