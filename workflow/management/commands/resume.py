import json

from cases.selectors import case_by_id
from core.commandline import WorkflowCommand
from core.errors import ConflictingDecision, OutcomeUncertain, WorkflowIncompatible
from engine.graph import FAULTS
from reviews.models import HUMAN_DECLINE_REASONS, Channel
from workflow.decide import decision_record


class Command(WorkflowCommand):
    help = (
        "Resume a paused review in this process and answer it: "
        "`python manage.py resume CASE_ID --operation-id OP (--approve | --decline) [--reviewer USERNAME]`. "
        "Exactly one of --approve/--decline is required: no decision is not consent. A decline may say why: "
        f"--reason {{{','.join(HUMAN_DECLINE_REASONS)}}} and --note TEXT (docs/QUEUE.md). The reviewer defaults "
        "to $DECISIONFLOW_REVIEWER. A case whose current proposal was never begun is begun first, as in the "
        "admin and the API. Prints `approve: resumed status=PendingRequests requestBound=True` (or "
        '`decline:`) and `result={"Status":...,"Replay":...,"EffectCount":...}`. The same pause may be '
        "resumed any number of times; a second approval is a replay. Exit codes: 0 committed, replayed or "
        "declined; 1 error; 3 conflicting decision; 4 stale, or not the recorded proposal; 5 incompatible "
        "workflow version, or a checkpoint that fails its checks (nothing ran); 6 the case is busy, try "
        "again; 8 four eyes: the reviewer changed this proposal, so another reviewer must approve it; "
        "9 withdrawn: the pipeline withdrew this review, so it cannot be approved; 42 the outcome is uncertain (run `manage.py reconcile CASE_ID`)."
    )

    def add_arguments(self, parser):
        parser.add_argument("case_id", metavar="CASE_ID", help="The case's external ID, e.g. T-1042.")
        parser.add_argument(
            "--operation-id", required=True, metavar="OP", help="The operation identity the reviewer saw (op-v1-…)."
        )
        decision = parser.add_mutually_exclusive_group(required=True)
        decision.add_argument("--approve", action="store_true", help="Approve exactly this operation.")
        decision.add_argument("--decline", action="store_true", help="Decline exactly this operation.")
        parser.add_argument(
            "--reason",
            choices=HUMAN_DECLINE_REASONS,
            help="With --decline: why (docs/QUEUE.md). A second decline is a replay; the first reason stands.",
        )
        parser.add_argument("--note", metavar="TEXT", help="With --decline: optional free text.")
        parser.add_argument(
            "--reviewer",
            metavar="USERNAME",
            help="Who decides (needs the review permission); default $DECISIONFLOW_REVIEWER.",
        )
        parser.add_argument(
            "--fault",
            metavar="FAULT",
            help=f"Test only, with DECISIONFLOW_FAULT_INJECTION=1: {', '.join(FAULTS)} (lose the receipt after commit).",
        )

    def handle(self, *args, case_id, operation_id, approve, decline, reviewer, fault, reason, note, **options):
        self.verb = "approve" if approve else "decline"
        self.case_id = case_id
        case = case_by_id(case_id)
        user = self.user(reviewer, option="--reviewer", role="reviewer")
        # What the binding check proved before anything ran: the pause checkpoint holds exactly
        # one pending request, for this case and this operation (docs/COMMANDS.md).
        bound = f"{self.verb}: resumed status=PendingRequests requestBound=True"
        try:
            decided = decision_record(
                case=case,
                operation_id=operation_id,
                approved=bool(approve),
                reviewer=user,
                channel=Channel.COMMAND,
                fault=fault,
                decline_reason=reason,
                decline_note=note,
            )
        except ConflictingDecision as exc:
            self.stdout.write(bound)
            if exc.result is not None:
                self.stdout.write("result=" + json.dumps(exc.result.receipt(), separators=(",", ":")))
            raise
        except OutcomeUncertain:
            self.stdout.write(bound)
            raise
        self.stdout.write(bound)
        if decided.commit.approvals_shown:
            # A policy that needs several approvers: how far its approvals are.
            self.stdout.write(f"approvals={decided.commit.approvals_shown}")
        self.stdout.write("result=" + json.dumps(decided.commit.receipt(), separators=(",", ":")))

    def hints(self, exc):
        if isinstance(exc, WorkflowIncompatible):
            return [f"resume: `manage.py begin {self.case_id}` pauses this operation again on the current workflow"]
        if isinstance(exc, OutcomeUncertain):
            return [
                "resume: the commit step failed after it may have written, so there is no receipt; "
                f"run `manage.py reconcile {self.case_id}` to read what happened (it reruns nothing)"
            ]
        return []
