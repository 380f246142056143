"""A new source version: which undecided proposals move onto it, which are marked, and doing it safely.

Each case is a copy of the demo T-1042, which cites HOLD-7 v2 (a quotation and two licensed
clauses) and KB-311 v3. The seed has HOLD-7 v4 too; these tests add v5: either v4's text
(every quotation still in it: the cases move) or a text without the quotation "Engineering
needs a diagnostic export ..." (the cases are marked).
"""

from __future__ import annotations

import json
import signal
import threading

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import Client
from django.urls import reverse

from cases.models import Case, EvidenceChange, SourceVersion
from cases.services import case_import
from core.errors import EvidenceChanged, InvalidInput, NotFound, PermissionRefused, StaleProposal
from effects.models import CommitAttempt, EffectRecord
from reviews.models import Origin, PendingReview, Proposal, ReviewDecision
from tests.conftest import Terminal, command_run, load_fixture, snapshot
from workflow.begin import review_begin
from workflow.decide import decision_record
from workflow.edit import review_edit
from workflow.sources import source_version_add

SEED = {v["version"]: v["text"] for v in load_fixture("t1042.json")["sources"][0]["versions"]}
QUOTATION = "Engineering needs a diagnostic export from affected units before advising any change."
SAME = SEED[4]  # every quotation and clause of v2 is still in it
DROPPED = SEED[4].replace(QUOTATION + " ", "")  # the quotation (and a licensed clause) gone


def new_case(case_id: str) -> Case:
    return case_import(data={**load_fixture("t1042.json"), "case_id": case_id}).case


def begun(case_id: str) -> Case:
    case = new_case(case_id)
    review_begin(case=case)
    case.refresh_from_db()
    return case


def current(case: Case) -> Proposal:
    return Case.objects.select_related("current_proposal").get(pk=case.pk).current_proposal


def hold7(proposal: Proposal) -> set[int]:
    return {i["version"] for i in proposal.passages + proposal.findings if i["source_id"] == "HOLD-7"}


@pytest.fixture
def world(db, reviewer, pipeline):
    pending = begun("S-PENDING")
    other = begun("S-OTHER")
    decided = begun("S-DECIDED")
    decision_record(
        case=decided, operation_id=current(decided).operation_id, approved=True, reviewer=reviewer, channel="test"
    )
    fresh = new_case("S-FRESH")  # no proposal yet: begin prepares it from the case file
    return {"pending": pending, "other": other, "decided": decided, "fresh": fresh}


def add(actor, text=SAME, version=5, **kw):
    return source_version_add(source_id="HOLD-7", version=version, text=text, actor=actor, **kw)


def test_a_version_holding_every_quotation_moves_the_undecided_cases_to_a_new_identity(world, pipeline, reviewer):
    before = {name: current(c) for name, c in world.items() if name != "fresh"}
    result = add(pipeline, apply=True)
    assert result.version_created and (result.moved, result.marked, result.failed) == (2, 0, [])
    for name in ("pending", "other"):
        case, old = world[name], before[name]
        new = current(case)
        assert new.operation_id != old.operation_id and new.parent_id == old.pk
        assert new.origin == Origin.EVIDENCE_CHANGE and new.author is None and new.body == old.body
        assert hold7(new) == {5} and hold7(old) == {2}
        assert sorted(PendingReview.objects.filter(case=case).values_list("operation_id", "status")) == sorted(
            [(old.operation_id, "superseded"), (new.operation_id, "pending")]
        )
        # The old tab is stale; the new proposal is approvable by anyone (no author: four eyes
        # treats it like the prepared proposal).
        with pytest.raises(StaleProposal):
            decision_record(case=case, operation_id=old.operation_id, approved=True, reviewer=reviewer, channel="t")
    assert current(world["decided"]) == before["decided"]  # history does not change
    assert current(world["fresh"]) is None
    assert (
        decision_record(
            case=world["pending"],
            operation_id=current(world["pending"]).operation_id,
            approved=True,
            reviewer=reviewer,
            channel="t",
        ).outcome
        == "committed"
    )


def test_the_same_version_twice_moves_nothing_the_second_time(world, pipeline):
    add(pipeline, apply=True)
    proposals = Proposal.objects.count()
    again = add(pipeline, apply=True)
    assert not again.version_created and (again.done, again.moved, again.marked) == (0, 0, 0)
    assert Proposal.objects.count() == proposals


