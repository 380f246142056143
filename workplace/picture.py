"""Where a case stands, as a picture: the review workflow's graph with the case marked on it.

The graph is the engine's own: agent-framework's ``WorkflowViz`` writes it as DOT from the
built workflow (``engine.build_workflow``), so a new executor or edge shows up here without a
change to this module. To it we add, dashed and labelled as the host's, the outcomes the
engine's last step can end in (committed, declined, outcome uncertain) and the one way a
proposal leaves the graph early (superseded by a newer proposal).

Graphviz's ``dot`` lays the graph out once per workflow version and graph hash, in memory
(``base_svg``); each request only adds CSS classes to the cached SVG (``marked_svg``): the
node the case stands at gets ``df-here``, the edges it went along ``df-walked``. Where
``dot`` is missing the picture is ``None`` and the page says so, with the state as text.

``case_path`` reads where each of the case's proposals stands, oldest first, in a fixed
number of queries; ``path_from_history`` derives the same from a ``CaseHistory`` the
history page has already read (no query at all).
"""

from __future__ import annotations

import functools
import logging
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from agent_framework import WorkflowViz
from django.db import models
from django.db.models import OuterRef, Subquery
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from cases.models import Case
from core import identity
from core.outcomes import DecisionOutcome, Failure, OperationState
from effects.models import CommitAttempt, EffectRecord
from engine.graph import GRAPH_SIGNATURE_HASH, build_workflow
from engine.names import COMMIT_ID, HUMAN_REVIEW_ID, PREPARE_ID, WORKFLOW_VERSION
from reviews.models import Approval, PendingReview, Proposal, ReviewDecision, approvals_shown

if TYPE_CHECKING:
    from workflow.selectors import CaseHistory

log = logging.getLogger(__name__)

# Looked up when the picture is first drawn (tests point it elsewhere to play "not installed").
DOT_COMMAND: str | None = "dot"
DOT_TIMEOUT_SECONDS = 10
INSTALL_HINT = "install Graphviz (Debian: `apt-get install graphviz`, or `make graphviz` as root)"


_VERSIONED_STEP = re.compile(r"(?P<role>.+)-v(?P<version>\d+)")


def step_label(executor_id: str) -> str:
    """An engine step by its role, as the picture names it: ``human-review-v1`` is "human
    review (step v1)". The version in an executor's id is that step's own, which changes
    only with the step; the workflow's (``WORKFLOW_VERSION``, "review-v3") is another
    number, so the two never read as one version inside another."""
    found = _VERSIONED_STEP.fullmatch(executor_id)
    if found is None:
        return executor_id.replace("-", " ")
    return f"{found['role'].replace('-', ' ')} (step v{found['version']})"


class Standing(models.TextChoices):
    """Where one proposal stands in the review workflow.

    The commit step's outcomes say the decision's own words (``DecisionOutcome``,
    ``Failure``); the values are the node names the SVG marks, so they stay short.
    """

    NOT_STARTED = "not_started", "Not started"
    PREPARED = "prepared", "Prepared"
    WAITING = "waiting", "Waiting for a reviewer"
    COMMITTED = DecisionOutcome.COMMITTED.value, DecisionOutcome.COMMITTED.label
    DECLINED = DecisionOutcome.DECLINED.value, DecisionOutcome.DECLINED.label
    SUPERSEDED = "superseded", "Superseded by a newer proposal"
    UNCERTAIN = "uncertain", Failure.UNCERTAIN.label


# The host's nodes, drawn after the engine's: outcomes of the commit step, and superseded.
OUTCOME_NODES = {
    Standing.COMMITTED: (Standing.COMMITTED.value, f"{Standing.COMMITTED.label}\\neffect recorded"),
    Standing.DECLINED: (Standing.DECLINED.value, f"{Standing.DECLINED.label}\\nno effect"),
    Standing.UNCERTAIN: (Standing.UNCERTAIN.value, f"{Standing.UNCERTAIN.label}\\nreconcile decides"),
}
SUPERSEDED_NODE = ("superseded", "Superseded\\na newer proposal\\nis reviewed instead")
ENGINE_LABELS = {
    PREPARE_ID: "build the proposal",
    HUMAN_REVIEW_ID: "wait for a reviewer",
    COMMIT_ID: "record the decision",
}
# The legend's words: the workflow's version, and what a step's own version means.
LEGEND = (
    f"Workflow {WORKFLOW_VERSION}. Solid boxes are its engine steps, each named by its role; a step's "
    "own version, such as (step v1), changes only when that step does. Dashed boxes are where a "
    "proposal ends. The thick outline and the coloured arrows show where this proposal is and how it got there."
)

