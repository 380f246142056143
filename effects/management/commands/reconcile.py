import json
from collections import Counter
from itertools import islice

from django.utils import timezone

from cases.models import Case
from core.commandline import Exit, WorkflowCommand
from core.locks import case_session_lock, reconcile_lock
from core.observability import reconcile_observed
from core.outcomes import OperationState
from core.progress import CommandProgress, bar_wanted
from core.text import shown
from effects.models import DeliveryState
from effects.services import (
    NO_LOCAL_EFFECT,
    DeliveryAlert,
    deliveries_repair,
    delivery_alert,
    effects_repair,
    operation_reconcile,
    operations_reconcile,
    operations_reconcile_lines,
)
from reviews.models import approvals_shown

# Exit bits (docs/COMMANDS.md): each finding its own, so that cron can tell them apart; 1 is
# the code NoLocalEffectRecorded always had (it is also the usage error's).
EXIT_NO_LOCAL_EFFECT = 1
EXIT_DELIVERY_UNKNOWN = 16
EXIT_DELIVERY_REJECTED = 32
EXIT_DELIVERY_QUEUED = 64
EXIT_DELIVERY_NEEDS_CHECK = 128
# What --repair settles in this process: Unknown, and Sending (the sweep may find its lease over).
UNSETTLED = (DeliveryState.UNKNOWN.label, DeliveryState.SENDING.label)


