"""A new version of a source: every undecided current proposal citing an older one follows.

The one service behind ``POST /api/sources/{id}/versions`` (which runs the cases on a task
worker, as a job) and ``manage.py add_source_version`` (inline, with a progress bar). First
a plan (what would move and what would be marked: a dry run writes nothing), then the
version is added and the cases are handled one at a time, each in one transaction under its
case lock, read in batches from the database (workflow/batches.py): idempotent and
resumable, as a policy publish is.

For each undecided case whose current proposal cites an older version of the source:

- **moved**: every quotation and licensed clause it cites from that source is still in the
  new version verbatim (``evidence_missing``, the rule an edit of source versions applies).
  An evidence-change proposal (``proposal_revise`` with ``source_versions``) becomes current,
  with a new operation identity and no author: the pipeline moved evidence, nobody changed
  the text, so four eyes treats it like the proposal it came from. The case's other pending
  reviews are superseded and the new review is begun, as an edit does. An approval from a
  tab opened before is refused as stale.
- **marked**: one of them is gone. The proposal stays current, an ``EvidenceChange`` row
  records why (naming the source and version), and the case's ``evidence_hold`` names the
  operation; the commit refuses an approval of it (``EvidenceChanged``) until a re-draft or
  an edit makes another proposal current, which carries no mark. A decline stands.

The race with an approval: both take the case row. The mark (and the move, whose pointer
moves) updates the row under ``FOR NO KEY UPDATE``, after reading that the proposal is
undecided; the commit's write has a guard that holds the row as its read saw it, current
proposal and evidence hold included (effects/store.py). So an approval either committed
first (this reads it decided and leaves the case alone) or its guard finds the row changed,
and it reads again and is refused. A row lock alone, without the update, would not do: the
guard, having waited for it, would find the row as read and let the approval through.

Decided cases are never touched: history does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone
from django_tasks import task

from cases.models import Case, EvidenceChange, SelectedPassage, SourceVersion, SourceVersionJob
from cases.services import NewSourceVersion, source_version_check, source_version_create
from core import faults
from core.errors import CaseBusy, DecisionflowError, EvidenceChanged, PermissionRefused
from core.locks import case_lock
from reviews.groups import INTAKE_PERMISSION
from reviews.models import Channel, Proposal, ReviewDecision
from reviews.services import evidence_missing, proposal_revise
from workflow.batches import batch_size, cases_in_batches
from workflow.begin import begin_under_lock, pending_supersede_others

SAMPLE = 50  # rows of the plan shown before acting


class Follow(StrEnum):
    """What a new source version does to one case's current proposal."""

    MOVED = "moved"  # an evidence-change proposal on the new version became current
    MARKED = "marked"  # marked evidence changed: not approvable until a re-draft or an edit


@dataclass(frozen=True)
class PlanRow:
    case_id: str
    operation_id: str
    from_version: int
    action: Follow  # what applying would do
    reason: str  # for a mark, its reason; "" for a move


@dataclass(frozen=True)
class SourceVersionPlan:
    new: NewSourceVersion
    to_move: int
    to_mark: int
    sample: list[PlanRow]

    @property
    def total(self) -> int:
        return self.to_move + self.to_mark


@dataclass
class SourceVersionResult:
    plan: SourceVersionPlan
    applied: bool
    version_created: bool = False
    done: int = 0
    moved: int = 0
    marked: int = 0
    failed: list[tuple[str, DecisionflowError]] = field(default_factory=list)

    def summary(self) -> dict:
        new = self.plan.new
        return {
            "source_id": new.source.source_id,
            "version": new.version,
            "applied": self.applied,
            "version_created": self.version_created,
            "to_move": self.plan.to_move,
            "to_mark": self.plan.to_mark,
            "done": self.done,
            "moved": self.moved,
            "marked": self.marked,
            "failed": len(self.failed),
        }


def _intake_check(actor) -> None:
    if not (getattr(actor, "is_active", False) and actor.has_perm(INTAKE_PERMISSION)):
        name = actor.get_username() if hasattr(actor, "get_username") else "nobody"
        raise PermissionRefused(f"{name} does not have the intake permission ({INTAKE_PERMISSION}, the Pipeline group)")


def _decided():
    return Exists(ReviewDecision.objects.filter(proposal_id=OuterRef("current_proposal_id")))


