from django.core.management.base import BaseCommand

from reviews import notifications


class Command(BaseCommand):
    help = (
        "Run from cron (sla_report runs it too): a notification left Sending past DECISIONFLOW_NOTIFY_LEASE "
        "(its worker died mid-send: it may have been delivered) becomes Unknown and is enqueued once more; "
        "Queued ones due for a retry, or whose enqueue was lost, are enqueued again. Prints one summary line. "
        "Exit 0."
    )

    def handle(self, *args, **options):
        done = notifications.notify_sweep()
        self.stdout.write(f"notify_sweep: unknown={done['unknown']} enqueued={done['enqueued']}")
