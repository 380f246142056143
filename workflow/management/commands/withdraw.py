import json

from cases.selectors import case_by_id
from core.commandline import WorkflowCommand
from core.identity import short
from reviews.models import Channel
from workflow.withdraw import WITHDRAW_REASON_MAX, case_withdraw


class Command(WorkflowCommand):
    help = (
        "Withdraw a pending review because its ticket was closed elsewhere, as the pipeline does with "
        "POST /api/cases/{id}/withdraw: `python manage.py withdraw CASE_ID --operation-id OP --user PIPELINE_USER "
        "[--reason TEXT]`. The operation is declined with reason withdrawn by the system actor pipeline-withdraw "
        "(the decision names the user, who needs the withdraw permission: the Pipeline group); a later approval "
        "is refused as withdrawn. Prints `withdraw: CASE_ID op=OP status=Declined replay=False reason=withdrawn` "
        'and `result={"Status":...,"Replay":...,"EffectCount":...}`. The same withdrawal again is a replay. Exit '
        "codes: 0 withdrawn or replayed (an operation already declined stays as it was declined); 1 error (unknown "
        "case or user, no permission, bad --reason); 3 the operation was approved: decided means decided; 4 stale: "
        "not the case's current proposal; 6 the case is busy, try again; 42 the outcome is uncertain (run "
        "`manage.py reconcile CASE_ID`)."
    )

    def add_arguments(self, parser):
        parser.add_argument("case_id", metavar="CASE_ID", help="The case's external ID, e.g. T-1042.")
        parser.add_argument(
            "--operation-id", required=True, metavar="OP", help="The operation the pipeline saw (op-v1-…)."
        )
        parser.add_argument(
            "--user", required=True, metavar="USERNAME", help="The pipeline user who withdraws (the Pipeline group)."
        )
        parser.add_argument(
            "--reason", metavar="TEXT", help=f"Optional, one line of at most {WITHDRAW_REASON_MAX} characters: why."
        )

    def handle(self, *args, case_id, operation_id, user, reason, **options):
        case = case_by_id(case_id)
        actor = self.user(user, option="--user", role="pipeline user")
        commit = case_withdraw(
            case=case, operation_id=operation_id, actor=actor, reason=reason, channel=Channel.COMMAND
        )
        standing = commit.decision
        self.stdout.write(
            f"withdraw: {case.case_id} op={short(commit.operation_id)} status={commit.status} "
            f"replay={commit.replay} reason={standing.decline_reason if standing is not None else None}"
        )
        self.stdout.write("result=" + json.dumps(commit.receipt(), separators=(",", ":")))
