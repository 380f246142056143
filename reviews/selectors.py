"""Reads that more than one entry point needs."""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from cases.models import approvals_required
from core import identity
from reviews.models import Approval, Proposal

# How a finding is flagged while its policy changed under it (``policy_change``'s
# ``recheck``): the review page's flag on each finding, the bulk confirmation's warning.
RECHECK_FLAG = "Re-check (policy changed)"


def proposal_diff(proposal: Proposal) -> list[str]:
    """A unified diff of the body against the parent proposal (empty for a prepared one)."""
    if proposal.parent is None:
        return []
    return list(
        difflib.unified_diff(
            proposal.parent.body.splitlines(),
            proposal.body.splitlines(),
            fromfile=proposal.parent.short_operation_id,
            tofile=proposal.short_operation_id,
            lineterm="",
        )
    )


def evidence_moves(proposal: Proposal) -> list[dict]:
    """Which sources moved from which version to which, relative to the parent proposal.

    This is shown even when the quotation is identical: that is exactly the case where the
    visible text does not reveal the change.
    """
    if proposal.parent is None:
        return []
    before = {(p["source_id"], p["quotation"]): p["version"] for p in proposal.parent.passages}
    moves = []
    for p in proposal.passages:
        old = before.get((p["source_id"], p["quotation"]))
        if old is not None and old != p["version"]:
            moves.append({"source_id": p["source_id"], "from": old, "to": p["version"], "quotation_identical": True})
    old_sources = {p["source_id"]: p for p in proposal.parent.passages}
    for p in proposal.passages:
        o = old_sources.get(p["source_id"])
        if o is not None and (p["source_id"], p["quotation"]) not in before and o["version"] != p["version"]:
            moves.append(
                {"source_id": p["source_id"], "from": o["version"], "to": p["version"], "quotation_identical": False}
            )
    return moves


def proposal_text_fields(proposal: Proposal) -> list[tuple[str, str]]:
    """Every text of a proposal that a reviewer approves or reads as evidence, named as the
    API names it, for the text policy's markers (docs/TEXT.md)."""
    fields: list[tuple[str, object]] = [("body", proposal.body)]
    for i, p in enumerate(proposal.passages or []):
        fields += [(f"passages[{i}].source_id", p.get("source_id")), (f"passages[{i}].quotation", p.get("quotation"))]
    for i, f in enumerate(proposal.findings or []):
        fields += [
            (f"findings[{i}].finding", f.get("finding")),
            (f"findings[{i}].licensed_clause", f.get("licensed_clause")),
        ]
    policy = proposal.policy_snapshot or {}
    fields += [("policy.name", policy.get("name")), ("policy.label", policy.get("label"))]
    for key, value in sorted((policy.get("parameters") or {}).items()):
        fields += [(f"policy.parameters key {key}", key), (f"policy.parameters.{key}", value)]
    return [(name, value) for name, value in fields if isinstance(value, str)]


def policy_change(
    proposal: Proposal, depends_on: list[str] | None, *, chain: Mapping[int, Proposal] | None = None
) -> dict | None:
    """What changed in the policy since the nearest ancestor under another policy, or None.

    ``changes`` lists each parameter whose value changed (``before``/``after``; None when
    absent). ``recheck`` is False only when the case declares ``depends_on`` and none of
    those parameters changed: nothing is carried over silently. ``chain``: the case's
    proposals by primary key, when the caller has read them (the ancestors are found there,
    with no query); otherwise each parent is read in turn.
    """

    def parent(of: Proposal) -> Proposal | None:
        if chain is None:
            return of.parent
        return chain.get(of.parent_id) if of.parent_id is not None else None

    ancestor = parent(proposal)
    while ancestor is not None and ancestor.policy_id == proposal.policy_id:
        ancestor = parent(ancestor)
    if ancestor is None:
        return None
    before = ancestor.policy_snapshot.get("parameters", {})
    after = proposal.policy_snapshot.get("parameters", {})
    changes = [
        {"key": key, "before": before.get(key), "after": after.get(key)}
        for key in sorted(set(before) | set(after))
        if key not in before
        or key not in after
        or identity.typed_value(before[key]) != identity.typed_value(after[key])
    ]
    changed = {c["key"] for c in changes}
    recheck = depends_on is None or bool(changed & set(depends_on))
    return {
        "from_proposal": ancestor,
        "from_label": ancestor.policy_snapshot.get("label", ""),
        "to_label": proposal.policy_snapshot.get("label", ""),
        "name_changed": ancestor.policy_snapshot.get("name") != proposal.policy_snapshot.get("name"),
        "changes": changes,
        "recheck": recheck,
        "depends_on": depends_on,
    }


def approvals_of(*, operation_id: str, policy_snapshot: dict | None) -> tuple[int, int]:
    """How many distinct reviewers approved ``operation_id`` so far, of how many the policy
    it was prepared under needs: (0, 1) for a policy of one approver, without a query."""
    required = approvals_required((policy_snapshot or {}).get("parameters"))
    if required == 1:
        return 0, 1
    return Approval.objects.filter(operation_id=operation_id).count(), required
