"""One error class per refusal, each carrying its exit code and its HTTP status.

Every refusal carries a message an operator can act on. The admin shows it with
``message_user``; commands exit with ``exit_code`` (docs/COMMANDS.md); the API answers
``http_status`` with ``code`` in its JSON body (docs/API.md). The channels read these
attributes and nothing else, so a new refusal is one new class here.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from django.db import models

from core.identity import short


class RefusalReason(models.TextChoices):
    """Why a decision was refused: the one vocabulary of the audit (``CommitAttempt.reason``).

    Each refusal class names its reason, so a channel never chooses one itself.
    """

    OMITTED_DECISION = "omitted_decision", "Omitted decision"
    NO_PERMISSION = "no_permission", "No permission"
    FOUR_EYES = "four_eyes", "Four eyes"
    NOT_IN_GROUP = "not_in_group", "Not in the policy's groups"
    NOT_ASSIGNEE = "not_assignee", "Not the assignee"
    STALE = "stale", "Stale proposal"
    CHECKPOINT = "checkpoint", "Corrupt or incompatible checkpoint"
    BUSY = "busy", "Case busy"
    BAD_INPUT = "bad_input", "Bad input"
    NOT_FOUND = "not_found", "Not found"
    EVIDENCE_CHANGED = "evidence_changed", "Evidence changed"
    FAILED = "failed", "Failed"


class DecisionflowError(Exception):
    """A failure of our own that is not the caller's fault (the workflow could not pause)."""

    code = "internal_error"
    exit_code = 1
    http_status = 500
    reason = RefusalReason.FAILED

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidInput(DecisionflowError):
    code = "invalid_request"
    exit_code = 1
    http_status = 400
    reason = RefusalReason.BAD_INPUT


class DecisionOmitted(InvalidInput):
    """The request carried no real decision (no boolean, no Approve or Decline chosen)."""

    reason = RefusalReason.OMITTED_DECISION


class NotFound(DecisionflowError):
    code = "not_found"
    exit_code = 1
    http_status = 404
    reason = RefusalReason.NOT_FOUND


class PermissionRefused(DecisionflowError):
    code = "forbidden"
    exit_code = 1
    http_status = 403
    reason = RefusalReason.NO_PERMISSION


class MetricsRefused(PermissionRefused):
    """A ``/metrics`` request that fails a guard that is configured (docs/DEPLOY.md, "Metrics").

    The message names each check that failed, so an operator wiring a scraper knows which
    setting to look at; it never quotes the configured token nor the one sent.
    ``details["failed"]`` lists the checks by these names.
    """

    ALLOW_LIST = "allow_list"
    TOKEN = "token"
    NOT_CONFIGURED = "not_configured"

    @classmethod
    def not_configured(cls) -> MetricsRefused:
        return cls(
            "metrics are served to nobody: set DECISIONFLOW_METRICS_ALLOW (addresses or networks) "
            "or DECISIONFLOW_METRICS_TOKEN (a bearer token), or both",
            failed=[cls.NOT_CONFIGURED],
        )

    @classmethod
    def checks_failed(cls, *, address: str | None, token_sent: bool | None, both_set: bool) -> MetricsRefused:
        """``address``: the peer address that is not in the allow-list (None: it is, or there is
        no allow-list). ``token_sent``: whether an Authorization header came with a token that
        is not ours (None: the token matched, or there is no token)."""
        failed, reasons = [], []
        if address is not None:
            failed.append(cls.ALLOW_LIST)
            reasons.append(f"the address {address} is not in DECISIONFLOW_METRICS_ALLOW")
        if token_sent is not None:
            failed.append(cls.TOKEN)
            reasons.append(
                "the bearer token sent is not the one in DECISIONFLOW_METRICS_TOKEN"
                if token_sent
                else "no bearer token was sent (Authorization: Bearer <DECISIONFLOW_METRICS_TOKEN>)"
            )
        message = "metrics refused: " + "; and ".join(reasons)
        if both_set:
            message += (
                " (DECISIONFLOW_METRICS_ALLOW and DECISIONFLOW_METRICS_TOKEN are both set: a scrape must pass both)"
            )
        return cls(message, failed=failed)


class FourEyesRefused(DecisionflowError):
    """The reviewer made a human change in this proposal (an edit of its body or evidence).

    Four eyes: whoever changed what the pipeline prepared cannot also approve it; somebody
    else must. Declining stays allowed. 403, like any other "not you": the request is
    understood, the proposal is decidable, only this person may not approve it, and
    retrying will not change that. ``DECISIONFLOW_FOUR_EYES=0`` turns the rule off.
    """

    code = "four_eyes"
    exit_code = 8  # 7 is `edit` saved but not begun
    http_status = 403
    reason = RefusalReason.FOUR_EYES