class Command(WorkflowCommand):
    help = (
        "Run from cron, e.g. every 5 minutes: "
        "`*/5 * * * * cd /srv/decisionflow && .venv/bin/python manage.py reconcile --all --repair --json >> "
        "var/log/reconcile.jsonl` (deploy/decisionflow.cron). A non-zero exit means someone should look (cron mails it). "
        "Reads the decision and effect tables and reruns nothing. For each operation it prints "
        f"`reconcile: case=<id> op=<op> state=<{'|'.join(OperationState.values)}> effects=<n>` "
        "(with --json, one JSON object per line with the keys case, operation_id, state, effects, decline_reason). "
        "Give CASE_IDs or --all (one of them is required). Without --repair it exits 1 when any operation "
        f"is {NO_LOCAL_EFFECT} (approved, but no effect); --repair writes those effects (idempotent) and "
        "prints each repaired operation again with its new state. Only one reconcile runs at a time: a "
        "second run exits 1 at once with a message instead of waiting. Exit codes: 0 ok; 1 usage error, "
        f"lock held, unknown case, or {NO_LOCAL_EFFECT} found without --repair; with a helpdesk configured, "
        "these bits are added: 16 a delivery Unknown past DECISIONFLOW_DELIVERY_UNKNOWN_ALERT, 32 a delivery "
        "Rejected, 64 a delivery Queued or Sending past DECISIONFLOW_DELIVERY_QUEUED_ALERT, 128 a delivery "
        f"{DeliveryState.NEEDS_CHECK.label} (a person looks at the ticket first: the reply may be on it). --repair also "
        "looks up each Unknown delivery and resends it with the same key (docs/COMMANDS.md). "
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
            "--repair",
            action="store_true",
            help=f"Write the missing effect of {NO_LOCAL_EFFECT} operations; look up (and resend with the same "
            "key) each Unknown delivery; run the delivery sweep.",
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
            now = timezone.now()
            alerts = DeliveryAlert(0, 0, 0, 0)
            to_settle: list[str] = []
            deliveries: Counter[str] = Counter()
            bar = bool(all_cases) and bar_wanted(self.stdout, as_json=as_json)
            states: Counter[str] = Counter()
            with CommandProgress(
                self.stdout, label="reconcile", total=self.cases(case_ids) if bar else None, bar=bar
            ) as progress:
                if as_json:
                    self.json_listing(progress, case_ids, states)
                    # The rows the listing cannot say enough about: those to repair, and the
                    # deliveries (their age decides an alert), read again on their own.
                    listed = operations_reconcile(case_ids=case_ids or None, delivered=True)
                    if repair and states[NO_LOCAL_EFFECT]:
                        unrepaired = [
                            row
                            for row in operations_reconcile(case_ids=case_ids or None)
                            if row.state == NO_LOCAL_EFFECT
                        ]
                else:
                    listed = self.text_listing(progress, case_ids, states, unrepaired)
                for chunk in iter(lambda: list(islice(listed, 2000)), []):
                    delivered = [row for row in chunk if row.delivery is not None]
                    if delivered:
                        deliveries.update(str(row.delivery) for row in delivered)
                        if repair:
                            # Counted after the repair, from their new state.
                            to_settle += [row.operation_id for row in delivered if row.delivery in UNSETTLED]
                            delivered = [row for row in delivered if row.delivery not in UNSETTLED]
                        alerts = _add(alerts, delivery_alert(delivered, now=now))
                run.states.update(states)
            if all_cases:
                self.summary(progress, states, deliveries)
            run.listed = True
            code, messages = 0, []
            if states[NO_LOCAL_EFFECT] and not repair:
                code |= EXIT_NO_LOCAL_EFFECT
                messages.append(
                    f"reconcile: {states[NO_LOCAL_EFFECT]} operation(s) approved with no local effect recorded "
                    f"({NO_LOCAL_EFFECT}); run with --repair to write them"
                )
            for row in unrepaired if repair else []:
                # The repair writes: under the per-case lock that begin and edit take, held
                # around the repair's own transaction. A bulk repair keeps its own, longer
                # wait: it is not a person waiting on a page.
                with case_session_lock(row.case_id):
                    effects_repair(rows=[row], dry_run=False)
                run.repaired += 1
                self.report(operation_reconcile(row.operation_id), repaired=True)
            if repair and deliveries:
                # The sweep, then each Unknown delivery tried here and now (lookup, then a
                # resend with the same key). No case lock: a delivery's claim is its own.
                tried = dict(deliveries_repair(operation_ids=to_settle))
                fresh = [found for op in to_settle if (found := operation_reconcile(op)) is not None]
                for settled in fresh:
                    if settled.operation_id in tried:
                        run.repaired += 1
                        self.report(settled, repaired=True)
                alerts = _add(alerts, delivery_alert(fresh, now=now))
            code, messages = _delivery_findings(alerts, code, messages, repair)
            if code:
                self.fail(code, *messages)

    def cases(self, case_ids) -> int:
        """Cases with an operation: those with a current proposal (it is never unset)."""
        found = Case.objects.filter(current_proposal__isnull=False)
        return (found.filter(case_id__in=case_ids) if case_ids else found).count()

    def json_listing(self, progress: CommandProgress, case_ids, states: Counter[str]) -> None:
        """--json: the lines as the database makes them, a chunk per write, as bytes straight
        to standard output when it has a binary layer; the states are counted in each chunk's
        text (a state key cannot occur inside a JSON string). Each key runs on to the next
        key's name: bytes.count skips ahead by up to a key's length, and over a million lines
        the longer keys took a fifth less time (docs/PERFORMANCE.md, 8)."""
        keys = {state: f'"state":"{state}","effects":'.encode() for state in OperationState.values}
        out = getattr(self.stdout, "_out", self.stdout)
        binary = getattr(out, "buffer", None)
        if binary is not None:
            out.flush()  # what was written as text goes first
        for chunk in operations_reconcile_lines(case_ids=case_ids or None):
            if binary is not None:
                binary.write(chunk)
            else:
                out.write(chunk.decode())
            for state, key in keys.items():
                if found := chunk.count(key):
                    states[state] += found
        if binary is not None:
            binary.flush()
        progress.advance(self.cases(case_ids))

    def text_listing(self, progress: CommandProgress, case_ids, states: Counter[str], unrepaired: list):
        """Status lines, a chunk per write; yields the rows once they are printed."""
        rows = operations_reconcile(case_ids=case_ids or None)
        last_case = None
        # Written a chunk at a time: over a million operations, one write call per line cost
        # as much as the query itself.
        while chunk := list(islice(rows, 2000)):
            progress.write("\n".join(map(self.line, chunk)))
            unrepaired += [row for row in chunk if row.state == NO_LOCAL_EFFECT]
            states.update(row.state for row in chunk)
            # Rows come ordered by case: count each case once.
            progress.advance(len({row.case_id for row in chunk} - {last_case}))
            last_case = chunk[-1].case_id
            yield from chunk

    def summary(self, progress: CommandProgress, states: Counter[str], deliveries: Counter[str]) -> None:
        """One line after the listing of --all (cron's log, a pipe): how much, how fast."""
        operations, seconds = sum(states.values()), round(progress.elapsed, 3)
        if self.as_json:
            fields = {"operations": operations, "cases": progress.done, "seconds": seconds}
            summary = {"summary": "reconcile", **fields, "states": dict(sorted(states.items()))}
            if deliveries:
                summary["deliveries"] = dict(sorted(deliveries.items()))
            line = json.dumps(summary)
        else:
            counts = ", ".join(f"{state} {n}" for state, n in sorted(states.items())) or "nothing to report"
            if deliveries:
                counts += "; deliveries: " + ", ".join(f"{state} {n}" for state, n in sorted(deliveries.items()))
            line = (
                f"reconcile: summary: {operations} operation(s) of {progress.done} case(s) in {seconds:.2f} s "
                f"({progress.rate()}): {counts}"
            )
        self.stdout.write(line)

    def line(self, row, repaired=False) -> str:
        if self.as_json:
            # Only the rows printed after a repair come here (the listing's lines are the
            # database's): the same text, from the row's own dict.
            return json.dumps(row.as_dict(), ensure_ascii=False, separators=(",", ":"))
        verb = "repaired" if repaired else "reconcile"
        # Values are quoted when they are not plain tokens: a case id stored before ids had a
        # pattern (or any value) cannot end this line and forge another one.
        line = f"{verb}: case={shown(row.case_id)} op={shown(row.operation_id)} state={row.state} effects={row.effects}"
        if row.delivery is not None:
            line += f" delivery={row.delivery}"
            if row.delivery_reference:
                line += f" reference={shown(row.delivery_reference)}"
        if row.approvals:
            line += f" approvals={shown(approvals_shown(row.approvals, row.required))}"
        return line

    def report(self, row, repaired=False):
        self.stdout.write(self.line(row, repaired))


def _add(a: DeliveryAlert, b: DeliveryAlert) -> DeliveryAlert:
    return DeliveryAlert(*(x + y for x, y in zip(a, b, strict=True)))


def _delivery_findings(alerts: DeliveryAlert, code: int, messages: list[str], repair: bool) -> tuple[int, list[str]]:
    """The exit bits and stderr lines for the deliveries someone should look at."""
    if alerts.unknown:
        code |= EXIT_DELIVERY_UNKNOWN
        messages.append(
            f"reconcile: {alerts.unknown} delivery(ies) Unknown past DECISIONFLOW_DELIVERY_UNKNOWN_ALERT: the helpdesk "
            "may or may not hold the reply; "
            + ("the lookup and the resend could not settle them (see their tries)" if repair else "run with --repair")
        )
    if alerts.rejected:
        code |= EXIT_DELIVERY_REJECTED
        messages.append(
            f"reconcile: {alerts.rejected} delivery(ies) Rejected by the helpdesk: the customer did not get the reply "
            "(the reason is on each delivery)"
        )
    if alerts.needs_check:
        code |= EXIT_DELIVERY_NEEDS_CHECK
        messages.append(
            f"reconcile: {alerts.needs_check} delivery(ies) {DeliveryState.NEEDS_CHECK.label}: an earlier request got "
            "no answer and the helpdesk refused the resend, so the reply may already be on the ticket; a person "
            "looks at the ticket first (the helpdesk's answer is on each delivery)"
        )
    if alerts.queued:
        code |= EXIT_DELIVERY_QUEUED
        messages.append(
            f"reconcile: {alerts.queued} delivery(ies) still Queued or Sending past DECISIONFLOW_DELIVERY_QUEUED_ALERT: "
            "is a worker running (manage.py db_worker), and does the helpdesk answer?"
        )
    return code, messages
