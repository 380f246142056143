"""The words for how a decision ended and where an operation stands, one enum per concept.

They live on the ground floor because every layer says them: the effect store writes them
(attempt rows, reconcile), the decision service returns them, the metrics count by them
(core/observability.py), and the channels show them (the admin, the API's schema, the
commands). Each copy elsewhere is derived from these, and tests/decisionflow/test_vocabulary.py
fails when one drifts.
"""

from __future__ import annotations

from django.db import models

from core.errors import (
    AlreadyDecided,
    ConflictingDecision,
    DecisionflowError,
    OutcomeUncertain,
    StaleProposal,
)


class DecisionOutcome(models.TextChoices):
    """How one call to decide an operation ended: the commit attempt's ``outcome`` column.

    The decision service returns one of ``DECIDED``; every other outcome is a refusal (an
    error class, ``error_outcome``) or a failure. The stored values are the database's:
    they never change.
    """

    COMMITTED = "committed", "Committed"  # the first approval: decision and effect written
    REPLAY = "replay", "Replay"  # the same decision again: nothing new written
    DECLINED = "declined", "Declined"  # the first decline: decision written, no effect
    CONFLICT = "conflict", "Conflicting decision"  # the opposite decision stands
    STALE = "stale", "Stale"  # the operation is not the case's current one
    REFUSED = "refused", "Refused"  # any other refusal: permission, input, checkpoint, busy
    FAILED = "failed", "Failed"  # the commit's transaction failed and is known rolled back
    # An approval recorded under a policy that needs more distinct approvers: no decision and
    # no effect yet ("1 of 2 approvals").
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"


# What the decision service returns; the decision asked for stands. Every other outcome
# means it did not take effect.
DECIDED: tuple[DecisionOutcome, ...] = (DecisionOutcome.COMMITTED, DecisionOutcome.DECLINED, DecisionOutcome.REPLAY)
# Everything the decision service returns: a decision that stands, or an approval that is
# one of the several its policy needs. Every other outcome is a refusal or a failure.
RETURNED: tuple[DecisionOutcome, ...] = (*DECIDED, DecisionOutcome.AWAITING_APPROVAL)


class Failure(models.TextChoices):
    """How a decision that raised something other than a refusal is counted (metrics, events).

    The caller cannot know that a failed commit rolled back (a ``failed`` attempt row is
    written only when the effect store knows it), so a failed call says whether the commit
    may have happened.
    """

    UNCERTAIN = "outcome_uncertain", "Outcome uncertain"  # the commit may have happened: reconcile decides
    ERROR = "error", "Error"  # a failure of ours before the commit


def error_outcome(exc: BaseException) -> DecisionOutcome | Failure:
    """What a decision that raised ``exc`` is counted as: a refusal's outcome, or a failure."""
    if isinstance(exc, OutcomeUncertain):
        return Failure.UNCERTAIN
    if isinstance(exc, ConflictingDecision):
        return DecisionOutcome.CONFLICT
    if isinstance(exc, StaleProposal | AlreadyDecided):
        return DecisionOutcome.STALE
    if isinstance(exc, DecisionflowError) and type(exc) is not DecisionflowError:
        return DecisionOutcome.REFUSED
    return Failure.ERROR


class OperationState(models.TextChoices):
    """Where an operation stands in the decision and effect tables: what reconcile reads.

    Its own concept, apart from ``DecisionOutcome``: a state is read at any time from the
    tables, an outcome is what one call did.
    """

    PENDING = "Pending", "Pending"  # no decision yet
    AWAITING_APPROVAL = "AwaitingApproval", "AwaitingApproval"  # some approvals, fewer than its policy needs
    COMMITTED = "Committed", "Committed"  # approved, and its effect exists
    DECLINED = "Declined", "Declined"  # declined: there is no effect
    NO_LOCAL_EFFECT = "NoLocalEffectRecorded", "NoLocalEffectRecorded"  # approved, no effect: repair writes it


class ReceiptStatus(models.TextChoices):
    """The receipt's ``Status`` (docs/COMMANDS.md): the state the call left the operation in,
    or ``ConflictingDecision`` when the opposite decision stands and nothing was written."""

    COMMITTED = OperationState.COMMITTED.value, OperationState.COMMITTED.label
    DECLINED = OperationState.DECLINED.value, OperationState.DECLINED.label
    AWAITING_APPROVAL = OperationState.AWAITING_APPROVAL.value, OperationState.AWAITING_APPROVAL.label
    CONFLICTING = "ConflictingDecision", "ConflictingDecision"


class ReadSource(models.TextChoices):
    """Where a read-only page read its rows (core/replicas.py): the replica, or the primary
    and why. The ``source`` label of ``decisionflow_replica_reads`` and the staff footer."""

    REPLICA = "replica"
    OWN_WRITE = "primary_own_write"  # this session wrote within the lag window
    LAGGING = "primary_lagging"  # the replica is further behind than allowed
    UNREACHABLE = "primary_unreachable"  # the replica did not answer
    NOT_YET = "primary_not_yet_replicated"  # the replica did not have it (yet): read again
