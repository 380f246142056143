import re
from pathlib import Path

from audit.verify import audit_result, configured_public_keys, database_verify
from core.commandline import WorkflowCommand
from core.errors import AuditMismatch, AuditNotSealed, InvalidInput
from core.observability import AuditResult, AuditScope, audit_observed

SEAL_GIVEN = re.compile(r"^(?P<number>[0-9]+)=(?P<hash>seal-v1-[0-9a-f]{64})$")


class Command(WorkflowCommand):
    help = (
        "Run by an auditor, with the public key alone. `manage.py audit_verify --public-key audit-public.pem` "
        "checks the live database's audit chain (docs/AUDIT.md): every seal (numbered, linked, signed by a key "
        "given), every chained row's hash and link, and that the rows each seal covers are exactly those it "
        "sealed. Prints `audit_verify: ok seals=<n> latest=<n> at=<time> rows=<n> sealed=<n> unsealed=<n>` and "
        "exits 0; rows newer than the latest seal are listed as unsealed (their deletion cannot be proven). "
        "Exits 12 naming the first broken row or seal (and counting the rest), 13 when there is no seal yet. "
        "--seal N=HASH (repeatable, from audit_seal's log lines) insists that seal N is still there as it was. "
        "`manage.py audit_verify FILE --public-key audit-public.pem` checks an export (manage.py export_audit, "
        "or the admin's export) against its detached FILE.sig: the signature, the key that made it, and that "
        "the file's bytes are exactly those signed; prints `audit_verify: ok file=<FILE> bytes=<n> "
        "sha256=<hex> key=<key id>` and exits 0, exits 12 naming the problem when the file or its .sig was "
        "edited or another key signed it. Both forms: --public-key may be given more than once (the keys of "
        "before and after a rotation); without it, the files of DECISIONFLOW_AUDIT_PUBLIC_KEY_FILES, else the "
        "public half of the configured signing key. Exit 1 when a file cannot be read or an argument is wrong. "
        "docs/DEPLOY.md runs the live form nightly, so that a break is mailed."
    )
    # An export is checked with files only: no database is needed for that form.
    requires_migrations_checks = False

    def add_arguments(self, parser):
        parser.add_argument("file", nargs="?", metavar="FILE", help="An export; its signature is FILE.sig.")
        parser.add_argument(
            "--public-key",
            metavar="PEM",
            action="append",
            help="A signer's public key, a PEM file; repeat it for several keys (default: the configured ones).",
        )
        parser.add_argument("--sig", metavar="SIG", help="The signature file, when it is not FILE.sig.")
        parser.add_argument(
            "--seal",
            metavar="N=HASH",
            action="append",
            default=[],
            help="Seal N must be there with this hash (audit_seal's line `seal N hash=HASH`); repeatable.",
        )

    def handle(self, *args, file, public_key, sig, seal, **options):
        expected = dict(self.seal_given(given) for given in seal)
        public_pems = self.public_pems(public_key)
        if file is None:
            return self.verify_live(public_pems, expected)
        if expected:
            raise InvalidInput("audit_verify: --seal is for the live database, not an export FILE")
        return self.verify_export(Path(file), public_pems, Path(sig) if sig else None)

    def seal_given(self, given: str) -> tuple[int, str]:
        match = SEAL_GIVEN.match(given)
        if match is None:
            raise InvalidInput(f"audit_verify: --seal {given!r}: expected N=seal-v1-<64 hex digits>")
        return int(match["number"]), match["hash"]

    def public_pems(self, paths: list[str] | None) -> list[bytes]:
        if not paths:
            return configured_public_keys()
        pems = []
        for path in paths:
            try:
                pems.append(Path(path).read_bytes())
            except OSError as exc:
                raise InvalidInput(f"audit_verify: cannot read the public key {path}: {exc.strerror}") from None
        return pems

    def verify_export(self, path: Path, public_pems: list[bytes], sig: Path | None) -> None:
        from audit.signature import export_verify

        failure: AuditMismatch | None = None
        for pem in public_pems:
            try:
                found = export_verify(path, public_pem=pem, sig=sig)
            except AuditMismatch as exc:
                failure = failure or exc
                continue
            audit_observed(scope=AuditScope.EXPORT, result=AuditResult.VERIFIED)
            self.stdout.write(
                f"audit_verify: ok file={found.path} bytes={found.size} sha256={found.sha256} key={found.key_id}"
            )
            return
        audit_observed(scope=AuditScope.EXPORT, result=AuditResult.BROKEN)
        assert failure is not None  # at least one key was given
        raise failure

    def verify_live(self, public_pems: list[bytes], expected: dict[int, str]) -> None:
        try:
            report = database_verify(public_keys=public_pems, expected_seals=expected)
        except ValueError as exc:
            audit_observed(scope=AuditScope.DATABASE, result=AuditResult.ERROR)
            raise InvalidInput(f"audit_verify: a public key given: {exc}") from None
        audit_observed(scope=AuditScope.DATABASE, result=audit_result(report))
        if not report.ok:
            for problem in report.problems:
                self.stdout.write(f"audit_verify: broken: {problem}")
            raise AuditMismatch.chain_broken(report.problems[0], count=report.problem_count)
        if report.seal is None:
            raise AuditNotSealed.rows(report.rows)
        seal = report.seal
        self.stdout.write(
            f"audit_verify: ok seals={report.seals} latest={seal.number} hash={seal.seal_hash} "
            f"at={seal.sealed_at.isoformat()} rows={report.rows} sealed={report.sealed} "
            f"unsealed={report.unsealed_count}"
        )
        if report.unsealed_count:
            tables = ", ".join(f"{label} {n}" for label, n in report.unsealed.items() if n)
            self.stdout.write(
                f"audit_verify: unsealed: {report.unsealed_count} rows newer than seal {seal.number} ({tables}); "
                "they hash and link as written, but no seal says they exist, so deleting one could not be proven"
            )
