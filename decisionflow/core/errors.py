"""The one application error type, with the exit codes the commands document.

Every refusal carries a message an operator can act on. The admin shows it with
``message_user``; commands turn it into a ``CommandError`` with ``exit_code``; the API maps
``code`` to an HTTP status.
"""

from __future__ import annotations


class DecisionflowError(Exception):
    code = "error"
    exit_code = 1

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidInput(DecisionflowError):
    code = "invalid_request"
    exit_code = 1


class NotFound(DecisionflowError):
    code = "not_found"
    exit_code = 1


class PermissionRefused(DecisionflowError):
    code = "permission_denied"
    exit_code = 1


class StaleProposal(DecisionflowError):
    """The request names an operation that is not the case's current proposal."""

    code = "stale_proposal"
    exit_code = 4

    def __init__(self, message: str, *, current_operation_id: str | None = None, **details):
        super().__init__(message, current_operation_id=current_operation_id, **details)
        self.current_operation_id = current_operation_id


class AlreadyDecided(DecisionflowError):
    code = "already_decided"
    exit_code = 4


class ConflictingDecision(DecisionflowError):
    code = "conflicting_decision"
    exit_code = 3


class WorkflowIncompatible(DecisionflowError):
    """A pending review from another workflow version, or a checkpoint that fails its digest."""

    code = "workflow_incompatible"
    exit_code = 5


class OutcomeUncertain(DecisionflowError):
    """The commit step failed after it may have written: ask the effect store."""

    code = "outcome_uncertain"
    exit_code = 42
