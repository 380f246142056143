"""The JSON API for automation. Endpoints parse, call one service or selector, and answer.

Errors are all one JSON shape, ``{"code", "message"}``; see docs/API.md for the table.
"""

from __future__ import annotations

import json
import logging

from csp.decorators import csp_update
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, UnreadablePostError
from django.http.request import RawPostDataException
from django.shortcuts import render
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI, Path, Swagger
from ninja.errors import AuthenticationError, AuthorizationError, HttpError, ValidationError
from ninja.openapi.docs import _csrf_needed
from ninja.responses import Status

from api import selectors, services
from api.auth import AUTH
from api.parser import StrictJsonParser
from api.schemas import (
    DEMO_OPERATION_ID,
    OPERATION_ID_PATTERN,
    AssignIn,
    CaseIn,
    CaseOut,
    DecisionIn,
    DecisionOut,
    DraftIn,
    DraftOut,
    EditIn,
    EditOut,
    ErrorOut,
    HandOverIn,
    IntakeOut,
    JobOut,
    MoveOut,
    OperationOut,
    PolicyPublishIn,
    PolicyPublishOut,
    SourceVersionAddOut,
    SourceVersionIn,
    WithdrawIn,
    WithdrawOut,
)
from cases.idempotency import HEADER as IDEMPOTENCY_HEADER
from cases.idempotency import idempotent
from core import errors
from core.replicas import replica_reads
from reviews.models import Channel
from workflow.assignment import review_move
from workflow.decide import decision_record
from workflow.edit import review_edit
from workflow.intake import case_intake as intake_service
from workflow.publishing import policy_publish as publish_service
from workflow.redraft import case_redraft
from workflow.sources import source_version_job_start
from workflow.withdraw import case_withdraw as withdraw_service

logger = logging.getLogger(__name__)


# Swagger UI's icons are data: URLs in its stylesheet: its page alone adds data: images to the
# Content-Security-Policy (settings.py), to the policy sent and to its report-only twin alike.
DOCS_CSP = {"img-src": ["data:"]}


class LocalSwagger(Swagger):
    """Swagger UI from the package's own files (settings: its templates and static folders),
    whether or not ``ninja`` is an installed app; ninja itself would fall back to a CDN."""

    @method_decorator(csp_update(DOCS_CSP))
    @method_decorator(csp_update(DOCS_CSP, REPORT_ONLY=True))
    def render_page(self, request, api, **kwargs):
        self.settings["url"] = self.get_openapi_url(api, kwargs)
        context = {"swagger_settings": json.dumps(self.settings, indent=1), "api": api, "add_csrf": _csrf_needed(api)}
        return render(request, self.template, context)


api = NinjaAPI(
    title="decisionflow API",
    version="1",
    description="Approve, decline and edit proposals, and look up operations by their identity. See docs/API.md.",
    auth=AUTH,
    parser=StrictJsonParser(),
    urls_namespace="api",
    openapi_url="/openapi.json",
    docs_url="/docs",
    docs=LocalSwagger(),
)

# The error table: every application error class carries its own status and code
# (core/errors.py), so the table is built from the classes themselves.
ERROR_TABLE = {cls.code: cls.http_status for cls in errors.REFUSALS + errors.INTAKE_REFUSALS}
# Codes for the refusals that do not come from a service.
HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    429: "throttled",
}


def error_body(code: str, message: str, **extra) -> dict:
    return {"code": code, "message": message, **{k: v for k, v in extra.items() if v is not None}}


def _reply(request, status: int, code: str, message: str, **extra):
    return api.create_response(request, error_body(code, message, **extra), status=status)


@api.exception_handler(errors.DecisionflowError)
def _app_error(request, exc: errors.DecisionflowError):
    if type(exc) is errors.DecisionflowError:
        # The workflow failing (e.g. begin could not pause): not the client's fault, and
        # nothing the client can fix by changing the request.
        logger.error("workflow error in %s %s: %s", request.method, request.path, exc.message)
    message = exc.message
    if isinstance(exc, errors.OutcomeUncertain):
        op = exc.details.get("operation_id")
        message += (
            f"; the commit may have happened: GET /api/operations/{op} to see what did, then retry "
            "(a retry is a replay, never a duplicate)"
        )
    response = _reply(
        request,
        exc.http_status,
        exc.code,
        message,
        current_operation_id=getattr(exc, "current_operation_id", None),
        operation_id=exc.details.get("operation_id"),
        sent_operation_id=exc.details.get("sent_operation_id"),
        field=exc.details.get("field") if isinstance(exc, errors.InvalidInput) else None,
    )
    if isinstance(exc, errors.CaseBusy | errors.RequestInProgress):
        response["Retry-After"] = str(exc.retry_after)
    return response


