"""An edit is two transactions under the case lock: the revision, then its review begun.

Another action may take the case between them; the edit then stays saved and says that its
review could not be begun (the first decision on it, or ``manage.py begin``, begins it).
"""

from __future__ import annotations

import pytest

from core.errors import CaseBusy
from reviews.models import PendingReview, Proposal
from tests.conftest import case_held_elsewhere
from workflow import edit
from workflow.begin import review_begin

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_edit_whose_begin_meets_a_busy_case_is_saved_and_says_so(case, editor, settings, monkeypatch):
    begun = review_begin(case=case)
    settings.DECISIONFLOW_DECISION_LOCK_TIMEOUT = 0.3
    real, taken = edit.case_lock, []

    def second_one_busy(case_id, **kwargs):
        taken.append(case_id)
        if len(taken) == 2:
            # Between the revision and its begin another action takes the case: the real
            # lock then answers busy, inside the edit.
            with case_held_elsewhere(case_id), real(case_id, **kwargs):
                pytest.fail("the case lock must be busy here")
        return real(case_id, **kwargs)

    monkeypatch.setattr(edit, "case_lock", second_one_busy)
    result = edit.review_edit(
        case=case,
        expected_operation_id=begun.operation_id,
        body=begun.pending_review.proposal.body + " More.",
        editor=editor,
    )
    assert taken == [case.case_id, case.case_id]
    assert result.revision.changed and result.begun is None
    assert isinstance(result.begin_error, CaseBusy)
    # The revision is saved and current; the old pause is superseded; the new one not begun.
    case.refresh_from_db()
    assert case.current_proposal_id == result.revision.proposal.pk
    assert Proposal.objects.filter(case=case).count() == 2
    assert PendingReview.objects.get(operation_id=begun.operation_id).status == PendingReview.Status.SUPERSEDED
    assert not PendingReview.objects.filter(operation_id=result.revision.proposal.operation_id).exists()
    # Free again: beginning it now records its pending review.
    again = review_begin(case=case)
    assert again.created and again.operation_id == result.revision.proposal.operation_id