# Where each standing is drawn, and the edges a proposal went along to get there.
_PLACES: dict[str, tuple[str | None, tuple[tuple[str, str], ...]]] = {
    Standing.NOT_STARTED: (None, ()),
    Standing.PREPARED: (PREPARE_ID, ()),
    Standing.WAITING: (HUMAN_REVIEW_ID, ((PREPARE_ID, HUMAN_REVIEW_ID),)),
    Standing.SUPERSEDED: ("superseded", ((PREPARE_ID, HUMAN_REVIEW_ID), (HUMAN_REVIEW_ID, "superseded"))),
    **{
        standing: (node, ((PREPARE_ID, HUMAN_REVIEW_ID), (HUMAN_REVIEW_ID, COMMIT_ID), (COMMIT_ID, node)))
        for standing, (node, _label) in OUTCOME_NODES.items()
    },
}


def node_dom_id(node: str) -> str:
    return f"df-node-{node}"


def edge_dom_id(source: str, target: str) -> str:
    return f"df-edge-{source}--{target}"


# --- the picture, drawn once ---------------------------------------------------------------


def workflow_dot() -> str:
    """The engine's graph as ``WorkflowViz`` writes it, plus the host's outcome nodes and ids.

    The engine's DOT is kept as it is; our statements come after it, and ``strict`` makes a
    repeated node or edge statement add attributes instead of a second node or edge.
    """
    workflow = build_workflow()
    dot = WorkflowViz(workflow).to_digraph().strip()
    if not dot.startswith("digraph") or not dot.endswith("}"):
        raise ValueError("WorkflowViz wrote DOT of an unexpected shape")
    executors = set(workflow.executors)
    # The executors' own edges; the framework's internal request/response edges are left out,
    # as WorkflowViz leaves them out.
    engine_edges = [
        (edge.source_id, edge.target_id)
        for group in workflow.edge_groups
        for edge in group.edges
        if edge.source_id in executors and edge.target_id in executors
    ]
    lines = [
        "  // decisionflow: layout, ids for marking, the host's outcomes",
        '  graph [rankdir=LR, nodesep=0.35, ranksep=0.5, fontname="Helvetica", bgcolor="transparent"];',
        '  node [fontname="Helvetica", fontsize=12, margin="0.18,0.08"];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    for executor_id in workflow.executors:
        hint = ENGINE_LABELS.get(executor_id, "")
        label = f"{step_label(executor_id)}\\n{hint}" if hint else step_label(executor_id)
        lines.append(
            f'  "{executor_id}" [id="{node_dom_id(executor_id)}", class="df-engine", '
            f'fontname="Helvetica", fontsize=12, label="{label}"];'
        )
    for source, target in engine_edges:
        # Heavy edges keep the engine's own path on one straight line.
        lines.append(f'  "{source}" -> "{target}" [id="{edge_dom_id(source, target)}", weight=8];')
    for node, label in [*OUTCOME_NODES.values(), SUPERSEDED_NODE]:
        lines.append(
            f'  "{node}" [id="{node_dom_id(node)}", class="df-host", shape=box, style="rounded,dashed", label="{label}"];'
        )
    for node, _label in OUTCOME_NODES.values():
        weight = 8 if node == OUTCOME_NODES[Standing.COMMITTED][0] else 1
        lines.append(
            f'  "{COMMIT_ID}" -> "{node}" [id="{edge_dom_id(COMMIT_ID, node)}", style=dashed, weight={weight}];'
        )
    lines.append(
        f'  "{HUMAN_REVIEW_ID}" -> "superseded" [id="{edge_dom_id(HUMAN_REVIEW_ID, "superseded")}", style=dashed, '
        'label="edit or evidence change"];'
    )
    return "strict " + dot[:-1].rstrip() + "\n" + "\n".join(lines) + "\n}\n"


_PROLOGUE = re.compile(r"\A.*?(?=<svg\b)", re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_SIZE = re.compile(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"')


@dataclass(frozen=True)
class Drawing:
    svg: str | None  # the unmarked SVG, or None when it could not be drawn
    problem: str = ""  # why not, for the page


def _render(dot_source: str) -> Drawing:
    command = shutil.which(DOT_COMMAND) if DOT_COMMAND else None
    if command is None:
        return Drawing(None, f"Graphviz is not installed on this server, so the picture is not drawn: {INSTALL_HINT}.")
    try:
        done = subprocess.run(  # noqa: S603 - a fixed command on our own DOT text
            [command, "-Tsvg"],
            input=dot_source.encode(),
            capture_output=True,
            timeout=DOT_TIMEOUT_SECONDS,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("drawing the workflow picture with %s failed: %s", command, exc)
        return Drawing(None, f"Graphviz could not draw the picture ({type(exc).__name__}); {INSTALL_HINT}.")
    # Graphviz writes every "-" as "&#45;" (for its comments); plain hyphens keep ids matchable.
    svg = _COMMENT.sub("", _PROLOGUE.sub("", done.stdout.decode())).replace("&#45;", "-")
    # Sized by CSS (max-width: 100%), never wider than the page; the viewBox keeps the shape.
    svg = _SIZE.sub(r'<svg class="df-workflow-svg" width="\1pt" height="\2pt"', svg, count=1)
    return Drawing(svg)


def base_svg(workflow_version: str = WORKFLOW_VERSION, graph_hash: str | None = None) -> Drawing:
    """The unmarked picture, drawn once per workflow version and graph (per process)."""
    if graph_hash is None:
        graph_hash = GRAPH_SIGNATURE_HASH
    return _drawn(workflow_version, graph_hash)


@functools.cache
def _drawn(workflow_version: str, graph_hash: str) -> Drawing:
    return _render(workflow_dot())


base_svg.cache_clear = _drawn.cache_clear  # type: ignore[attr-defined]  # tests draw afresh


def marked_svg(standing: str, *, label: str) -> SafeString | None:
    """The cached picture with the standing's node and the edges walked to it marked."""
    drawing = base_svg()
    if drawing.svg is None:
        return None
    node, walked = _PLACES[standing]
    svg = drawing.svg
    if node is not None:
        svg = svg.replace(f'id="{node_dom_id(node)}" class="node', f'id="{node_dom_id(node)}" class="node df-here', 1)
    for source, target in walked:
        dom_id = edge_dom_id(source, target)
        svg = svg.replace(f'id="{dom_id}" class="edge', f'id="{dom_id}" class="edge df-walked', 1)
    svg = svg.replace(
        '<svg class="df-workflow-svg"',
        f'<svg class="df-workflow-svg df-at-{standing}" role="img" aria-label="{escape(label)}"',
        1,
    )
    return mark_safe(svg)  # noqa: S308 - our own Graphviz output; the only inserted text is escaped


# --- where the case stands -------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One proposal on the case's path, and where it stands."""

    proposal: Proposal
    standing: str
    label: str
    detail: str = ""
    since: datetime | None = None
    checkpoint_id: str = ""

    @property
    def short_operation_id(self) -> str:
        return identity.short(self.proposal.operation_id)


def _standing(
    proposal: Proposal,
    *,
    current_pk: int | None,
    decision: ReviewDecision | None,
    has_effect: bool,
    pending: PendingReview | None,
    failed_attempt: CommitAttempt | None,
    successor: Proposal | None,
    approvals: tuple[int, int] = (0, 1),
) -> Step:
    if decision is not None:
        who = decision.reviewer.get_username() if decision.reviewer_id else "(unknown)"
        if not decision.approved:
            by = f"withdrawn by the pipeline ({who})" if decision.withdrawn else f"by {who}"
            return Step(proposal, Standing.DECLINED, Standing.DECLINED.label, by, decision.decided_at)
        if has_effect:
            return Step(
                proposal, Standing.COMMITTED, Standing.COMMITTED.label, f"approved by {who}", decision.decided_at
            )
        return Step(
            proposal,
            Standing.UNCERTAIN,
            Standing.UNCERTAIN.label,
            f"approved by {who}, but no effect record exists (reconcile: {OperationState.NO_LOCAL_EFFECT})",
            decision.decided_at,
        )
    if proposal.pk != current_pk:
        newer = f"by {identity.short(successor.operation_id)}" if successor is not None else "by a newer proposal"
        since = successor.created_at if successor is not None else None
        return Step(proposal, Standing.SUPERSEDED, Standing.SUPERSEDED.label, newer, since)
    if failed_attempt is not None:
        return Step(
            proposal,
            Standing.UNCERTAIN,
            Standing.UNCERTAIN.label,
            "the last commit attempt failed; reconcile reads the effect store",
            failed_attempt.attempted_at,
        )
    if pending is not None and pending.status == PendingReview.Status.PENDING:
        # Under a policy that needs several approvers, how far its approvals are.
        shown = approvals_shown(*approvals) if approvals[0] else None
        return Step(
            proposal,
            Standing.WAITING,
            Standing.WAITING.label,
            f"workflow {pending.workflow_version}" + (f"; {shown}" if shown else ""),
            pending.created_at,
            pending.checkpoint_id,
        )
    return Step(
        proposal,
        Standing.PREPARED,
        Standing.PREPARED.label,
        "the review has not been begun; the first Approve or Decline begins it",
        proposal.created_at,
    )


def _path(
    case: Case,
    proposals: list[Proposal],
    decisions: dict[int, ReviewDecision],
    effects: set[int],
    pendings: dict[int, PendingReview],
    last_attempts: dict[str, CommitAttempt],
    approvals: dict[int, tuple[int, int]],
) -> list[Step]:
    proposals = sorted(proposals, key=lambda p: (p.created_at, p.pk))
    successors: dict[int, Proposal] = {}
    for older, newer in zip(proposals, proposals[1:], strict=False):
        successors[older.pk] = newer
    for p in proposals:  # a proposal made from another supersedes it, whatever came between
        if p.parent_id is not None:
            successors[p.parent_id] = p
    steps = []
    for proposal in proposals:
        attempt = last_attempts.get(proposal.operation_id)
        steps.append(
            _standing(
                proposal,
                current_pk=case.current_proposal_id,
                decision=decisions.get(proposal.pk),
                has_effect=proposal.pk in effects,
                pending=pendings.get(proposal.pk),
                failed_attempt=attempt
                if attempt is not None and attempt.outcome == CommitAttempt.Outcome.FAILED
                else None,
                successor=successors.get(proposal.pk),
                approvals=approvals.get(proposal.pk, (0, 1)),
            )
        )
    return steps


def case_path(case: Case) -> list[Step]:
    """Each of the case's proposals, oldest first, with where it stands (five queries)."""
    latest = Approval.objects.filter(proposal=OuterRef("pk")).order_by("-ordinal")
    annotated = list(
        Proposal.objects.filter(case=case)
        .select_related("author")
        .only("id", "case_id", "parent_id", "operation_id", "origin", "created_at", "author__username")
        # Two-person approval: the latest approval's ordinal is the count (none: no subquery row).
        .annotate(
            approvals_n=Subquery(latest.values("ordinal")[:1]), approvals_of=Subquery(latest.values("required")[:1])
        )
    )
    approvals = {p.pk: (p.approvals_n, p.approvals_of) for p in annotated if p.approvals_n}
    proposals: list[Proposal] = list(annotated)
    decisions = {
        d.proposal_id: d for d in ReviewDecision.objects.filter(proposal__case=case).select_related("reviewer")
    }
    effects = set(EffectRecord.objects.filter(case=case).values_list("proposal_id", flat=True))
    pendings = {p.proposal_id: p for p in PendingReview.objects.filter(case=case).order_by("created_at", "id")}
    last_attempts: dict[str, CommitAttempt] = {}
    for attempt in (
        CommitAttempt.objects.filter(case=case)
        .order_by("attempted_at", "id")
        .only("id", "operation_id", "outcome", "attempted_at")
    ):
        last_attempts[attempt.operation_id] = attempt
    return _path(case, proposals, decisions, effects, pendings, last_attempts, approvals)


def path_from_history(history: CaseHistory) -> list[Step]:
    """The same path from the events the history page already read."""
    proposals: list[Proposal] = []
    decisions: dict[int, ReviewDecision] = {}
    pendings: dict[int, PendingReview] = {}
    effects: set[int] = set()
    last_attempts: dict[str, CommitAttempt] = {}
    approvals: dict[int, tuple[int, int]] = {}
    for event in history.events:  # oldest first: the last attempt per operation wins
        obj = event.obj
        if isinstance(obj, Proposal):
            proposals.append(obj)
        elif isinstance(obj, Approval):
            approvals[obj.proposal_id] = max(approvals.get(obj.proposal_id, (0, 1)), (obj.ordinal, obj.required))
        elif isinstance(obj, ReviewDecision):
            decisions[obj.proposal_id] = obj
        elif isinstance(obj, EffectRecord):
            effects.add(obj.proposal_id)
        elif isinstance(obj, PendingReview):
            pendings[obj.proposal_id] = obj
        elif isinstance(obj, CommitAttempt):
            last_attempts[obj.operation_id] = obj
    return _path(history.case, proposals, decisions, effects, pendings, last_attempts, approvals)


@dataclass(frozen=True)
class Picture:
    """What the template shows: the marked SVG (or why not), the step shown, the whole path."""

    svg: SafeString | None
    problem: str
    step: Step | None
    path: list[Step]
    sentence: str
    legend: str = LEGEND

    @property
    def standing(self) -> str:
        return self.step.standing if self.step is not None else Standing.NOT_STARTED


def describe(step: Step | None, case: Case) -> str:
    if step is None:
        return f"{case.case_id} has not been begun: no proposal yet."
    text = f"Proposal {step.short_operation_id} of {case.case_id}: {step.label.lower()}"
    if step.detail:
        text += f" ({step.detail})"
    return text + "."


def picture_for(case: Case, path: list[Step], proposal_pk: int | None = None) -> Picture:
    """The picture of one proposal on the case's path: the given one, else the current one."""
    wanted = proposal_pk if proposal_pk is not None else case.current_proposal_id
    step = next((s for s in path if s.proposal.pk == wanted), None)
    standing = step.standing if step is not None else Standing.NOT_STARTED
    sentence = describe(step, case)
    svg = marked_svg(standing, label=f"Review workflow. {sentence}")
    return Picture(svg, "" if svg is not None else base_svg().problem, step, path, sentence)