@api.exception_handler(ValidationError)
def _validation_error(request, exc: ValidationError):
    parts = []
    for err in exc.errors[:10]:
        # ninja prefixes the location with the parameter source ("body", "path"); keep it.
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "payload")
        parts.append(f"{loc}: {err.get('msg', 'invalid')}" if loc else str(err.get("msg", "invalid")))
    return _reply(request, 400, "invalid_request", "; ".join(parts) or "invalid request")


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    cause = exc.__cause__
    if isinstance(cause, errors.DecisionflowError):  # our parser's refusal, wrapped by ninja
        return _app_error(request, cause)
    if isinstance(cause, RequestDataTooBig):
        return _too_large(request, cause)
    code = HTTP_CODES.get(exc.status_code, "error")
    message = str(exc)
    if isinstance(exc, AuthenticationError) and message == "Unauthorized":
        message = "authentication required: send Authorization: Bearer <token>, or use the admin session"
    if isinstance(exc, AuthorizationError) and message == "Forbidden":
        message = "forbidden"
    response = _reply(request, exc.status_code, code, message)
    if exc.status_code == 401:
        response["WWW-Authenticate"] = 'Bearer realm="decisionflow"'
    return response


@api.exception_handler(RequestDataTooBig)
def _too_large(request, exc):
    from django.conf import settings

    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return _reply(request, 413, "too_large", f"the request body is over the limit of {limit} bytes")


@api.exception_handler(RawPostDataException)
@api.exception_handler(UnreadablePostError)
@api.exception_handler(SuspiciousOperation)
def _unreadable_body(request, exc):
    # A form or multipart body, already consumed as form data (the session CSRF check reads
    # form fields), too many fields, or a client that hung up mid-body: not JSON we can read.
    return _reply(request, 400, "invalid_request", "the body must be a JSON object sent as application/json")


@api.exception_handler(Http404)
def _http404(request, exc):
    return _reply(request, 404, "not_found", "not found")


@api.exception_handler(Exception)
def _unexpected(request, exc):
    # A bug, not a refusal: log it with its traceback and answer in the same JSON shape.
    logger.exception("unexpected error in %s %s", request.method, request.path)
    return _reply(request, 500, "internal_error", f"internal error ({type(exc).__name__}); see the server log")


@csrf_exempt
def not_found(request: HttpRequest, *args, **kwargs):
    return JsonResponse(error_body("not_found", f"no API endpoint at {request.path[:200]}"), status=404)


def _errors(*statuses: int) -> dict:
    return dict.fromkeys(statuses, ErrorOut)


def _once_per_key(request, response: HttpResponse, endpoint: str, payload, run) -> Status:
    """The pipeline's requests with an ``Idempotency-Key`` (cases/idempotency.py): ``run``
    once per key, its first answer sent again to a retry, marked ``Idempotent-Replayed``."""
    answer = idempotent(
        user=request.auth,
        key=request.headers.get(IDEMPOTENCY_HEADER),
        endpoint=endpoint,
        body=payload.model_dump(mode="json"),
        run=run,
    )
    if answer.replayed:
        response["Idempotent-Replayed"] = "true"
    return Status(answer.status, answer.body)


CaseId = Path(..., description="the case's external ID, e.g. T-1042", examples=["T-1042"], max_length=100)
SourceId = Path(..., description="the source's ID, e.g. HOLD-7", examples=["HOLD-7"], max_length=100)
OperationIdPath = Path(
    ..., pattern=OPERATION_ID_PATTERN, description="op-v1- and 64 lowercase hex digits", examples=[DEMO_OPERATION_ID]
)


@api.get(
    "/cases/{case_id}",
    response={200: CaseOut, **_errors(400, 401, 403, 404)},
    tags=["cases"],
    operation_id="case_detail",
)
@replica_reads
def case_detail(request, case_id: str = CaseId):
    """The case's current proposal, its pending review, and its reconcile state."""
    return selectors.case_data(selectors.case_get(case_id))


