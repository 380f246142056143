from cases.selectors import case_by_id
from core.commandline import WorkflowCommand
from core.text import shown, when
from reviews.models import Channel
from workflow.begin import review_begin


class Command(WorkflowCommand):
    help = (
        "Start the review workflow for a case: `python manage.py begin CASE_ID`. It runs `prepare`, "
        "pauses at human-review-v1, records the pending review and exits, printing "
        "`begin: status=PendingRequests op=<operation id> checkpoints=<n>`. Run again for a case that "
        "is already pending, it reports that pending review and creates nothing. For a case whose current "
        "proposal is decided it prints `status=Committed` (or Declined), who decided and when, and creates nothing. "
        "Exit codes: 0 ok, 1 error, 5 the pause checkpoint was not saved."
    )

    def add_arguments(self, parser):
        parser.add_argument("case_id", metavar="CASE_ID", help="The case's external ID, e.g. T-1042.")

    def handle(self, *args, case_id, **options):
        result = review_begin(case=case_by_id(case_id), channel=Channel.COMMAND)
        # Every value is shown quoted unless it is a plain token: no value can forge a line.
        self.stdout.write(
            f"begin: status={shown(result.status)} op={shown(result.operation_id)} checkpoints={result.checkpoints}"
        )
        decision = result.decision
        if decision is not None:
            verb = "approved" if decision.approved else "declined"
            self.stdout.write(
                f"begin: already {verb} by {decision.reviewer.get_username()} at {when(decision.decided_at)}; "
                "decided means decided, nothing new was created"
            )
        elif not result.created:
            self.stdout.write(
                f"begin: already pending since {result.pending_review.created_at:%Y-%m-%d %H:%M:%S} UTC "
                f"(workflow {shown(result.pending_review.workflow_version)}); nothing new was created"
            )
