"""Supersession under races: rounds of 16 approvals and 4 imports racing one policy publish
each, on PostgreSQL (``make reliability``: 4 rounds; ``make test``: 1).

What a publish promises (docs/COMMANDS.md, publish_policy): once it has committed (its
switch), no approval of a proposal under an older version commits, and no case is imported
under one. Each round counts the approvals decided after the publish stamped itself (the
goal is 0), the approvals that committed before it, those refused as stale or busy, the
imports that came in before the switch and those refused, and the cases left under an old
version once the publish returned (0).
"""

from __future__ import annotations

import pytest

from cases.models import Case
from cases.services import case_import
from reviews.models import ReviewDecision
from tests.publish_race import race
from tests.reliability.conftest import case_data, iterations, record
from workflow.begin import review_begin

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

APPROVALS, IMPORTS = 16, 4


def version(round_: int, base: dict) -> dict:
    """The version a round publishes: the allowance raised by one each round."""
    parameters = {**base["parameters"], "allowance_units": base["parameters"]["allowance_units"] + 1 + round_}
    return {"name": base["name"], "label": f"r{round_ + 1}", "parameters": parameters}


def test_rounds_of_approvals_and_imports_racing_a_publish(make_user, reviewer):
    publisher = make_user("publisher", group="leads")
    rounds = min(iterations(), 4)
    policy = case_data("seed")["policy"]  # the version the cases come under (v3, then each round's)
    totals = {"after_publish": 0, "left_under_old": 0}
    for r in range(rounds):
        cases = []
        for i in range(APPROVALS):
            case = case_import(data={**case_data(f"SUP-{r}-{i:02d}"), "policy": policy}).case
            review_begin(case=case)
            cases.append(Case.objects.select_related("current_proposal").get(pk=case.pk))
        files = [{**case_data(f"SUP-{r}-IMPORT-{i}"), "policy": policy} for i in range(IMPORTS)]
        new = version(r, policy)
        raced = race(
            data=new,
            publisher=publisher,
            reviewer=reviewer,
            approve=[(c, c.current_proposal.operation_id) for c in cases],
            imports=files,
        )
        assert len(raced.approvals) == APPROVALS and len(raced.imports) == IMPORTS and raced.published
        assert set(raced.approvals.values()) <= {"committed", "StaleProposal", "CaseBusy"}, raced.approvals
        assert set(raced.imports.values()) <= {"imported", "refused"}, raced.imports
        ids = [c.case_id for c in cases] + [f["case_id"] for f in files]
        decided = set(
            ReviewDecision.objects.filter(proposal__case__case_id__in=ids).values_list("proposal__case_id", flat=True)
        )
        # Undecided cases under another version than the one just published, after it returned
        # (a busy case is still switched: refused until a run again prepares it).
        left = Case.objects.filter(case_id__in=ids).exclude(pk__in=decided).exclude(policy__label=new["label"])
        figures = {
            "round": r + 1,
            "approvals": APPROVALS,
            "committed_before": raced.count("committed"),
            "stale": raced.count("StaleProposal"),
            "busy": raced.count("CaseBusy"),
            "after_publish": len(raced.after_publish),
            "imports": IMPORTS,
            "imported_before": sum(o == "imported" for o in raced.imports.values()),
            "imports_refused": sum(o == "refused" for o in raced.imports.values()),
            "left_under_old": left.count(),
        }
        record("supersession", **figures)
        totals["after_publish"] += figures["after_publish"]
        totals["left_under_old"] += figures["left_under_old"]
        policy = new
    assert totals == {"after_publish": 0, "left_under_old": 0}