@api.post(
    "/cases",
    response={200: IntakeOut, 201: IntakeOut, **_errors(400, 401, 403, 409, 413, 422, 500)},
    tags=["intake"],
    operation_id="case_intake",
)
def case_intake(request, payload: CaseIn, response: HttpResponse):
    """Bring a case in from the pipeline: the same content `load_case` takes (201; 200 with
    ``created: false`` when this case file came in before), and its review begun unless
    ``begin`` is false. Needs the intake permission (the Pipeline group).

    Send an ``Idempotency-Key`` header: the same key with the same body answers the first
    answer again with ``Idempotent-Replayed: true``; with another body, 422
    ``idempotency_mismatch``; while the first request runs, 409 ``in_progress`` with
    ``Retry-After``. See docs/INTAKE.md.
    """

    def run() -> tuple[int, dict]:
        result = intake_service(
            data=payload.case_file(),
            actor=request.auth,
            operation_id=payload.operation_id,
            begin=payload.begin,
            channel=Channel.API,
        )
        answer = {
            "created": result.created,
            "operation_id": result.operation_id,
            "review_begun": result.begun is not None,
            "review_error": result.begin_error.message if result.begin_error is not None else None,
            "case": selectors.case_data(selectors.case_get(result.case.case_id)),
        }
        # Stored as JSON for the replays, exactly as this first answer is sent.
        return (201 if result.created else 200), IntakeOut.model_validate(answer).model_dump(mode="json")

    return _once_per_key(request, response, "POST /api/cases", payload, run)


@api.post(
    "/cases/{case_id}/drafts",
    response={200: DraftOut, 201: DraftOut, **_errors(400, 401, 403, 404, 409, 413, 422, 500)},
    tags=["intake"],
    operation_id="case_redraft",
)
def case_redraft_post(request, payload: DraftIn, response: HttpResponse, case_id: str = CaseId):
    """Re-draft: the pipeline's new draft, selected evidence or findings for a case supersede
    its current proposal (``expected_operation_id``) with a ``pipeline_redraft`` proposal
    (201), and its review is begun unless ``begin`` is false. 200 with ``changed: false``
    when the current proposal is already what this asks for. A stale
    ``expected_operation_id`` is 409 ``stale_proposal``; a decided case 409
    ``already_decided``. Needs the intake permission (the Pipeline group). The same
    ``Idempotency-Key`` rules as ``POST /api/cases``. See docs/INTAKE.md.
    """
    case = selectors.case_get(case_id)

    def run() -> tuple[int, dict]:
        passages, findings = payload.evidence()
        result = case_redraft(
            case=case,
            expected_operation_id=payload.expected_operation_id,
            draft=payload.draft,
            selected_evidence=passages,
            findings=findings,
            operation_id=payload.operation_id,
            begin=payload.begin,
            actor=request.auth,
            channel=Channel.API,
        )
        answer = {
            "changed": result.revision.changed,
            "operation_id": result.revision.proposal.operation_id,
            "review_begun": result.begun is not None,
            "review_error": result.begin_error.message if result.begin_error is not None else None,
            "case": selectors.case_data(selectors.case_get(case.case_id)),
        }
        # Stored as JSON for the replays, exactly as this first answer is sent.
        return (201 if result.revision.changed else 200), DraftOut.model_validate(answer).model_dump(mode="json")

    return _once_per_key(request, response, f"POST /api/cases/{case.case_id}/drafts", payload, run)


@api.post(
    "/cases/{case_id}/decision",
    response={200: DecisionOut, **_errors(400, 401, 403, 404, 409, 413, 500)},
    tags=["cases"],
    operation_id="case_decision",
)
def case_decision(request, payload: DecisionIn, case_id: str = CaseId):
    """Approve or decline the operation you saw. The reviewer is you, the authenticated user.

    The same request again answers 200 with ``replay: true`` and writes nothing. Under a
    policy that needs several approvers, an approval before the last is 200 with outcome
    ``awaiting_approval`` and ``approvals`` "1 of 2 approvals": nothing is decided yet. The
    opposite decision is 409 ``conflicting_decision``. After a 500 ``outcome_uncertain``,
    GET the operation, then retry: a retry is a replay, never a duplicate.
    """
    decided = decision_record(
        case=selectors.case_get(case_id),
        operation_id=payload.operation_id,
        approved=payload.approved,
        reviewer=request.auth,
        channel=Channel.API,
        fault=services.fault_requested(request),
        decline_reason=payload.reason,
        decline_note=payload.note,
    )
    commit = decided.commit
    standing = commit.decision
    return {
        "decline_reason": standing.decline_reason if standing is not None else None,
        "status": commit.status,
        "replay": commit.replay,
        "effect_count": commit.effect_count,
        "operation_id": commit.operation_id,
        "outcome": decided.outcome.value,
        "approvals": commit.approvals_shown,
    }


