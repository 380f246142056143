"""What the workflow's admin pages share: who may review, and where a proposal is reviewed.

Kept apart from admin.py so that the pages it registers (queue_admin.py and the others,
imported at its end) can use them without importing admin.py back.
"""

from __future__ import annotations

from django.urls import reverse

from effects.services import REVIEW_PERMISSION


def can_review(user) -> bool:
    return user.is_active and user.has_perm(REVIEW_PERMISSION)


def review_url(proposal_pk) -> str:
    return reverse("admin:reviews_proposal_review", args=[proposal_pk])


def case_history_url(case_pk) -> str:
    return reverse("admin:cases_case_history", args=[case_pk])