class NotInGroup(DecisionflowError):
    """The policy names the groups whose members may decide its proposals, and the reviewer is
    in none of them (docs/ADMIN.md, "Reviewer groups").

    403, like four eyes: the proposal is decidable, only not by this person, and retrying
    will not change that; a member of one of the groups (or a lead who adds this reviewer to
    one) can. Approving and declining alike: the groups say who decides.
    """

    code = "not_in_group"
    exit_code = 11  # 10 is sla_report's "breached reviews listed"
    http_status = 403
    reason = RefusalReason.NOT_IN_GROUP

    @classmethod
    def of(cls, *, username: str, groups: tuple[str, ...], policy: str, operation_id: str) -> NotInGroup:
        """``username`` is in none of ``groups``, the groups policy ``policy`` (name and label) names."""
        # Quoted as JSON strings: a group name is free text, and the message is one line.
        named = ", ".join(json.dumps(name, ensure_ascii=True) for name in groups)
        return cls(
            f"not in group: {username} is not a member of {named}, the group{'s' if len(groups) > 1 else ''} "
            f"that may decide {short(operation_id)} under policy {policy}; a member must decide it; "
            "nothing was written",
            groups=list(groups),
            operation_id=operation_id,
        )


class NotAssignee(DecisionflowError):
    """The policy lets only the assignee decide (``assignee_only``), and the review is
    assigned to somebody else (docs/QUEUE.md, "Assignment"). 403 like ``not_in_group``:
    the assignee, or whoever it is handed over to, can decide it."""

    code = "not_assignee"
    exit_code = 14  # 12 and 13 are audit_verify's
    http_status = 403
    reason = RefusalReason.NOT_ASSIGNEE

    @classmethod
    def of(cls, *, username: str, assignee: str, policy: str, operation_id: str) -> NotAssignee:
        return cls(
            f"not the assignee: {short(operation_id)} is assigned to {assignee}, and policy {policy} lets only the "
            f"assignee decide; {username} may ask for it to be handed over; nothing was written",
            assignee=assignee,
            operation_id=operation_id,
        )


class StaleProposal(DecisionflowError):
    """The request names an operation that is not the case's current proposal."""

    code = "stale_proposal"
    exit_code = 4
    http_status = 409
    reason = RefusalReason.STALE

    def __init__(self, message: str, *, current_operation_id: str | None = None, **details):
        super().__init__(message, current_operation_id=current_operation_id, **details)
        self.current_operation_id = current_operation_id

    @classmethod
    def superseded(cls, *, operation_id: str, case_id: str, current_operation_id: str | None) -> StaleProposal:
        """``operation_id`` names a proposal of case ``case_id`` that is no longer its
        current one (``current_operation_id``, None when the case has none)."""
        current = short(current_operation_id) if current_operation_id else "none"
        return cls(
            f"stale: {short(operation_id)} is not the current proposal of case {case_id}; "
            f"the current one is {current}; nothing was written",
            current_operation_id=current_operation_id,
            case_id=case_id,
        )

    @classmethod
    def policy_superseded(
        cls, *, operation_id: str, case_id: str, policy: str, prepared_under: str, current: str
    ) -> StaleProposal:
        """``operation_id`` was prepared under version ``prepared_under`` of ``policy``, and
        the publish of version ``current`` has switched case ``case_id`` onto it: no decision
        under the old version commits once that publish has (docs/COMMANDS.md,
        publish_policy). The case's new proposal is being prepared, so there is no current
        operation to name yet."""
        return cls(
            f"stale: {short(operation_id)} was prepared under policy {policy} {prepared_under}, and {policy} "
            f"{current} has been published since; case {case_id} is being prepared again under {current} "
            "(reload to review its new proposal); nothing was written",
            current_operation_id=None,
            case_id=case_id,
            policy=policy,
            current_policy_label=current,
        )


class EvidenceChanged(DecisionflowError):
    """A newer version of a source this proposal cites no longer contains one of its
    quotations or licensed clauses verbatim: the proposal cannot be approved until a
    re-draft or an edit makes another proposal current (docs/INTAKE.md, "New source
    versions"). Declining stays allowed. 409, like stale: the proposal is no longer one
    that can be approved, and the same request will not change that."""

    code = "evidence_changed"
    exit_code = 4
    http_status = 409
    reason = RefusalReason.EVIDENCE_CHANGED

    @staticmethod
    def reason_of(*, what: str, source_id: str, version: int) -> str:
        """The mark's own words (``EvidenceChange.reason``): what is missing, and where."""
        return f"evidence changed: the {what} is no longer in {source_id} v{version}"

    @classmethod
    def of(cls, *, operation_id: str, case_id: str, reason: str) -> EvidenceChanged:
        return cls(
            f"{reason}: {short(operation_id)} of case {case_id} cannot be approved until it is re-drafted or "
            "edited (you may decline it); nothing was written",
            operation_id=operation_id,
            case_id=case_id,
            reason=reason,
        )


