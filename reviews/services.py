"""Proposals: built once from a case's prepared work, revised only as new proposals.

Every write is a service here. The pointer ``Case.current_proposal`` moves only by
compare-and-swap, and a proposal row is never updated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from cases.models import Case, Policy, Source, SourceVersion
from cases.selectors import case_evidence
from cases.services import VERSION_RANGE, evidence_check
from core import identity, text
from core.errors import AlreadyDecided, InvalidInput, NotFound, OperationIdMismatch, StaleProposal
from reviews.models import Origin, Proposal, ReviewDecision

SOURCE_ID_MAX = Source._meta.get_field("source_id").max_length
VERSION_MIN, VERSION_MAX = VERSION_RANGE

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def unchecked_sentences(*, body: str, prepared: str) -> list[str]:
    """Sentences of ``body`` that the prepared draft does not contain, in order."""
    known = set(split_sentences(prepared))
    return [s for s in split_sentences(body) if s not in known]


@dataclass(frozen=True)
class RevisionResult:
    proposal: Proposal
    changed: bool


def _content(case: Case, *, body: str, passages: list[dict], findings: list[dict], policy: dict) -> dict:
    """Everything a proposal binds, with its three identities computed exactly once."""
    body = identity.normalize_newlines(body)
    ev = identity.evidence_id(passages)
    pol = identity.policy_id(policy["name"], policy["parameters"])
    return {
        "case": case,
        "action": case.action,
        "body": body,
        "passages": passages,
        "findings": findings,
        "policy_snapshot": policy,
        "evidence_id": ev,
        "policy_id": pol,
        "operation_id": identity.operation_id(case.case_id, case.action, body, ev, pol),
    }


def file_operation_id(data: dict) -> str:
    """The operation identity of the proposal a case file's import and begin will prepare,
    computed from the file alone (before anything is written): what the pipeline computes on
    its side with docs/PROTOCOL.md. ``data`` is a validated case file."""
    passages = [{k: p[k] for k in ("source_id", "version", "quotation")} for p in data["selected_evidence"]]
    policy = data["policy"]
    body = identity.normalize_newlines(data["draft"])
    return identity.operation_id(
        data["case_id"],
        data["action"],
        body,
        identity.evidence_id(passages),
        identity.policy_id(policy["name"], policy["parameters"]),
    )


def prepared_content(case: Case, *, evidence: tuple[list[dict], list[dict]] | None = None, policy=None) -> dict:
    """What ``proposal_create`` would insert for ``case`` (identities included), unsaved.

    ``evidence`` (``case_evidence``'s passages and findings) and ``policy`` (its snapshot:
    name, label, parameters), when the caller read them already; else they are read here.
    """
    passages, findings = case_evidence(case.pk) if evidence is None else evidence
    if policy is None:
        policy = {"name": case.policy.name, "label": case.policy.label, "parameters": case.policy.parameters}
    return _content(case, body=case.draft, passages=passages, findings=findings, policy=policy)


def _find_or_insert(fields: dict, *, savepoint: bool = True) -> Proposal:
    """Insert a proposal, or find the one that already has this identity.

    The unique constraint on ``operation_id`` decides; a savepoint keeps the surrounding
    transaction usable when the insert loses a race. Without ``savepoint`` (the caller
    knows no such proposal can exist) a unique violation fails the caller's transaction.
    """
    if not savepoint:
        return Proposal.objects.create(**fields)
    try:
        with transaction.atomic():
            return Proposal.objects.create(**fields)
    except IntegrityError:
        existing = Proposal.objects.filter(operation_id=fields["operation_id"]).first()
        if existing is None:
            raise
        return existing


def proposal_create(*, case: Case, author=None, first: bool = False) -> Proposal:
    """Build the prepared proposal for ``case`` and make it current if the case has none.

    Building the same content again finds the existing proposal. If the case has already
    moved on (an edit made another proposal current), the current proposal is returned
    unchanged: preparing again never rolls the pointer back.

    ``first``: the caller holds the case lock and has just read that the case has no current
    proposal, so none of its proposals exists (the first one always becomes current and the
    pointer is never cleared). The insert then takes no savepoint (two round trips fewer per
    begin); should it still meet an existing proposal, the unique violation fails the
    caller's transaction, and the caller retries without ``first``.
    """
    # No savepoint of its own: inside a caller's transaction (begin) a failure here fails
    # the whole of it anyway; alone, this is its own transaction.
    with transaction.atomic(savepoint=False):
        proposal = _find_or_insert(
            {**prepared_content(case), "origin": Origin.PREPARED, "parent": None, "author": author},
            savepoint=not first,
        )
        # Compare-and-swap from "no proposal yet".
        if Case.objects.filter(pk=case.pk, current_proposal__isnull=True).update(current_proposal=proposal):
            case.current_proposal = proposal  # swapped just now: the caller's object follows
            return proposal
        case.refresh_from_db(fields=["current_proposal"])
        current = case.current_proposal
        # Already set before the swap: never None here.
        assert current is not None
        return current


def _revised_passages(current: Proposal, source_versions: dict) -> tuple[list[dict], list[dict]]:
    """Move the named sources to other versions, checking each quotation still stands."""
    cited = {p["source_id"] for p in current.passages}
    unknown = set(source_versions) - cited
    if unknown:
        raise InvalidInput(
            f"source {sorted(unknown)[0]} is not among this proposal's selected evidence", field="source_versions"
        )
    wanted = {}
    for source_id, version in source_versions.items():
        if not isinstance(version, int) or isinstance(version, bool):
            raise InvalidInput(f"{source_id}: version must be an integer, not {version!r}", field="source_versions")
        sv = SourceVersion.objects.filter(source__source_id=source_id, version=version).first()
        if sv is None:
            raise InvalidInput(f"{source_id} has no version {version}", field="source_versions")
        wanted[source_id] = sv

    missing = evidence_missing(current, wanted)
    if missing is not None:
        item, what, sv = missing
        raise InvalidInput(
            f"the {what} from {item['source_id']} v{item['version']} is not in version {sv.version}: "
            f"{item[_CITED_TEXT[what]]!r}",
            field="source_versions",
        )

    def move(item: dict) -> dict:
        sv = wanted.get(item["source_id"])
        return dict(item) if sv is None else {**item, "version": sv.version}

    return [move(p) for p in current.passages], [move(f) for f in current.findings]


# What a proposal cites of a source version, by the word a message uses for it.
_CITED_TEXT = {"quotation": "quotation", "licensed clause": "licensed_clause"}


def evidence_missing(proposal: Proposal, versions: dict[str, SourceVersion]) -> tuple[dict, str, SourceVersion] | None:
    """The first quotation or licensed clause of ``proposal`` from a source in ``versions``
    that the version given for it does not contain verbatim, as (item, what, version); None
    when every one is still there. The one rule of "moving evidence to another version"."""
    for items, what in ((proposal.passages, "quotation"), (proposal.findings, "licensed clause")):
        for item in items:
            sv = versions.get(item["source_id"])
            if sv is not None and item[_CITED_TEXT[what]] not in sv.text:
                return item, what, sv
    return None


def _prepared_root(proposal: Proposal) -> Proposal:
    # ``parent`` is None without a query when ``parent_id`` is None.
    while (parent := proposal.parent) is not None:
        proposal = parent
    return proposal


def _locked_current(case: Case) -> tuple[Case, Proposal]:
    """The case row locked, and its current proposal. Must run inside the caller's transaction.

    NO KEY UPDATE: orders this change against a commit of the same case (which takes the
    same lock) without blocking the FOR KEY SHARE an attempt row's foreign key takes.
    """
    locked = Case.objects.select_for_update(no_key=True).filter(pk=case.pk).first()
    if locked is None:
        raise NotFound(f"case {case.case_id} does not exist")
    current = locked.current_proposal
    if current is None:
        raise InvalidInput(f"case {case.case_id} has no proposal yet; run begin first")
    return locked, current


def _undecided_check(current: Proposal, *, act: str) -> None:
    decision = ReviewDecision.objects.filter(operation_id=current.operation_id).select_related("reviewer").first()
    if decision is not None:
        raise AlreadyDecided.of(
            operation_id=current.operation_id,
            approved=decision.approved,
            by=decision.reviewer.get_username(),
            act=act,
        )


def _supersede(case: Case, current: Proposal, fields: dict, **pointer) -> Proposal:
    """Insert (or find) the proposal ``fields`` describe, with ``current`` as its parent, and
    move the case's pointer to it by compare-and-swap from ``current`` (``pointer``: other
    columns of the case that move with it). Runs under the row lock of ``_locked_current``."""
    proposal = _find_or_insert({**fields, "parent": current})
    moved = Case.objects.filter(pk=case.pk, current_proposal=current).update(current_proposal=proposal, **pointer)
    if moved != 1:
        # Unreachable while the row lock is held; kept so the CAS is the real guard.
        raise StaleProposal(f"stale: case {case.case_id} moved on during this change")
    case.current_proposal = proposal
    return proposal


def _body_check(body: str, *, field: str) -> None:
    # The text policy (docs/TEXT.md): the same check as load_case, for every channel.
    text.check_body(body, field=field)
    if not body.strip():
        raise InvalidInput(f"{field} must not be empty", field=field)


def proposal_revise(
    *,
    case: Case,
    expected_operation_id: str,
    body: str | None = None,
    source_versions: dict[str, int] | None = None,
    editor,
) -> RevisionResult:
    """Make a new proposal from the current one, with an edited body and/or source versions.

    Invariants: the request must name the case's current operation (else ``StaleProposal``);
    a decided proposal is never revised (``AlreadyDecided``); the pointer moves by
    compare-and-swap, so of two concurrent revisions from the same expected identity exactly
    one wins. A change of line endings only is "no change". One transaction: a refusal
    writes nothing.
    """
    if body is None and not source_versions:
        raise InvalidInput("an edit needs a new body, new source versions, or both")
    if body is not None:
        _body_check(body, field="body")
    for source_id, version in (source_versions or {}).items():
        text.check_text(source_id, field="source_versions key", one_line=True, max_length=SOURCE_ID_MAX)
        text.check_integer(version, field=f"source_versions.{source_id}", minimum=VERSION_MIN, maximum=VERSION_MAX)

    with transaction.atomic():
        # The case row locked, so a commit and an edit of the same case cannot interleave.
        locked, current = _locked_current(case)
        if current.operation_id != expected_operation_id:
            raise StaleProposal(
                f"stale: case {case.case_id} is now at {identity.short(current.operation_id)}, "
                f"not {identity.short(str(expected_operation_id))}",
                current_operation_id=current.operation_id,
            )
        _undecided_check(current, act="edited")

        new_body = current.body if body is None else body
        passages, findings = (
            _revised_passages(current, source_versions) if source_versions else (current.passages, current.findings)
        )
        content = _content(locked, body=new_body, passages=passages, findings=findings, policy=current.policy_snapshot)
        if content["operation_id"] == current.operation_id:
            return RevisionResult(current, False)

        body_changed = content["body"] != current.body
        root = _prepared_root(current)
        proposal = _supersede(
            case,
            current,
            {
                **content,
                "origin": Origin.HUMAN_EDIT if body_changed else Origin.EVIDENCE_CHANGE,
                "author": editor,
                "unchecked_sentences": unchecked_sentences(body=content["body"], prepared=root.body),
            },
        )
        return RevisionResult(proposal, True)


def proposal_redraft(
    *,
    case: Case,
    expected_operation_id: str,
    draft: str | None = None,
    selected_evidence: list[dict] | None = None,
    findings: list[dict] | None = None,
    operation_id: str | None = None,
) -> RevisionResult:
    """Supersede the case's current proposal with the pipeline's re-draft: a new body, new
    selected evidence, new findings, or any of them together (the rest kept from the current
    proposal; the policy kept too).

    The new proposal's origin is ``pipeline_redraft``, its parent the replaced proposal, and
    it has no author: the pipeline wrote it, so four eyes treats it like a prepared proposal.
    A new draft is the pipeline's own text and has no unchecked sentences; a kept body keeps
    the ones a person wrote. Evidence and findings follow the case file's rules against the
    stored source versions (``evidence_check``).

    Invariants, as for ``proposal_revise``: ``expected_operation_id`` must be the current
    proposal (else ``StaleProposal``) and undecided (else ``AlreadyDecided``); the pointer
    moves by compare-and-swap under the case row lock, so a commit of the old proposal either
    came first (and this is refused as decided) or is refused as stale. The same re-draft
    again is no change: the current proposal is already what it asks for, whether it was the
    expected one or the re-draft that replaced it. Findings are not part of the operation
    identity, so new findings alone, with the identity unchanged, are refused.
    ``operation_id``: the identity the pipeline computed for the new proposal; when it is not
    ours, ``OperationIdMismatch`` names both. One transaction: a refusal writes nothing.
    """
    if draft is None and selected_evidence is None and findings is None:
        raise InvalidInput("a re-draft needs draft, selected_evidence, findings, or more than one of them")
    if draft is not None:
        _body_check(draft, field="draft")

    with transaction.atomic():
        locked, current = _locked_current(case)
        base = current
        if current.operation_id != expected_operation_id:
            found = Proposal.objects.filter(case=locked, operation_id=expected_operation_id).first()
            if found is None:
                raise StaleProposal.superseded(
                    operation_id=str(expected_operation_id),
                    case_id=case.case_id,
                    current_operation_id=current.operation_id,
                )
            base = found
        else:
            _undecided_check(current, act="re-drafted")
        passages, new_findings = evidence_check(
            selected_evidence=base.passages if selected_evidence is None else selected_evidence,
            findings=base.findings if findings is None else findings,
        )
        content = _content(
            locked,
            body=base.body if draft is None else draft,
            passages=passages,
            findings=new_findings,
            policy=base.policy_snapshot,
        )
        same = content["operation_id"] == current.operation_id
        unchanged = same and content["findings"] == current.findings
        if base is not current and not unchanged:
            raise StaleProposal.superseded(
                operation_id=str(expected_operation_id),
                case_id=case.case_id,
                current_operation_id=current.operation_id,
            )
        if operation_id is not None and operation_id != content["operation_id"]:
            raise OperationIdMismatch.of(sent=operation_id, ours=content["operation_id"])
        if unchanged:
            return RevisionResult(current, False)
        if same:
            raise InvalidInput(
                "findings: new findings alone do not change the operation identity (docs/PROTOCOL.md: the draft, "
                "the selected evidence and the policy), so they cannot make a new proposal; send them with the "
                "draft or the evidence they belong to; nothing was written",
                field="findings",
            )
        proposal = _supersede(
            case,
            current,
            {
                **content,
                "origin": Origin.PIPELINE_REDRAFT,
                "author": None,
                "unchecked_sentences": [] if draft is not None else list(current.unchecked_sentences),
            },
        )
        return RevisionResult(proposal, True)


def proposal_policy_change(*, case: Case, policy: Policy) -> Proposal | None:
    """Supersede the case's undecided current proposal with one under ``policy``.

    The new proposal keeps the body and the evidence, takes the new policy snapshot and so
    a new policy and operation identity; origin ``policy_change``, the old proposal as its
    parent, and no author (the publisher did not write the text, so four eyes treats it
    like a prepared proposal). The case points at ``policy`` afterwards, so a case with no
    proposal yet is prepared under it.

    Returns the new proposal, or None when there is nothing to supersede: the current
    proposal is decided (history does not change) or already under this policy. Must run
    inside the caller's transaction: the case row is locked (the same lock a commit takes),
    so a concurrent approval either commits first, and then this finds it decided, or waits
    and is refused as stale. The pointer moves by compare-and-swap.
    """
    locked = Case.objects.select_for_update(no_key=True).filter(pk=case.pk).first()
    if locked is None:
        raise NotFound(f"case {case.case_id} does not exist")
    current = locked.current_proposal
    if current is None:
        if locked.policy_id != policy.pk:
            Case.objects.filter(pk=case.pk).update(policy=policy)
        return None
    if current.policy_id == policy.policy_id:
        return None
    if ReviewDecision.objects.filter(operation_id=current.operation_id).exists():
        return None
    snapshot = {"name": policy.name, "label": policy.label, "parameters": policy.parameters}
    content = _content(locked, body=current.body, passages=current.passages, findings=current.findings, policy=snapshot)
    proposal = _supersede(
        case,
        current,
        {
            **content,
            "origin": Origin.POLICY_CHANGE,
            "author": None,
            # The body did not change: its sentences a person wrote are still unchecked.
            "unchecked_sentences": list(current.unchecked_sentences),
        },
        policy=policy,
    )
    case.policy = policy
    return proposal