def _moved(request, case_id: str, payload: AssignIn | HandOverIn) -> dict:
    """Both moves: the one service, the answer every channel gives (``Moved.as_dict``)."""
    case = selectors.case_get(case_id)
    moved = review_move(
        case=case,
        operation_id=payload.operation_id,
        by=request.auth,
        to_user=payload.to_user,
        to_group=payload.to_group if isinstance(payload, AssignIn) else None,
        note=payload.note,
        hand_over=isinstance(payload, HandOverIn),
    )
    return moved.as_dict(case.case_id)


@api.post(
    "/cases/{case_id}/assignment",
    response={200: MoveOut, **_errors(400, 401, 403, 404, 409, 413, 500)},
    tags=["cases"],
    operation_id="case_assign",
)
def case_assign(request, payload: AssignIn, case_id: str = CaseId):
    """Assign the pending review to one person or one group, as a support lead (the
    "assign reviews" permission; 403 otherwise), with an optional note: the review page's
    Assign form. A person who is away gets it through their substitute; a person or group who
    could not decide it under the policy's groups is 400. The same move again (the review is
    already there) answers 200 with ``replay: true`` and writes nothing. See docs/QUEUE.md,
    "Assignment"."""
    return _moved(request, case_id, payload)


@api.post(
    "/cases/{case_id}/hand-over",
    response={200: MoveOut, **_errors(400, 401, 403, 404, 409, 413, 500)},
    tags=["cases"],
    operation_id="case_hand_over",
)
def case_hand_over(request, payload: HandOverIn, case_id: str = CaseId):
    """Hand the pending review over to another reviewer, saying why (the note is required):
    the review page's Hand over form. Only a reviewer who may decide it may hand it over (403
    otherwise). The same hand-over again answers 200 with ``replay: true`` and writes nothing.
    See docs/QUEUE.md, "Assignment"."""
    return _moved(request, case_id, payload)


@api.post(
    "/cases/{case_id}/withdraw",
    response={200: WithdrawOut, **_errors(400, 401, 403, 404, 409, 413, 422, 500)},
    tags=["intake"],
    operation_id="case_withdraw",
)
def case_withdraw(request, payload: WithdrawIn, response: HttpResponse, case_id: str = CaseId):
    """Withdraw the pending review of the operation the pipeline saw, because the ticket was
    closed elsewhere: it is declined with reason ``withdrawn`` by the system actor
    ``pipeline-withdraw``, and a later approval is 409 ``withdrawn``. Needs the withdraw
    permission (the Pipeline group).

    The same withdrawal again answers 200 with ``replay: true``. An approved operation is 409
    ``conflicting_decision``; an operation that is not the case's current proposal, 409
    ``stale_proposal``. An ``Idempotency-Key`` is optional and works as the intake's. See
    docs/INTAKE.md, "Withdrawals".
    """
    case = selectors.case_get(case_id)

    def run() -> tuple[int, dict]:
        commit = withdraw_service(
            case=case,
            operation_id=payload.operation_id,
            actor=request.auth,
            reason=payload.reason,
            channel=Channel.API,
        )
        decision = commit.decision
        assert decision is not None  # a withdrawal that answers leaves a decline standing
        answer = {
            "status": commit.status,
            "replay": commit.replay,
            "operation_id": commit.operation_id,
            "decline_reason": decision.decline_reason,
            "decision": selectors.decision_data(decision),
        }
        return 200, WithdrawOut.model_validate(answer).model_dump(mode="json")

    answer = idempotent(
        user=request.auth,
        key=request.headers.get(IDEMPOTENCY_HEADER),
        endpoint=f"POST /api/cases/{case.case_id}/withdraw",
        body=payload.model_dump(mode="json"),
        run=run,
    )
    if answer.replayed:
        response["Idempotent-Replayed"] = "true"
    return Status(answer.status, answer.body)


