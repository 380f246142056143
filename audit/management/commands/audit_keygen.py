import os
from pathlib import Path

from core import signing
from core.commandline import WorkflowCommand
from core.errors import InvalidInput

PRIVATE_NAME = "audit-signing-key.pem"
PUBLIC_NAME = "audit-public-key.pem"


class Command(WorkflowCommand):
    help = (
        "Run once per key, on the host that will sign: `manage.py audit_keygen DIR` writes a new Ed25519 key "
        f"pair to DIR/{PRIVATE_NAME} (owner-only; set DECISIONFLOW_AUDIT_SIGNING_KEY_FILE to it) and "
        f"DIR/{PUBLIC_NAME} (give it to auditors). It never overwrites a file: exit 1 when one is there. "
        "Prints `audit_keygen: key=<key id> private=<path> public=<path>`."
    )
    requires_migrations_checks = False

    def add_arguments(self, parser):
        parser.add_argument("directory", metavar="DIR", help="Where to write the two files (made if missing).")

    def handle(self, *args, directory, **options):
        folder = Path(directory)
        private, public = folder / PRIVATE_NAME, folder / PUBLIC_NAME
        for path in (private, public):
            if path.exists():
                raise InvalidInput(f"audit_keygen: {path} exists; a key is never overwritten (choose another DIR)")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            key = signing.generate_key()
            public_pem = signing.public_key_pem(key)
            fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(signing.private_key_pem(key))
            public.write_bytes(public_pem)
        except OSError as exc:
            raise InvalidInput(f"audit_keygen: cannot write to {folder}: {exc.strerror}") from None
        self.stdout.write(f"audit_keygen: key={signing.key_id(public_pem)} private={private} public={public}")
