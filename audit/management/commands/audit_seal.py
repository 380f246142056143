from audit.seals import seal_write
from core.commandline import WorkflowCommand
from core.locks import cron_lock


class Command(WorkflowCommand):
    help = (
        "Run from cron, e.g. every 10 minutes: `*/10 * * * * cd /srv/decisionflow && .venv/bin/python manage.py "
        "audit_seal >> var/log/audit-seal.log`. Seals every row of the audit chain written since the last seal "
        "(proposals, decisions, effects, commit attempts, delivery tries, notification events; docs/AUDIT.md): "
        "one signed seal per run, with the audit signing key (DECISIONFLOW_AUDIT_SIGNING_KEY or _FILE), and none "
        "when nothing is new. Prints `audit_seal: seal <n> hash=<seal hash> key=<key id> rows=<new rows> "
        "at=<time>` (keep these lines: an auditor can ask audit_verify to insist on a seal), or `audit_seal: "
        "nothing new since seal <n>`. Exit codes: 0 sealed or nothing new; 12 a row is already broken, so it is "
        "not sealed (run audit_verify); 78 no signing key; 1 another run holds the lock or sealed meanwhile."
    )

    def handle(self, *args, **options):

        with cron_lock("audit_seal"):
            sealed = seal_write()
        if sealed.seal is None:
            latest = sealed.latest
            self.stdout.write(f"audit_seal: nothing new since seal {latest.number if latest else 0}")
            return
        seal = sealed.seal
        self.stdout.write(
            f"audit_seal: seal {seal.number} hash={seal.seal_hash} key={seal.key_id} rows={sealed.new_rows} "
            f"at={seal.sealed_at.isoformat()}"
        )