class AlreadyDecided(DecisionflowError):
    """The proposal a change names is decided: decided means decided, nothing replaces it."""

    code = "already_decided"
    exit_code = 4
    http_status = 409

    @classmethod
    def of(cls, *, operation_id: str, approved: bool, by: str, act: str) -> AlreadyDecided:
        """``operation_id`` was approved (or declined) by ``by``, so it cannot be ``act``
        ("edited", "re-drafted")."""
        return cls(
            f"already decided: {short(operation_id)} was {'approved' if approved else 'declined'} by {by} "
            f"and cannot be {act}; nothing was written",
            operation_id=operation_id,
        )


class ConflictingDecision(DecisionflowError):
    """The opposite decision is already recorded for this operation; nothing was written.

    ``result`` is the commit's own answer (the decision that stands, the effect count), so
    that a channel can show the receipt beside the refusal.
    """

    code = "conflicting_decision"
    exit_code = 3
    http_status = 409

    def __init__(self, message: str, *, result=None, **details):
        super().__init__(message, **details)
        self.result = result

    @staticmethod
    def standing(*, approved: bool | None, by: str | None) -> str:
        """What already stands: ``already approved by X`` (the attempt row's detail too);
        ``approved`` None when the decision is not known."""
        if approved is None:
            return "already decided the other way"
        return f"already {'approved' if approved else 'declined'} by {by}"

    @classmethod
    def of(cls, *, operation_id: str, approved: bool | None, by: str | None, result=None) -> ConflictingDecision:
        """The refusal of a decision on ``operation_id`` against the one that stands."""
        return cls(
            f"conflicting decision: {short(operation_id)} was {cls.standing(approved=approved, by=by)}; "
            "no decision or effect was written",
            result=result,
            operation_id=operation_id,
        )


class Withdrawn(ConflictingDecision):
    """The pipeline withdrew this operation's review (its ticket was closed elsewhere): the
    operation is declined for good, so an approval is refused; nothing was written.

    A conflict with its own code and exit code, so that whoever approves is told that the
    ticket is closed, by whom, when and why, and not only that somebody declined it.
    """

    code = "withdrawn"
    exit_code = 9
    http_status = 409

    @classmethod
    def of_withdrawal(cls, *, operation_id: str, by: str, at: datetime, reason: str | None, result=None) -> Withdrawn:
        """The refusal of an approval of ``operation_id``, which ``by`` (the pipeline's
        service user) withdrew at ``at``, saying ``reason`` (None: it gave none)."""
        why = f": {reason}" if reason else ""
        return cls(
            f"withdrawn: {short(operation_id)} was withdrawn by the pipeline ({by}) at "
            f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC{why}; the ticket was closed elsewhere, so it cannot be "
            "approved; no decision or effect was written",
            result=result,
            operation_id=operation_id,
        )


class WorkflowIncompatible(DecisionflowError):
    """A pending review from another workflow version, or a checkpoint that fails its checks."""

    code = "workflow_incompatible"
    exit_code = 5
    http_status = 409
    reason = RefusalReason.CHECKPOINT


class CaseBusy(DecisionflowError):
    """Another action on this case held its lock for longer than a decision waits.

    Nothing was written (the attempt row aside); the same request can simply be sent again.
    """

    code = "case_busy"
    exit_code = 6
    http_status = 409
    reason = RefusalReason.BUSY
    retry_after = 2  # seconds: the API's Retry-After

    @classmethod
    def held(cls, case_id: str) -> CaseBusy:
        """Case ``case_id`` was held by another action past the lock timeout."""
        return cls(f"another action on case {case_id} is in progress; try again", case_id=case_id)


class ClaimHeld(DecisionflowError):
    """Another reviewer holds a live claim on this review (docs/QUEUE.md).

    Claims are advisory: this refuses a second claim, never a decision. Only the admin's
    claim endpoints raise it (the API has none), so it is not in ``REFUSALS``.
    """

    code = "claim_held"
    exit_code = 1
    http_status = 409


class LockBusy(DecisionflowError):
    """A bulk command's lock (reconcile, repair) is held by another run."""

    code = "lock_busy"
    exit_code = 1
    http_status = 409


class OutcomeUncertain(DecisionflowError):
    """A failure once the commit may have run: only the effect store knows what happened."""

    code = "outcome_uncertain"
    exit_code = 42
    http_status = 500