def test_a_dry_run_shows_the_plan_and_writes_nothing(world, pipeline):
    before, versions = snapshot(), SourceVersion.objects.count()
    plan = add(pipeline).plan
    assert (plan.to_move, plan.to_mark) == (2, 0)
    assert {r.case_id for r in plan.sample} == {"S-PENDING", "S-OTHER"}
    dropped = add(pipeline, text=DROPPED).plan
    assert (dropped.to_move, dropped.to_mark) == (0, 2)
    assert dropped.sample[0].reason == "evidence changed: the quotation is no longer in HOLD-7 v5"
    assert snapshot() == before and SourceVersion.objects.count() == versions


def test_a_version_without_a_quotation_marks_the_proposal_and_refuses_its_approval(world, pipeline, reviewer):
    old = current(world["pending"])
    result = add(pipeline, text=DROPPED, apply=True)
    assert (result.moved, result.marked) == (0, 2)
    case = Case.objects.get(pk=world["pending"].pk)
    assert current(case) == old and case.evidence_hold == old.operation_id
    mark = EvidenceChange.objects.get(operation_id=old.operation_id)
    assert mark.reason == "evidence changed: the quotation is no longer in HOLD-7 v5"
    for _ in range(2):
        with pytest.raises(EvidenceChanged, match="no longer in HOLD-7 v5") as refused:
            decision_record(case=case, operation_id=old.operation_id, approved=True, reviewer=reviewer, channel="t")
    assert refused.value.http_status == 409 and refused.value.code == "evidence_changed"
    assert not ReviewDecision.objects.filter(operation_id=old.operation_id).exists()
    attempts = CommitAttempt.objects.filter(operation_id=old.operation_id, reason="evidence_changed")
    assert attempts.count() == 2
    # Marked once: a second run leaves it as it is.
    assert add(pipeline, text=DROPPED, apply=True).done == 0
    assert EvidenceChange.objects.filter(operation_id=old.operation_id).count() == 1
    # A decline stands.
    other = current(world["other"])
    assert (
        decision_record(
            case=world["other"], operation_id=other.operation_id, approved=False, reviewer=reviewer, channel="t"
        ).outcome
        == "declined"
    )


def test_an_edit_of_a_marked_proposal_lifts_the_mark(world, pipeline, reviewer, editor, make_user):
    add(pipeline, text=DROPPED, apply=True)
    case, old = world["pending"], current(world["pending"])
    edited = review_edit(
        case=case, expected_operation_id=old.operation_id, body=old.body + "\n\nThanks.", editor=editor
    )
    new = edited.revision.proposal
    assert new.operation_id != old.operation_id
    assert (
        decision_record(case=case, operation_id=new.operation_id, approved=True, reviewer=reviewer, channel="t").outcome
        == "committed"
    )


def test_the_review_page_shows_the_reason_instead_of_approve(world, pipeline, reviewer):
    add(pipeline, text=DROPPED, apply=True)
    old = current(world["pending"])
    client = Client()
    client.force_login(reviewer)
    page = client.get(reverse("admin:reviews_proposal_review", args=[old.pk])).content.decode()
    assert 'id="df-evidence-changed"' in page and 'id="df-approve"' not in page and 'id="df-decline"' in page
    assert "Evidence changed: the quotation is no longer in HOLD-7 v5" in page
    response = client.post(
        reverse("admin:reviews_proposal_decide", args=[old.pk]),
        {"operation_id": old.operation_id, "decision": "approve"},
        follow=True,
    )
    shown = " ".join(str(m) for m in response.context["messages"])
    assert "evidence changed: the quotation is no longer in HOLD-7 v5" in shown
    assert not ReviewDecision.objects.exists() or not ReviewDecision.objects.filter(operation_id=old.operation_id)


