import json

from cases.selectors import case_by_id
from core.commandline import WorkflowCommand
from core.identity import short
from core.text import shown
from workflow.assignment import NOTE_MAX, review_move


class Command(WorkflowCommand):
    help = (
        "Assign a pending review to a person or a group, as a support lead does with the review page's Assign "
        "form or POST /api/cases/{id}/assignment: `python manage.py assign CASE_ID --operation-id OP "
        "(--to-user USERNAME | --to-group GROUP) [--note TEXT] --user LEAD`; or hand it over to another reviewer, "
        "as a reviewer who may decide it does: `python manage.py assign CASE_ID --operation-id OP --hand-over "
        "--to-user USERNAME --note TEXT --user REVIEWER` (docs/QUEUE.md, Assignment). A person who is away gets it "
        "through their substitute. Prints `assign: CASE_ID op=OP kind=assigned to=anna replay=False` and "
        "`result={...}` (the API's answer). The same move again is a replay: nothing is written. Exit codes: 0 "
        "moved, or already there (replay); 1 error (unknown case, user or group, no permission, a target who could "
        "not decide it, a hand-over without a note, a review no longer pending, a review never begun); 4 stale: "
        "not the case's current proposal."
    )

    def add_arguments(self, parser):
        parser.add_argument("case_id", metavar="CASE_ID", help="The case's external ID, e.g. T-1077.")
        parser.add_argument(
            "--operation-id", required=True, metavar="OP", help="The operation whose review you saw (op-v1-…)."
        )
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--to-user", metavar="USERNAME", help="The person who takes it.")
        target.add_argument("--to-group", metavar="GROUP", help="The group that takes it (not with --hand-over).")
        parser.add_argument(
            "--note", default="", metavar="TEXT", help=f"Why, at most {NOTE_MAX} characters; required to hand over."
        )
        parser.add_argument(
            "--hand-over", action="store_true", help="Hand it over as a reviewer who may decide it (not assign)."
        )
        parser.add_argument(
            "--user",
            metavar="USERNAME",
            help="Who moves it: a support lead to assign, a reviewer to hand over (or $DECISIONFLOW_REVIEWER).",
        )

    def handle(self, *args, case_id, operation_id, to_user, to_group, note, hand_over, user, **options):
        case = case_by_id(case_id)
        by = self.user(user, option="--user", role="lead or reviewer who moves it")
        moved = review_move(
            case=case,
            operation_id=operation_id,
            by=by,
            to_user=to_user,
            to_group=to_group,
            note=note,
            hand_over=hand_over,
        )
        self.stdout.write(
            f"assign: {shown(case.case_id)} op={short(moved.row.operation_id)} kind={moved.row.kind} "
            f"to={shown(moved.to_label)} replay={moved.replay}"
        )
        self.stdout.write("result=" + json.dumps(moved.as_dict(case.case_id), separators=(",", ":")))
