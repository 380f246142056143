"""Four eyes: whoever made a human change in a proposal cannot approve it."""

from __future__ import annotations

from django.conf import settings

from core import identity
from core.errors import FourEyesRefused
from reviews.models import Origin, Proposal


def four_eyes_enabled() -> bool:
    return bool(getattr(settings, "DECISIONFLOW_FOUR_EYES", True))


def human_changers(proposal_pk: int, case_pk: int | None = None) -> dict[int, Proposal]:
    """Everyone who made a human change in this proposal or in an edit it builds on.

    Maps each person's user pk to the nearest proposal they made. An edit of an edit still
    carries the first editor's sentences, so the whole chain of human proposals counts,
    back to what the pipeline prepared. One query: the case's human proposals only (a case
    nobody edited returns none).
    """
    if case_pk is None:
        case_pk = Proposal.objects.filter(pk=proposal_pk).values_list("case_id", flat=True).first()
    if case_pk is None:
        return {}
    chain = {
        p.pk: p
        for p in Proposal.objects.filter(case_id=case_pk)
        .exclude(origin=Origin.PREPARED)
        .only("pk", "parent_id", "author_id", "origin", "operation_id")
        .order_by()
    }
    changers: dict[int, Proposal] = {}
    current: int | None = proposal_pk
    while current in chain:
        proposal = chain[current]
        if proposal.author_id is not None:
            changers.setdefault(proposal.author_id, proposal)
        current = proposal.parent_id
    return changers


def four_eyes_refusal(*, proposal_pk: int, reviewer, case_pk: int | None = None) -> FourEyesRefused | None:
    """The refusal an approval of this proposal by ``reviewer`` would get, or None.

    Four eyes: whoever made a human change (a body edit or an evidence change) cannot approve
    that proposal; they may decline it. Off with ``DECISIONFLOW_FOUR_EYES=0``.
    """
    pk = getattr(reviewer, "pk", None)
    if pk is None or not four_eyes_enabled():
        return None
    changed = human_changers(proposal_pk, case_pk).get(pk)
    if changed is None:
        return None
    return FourEyesRefused(
        f"four eyes: {reviewer.get_username()} made the {changed.get_origin_display().lower()} "
        f"{identity.short(changed.operation_id)} in this proposal, so another reviewer must approve it "
        "(you may decline it); nothing was written",
        change=changed.get_origin_display().lower(),
        changed_operation_id=changed.operation_id,
    )


def four_eyes_check(*, proposal_pk: int, reviewer, case_pk: int | None = None) -> None:
    refusal = four_eyes_refusal(proposal_pk=proposal_pk, reviewer=reviewer, case_pk=case_pk)
    if refusal is not None:
        raise refusal
