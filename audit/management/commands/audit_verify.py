from pathlib import Path

from core import signing
from core.commandline import WorkflowCommand
from core.errors import InvalidInput


class Command(WorkflowCommand):
    help = (
        "Run by an auditor, with the public key alone: `manage.py audit_verify FILE --public-key audit-public.pem` "
        "checks an export (manage.py export_audit, or the admin's export) against its detached FILE.sig: "
        "the signature, the key that made it, and that the file's bytes are exactly those signed. "
        "Prints `audit_verify: ok file=<FILE> bytes=<n> sha256=<hex> key=<key id>` and exits 0; exits 12 and "
        "names the problem when the file or its .sig was edited or another key signed it, 1 when a file "
        "cannot be read or is not an export signature (docs/AUDIT.md). Without --public-key it uses the "
        "public half of the configured signing key. Without FILE it is to check the live database's chain "
        "(until that chain exists it refuses: exit 1)."
    )
    # An export is checked with files only: no database is needed for that form.
    requires_migrations_checks = False

    def add_arguments(self, parser):
        parser.add_argument("file", nargs="?", metavar="FILE", help="An export; its signature is FILE.sig.")
        parser.add_argument(
            "--public-key", metavar="PEM", help="The signer's public key, a PEM file (default: the configured key's)."
        )
        parser.add_argument("--sig", metavar="SIG", help="The signature file, when it is not FILE.sig.")

    def handle(self, *args, file, public_key, sig, **options):
        public_pem = self.public_pem(public_key)
        if file is None:
            return self.verify_live(public_pem)
        return self.verify_export(Path(file), public_pem, Path(sig) if sig else None)

    def public_pem(self, path: str | None) -> bytes:
        if path is None:
            return signing.public_key_pem()
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise InvalidInput(f"audit_verify: cannot read the public key {path}: {exc.strerror}") from None

    def verify_export(self, path: Path, public_pem: bytes, sig: Path | None) -> None:
        from audit.signature import export_verify

        found = export_verify(path, public_pem=public_pem, sig=sig)
        self.stdout.write(
            f"audit_verify: ok file={found.path} bytes={found.size} sha256={found.sha256} key={found.key_id}"
        )

    def verify_live(self, public_pem: bytes) -> None:
        self.fail(1, "audit_verify: live verification not available yet: give an export FILE (docs/AUDIT.md)")
