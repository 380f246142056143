"""The review queue's pieces on other pages: the claim on the review page, the index line."""

from django import template

from workplace.queue import VIEW_PENDING, assignment_context, claim_context, queue_summary

register = template.Library()


@register.inclusion_tag("admin/reviews/proposal/claim.html", takes_context=True)
def review_claim(context, pending):
    return claim_context(pending, context["request"].user)


@register.inclusion_tag("admin/reviews/proposal/assignment.html", takes_context=True)
def review_assignment(context, pending):
    return assignment_context(pending, context["request"])


@register.inclusion_tag("admin/reviews/queue_summary.html", takes_context=True)
def review_queue_summary(context):
    user = context["request"].user
    if not (user.is_active and user.has_perm(VIEW_PENDING)):
        return {"shown": False}
    return {"shown": True, **queue_summary()}