def _candidates(sv: SourceVersion) -> QuerySet[Case]:
    """Undecided cases whose evidence comes from this source (the case file's selected
    passages name every source a proposal of the case can cite: an edit moves versions, never
    sources), and whose current proposal has no mark for this version yet. Which version the
    current proposal cites is in its JSON, read per case (``_older_cited``): a case already
    on this version is passed over, so a second run does nothing."""
    cases = (
        Case.objects.filter(current_proposal__isnull=False)
        .filter(~_decided())
        .filter(Exists(SelectedPassage.objects.filter(case=OuterRef("pk"), source_version__source_id=sv.source_id)))
        .select_related("current_proposal")
    )
    if sv.pk is None:
        return cases  # a dry run's version, not written yet: nothing is marked for it
    marked = EvidenceChange.objects.filter(operation_id=OuterRef("current_proposal__operation_id"), source_version=sv)
    return cases.exclude(Exists(marked))


def _older_cited(proposal: Proposal, sv: SourceVersion) -> int | None:
    """The older version of ``sv``'s source that ``proposal`` cites (None: none older)."""
    source_id = sv.source.source_id
    older = [i["version"] for i in proposal.passages + proposal.findings if i["source_id"] == source_id]
    older = [v for v in older if v < sv.version]
    return min(older) if older else None


def _verdict(proposal: Proposal, sv: SourceVersion) -> tuple[Follow, str]:
    """What follows for a proposal that cites an older version, and a mark's reason."""
    missing = evidence_missing(proposal, {sv.source.source_id: sv})
    if missing is None:
        return Follow.MOVED, ""
    _, what, _ = missing
    return Follow.MARKED, EvidenceChanged.reason_of(what=what, source_id=sv.source.source_id, version=sv.version)


def source_version_plan(*, source_id, version, text, size: int | None = None) -> SourceVersionPlan:
    """What adding this version would do now: how many cases would move, how many would be
    marked, and a sample. Checks the input (``InvalidInput`` naming the field, ``NotFound``
    for an unknown source); reads only."""
    new = source_version_check(source_id=source_id, version=version, text=text)
    sv = new.unsaved()
    to_move = to_mark = 0
    sample: list[PlanRow] = []
    # The plan does not write, so the cases it reads do not drop out: filter by pk alone.
    for case in cases_in_batches(lambda: _candidates(sv), size=batch_size(size)):
        proposal = case.current_proposal
        assert proposal is not None  # _candidates: every case has one
        older = _older_cited(proposal, sv)
        if older is None:
            continue
        action, reason = _verdict(proposal, sv)
        if action == Follow.MOVED:
            to_move += 1
        else:
            to_mark += 1
        if len(sample) < SAMPLE:
            sample.append(PlanRow(case.case_id, proposal.operation_id, older, action, reason))
    return SourceVersionPlan(new=new, to_move=to_move, to_mark=to_mark, sample=sample)


def _follow_case(case: Case, sv: SourceVersion, actor, channel: str) -> Follow | None:
    """One case, all or nothing, in one transaction holding the case lock: moved, marked, or
    None when it no longer needs it (decided, moved on, already on this version or marked)."""
    with case_lock(case.case_id):
        # The case row, as the commit's guard takes it (see the module): an approval that
        # committed first is seen by the reads below.
        locked = (
            Case.objects.select_for_update(no_key=True, of=("self",)).select_related("current_proposal").get(pk=case.pk)
        )
        current = locked.current_proposal
        if current is None or ReviewDecision.objects.filter(operation_id=current.operation_id).exists():
            return None
        if _older_cited(current, sv) is None:
            return None
        if EvidenceChange.objects.filter(operation_id=current.operation_id, source_version=sv).exists():
            return None
        action, reason = _verdict(current, sv)
        if action == Follow.MOVED:
            revision = proposal_revise(
                case=locked,
                expected_operation_id=current.operation_id,
                source_versions={sv.source.source_id: sv.version},
                editor=None,  # the pipeline moved evidence; no person changed the proposal
            )
            pending_supersede_others(locked, revision.proposal.operation_id)
            begin_under_lock(locked, actor, channel)
            return Follow.MOVED
        EvidenceChange.objects.create(case=locked, operation_id=current.operation_id, source_version=sv, reason=reason)
        Case.objects.filter(pk=locked.pk, current_proposal=current).update(evidence_hold=current.operation_id)
        return Follow.MARKED


