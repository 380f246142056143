import json
from collections import Counter
from itertools import islice
from json.encoder import encode_basestring

from cases.models import Case
from decisionflow.core.commandline import Exit, WorkflowCommand
from decisionflow.core.locks import DEFAULT_TIMEOUT, case_lock, reconcile_lock
from decisionflow.core.observability import reconcile_observed
from decisionflow.core.progress import CommandProgress, bar_wanted
from decisionflow.core.text import shown
from effects.services import NO_LOCAL_EFFECT, effects_repair, operation_reconcile, operations_reconcile


class Command(WorkflowCommand):
    help = (
        "Run from cron, e.g. every 5 minutes: "
        "`*/5 * * * * cd /srv/decisionflow && .venv/bin/python manage.py reconcile --all --json >> "
        "var/log/reconcile.jsonl`. A non-zero exit means someone should look (cron mails it). "
        "Reads the decision and effect tables and reruns nothing. For each operation it prints "
        "`reconcile: case=<id> op=<op> state=<Pending|Committed|Declined|NoLocalEffectRecorded> effects=<n>` "
        "(with --json, one JSON object per line with the keys case, operation_id, state, effects, decline_reason). "
        "Give CASE_IDs or --all (one of them is required). Without --repair it exits 1 when any operation "
        "is NoLocalEffectRecorded (approved, but no effect); --repair writes those effects (idempotent) and "
        "prints each repaired operation again with its new state. Only one reconcile runs at a time: a "
        "second run exits 1 at once with a message instead of waiting. Exit codes: 0 ok; 1 usage error, "
        "lock held, unknown case, or NoLocalEffectRecorded found without --repair. "
        "With --all on a terminal it shows a progress bar (cases done, rate, time left); otherwise "
        "(cron, a pipe, --json) it ends the listing with one summary line: "
        "`reconcile: summary: <n> operation(s) of <m> case(s) in <s> s (<rate>): <state> <count>, ...` "
        '(with --json: {"summary": "reconcile", "operations": n, "cases": m, "seconds": s, "states": {...}}).'
    )

    def add_arguments(self, parser):
        parser.add_argument("case_ids", nargs="*", metavar="CASE_ID", help="Cases to reconcile.")
        parser.add_argument("--all", dest="all_cases", action="store_true", help="Reconcile every case.")
        parser.add_argument(
            "--json", dest="as_json", action="store_true", help="One JSON object per line instead of text."
        )
        parser.add_argument(
            "--repair", action="store_true", help="Write the missing effect of NoLocalEffectRecorded operations."
        )

    def handle(self, *args, case_ids, all_cases, as_json, repair, **options):
        if bool(case_ids) == bool(all_cases):
            self.fail(1, "reconcile: give one or more CASE_IDs, or --all (not both)")
        if case_ids:
            known = set(Case.objects.filter(case_id__in=case_ids).values_list("case_id", flat=True))
            missing = [c for c in case_ids if c not in known]
            if missing:
                self.fail(1, f"reconcile: no case {', '.join(shown(c) for c in missing)}")
        self.as_json = as_json
        # Runs by result and operations by state, for /metrics (docs/DEPLOY.md).
        with reconcile_observed(scope="cases" if case_ids else "all", exit_error=Exit) as run, reconcile_lock():
            unrepaired = []
            rows = operations_reconcile(case_ids=case_ids or None)
            bar = bool(all_cases) and bar_wanted(self.stdout, as_json=as_json)
            # The bar's total: cases with a current proposal (each has at least one operation).
            total = Case.objects.filter(current_proposal__isnull=False).count() if bar else None
            states: Counter[str] = Counter()
            last_case = None
            with CommandProgress(self.stdout, label="reconcile", total=total, bar=bar) as progress:
                # Written a chunk at a time: over a million operations, one write call per line
                # cost as much as the query itself.
                while chunk := list(islice(rows, 2000)):
                    progress.write("\n".join(map(self.line, chunk)))
                    unrepaired += [row for row in chunk if row.state == NO_LOCAL_EFFECT]
                    run.states.update(row.state for row in chunk)
                    states.update(row.state for row in chunk)
                    # Rows come ordered by case: count each case once.
                    new_cases = len({row.case_id for row in chunk} - {last_case})
                    last_case = chunk[-1].case_id
                    progress.advance(new_cases)
            if all_cases:
                self.summary(progress, states)
            run.listed = True
            if not unrepaired:
                return
            if not repair:
                self.fail(
                    1,
                    f"reconcile: {len(unrepaired)} operation(s) approved with no local effect recorded "
                    "(NoLocalEffectRecorded); run with --repair to write them",
                )
            for row in unrepaired:
                # The repair writes; take the same per-case lock as begin/resume/edit.
                # A bulk repair keeps its own, longer wait: it is not a person waiting on a page.
                with case_lock(row.case_id, timeout=DEFAULT_TIMEOUT):
                    effects_repair(rows=[row], dry_run=False)
                run.repaired += 1
                self.report(operation_reconcile(row.operation_id), repaired=True)

    def summary(self, progress: CommandProgress, states: Counter[str]) -> None:
        """One line after the listing of --all (cron's log, a pipe): how much, how fast."""
        operations, seconds = sum(states.values()), round(progress.elapsed, 3)
        if self.as_json:
            fields = {"operations": operations, "cases": progress.done, "seconds": seconds}
            line = json.dumps({"summary": "reconcile", **fields, "states": dict(sorted(states.items()))})
        else:
            counts = ", ".join(f"{state} {n}" for state, n in sorted(states.items())) or "nothing to report"
            line = (
                f"reconcile: summary: {operations} operation(s) of {progress.done} case(s) in {seconds:.2f} s "
                f"({progress.rate()}): {counts}"
            )
        self.stdout.write(line)

    def line(self, row, repaired=False) -> str:
        if self.as_json:
            # The same compact JSON as json.dumps(row.as_dict(), ensure_ascii=False, separators=(",", ":")),
            # built directly: this runs once per operation.
            return (
                f'{{"case":{encode_basestring(row.case_id)},"operation_id":{encode_basestring(row.operation_id)},'
                f'"state":"{row.state}","effects":{row.effects},"decline_reason":'
                f"{'null' if row.decline_reason is None else encode_basestring(row.decline_reason)}}}"
            )
        verb = "repaired" if repaired else "reconcile"
        # Values are quoted when they are not plain tokens: a case id stored before ids had a
        # pattern (or any value) cannot end this line and forge another one.
        return f"{verb}: case={shown(row.case_id)} op={shown(row.operation_id)} state={row.state} effects={row.effects}"

    def report(self, row, repaired=False):
        self.stdout.write(self.line(row, repaired))