@pytest.mark.parametrize(
    ("version", "text", "field"),
    [
        (4, SEED[4] + " Changed.", "version"),  # v4 exists with other text: versions are immutable
        (2, DROPPED, "version"),
        (-1, SAME, "version"),
        (2**31, SAME, "version"),
        ("5", SAME, "version"),
        (5, "bad \x07 bell", "text"),
        (5, 5, "text"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_nothing_is_written(world, pipeline, version, text, field):
    before, versions = snapshot(), SourceVersion.objects.count()
    for apply in (False, True):
        with pytest.raises(InvalidInput) as refused:
            add(pipeline, text=text, version=version, apply=apply)
        assert refused.value.details["field"] == field
    assert snapshot() == before and SourceVersion.objects.count() == versions


def test_an_unknown_source_and_the_version_limit(world, pipeline):
    with pytest.raises(NotFound, match="no source NOPE-1"):
        source_version_add(source_id="NOPE-1", version=1, text="x", actor=pipeline, apply=True)
    for number in range(5, 23):
        SourceVersion.objects.create(source_id=SourceVersion.objects.get(version=2).source_id, version=number, text="x")
    with pytest.raises(InvalidInput, match="at most 20") as refused:
        add(pipeline, version=40, apply=True)
    assert refused.value.details["field"] == "version"


def test_only_the_intake_permission_adds_a_version(world, reviewer, lead):
    before = snapshot()
    for user in (reviewer, lead):
        with pytest.raises(PermissionRefused, match="intake permission"):
            add(user, apply=True)
    assert snapshot() == before and not SourceVersion.objects.filter(version=5).exists()


# --- the command -----------------------------------------------------------------------


def run(*args, stdout=None):
    return command_run("add_source_version", *args, stdout=stdout)


@pytest.fixture
def text_file(tmp_path):
    def write(text=SAME):
        path = tmp_path / "hold-7.txt"
        path.write_text(text)
        return str(path)

    return write


def test_command_is_a_dry_run_unless_told_to_apply(world, pipeline, text_file):
    before = snapshot()
    code, out, _ = run("HOLD-7", "5", "--text-file", text_file(), "--actor", "pipeline")
    assert code == 0 and snapshot() == before and not SourceVersion.objects.filter(version=5).exists()
    assert out.count("\n") == 1 and "dry run" in out and "to_move=2 to_mark=0" in out
    code, out, _ = run("HOLD-7", "5", "--text-file", text_file(), "--actor", "pipeline", "--apply", "--json")
    assert code == 0
    summary = json.loads(out)
    assert (summary["moved"], summary["marked"], summary["version_created"]) == (2, 0, True)
    code, out, _ = run("HOLD-7", "5", "--text-file", text_file(), "--actor", "pipeline", "--apply", "--json")
    assert json.loads(out)["moved"] == 0


def test_command_shows_a_progress_bar_on_a_terminal_only(world, pipeline, text_file):
    code, out, _ = run("HOLD-7", "5", "--text-file", text_file(DROPPED), "--actor", "pipeline", stdout=Terminal())
    assert code == 0 and "would mark S-OTHER" in out and "no longer in HOLD-7 v5" in out
    code, out, _ = run(
        "HOLD-7", "5", "--text-file", text_file(DROPPED), "--actor", "pipeline", "--apply", stdout=Terminal()
    )
    assert code == 0 and "following" in out and "2/2" in out and "marked=2" in out


def test_command_refuses_bad_input_and_a_reviewer(world, reviewer, text_file):
    before = snapshot()
    code, _, err = run("HOLD-7", "4", "--text-file", text_file("other"), "--actor", "pipeline", "--apply")
    assert code == 1 and "version: HOLD-7 version 4 already exists with different text" in err
    code, _, err = run("HOLD-7", "5", "--text-file", text_file(), "--actor", "reviewer", "--apply")
    assert code == 1 and "does not have the intake permission" in err
    assert snapshot() == before


def test_command_help(capsys):
    with pytest.raises(SystemExit):
        call_command("add_source_version", "--help")
    assert "dry run" in capsys.readouterr().out


# --- crash and race --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_sigkill_mid_run_then_rerun_leaves_no_duplicates_and_no_gaps(manage, make_user, tmp_path):
    make_user("pipeline", group="pipeline")
    cases = [begun(f"S-KILL-{i}") for i in range(3)]
    olds = {c.pk: current(c) for c in cases}
    path = tmp_path / "v5.txt"
    path.write_text(SAME)
    args = ("add_source_version", "HOLD-7", "5", "--text-file", str(path), "--apply", "--actor", "pipeline")
    killed = manage(*args, "--batch-size", "2", DECISIONFLOW_CRASH_AT="source-version-after-case")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert Proposal.objects.filter(origin=Origin.EVIDENCE_CHANGE).count() == 1  # its first case committed
    rerun = manage(*args, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["moved"] == 2 and not json.loads(rerun.stdout)["version_created"]
    for case in cases:
        new = current(case)
        assert new.origin == Origin.EVIDENCE_CHANGE and new.parent_id == olds[case.pk].pk and hold7(new) == {5}
        assert Proposal.objects.filter(case=case).count() == 2
        assert sorted(PendingReview.objects.filter(case=case).values_list("operation_id", "status")) == sorted(
            [(new.operation_id, "pending"), (olds[case.pk].operation_id, "superseded")]
        )
    assert json.loads(manage(*args, "--json").stdout)["moved"] == 0


def _race(pipeline, reviewer, cases, olds, text):
    """Approve every case's old operation while the version is added, all at once. The
    approvals of the first half of the cases (the run's first, in primary-key order) wait
    until the run has handled four cases, so some are certainly late; the rest race it."""
    barrier = threading.Barrier(len(cases) + 1)
    four_done = threading.Event()
    late = {c.pk for c in cases[: len(cases) // 2]}
    outcomes: dict[int, str] = {}
    results = []

    def approving(case):
        try:
            barrier.wait(10)
            if case.pk in late:
                four_done.wait(30)
            decided = decision_record(
                case=case, operation_id=olds[case.pk], approved=True, reviewer=reviewer, channel="test"
            )
            outcomes[case.pk] = decided.outcome
        except Exception as exc:  # noqa: BLE001 - the outcome is the class
            outcomes[case.pk] = type(exc).__name__
        finally:
            connections.close_all()

    def progress(result):
        if result.done >= 4:
            four_done.set()

    def adding():
        try:
            barrier.wait(10)
            results.append(add(pipeline, text=text, apply=True, progress=progress))
        finally:
            four_done.set()
            connections.close_all()

    threads = [threading.Thread(target=approving, args=(c,)) for c in cases] + [threading.Thread(target=adding)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes, results


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("text", [SAME, DROPPED], ids=["move", "mark"])
def test_approvals_racing_a_new_version_are_committed_first_or_refused(make_user, text):
    """Each case either committed first (and the run left it alone) or was moved or marked,
    and then its approval was refused: stale after a move, evidence changed after a mark."""
    pipeline, reviewer = make_user("pipeline", group="pipeline"), make_user("reviewer")
    cases = [begun(f"S-RACE-{i:02d}") for i in range(12)]
    olds = {c.pk: current(c).operation_id for c in cases}
    outcomes, results = _race(pipeline, reviewer, cases, olds, text)
    assert len(outcomes) == 12 and results
    refusal = "StaleProposal" if text == SAME else "EvidenceChanged"
    assert sum(o == refusal for o in outcomes.values()) >= 4  # the late ones at least
    add(pipeline, text=text, apply=True)  # finishes a case that was busy
    for case in cases:
        now, marked = current(case), EvidenceChange.objects.filter(operation_id=olds[case.pk]).exists()
        if outcomes[case.pk] == "committed":
            assert now.operation_id == olds[case.pk] and not marked
            assert EffectRecord.objects.filter(operation_id=olds[case.pk]).count() == 1
        else:
            assert outcomes[case.pk] in (refusal, "CaseBusy"), outcomes[case.pk]
            assert not ReviewDecision.objects.filter(proposal__case=case).exists()
            assert (now.origin == Origin.EVIDENCE_CHANGE) if text == SAME else marked


def test_a_bulk_approval_skips_a_marked_case_and_says_why(world, pipeline):
    from workflow.selectors import bulk_decision_plan, cases_with_status

    add(pipeline, text=DROPPED, apply=True)
    cases = list(cases_with_status().filter(case_id__in=["S-PENDING", "S-DECIDED"]).order_by("case_id"))
    decided, pending = bulk_decision_plan(cases, approved=True)
    assert not pending.acts and pending.reason == (
        "evidence changed: the quotation is no longer in HOLD-7 v5: an approval waits for a re-draft or an edit"
    )
    assert not decided.acts and decided.reason.startswith("already approved")
    assert all(row.acts for row in bulk_decision_plan(cases[1:], approved=False))  # a decline stands
