"""Resume against its raw floor (bench.measures.bench_resume_floor), once at a tiny size.

Nothing here is timed: it proves the measure runs, that the floor writes the same rows a
resume's commit writes, and that the report shows the ratio as a goal row.
"""

from __future__ import annotations

import pytest

from bench import report
from bench.data import bench_reviewer, make_cases, raw_connect, run_token
from bench.measures import _floor_rows, bench_resume_floor, raw_floor_loop

GOAL_LABEL = "| resume ÷ the raw floor (psycopg: BEGIN; the lock; one write statement; COMMIT; ms per resume) | "


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # the floor's own connection must see the cases
def test_the_measure_produces_a_ratio_and_its_goal_row():
    res = bench_resume_floor(runs=1, n=2)
    assert res["key"] == "resume_floor" and res["kind"] == "cost" and res["goal"] == ("≤", 2.5)
    assert len(res["ratios"]) == 1 and res["ratios"][0] > 0
    assert res["subject_values"][0] > 0 and res["baseline_values"][0] > 0
    (row,) = [line for line in report.goals_table({"resume_floor": res}) if line.startswith(GOAL_LABEL)]
    assert f"**{res['ratios'][0]:.2f}×**, median of 1 runs" in row and "| ≤ 2.5× |" in row
    sections = report.render_sections({}, [res])
    assert sections[f"line:{GOAL_LABEL}"] == row
    assert sections["row:16"].startswith("| 16. resume ÷ the raw floor, PostgreSQL |")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # the floor's own connection must see the cases
def test_the_floor_writes_the_decision_and_effect_a_commit_writes():
    from effects.models import EffectRecord
    from effects.services import effect_commit
    from reviews.models import ReviewDecision

    reviewer = bench_reviewer()
    ours, floor = make_cases(2, prefix=f"{run_token()}-t", proposals=True)
    effect_commit(operation_id=ours.current_proposal.operation_id, approved=True, reviewer=reviewer, channel="bench")
    with raw_connect() as conn:
        raw_floor_loop(conn, _floor_rows([floor], reviewer.pk))

    def written(case):
        op = case.current_proposal.operation_id
        decision = ReviewDecision.objects.get(operation_id=op)
        effect = EffectRecord.objects.get(operation_id=op)
        assert effect.decision_id == decision.pk and effect.case_id == case.pk
        assert effect.proposal_id == decision.proposal_id == case.current_proposal_id
        return (
            (decision.approved, decision.reviewer_id, decision.decline_reason, decision.system_actor),
            {f: getattr(effect, f) for f in ("action", "body", "evidence_id", "source_versions", "policy_id")},
            (effect.policy_snapshot, effect.reviewer_id),
        )

    assert written(floor) == written(ours)


def test_a_failed_floor_measure_says_why_in_its_goal_row():
    failed = {"key": "resume_floor_postgresql", "kind": "error", "error": "Traceback ...\nAssertionError: no case row"}
    (row,) = [line for line in report.goals_table({failed["key"]: failed}) if line.startswith(GOAL_LABEL)]
    assert "not measured: AssertionError: no case row" in row
