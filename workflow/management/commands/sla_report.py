import json

from django.utils import timezone

from core.commandline import WorkflowCommand
from core.errors import DecisionflowError, OutcomeUncertain
from core.locks import cron_lock
from core.observability import SlaAction, sla_observed
from core.text import shown
from effects.services import CONFLICTING
from reviews import notifications
from workflow import escalation, queue

# Breached reviews were found (docs/COMMANDS.md): someone should look.
EXIT_BREACHED = 10


class Command(WorkflowCommand):
    help = (
        "Run from cron, e.g. every 5 minutes: `*/5 * * * * cd /srv/decisionflow && .venv/bin/python manage.py "
        "sla_report --expire --json >> var/log/sla.jsonl`. Lists every pending review past its SLA target "
        "(DECISIONFLOW_REVIEW_SLA, per policy DECISIONFLOW_REVIEW_SLA_BY_POLICY; docs/QUEUE.md), oldest first, "
        "one line each (with --json, one JSON object per line with the keys case, operation_id, policy, begun_at, "
        "age_seconds, target_seconds, claimed_by, on_breach, action). What happens on breach is the setting "
        "DECISIONFLOW_REVIEW_ON_BREACH (per policy ..._BY_POLICY): stay_pending (listed only) or decline (fail "
        "closed: with --expire each such review is declined with reason expired by the system actor sla-expiry; "
        "without --expire it is listed as would_expire). Nothing is ever approved automatically. First, the "
        "escalation steps due (DECISIONFLOW_REVIEW_ESCALATION_BY_POLICY: at risk and breached, notify:GROUP, "
        "reassign:GROUP or expire) are taken, once per review and step, one `escalated:` line each. Every run ends "
        "with one summary line, nothing breached included: `sla_report: summary: <n> pending review(s): within <a>, "
        'at_risk <b>, breached <c>[; <action> <count>, ...]` (with --json: {"summary": "sla_report", '
        '"pending": n, "states": {...}, "actions": {...}}). Exit codes: '
        "0 no breached review; 10 breached reviews were listed (or expired); 1 usage error, or another run holds "
        "the lock."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", dest="as_json", action="store_true", help="One JSON object per line.")
        parser.add_argument(
            "--expire",
            action="store_true",
            help="Decline the breached reviews whose policy says fail closed (a dry run without it).",
        )

    def handle(self, *args, as_json, expire, **options):
        found = 0
        actions: dict[str, int] = {}
        escalated: dict[str, int] = {}  # by outcome: done, refused, already, not_pending, uncertain
        # One clock for the run: the summary's counts and the listing agree.
        now = timezone.now()
        with cron_lock("sla_report"):
            states = queue.sla_counts(now)
            # Escalations first (docs/QUEUE.md, "Escalation"): once per review and step, each
            # said on a line of its own; a notify step's notification is then already written
            # (to its group), and the plain SLA notification below finds it.
            for done in escalation.escalate_due(now):
                escalated[done.outcome] = escalated.get(done.outcome, 0) + 1
                if as_json:
                    self.stdout.write(json.dumps({"escalation": done.as_dict()}, separators=(",", ":")))
                else:
                    self.stdout.write(
                        f"escalated: case={shown(done.case_id)} op={shown(done.operation_id)} step={done.step} "
                        f"escalation={shown(done.escalation.label)} outcome={done.outcome}"
                        + (f" detail={shown(done.detail)}" if done.detail else "")
                    )
            for pending, row in queue.breached_reviews(now):
                found += 1
                action: str = SlaAction.REPORTED
                if row.on_breach == queue.OnBreach.DECLINE:
                    action = self._expire(pending) if expire else SlaAction.WOULD_EXPIRE
                kind = action.split(" ", 1)[0]
                actions[kind] = actions.get(kind, 0) + 1
                if as_json:
                    self.stdout.write(json.dumps({**row.as_dict(), "action": action}, separators=(",", ":")))
                else:
                    self.stdout.write(
                        f"breached: case={shown(row.case_id)} op={shown(row.operation_id)} "
                        f"policy={shown(row.policy)} waiting={int(row.age.total_seconds())}s "
                        f"target={int(row.target.total_seconds())}s claimed_by={shown(row.claimed_by or '-')} "
                        f"action={action}"
                    )
            # Notifications (docs/QUEUE.md): at risk and breached, once per review and kind;
            # and the sweep: a dead worker's Sending row becomes Unknown and is sent again.
            queue.sla_notifications(now)
            notifications.notify_sweep()
            self.summary(states, actions, escalated, as_json=as_json)
        # For /metrics (docs/DEPLOY.md): still breached after this run, i.e. not expired now.
        sla_observed(
            breached=found - actions.get(SlaAction.EXPIRED, 0) - actions.get(SlaAction.REPLAY, 0), actions=actions
        )
        if found:
            self.fail(EXIT_BREACHED, f"sla_report: {found} review(s) past their SLA target")

    def summary(
        self, states: dict[str, int], actions: dict[str, int], escalated: dict[str, int], *, as_json: bool
    ) -> None:
        """One line on every run, nothing breached included: how many pending reviews are in
        each SLA state (before this run's expiries and escalations), what was done to the
        breached ones, and the escalation steps this run took, by outcome."""
        done = {str(action): actions[action] for action in SlaAction if action in actions}
        if as_json:
            line = {"summary": "sla_report", "pending": sum(states.values()), "states": states, "actions": done}
            if escalated:
                line["escalations"] = escalated
            self.stdout.write(json.dumps(line, separators=(",", ":")))
            return
        counts = ", ".join(f"{state} {count}" for state, count in states.items())
        did = "; " + ", ".join(f"{action} {count}" for action, count in done.items()) if done else ""
        if escalated:
            did += "; escalations " + ", ".join(f"{outcome} {count}" for outcome, count in escalated.items())
        self.stdout.write(f"sla_report: summary: {sum(states.values())} pending review(s): {counts}{did}")

    def _expire(self, pending) -> str:
        try:
            result = queue.review_expire(pending=pending)
        except OutcomeUncertain:
            # Its COMMIT failed and may have been applied: neither "expired" nor "not".
            return f"{SlaAction.UNCERTAIN} (outcome_uncertain: run `manage.py reconcile`)"
        except DecisionflowError as exc:
            # A person's decision (or an edit) got there first: it stands; say so and go on.
            return f"{SlaAction.NOT_EXPIRED} ({exc.code})"
        if result.status == CONFLICTING:
            return f"{SlaAction.NOT_EXPIRED} (already approved)"
        return SlaAction.REPLAY if result.replay else SlaAction.EXPIRED
