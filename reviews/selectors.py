"""Reads that more than one entry point needs."""

from __future__ import annotations

import difflib

from .models import Proposal


def proposal_by_operation(operation_id: str) -> Proposal | None:
    return Proposal.objects.select_related("case", "parent").filter(operation_id=operation_id).first()


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