def source_version_follow(
    *,
    sv: SourceVersion,
    actor,
    channel: str = Channel.SERVICE,
    result: SourceVersionResult,
    progress: Callable[[SourceVersionResult], None] | None = None,
    batch: int | None = None,
) -> SourceVersionResult:
    """Move or mark every undecided case citing an older version of ``sv``'s source, one
    transaction per case (``_follow_case``), read in batches. A case that is busy or whose
    review cannot be begun is left as it was and listed in ``failed``: a run again finishes
    it. ``progress(result)`` is called after each case."""
    for case in cases_in_batches(lambda: _candidates(sv), size=batch_size(batch)):
        proposal = case.current_proposal
        if proposal is None or _older_cited(proposal, sv) is None:
            continue  # on this version already: nothing to do, and not counted
        try:
            action = _follow_case(case, sv, actor, channel)
        except (CaseBusy, DecisionflowError) as exc:
            result.failed.append((case.case_id, exc))
        else:
            result.moved += action == Follow.MOVED
            result.marked += action == Follow.MARKED
        faults.crash_point("source-version-after-case")
        result.done += 1
        if progress is not None:
            progress(result)
    return result


def source_version_add(
    *,
    source_id,
    version,
    text,
    actor,
    channel: str = Channel.SERVICE,
    apply: bool = False,
    progress: Callable[[SourceVersionResult], None] | None = None,
    batch: int | None = None,
) -> SourceVersionResult:
    """Add version ``version`` with ``text`` to source ``source_id`` as ``actor`` (who needs
    the intake permission: ``PermissionRefused``), and bring the undecided cases onto it.

    Bad input is ``InvalidInput`` naming the field (a version number that exists with other
    text included) and writes nothing. Without ``apply``: the plan only, nothing written.
    With it: the version is written (the same number with the same text is the one already
    there), then the cases follow (``source_version_follow``). Idempotent and resumable.
    """
    _intake_check(actor)
    plan = source_version_plan(source_id=source_id, version=version, text=text, size=batch)
    result = SourceVersionResult(plan=plan, applied=apply)
    if not apply:
        return result
    sv, result.version_created = source_version_create(new=plan.new)
    faults.crash_point("source-version-after-create")
    return source_version_follow(sv=sv, actor=actor, channel=channel, result=result, progress=progress, batch=batch)


# -- the API's form: a job for the task workers ---------------------------------------------


def source_version_job_start(*, source_id, version, text, actor) -> tuple[SourceVersionResult, SourceVersionJob | None]:
    """Add the version now and hand the cases to a task worker: the job (None when no case
    needs it, e.g. the same version again once every case follows it), enqueued once its
    row is committed. Refusals are those of ``source_version_add`` and write nothing."""
    _intake_check(actor)
    plan = source_version_plan(source_id=source_id, version=version, text=text)
    result = SourceVersionResult(plan=plan, applied=True)
    with transaction.atomic():
        sv, result.version_created = source_version_create(new=plan.new)
        if plan.total == 0:
            return result, None
        job = SourceVersionJob.objects.create(source_version=sv, started_by=actor, total=plan.total)
        # Once the job's row is committed, so that a worker finds it.
        transaction.on_commit(lambda: source_version_job.enqueue(job.pk))
    return result, job


@task()
def source_version_job(job_pk: int) -> str:
    """The task a worker (``manage.py db_worker``) runs for one job."""
    return source_version_job_run(job_pk)


def source_version_job_run(job_pk: int) -> str:
    """Run one job (a task worker calls it): its state running, then done with its counts,
    or failed with the error. A job run twice (a task retried) finds the cases done by the
    first run already following, and counts only what it does itself."""
    job = SourceVersionJob.objects.select_related("source_version__source", "started_by").get(pk=job_pk)
    if job.state in (SourceVersionJob.State.DONE, SourceVersionJob.State.FAILED):
        return job.state
    SourceVersionJob.objects.filter(pk=job.pk).update(state=SourceVersionJob.State.RUNNING, updated_at=timezone.now())
    sv = job.source_version
    new = NewSourceVersion(sv.source, sv.version, sv.text, sv)
    result = SourceVersionResult(plan=SourceVersionPlan(new, 0, 0, []), applied=True)

    def counted(_: SourceVersionResult | None = None, *, state: str | None = None, error: str = "") -> None:
        fields: dict = {"done": result.done, "moved": result.moved, "marked": result.marked}
        fields.update(failed=len(result.failed), updated_at=timezone.now())
        if state is not None:
            fields.update(state=state, error=error)
        SourceVersionJob.objects.filter(pk=job.pk).update(**fields)

    try:
        source_version_follow(sv=sv, actor=job.started_by, channel=Channel.API, result=result, progress=counted)
    except Exception as exc:
        counted(state=SourceVersionJob.State.FAILED, error=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    counted(state=SourceVersionJob.State.DONE)
    return SourceVersionJob.State.DONE
