"""Request and response shapes. Requests are strict: unknown fields, and anything but a JSON
boolean for ``approved``, are refused (400) before any service runs."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from ninja import Schema
from pydantic import BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from cases.models import SourceVersionJob
from core import text
from core.identity import OPERATION_ID_RE
from core.outcomes import RETURNED, OperationState, ReceiptStatus
from effects.models import DeliveryState, DeliveryTry
from reviews.models import HUMAN_DECLINE_REASONS, AssignmentKind, Channel, Origin, PendingReview
from workflow.assignment import NOTE_MAX
from workflow.withdraw import WITHDRAW_REASON_MAX

OPERATION_ID_PATTERN = OPERATION_ID_RE.pattern
DEMO_OPERATION_ID = "op-v1-e3976ac9e004f816de8a7695aa8b5bf99b16b3f893063045153b2a114922fbfc"

OperationId = Annotated[
    StrictStr,
    Field(pattern=OPERATION_ID_PATTERN, description="op-v1- and 64 lowercase hex digits", examples=[DEMO_OPERATION_ID]),
]


def _integral_float(value):
    # JSON Schema counts 4.0 as an integer, and Python's json reads it as a float; take it as
    # 4. Strings and booleans stay refused (StrictInt).
    if type(value) is float and value.is_integer():
        return int(value)
    return value


Version = Annotated[StrictInt, Field(ge=1, le=2_147_483_647), BeforeValidator(_integral_float)]


def one_of(values: Iterable[str]) -> Any:
    """The ``Literal`` of exactly these values, taken from the enum that owns them.

    The OpenAPI document lists them as the field's ``enum``, and a value added to the enum
    needs no edit here.
    """
    return Literal[tuple(str(value) for value in values)]


# The case's status before its review is begun; afterwards it is the reconcile state.
NOT_STARTED = "NotStarted"

if TYPE_CHECKING:
    # A Literal built at run time is opaque to mypy: to it these are strings.
    DeclineReasonIn = str
    ReceiptStatusOut = str
    WithdrawStatusOut = str
    OutcomeOut = str
    OriginOut = str
    PendingStatusOut = str
    ChannelOut = str
    DeliveryTryKindOut = str
    DeliveryTryOutcomeOut = str
    DeliveryStateOut = str
    OperationStateOut = str
    CaseStatusOut = str
    TextWarningKindOut = str
    JobStateOut = str
    AssignmentKindOut = str
else:
    DeclineReasonIn = one_of(HUMAN_DECLINE_REASONS)  # never a system actor's reason
    # A conflict is a 409.
    ReceiptStatusOut = one_of([ReceiptStatus.COMMITTED, ReceiptStatus.DECLINED, ReceiptStatus.AWAITING_APPROVAL])
    WithdrawStatusOut = one_of([ReceiptStatus.DECLINED])
    OutcomeOut = one_of(RETURNED)
    OriginOut = one_of(Origin.values)
    PendingStatusOut = one_of(PendingReview.Status.values)
    ChannelOut = one_of(Channel.values)
    DeliveryTryKindOut = one_of(DeliveryTry.Kind.values)
    DeliveryTryOutcomeOut = one_of(DeliveryTry.Outcome.values)
    DeliveryStateOut = one_of(DeliveryState.values)
    OperationStateOut = one_of(OperationState.values)
    CaseStatusOut = one_of([NOT_STARTED, *OperationState.values])
    TextWarningKindOut = one_of(text.MarkerKind)
    JobStateOut = one_of(SourceVersionJob.State.values)
    AssignmentKindOut = one_of(AssignmentKind.values)


class Strict(Schema):
    # A field we do not know is refused, never ignored: a "reviewer" in the body must not
    # look as if it had been honoured.
    model_config = ConfigDict(extra="forbid")


# Requests ---------------------------------------------------------------------------------


class DecisionIn(Strict):
    # A reason or a note goes with a decline only: said in the schema too (if/then), and
    # refused with 400 otherwise.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "if": {"properties": {"approved": {"const": True}}, "required": ["approved"]},
            "then": {"properties": {"reason": {"type": "null"}, "note": {"type": "null"}}},
        },
    )

    operation_id: OperationId
    approved: StrictBool = Field(description="true approves, false declines; nothing else is consent")
    reason: DeclineReasonIn | None = Field(
        default=None,
        description="with a decline: why (docs/QUEUE.md). A second decline is a replay: the first reason "
        "stands. Refused (400) with an approval; `expired` and `withdrawn` are reserved for the system",
    )
    note: Annotated[StrictStr, Field(max_length=2000)] | None = Field(
        default=None, description="with a decline: optional free text; the text policy applies (docs/TEXT.md)"
    )

    @model_validator(mode="after")
    def _reason_with_decline_only(self):
        if self.approved and (self.reason is not None or self.note is not None):
            raise ValueError("a decline reason or note goes with a decline only")
        return self


class EditIn(Strict):
    # At least one of body and source_versions, said in the schema too (anyOf), so a client
    # generated from the schema knows it. Neither may be null: leave a field out instead.
    # Hence the non-Optional types with a None default (pydantic does not validate defaults,
    # so None means "left out" while an explicit null is still refused); the ignores below
    # are for exactly that, which mypy cannot express.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"anyOf": [{"required": ["body"]}, {"required": ["source_versions"]}]},
    )

    expected_operation_id: OperationId
    body: StrictStr = Field(  # type: ignore[assignment]  # None = left out; null is refused (see above)
        default=None,
        min_length=1,
        pattern=r"\S",
        description="the new draft body; not blank. The text policy applies (docs/TEXT.md): bidirectional "
        "controls U+202A-U+202E and U+2066-U+2069, tag characters U+E0000-U+E007F, control characters other "
        "than LF and TAB (CR and CRLF become LF), and lone surrogates are refused with 400 invalid_request",
        json_schema_extra={"default": None},
    )
    source_versions: dict[Annotated[StrictStr, Field(min_length=1, max_length=100)], Version] = Field(
        default=None,  # type: ignore[arg-type]  # None = left out; null is refused (see above)
        min_length=1,
        description='move cited sources to other versions, e.g. {"HOLD-7": 4}',
    )

    @model_validator(mode="after")
    def _something_to_change(self):
        if self.body is None and not self.source_versions:
            raise ValueError("an edit needs body, source_versions, or both")
        return self


class WithdrawIn(Strict):
    operation_id: OperationId = Field(
        description="the operation the pipeline saw (the case's current proposal); another one is 409 stale_proposal"
    )
    reason: Annotated[StrictStr, Field(min_length=1, max_length=WITHDRAW_REASON_MAX)] | None = Field(
        default=None,
        description='optional, one line: why, e.g. "ticket closed in the helpdesk"; shown to reviewers, and the '
        "text policy applies (docs/TEXT.md)",
    )


Username = Annotated[StrictStr, Field(min_length=1, max_length=150)]
MoveNote = Annotated[StrictStr, Field(max_length=NOTE_MAX)]


class AssignIn(Strict):
    operation_id: OperationId = Field(
        description="the operation whose review you saw (the case's current proposal); another one is 409 "
        "stale_proposal"
    )
    to_user: Username | None = Field(
        default=None, description="a username: the person to assign it to (their substitute when they are away)"
    )
    to_group: Username | None = Field(default=None, description="a group's name; give to_user or to_group, not both")
    note: MoveNote = Field(default="", description="optional: why; the text policy applies (docs/TEXT.md)")


class HandOverIn(Strict):
    operation_id: OperationId = Field(
        description="the operation whose review you saw (the case's current proposal); another one is 409 "
        "stale_proposal"
    )
    to_user: Username = Field(description="a username: the reviewer who takes it (their substitute when away)")
    note: MoveNote = Field(description="required: why, for whoever takes it; the text policy applies (docs/TEXT.md)")


# Responses --------------------------------------------------------------------------------


class MoveOut(Schema):
    case: str
    operation_id: str
    replay: bool = Field(
        description="true: the review was already on this person or group; nothing was written, and the move "
        "that put it there is shown"
    )
    kind: AssignmentKindOut = Field(description="assigned (by a lead), handed_over (by a reviewer), escalated")
    by: str | None = Field(description="who moved it; null for the SLA escalation")
    to_user: str | None = Field(description="the person it is on now (a substitute, when meant_for is set)")
    to_group: str | None = Field(description="the group it is on now")
    meant_for: str | None = Field(description="the person the move named, when they were away")
    note: str
    at: datetime
    said: str = Field(description="the one line every channel shows, e.g. `T-1077 is now assigned to anna.`")


class ErrorOut(Schema):
    code: str = Field(
        description="stable, machine-readable: invalid_request, unauthorized, forbidden, four_eyes, not_in_group, not_assignee, not_found, "
        "method_not_allowed, stale_proposal, conflicting_decision, already_decided, workflow_incompatible, "
        "case_busy (with Retry-After), too_large, outcome_uncertain, internal_error; for the intake "
        "(docs/INTAKE.md): operation_id_mismatch, idempotency_mismatch, in_progress (with Retry-After); "
        "withdrawn (an approval of a review the pipeline withdrew); "
        "evidence_changed (a new source version no longer holds a quotation the proposal cites)"
    )
    message: str
    current_operation_id: str | None = Field(
        default=None, description="with stale_proposal: the case's current operation"
    )
    operation_id: str | None = Field(default=None, description="the operation the error is about, when there is one")
    sent_operation_id: str | None = Field(
        default=None, description="with operation_id_mismatch: the identity you sent (operation_id is ours)"
    )
    field: str | None = Field(default=None, description="with a refused case file: the field it names")


class DecisionOut(Schema):
    status: ReceiptStatusOut
    replay: bool
    effect_count: int
    operation_id: str
    outcome: OutcomeOut = Field(
        description="the decision service's outcome: the first approval, the first decline, the same decision again, "
        "or an approval that awaits another approver"
    )
    approvals: str | None = Field(
        default=None,
        description='under a policy that needs several approvers, how far its approvals are ("1 of 2 approvals"); '
        "null otherwise",
    )
    decline_reason: str | None = Field(
        default=None, description="the reason of the decision that stands (a replay keeps the first one)"
    )


class PassageOut(Schema):
    source_id: str
    version: int
    quotation: str


class FindingOut(Schema):
    finding: str
    licensed_clause: str
    source_id: str
    version: int


class PolicyOut(Schema):
    name: str
    label: str
    parameters: dict[str, int | str | bool]


class TextWarningOut(Schema):
    """A character or word the text policy keeps but marks (docs/TEXT.md)."""

    field: str = Field(description='where it stands, e.g. "body", "passages[0].quotation", "proposal.body"')
    kind: TextWarningKindOut
    index: int = Field(description="code point index in the field, from 0")
    line: int = Field(description="line in the field, from 1")
    column: int = Field(description="column in the line, from 1, in code points")
    text: str = Field(description="the character itself, or the stack, run, number or word")
    code_point: str = Field(
        description='"U+200B"; for more than a character, the code points (and names) of the characters that count'
    )
    name: str = Field(
        description='the Unicode name, e.g. "ZERO WIDTH SPACE", or what is marked, e.g. what a word mixes'
    )
    label: str = Field(
        description='the badge the admin shows, e.g. "ZWSP U+200B", "Latin+Cyrillic" or "Fullwidth digits: 1000"'
    )
    message: str


class TextWarningsOmittedOut(Schema):
    """A field with more markers than ``warnings`` lists (docs/TEXT.md)."""

    field: str
    count: int = Field(description="how many of the field's markers are not listed")
    message: str = Field(description='e.g. "body: and 124950 more"')


_LISTED = f"at most {text.MARKERS_LISTED} per field"
_TOTAL = f"how many markers there are in all; warnings lists {_LISTED}"
_OMITTED = "the fields whose list was cut, and how many of their markers are not listed"


class ProposalOut(Schema):
    operation_id: str
    action: str
    origin: OriginOut
    parent_operation_id: str | None
    author: str | None = Field(
        description="the person who made this human edit or evidence change; null for a proposal the "
        "pipeline prepared (it has no human author, whoever began the review)"
    )
    created_at: datetime
    body: str
    evidence_id: str
    policy_id: str
    passages: list[PassageOut]
    findings: list[FindingOut]
    policy: PolicyOut
    unchecked_sentences: list[str]
    warnings: list[TextWarningOut] = Field(
        description="invisible or format characters and mixed-script words in the proposal's texts: kept in the "
        "text and its identity, listed so that a client can show them, "
        f"{_LISTED} (docs/TEXT.md)"
    )
    warnings_total: int = Field(description=_TOTAL)
    warnings_omitted: list[TextWarningsOmittedOut] = Field(description=_OMITTED)


class PendingOut(Schema):
    status: PendingStatusOut
    workflow_version: str
    created_at: datetime
    begun_by: str | None = Field(description="who began the review; null when a command began it without a user")
    begun_channel: ChannelOut | None = Field(
        description="through which channel the review was begun (command: the CLI); null before this was recorded"
    )


class DecisionInfoOut(Schema):
    approved: bool
    reviewer: str
    decided_at: datetime
    decline_reason: str | None = Field(
        default=None, description="why it was declined (docs/QUEUE.md); null for an approval or no reason given"
    )
    decline_note: str | None = Field(default=None, description="the decliner's free text, if any")
    system_actor: str | None = Field(
        default=None,
        description="set when no person decided: sla-expiry (declined as expired) or pipeline-withdraw "
        "(withdrawn by the pipeline's service user, the reviewer)",
    )


class WithdrawOut(Schema):
    status: WithdrawStatusOut = Field(description="a withdrawn operation is declined")
    replay: bool = Field(description="true: it was declined before (withdrawn, or declined by a person or the SLA)")
    operation_id: str
    decline_reason: str | None = Field(
        description="the reason that stands: withdrawn, or the earlier decline's own on a replay"
    )
    decision: DecisionInfoOut = Field(description="the decline that stands")


class DeliveryTryOut(Schema):
    kind: DeliveryTryKindOut = Field(description="send: POST {url}/replies; lookup: GET {url}/replies/{key}")
    outcome: DeliveryTryOutcomeOut = Field(
        description="how the try ended (docs/DELIVERY.md): not_found from a lookup settles nothing by itself"
    )
    worker: str = Field(description="the worker (host:pid) that made the try")
    http_status: int | None = Field(description="the helpdesk's HTTP status; null when no answer came back")
    error: str | None = Field(description="what went wrong, when something did (a timeout, a bad answer)")
    latency_ms: int | None
    started_at: datetime


class DeliveryOut(Schema):
    state: DeliveryStateOut = Field(
        description="where the approved reply stands on the helpdesk; unknown: a request went out and no answer "
        "came back, so the helpdesk may have stored it: reconcile --repair settles it; needs_check: after unknown, "
        "the helpdesk refused the resend, so the reply may already be on the ticket: a person looks at the ticket "
        "first (docs/DELIVERY.md)"
    )
    reference: str | None = Field(description="the helpdesk's own reference of the stored reply (delivered)")
    reason: str | None = Field(description="why the helpdesk refused it (rejected, needs_check)")
    tries: int = Field(description="requests made so far, sends and lookups")
    created_at: datetime = Field(description="when the approval queued it (in the commit's transaction)")
    settled_at: datetime | None = Field(
        description="when it became delivered or rejected; null while needs_check (nobody knows yet)"
    )
    last_try: DeliveryTryOut | None = Field(description="the newest try; null before the first")


class OperationOut(Schema):
    operation_id: str
    case_id: str
    state: OperationStateOut
    effect_count: int
    approvals: str | None = Field(
        default=None,
        description='an undecided operation whose policy needs several approvers: how far its approvals are ("1 of 2 '
        'approvals"); null otherwise',
    )
    current: bool = Field(description="whether this is still the case's current proposal")
    decision: DecisionInfoOut | None
    delivery: DeliveryOut | None = Field(
        description="the reply's delivery to the helpdesk: null when there is none (a decline, no decision yet, "
        "or no helpdesk configured when it was approved)"
    )


class CaseOut(Schema):
    case_id: str
    subject: str
    status: CaseStatusOut = Field(
        description="where the case's current proposal stands: NotStarted before the review was begun, "
        "otherwise its reconcile state"
    )
    decidable: bool = Field(
        description="false once the current proposal is decided: a decision now is a replay or a conflict, "
        "never a new decision"
    )
    decision: DecisionInfoOut | None = Field(description="who decided the current proposal, and when")
    evidence_changed: str | None = Field(
        default=None,
        description="null, or why the current proposal cannot be approved: a new source version no longer "
        'holds a quotation or licensed clause it cites ("evidence changed: the quotation is no longer in HOLD-7 v4"). '
        "An approval is 409 evidence_changed until a re-draft or an edit; a decline stands (docs/INTAKE.md)",
    )
    operation_id: str = Field(
        description="the operation a decision must name now: the current proposal's, or "
        "before the review was begun, the one begin will prepare"
    )
    proposal: ProposalOut | None
    pending: PendingOut | None = Field(description="the paused review of the current proposal; null before it is begun")
    reconcile: OperationOut | None
    warnings: list[TextWarningOut] = Field(
        description="the text policy's markers of the case's subject and of its current proposal "
        '(fields of the proposal are prefixed "proposal."), '
        f"{_LISTED}; see docs/TEXT.md"
    )
    warnings_total: int = Field(description=_TOTAL)
    warnings_omitted: list[TextWarningsOmittedOut] = Field(description=_OMITTED)


class EditOut(Schema):
    changed: bool
    proposal: ProposalOut
    pending: PendingOut | None
    review_begun: bool = Field(
        description="whether the review of the new proposal was begun; the edit is saved either way"
    )
    review_error: str | None = Field(
        description="why beginning the review failed (the first decision on the new proposal begins it)"
    )


# Policy versions ------------------------------------------------------------------------


class PolicyPublishIn(Strict):
    name: StrictStr = Field(min_length=1, max_length=200, description="the policy's name; its versions share it")
    label: StrictStr = Field(min_length=1, max_length=100, description="display only, not part of the identity")
    parameters: dict[str, StrictBool | StrictInt | StrictStr] = Field(
        description="typed parameters (integer, string or boolean); they and the name make the policy identity"
    )
    apply: StrictBool = Field(
        default=False, description="false (the default): a dry run that says what would be superseded"
    )


class PolicyPlanRowOut(Schema):
    case_id: str
    operation_id: str | None = Field(description="the current proposal's; null: the case has no proposal yet")
    from_label: str


class PolicyPublishOut(Schema):
    policy: str
    label: str
    policy_id: str
    applied: bool
    to_supersede: int = Field(description="undecided current proposals under another version, when planned")
    to_move: int = Field(description="cases without a proposal yet, when planned")
    superseded: int
    moved: int
    failed: int = Field(description="cases left as they were (busy); publish again to finish")
    policy_created: bool
    sample: list[PolicyPlanRowOut] = Field(description="the first cases of the plan")


# The pipeline's intake (docs/INTAKE.md) ------------------------------------------------
# The shapes only: what a case file may hold is checked by the import itself
# (cases/services.py validate_case_data, the same rules as `load_case`), with 400 naming the field.


class SourceVersionIn(Strict):
    version: StrictInt
    text: StrictStr


class SourceIn(Strict):
    source_id: StrictStr
    title: StrictStr
    versions: list[SourceVersionIn]


class PassageIn(Strict):
    source_id: StrictStr
    version: StrictInt
    quotation: StrictStr


class FindingIn(Strict):
    finding: StrictStr
    licensed_clause: StrictStr
    source_id: StrictStr
    version: StrictInt


class PolicyIn(Strict):
    name: StrictStr
    label: StrictStr
    parameters: dict[str, StrictBool | StrictInt | StrictStr]


class CaseIn(Strict):
    """A case file (docs/CASE_FORMAT.md), with what the intake adds."""

    case_id: StrictStr = Field(examples=["T-2001"])
    subject: StrictStr
    customer_message: StrictStr
    action: StrictStr = Field(examples=["record_support_review"])
    sources: list[SourceIn]
    selected_evidence: list[PassageIn]
    findings: list[FindingIn]
    policy: PolicyIn
    draft: StrictStr
    depends_on: list[StrictStr] = Field(
        default=None,  # type: ignore[arg-type]  # None = left out; null is refused
        description="optional: the policy parameters the findings depend on",
        json_schema_extra={"default": None},
    )
    operation_id: OperationId = Field(  # type: ignore[assignment]  # None = left out; null is refused
        default=None,
        description="optional: the identity you computed for the prepared proposal (docs/PROTOCOL.md); "
        "422 operation_id_mismatch with both values when ours differs",
        json_schema_extra={"default": None},
    )
    begin: StrictBool = Field(
        default=True, description="begin the review, so the queue shows it (the default); false: import only"
    )

    def case_file(self) -> dict:
        """The case file itself, as `load_case` reads it."""
        return self.model_dump(exclude={"operation_id", "begin"}, exclude_none=True)


class IntakeOut(Schema):
    created: bool = Field(description="false: this case file came in before; nothing new was written")
    operation_id: str = Field(description="the identity of the case's prepared proposal")
    review_begun: bool = Field(description="whether the review is begun (with begin: true); the case is in either way")
    review_error: str | None = Field(description="why beginning the review failed (the first decision begins it)")
    case: CaseOut


# New source versions (docs/INTAKE.md, "New source versions") ------------------------------


class JobOut(Schema):
    id: int
    state: JobStateOut = Field(description="queued, running, done or failed")
    source_id: str
    version: int
    total: int = Field(description="the cases that needed the version when the job was started")
    done: int = Field(description="the cases handled so far: moved, marked, failed")
    moved: int = Field(description="given an evidence-change proposal on the new version (a new operation)")
    marked: int = Field(description="marked evidence changed: not approvable until re-drafted or edited")
    failed: int = Field(description="left as they were (busy, say): POST the version again to finish them")
    error: str | None = Field(description="with failed: why the job stopped")
    created_at: datetime
    updated_at: datetime


class SourceVersionAddOut(Schema):
    source_id: str
    version: int
    version_created: bool = Field(description="false: this version with this text was there already")
    to_move: int = Field(description="undecided cases whose quotations are all still in the new version")
    to_mark: int = Field(description="undecided cases with a quotation or licensed clause not in it")
    job: JobOut | None = Field(description="the job moving and marking them (202); null: no case needs it")


class DraftIn(Strict):
    """A re-draft (docs/INTAKE.md, Re-drafts): what replaces the case's current proposal."""

    # At least one of draft, selected_evidence and findings, said in the schema too (anyOf).
    # None means "left out" and an explicit null is refused, as in EditIn.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "anyOf": [{"required": ["draft"]}, {"required": ["selected_evidence"]}, {"required": ["findings"]}]
        },
    )

    expected_operation_id: OperationId = Field(description="the proposal this re-draft replaces: the current one")
    draft: StrictStr = Field(  # type: ignore[assignment]  # None = left out; null is refused
        default=None,
        description="the new body; not blank; the text policy applies (docs/TEXT.md). Left out: the body is kept",
        json_schema_extra={"default": None},
    )
    selected_evidence: list[PassageIn] = Field(
        default=None,  # type: ignore[arg-type]  # None = left out; null is refused
        description="the new selected evidence, as in a case file: each quotation in the text of a source "
        "version stored here. Left out: the evidence is kept",
        json_schema_extra={"default": None},
    )
    findings: list[FindingIn] = Field(
        default=None,  # type: ignore[arg-type]  # None = left out; null is refused
        description="the new findings, each citing selected evidence. Left out: the findings are kept",
        json_schema_extra={"default": None},
    )
    operation_id: OperationId = Field(  # type: ignore[assignment]  # None = left out; null is refused
        default=None,
        description="optional: the identity you computed for the new proposal (docs/PROTOCOL.md); "
        "422 operation_id_mismatch with both values when ours differs",
        json_schema_extra={"default": None},
    )
    begin: StrictBool = Field(default=True, description="begin the review of the new proposal (the default)")

    @model_validator(mode="after")
    def _something_to_change(self):
        if self.draft is None and self.selected_evidence is None and self.findings is None:
            raise ValueError("a re-draft needs draft, selected_evidence, findings, or more than one of them")
        return self

    def evidence(self) -> tuple[list[dict] | None, list[dict] | None]:
        """The selected evidence and the findings as the service takes them (None: kept)."""
        passages = None if self.selected_evidence is None else [p.model_dump() for p in self.selected_evidence]
        findings = None if self.findings is None else [f.model_dump() for f in self.findings]
        return passages, findings


class DraftOut(Schema):
    changed: bool = Field(
        description="false: the current proposal is already what this re-draft asks for; nothing was written"
    )
    operation_id: str = Field(description="the identity of the case's current proposal: the re-draft's")
    review_begun: bool = Field(
        description="whether the review of the new proposal was begun (with begin: true); saved either way"
    )
    review_error: str | None = Field(description="why beginning the review failed (the first decision begins it)")
    case: CaseOut