class OperationIdMismatch(DecisionflowError):
    """The pipeline computed another operation identity for what it sent than we do: the two
    implementations of docs/PROTOCOL.md disagree, and nothing was written."""

    code = "operation_id_mismatch"
    exit_code = 1
    http_status = 422
    reason = RefusalReason.BAD_INPUT

    @classmethod
    def of(cls, *, sent: str, ours: str) -> OperationIdMismatch:
        return cls(
            f"operation_id: you computed {sent}, we compute {ours} for the same content; the two "
            "implementations of docs/PROTOCOL.md disagree (check the canonical bytes against its vectors); "
            "nothing was written",
            operation_id=ours,
            sent_operation_id=sent,
        )


class IdempotencyMismatch(DecisionflowError):
    """An Idempotency-Key sent again with another request than the first: refused, nothing written."""

    code = "idempotency_mismatch"
    exit_code = 1
    http_status = 422


class RequestInProgress(DecisionflowError):
    """The first request with this Idempotency-Key is still running: send it again shortly."""

    code = "in_progress"
    exit_code = 6
    http_status = 409
    retry_after = 1  # seconds: the API's Retry-After


class SigningKeyMissing(DecisionflowError):
    """No usable Ed25519 key to sign an audit export or a seal with (docs/AUDIT.md, "Keys").

    A configuration error, like a missing SECRET_KEY: a command exits 78, the admin answers 503
    with the message, and nothing is written or sent unsigned.
    """

    code = "signing_key_missing"
    exit_code = 78
    http_status = 503

    @classmethod
    def not_configured(cls) -> SigningKeyMissing:
        return cls(
            "no audit signing key: set DECISIONFLOW_AUDIT_SIGNING_KEY (the PEM text of an Ed25519 private key) "
            "or DECISIONFLOW_AUDIT_SIGNING_KEY_FILE (a PEM file); `manage.py audit_keygen DIR` makes a key pair"
        )

    @classmethod
    def unreadable(cls, source: str, why: str) -> SigningKeyMissing:
        """``source`` names where the key came from (the variable or the file), never the key."""
        return cls(f"the audit signing key in {source} cannot be used: {why}")


class AuditMismatch(DecisionflowError):
    """What ``audit_verify`` checked does not match what was signed (docs/AUDIT.md): an export
    edited after it was written, or signed by another key. The message names the first thing
    found, so the auditor knows where to look."""

    code = "audit_mismatch"
    exit_code = 12  # 11 is not in group
    http_status = 409

    @classmethod
    def export_edited(cls, path, why: str) -> AuditMismatch:
        return cls(f"audit_verify: {path} was changed after it was signed: {why}")

    @classmethod
    def export_signature(cls, sig) -> AuditMismatch:
        return cls(f"audit_verify: the signature in {sig} does not verify with this public key (the .sig was edited)")

    @classmethod
    def export_key(cls, sig, *, signed_by: str, given: str) -> AuditMismatch:
        return cls(
            f"audit_verify: {sig} was signed by key {signed_by}, the public key given is {given}: "
            "verify with the public key of the key that signed it"
        )

    @classmethod
    def chain_broken(cls, first, *, count: int) -> AuditMismatch:
        """The live database's chain: ``first`` names the first broken row or seal."""
        more = f" ({count - 1} more problem{'s' if count > 2 else ''} after it)" if count > 1 else ""
        return cls(f"audit_verify: broken: {first}{more}")

    @classmethod
    def unsealable(cls, label: str, row_id: int, problem: str) -> AuditMismatch:
        return cls(f"audit_seal: {label} {row_id} {problem}; it is not sealed (run manage.py audit_verify)")


class AuditNotSealed(DecisionflowError):
    """``audit_verify`` of the live database found no seal at all: every row hashes and links
    as written, and nothing signed says any of them existed (docs/AUDIT.md, "Seals")."""

    code = "audit_not_sealed"
    exit_code = 13
    http_status = 409

    @classmethod
    def rows(cls, count: int) -> AuditNotSealed:
        return cls(
            f"audit_verify: no seal yet: {count} rows hash and link as written, and none is sealed, so deleting "
            "one could not be proven (run manage.py audit_seal, from cron)"
        )


# The refusals of the pipeline's intake (docs/INTAKE.md), for the API's error table.
INTAKE_REFUSALS: tuple[type[DecisionflowError], ...] = (OperationIdMismatch, IdempotencyMismatch, RequestInProgress)

# Every refusal class, for the API's error table and the docs.
REFUSALS: tuple[type[DecisionflowError], ...] = (
    InvalidInput,
    PermissionRefused,
    FourEyesRefused,
    NotInGroup,
    NotAssignee,
    NotFound,
    StaleProposal,
    EvidenceChanged,
    AlreadyDecided,
    ConflictingDecision,
    Withdrawn,
    WorkflowIncompatible,
    CaseBusy,
    OutcomeUncertain,
    DecisionflowError,
)