@api.post(
    "/cases/{case_id}/edits",
    response={200: EditOut, 201: EditOut, **_errors(400, 401, 403, 404, 409, 413, 500)},
    tags=["cases"],
    operation_id="case_edit",
)
def case_edit(request, payload: EditIn, case_id: str = CaseId):
    """Edit the body and/or move cited sources to other versions: a new proposal (201).

    A change of line endings only is no change: 200 with ``changed: false``.
    """
    edited = review_edit(
        case=selectors.case_get(case_id),
        expected_operation_id=payload.expected_operation_id,
        body=payload.body,
        source_versions=payload.source_versions,
        editor=request.auth,
        channel=Channel.API,
    )
    revision = edited.revision
    data = {
        "changed": revision.changed,
        "proposal": selectors.proposal_data(revision.proposal),
        "pending": selectors.edit_pending_data(
            revision.proposal.operation_id,
            edited.begun.pending_review if edited.begun is not None else None,
            request.auth,
        ),
        # The edit is saved either way; a review that could not be begun is begun by the
        # first decision on the new proposal (or `manage.py begin`).
        "review_begun": edited.begun is not None,
        "review_error": edited.begin_error.message if edited.begin_error is not None else None,
    }
    return Status(201 if revision.changed else 200, data)


@api.post(
    "/policies/publish",
    response={200: PolicyPublishOut, **_errors(400, 401, 403, 413, 500)},
    tags=["policies"],
    operation_id="policy_publish",
)
def policy_publish(request, payload: PolicyPublishIn):
    """Publish a policy version; needs the "publish policy" permission (403 otherwise).

    Without ``apply: true`` a dry run: what would be superseded, nothing written. With it,
    every undecided current proposal under another version of the policy is superseded by
    a ``policy_change`` proposal whose review is begun. The same request again does nothing.
    """
    data = {"name": payload.name, "label": payload.label, "parameters": payload.parameters}
    result = publish_service(data=data, publisher=request.auth, channel=Channel.API, apply=payload.apply)
    return {
        **result.summary(),
        "sample": [
            {"case_id": r.case_id, "operation_id": r.operation_id, "from_label": r.from_label}
            for r in result.plan.sample
        ],
    }


@api.post(
    "/sources/{source_id}/versions",
    response={
        200: SourceVersionAddOut,
        201: SourceVersionAddOut,
        202: SourceVersionAddOut,
        **_errors(400, 401, 403, 404, 409, 413, 422, 500),
    },
    tags=["intake"],
    operation_id="source_version_add",
)
def source_version_add(request, payload: SourceVersionIn, response: HttpResponse, source_id: str = SourceId):
    """Add a version to a source, and bring every undecided proposal citing an older version
    onto it: moved (a new evidence-change proposal, a new operation) when its quotations are
    all still in the new text, else marked evidence changed (its approval refused until a
    re-draft or an edit). Needs the intake permission (the Pipeline group).

    202 with a job to poll (``GET /api/jobs/{id}``) when some case needs it; otherwise 201
    (the version is new) or 200 (this version with this text was there already: a no-op).
    The same number with other text is 400 naming ``version``, and nothing is written.
    ``Idempotency-Key`` as for ``POST /api/cases``. See docs/INTAKE.md.
    """

    def run() -> tuple[int, dict]:
        result, job = source_version_job_start(
            source_id=source_id, version=payload.version, text=payload.text, actor=request.auth
        )
        answer = {
            **{k: result.summary()[k] for k in ("source_id", "version", "version_created", "to_move", "to_mark")},
            "job": selectors.job_out(job) if job is not None else None,
        }
        status = 202 if job is not None else 201 if result.version_created else 200
        return status, SourceVersionAddOut.model_validate(answer).model_dump(mode="json")

    return _once_per_key(request, response, f"POST /api/sources/{source_id}/versions", payload, run)


@api.get(
    "/jobs/{job_id}",
    response={200: JobOut, **_errors(400, 401, 403, 404)},
    tags=["intake"],
    operation_id="job_detail",
)
def job_detail(request, job_id: int):
    """A job started by ``POST /api/sources/{id}/versions``: its state and its counts so far."""
    return selectors.job_data(job_id)


@api.get(
    "/operations/{operation_id}",
    response={200: OperationOut, **_errors(400, 401, 403, 404)},
    tags=["operations"],
    operation_id="operation_detail",
)
def operation_detail(request, operation_id: str = OperationIdPath):
    """What happened to one operation: Pending, Committed, Declined or NoLocalEffectRecorded.

    Read from the decision and effect tables; after a lost response, ask this instead of guessing.
    """
    return selectors.operation_data(operation_id)
