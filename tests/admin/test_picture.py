"""The workflow picture without a browser: drawn once, marked per request, and a page that
still tells the state when Graphviz is missing. (The browser test is tests/browser/test_picture.py.)"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from engine.graph import COMMIT_ID, HUMAN_REVIEW_ID, PREPARE_ID, WORKFLOW_VERSION
from workplace import picture

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (make graphviz)")


@pytest.fixture
def fresh_cache():
    picture.base_svg.cache_clear()
    yield
    picture.base_svg.cache_clear()


def test_dot_is_the_engines_graph_plus_the_hosts_outcomes():
    dot = picture.workflow_dot()
    assert dot.startswith("strict digraph")
    for executor in (PREPARE_ID, HUMAN_REVIEW_ID, COMMIT_ID):
        assert f'id="df-node-{executor}"' in dot
    assert f'"{PREPARE_ID}" -> "{HUMAN_REVIEW_ID}"' in dot and f'"{HUMAN_REVIEW_ID}" -> "{COMMIT_ID}"' in dot
    # The framework's internal request/response edges stay out, as WorkflowViz leaves them out.
    assert "internal:" not in dot


def test_steps_are_named_by_their_role_and_the_legend_tells_the_two_versions_apart():
    """A step's id carries its own version (human-review-v1) inside a workflow of another
    (review-v3): the picture names the step by its role, so the two never read as one."""
    assert picture.step_label(HUMAN_REVIEW_ID) == "human review (step v1)"
    assert (picture.step_label(PREPARE_ID), picture.step_label(COMMIT_ID)) == ("prepare", "commit")
    labels = dict(
        re.findall(r'"([^"]+)" \[id="df-node-[^"]+", class="df-engine".*?label="([^"]+)"\]', picture.workflow_dot())
    )
    assert labels[HUMAN_REVIEW_ID] == "human review (step v1)\\nwait for a reviewer"
    assert not any(HUMAN_REVIEW_ID in label for label in labels.values())
    assert picture.Standing.WAITING.label == "Waiting for a reviewer"
    assert picture.LEGEND.startswith(f"Workflow {WORKFLOW_VERSION}. ") and "(step v1)" in picture.LEGEND


@needs_dot
def test_drawn_once_per_workflow_version_then_only_marked(fresh_cache, monkeypatch):
    runs = []
    real_run = subprocess.run

    def counting_run(*args, **kwargs):
        runs.append(args[0])
        return real_run(*args, **kwargs)

    monkeypatch.setattr(picture.subprocess, "run", counting_run)
    for _ in range(2):
        for standing in picture.Standing.values:
            svg = picture.marked_svg(standing, label=f"at {standing}")
            assert svg is not None
            marked = re.findall(r'<g id="([^"]+)" class="node df-here', svg)
            node, walked = picture._PLACES[standing]
            assert marked == ([picture.node_dom_id(node)] if node else [])
            assert sorted(re.findall(r'<g id="([^"]+)" class="edge df-walked', svg)) == sorted(
                picture.edge_dom_id(s, t) for s, t in walked
            )
            assert f'aria-label="at {standing}"' in svg
    assert len(runs) == 1
    # Another workflow version is drawn again, once.
    picture.base_svg(f"{WORKFLOW_VERSION}-next")
    picture.base_svg(f"{WORKFLOW_VERSION}-next")
    assert len(runs) == 2


def test_the_label_is_escaped(fresh_cache):
    svg = picture.marked_svg(picture.Standing.WAITING, label='<script>"x"</script>')
    if svg is not None:
        assert "<script>" not in svg and "&lt;script&gt;" in svg


def test_without_graphviz_the_page_says_so_and_shows_the_state(begun, case, reviewer_client, fresh_cache, monkeypatch):
    monkeypatch.setattr(picture, "DOT_COMMAND", "dot-not-installed-here")
    response = reviewer_client.get(f"/admin/reviews/proposal/{case.current_proposal_id}/review/")
    html = response.content.decode()
    assert response.status_code == 200
    assert 'id="df-no-picture"' in html and "Graphviz is not installed" in html and "apt-get install graphviz" in html
    assert '<svg class="df-workflow-svg' not in html and 'id="df-workflow"' not in html
    assert 'data-standing="waiting"' in html and "Waiting for a reviewer" in html
    assert f"waiting for a reviewer (workflow {WORKFLOW_VERSION})." in html
    assert begun.pending_review.checkpoint_id in html


def test_the_path_costs_the_same_queries_for_one_proposal_or_several(begun, case, reviewer, django_assert_num_queries):
    from workflow.edit import review_edit
    from workflow.selectors import case_history

    with django_assert_num_queries(5):
        one = picture.case_path(case)
    assert [s.standing for s in one] == [picture.Standing.WAITING]
    body = case.current_proposal.body
    for n in range(2):
        case.refresh_from_db()
        review_edit(
            case=case,
            expected_operation_id=case.current_proposal.operation_id,
            body=body.replace("Kind regards,", f"Edit {n}.\n\nKind regards,"),
            editor=reviewer,
        )
    case.refresh_from_db()
    with django_assert_num_queries(5):
        three = picture.case_path(case)
    assert [s.standing for s in three] == [picture.Standing.SUPERSEDED] * 2 + [picture.Standing.WAITING]
    # Each superseded proposal names the one that replaced it.
    assert three[0].detail == f"by {three[1].short_operation_id}"
    # The history page derives the same path from what it already read.
    same = picture.path_from_history(case_history(case))
    assert [(s.proposal.pk, s.standing, s.detail) for s in same] == [
        (s.proposal.pk, s.standing, s.detail) for s in three
    ]


def test_a_failed_commit_attempt_on_the_waiting_proposal_is_outcome_uncertain(
    begun, case, reviewer_client, fresh_cache
):
    from effects.models import CommitAttempt

    CommitAttempt.objects.create(
        operation_id=begun.operation_id,
        case=case,
        approved=True,
        outcome=CommitAttempt.Outcome.FAILED,
        channel="admin",
        detail="the connection was lost",
    )
    [step] = picture.case_path(case)
    assert step.standing == picture.Standing.UNCERTAIN and "reconcile" in step.detail
    html = reviewer_client.get(f"/admin/cases/case/{case.pk}/history/").content.decode()
    assert 'data-standing="uncertain"' in html and "Outcome uncertain" in html
    if shutil.which("dot"):
        assert '<g id="df-node-uncertain" class="node df-here' in html
