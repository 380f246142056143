import os
from pathlib import Path

from django.db.models import QuerySet

from audit import exports
from audit.models import SignedExport
from audit.services import export_begin, export_stream
from audit.signature import sig_path
from core.commandline import WorkflowCommand
from core.errors import InvalidInput
from core.progress import CommandProgress, bar_wanted, rate_text


class Command(WorkflowCommand):
    help = (
        "Run by a support lead or from cron, e.g. nightly: `manage.py export_audit attempts --since 2026-12-01 "
        "--output var/audit/attempts.csv`. Writes KIND (cases: with their current state; history: one case's "
        "proposals, reviews begun, claims, attempts with every refusal, decisions, effects, deliveries and their "
        "tries, notifications; attempts: every commit attempt; deliveries; proposals; decisions) as CSV (formulas neutralised) or "
        "JSON Lines to FILE, and its detached Ed25519 signature to FILE.sig, which `manage.py audit_verify FILE` "
        "checks. Filters: --since/--until (a date, or an ISO date and time; until a date includes that day), "
        "--policy NAME, --state STATE, --reviewer USERNAME; the history takes --case CASE_ID and the dates. "
        "The file appears only when it is complete and signed. Streams: memory stays bounded whatever the "
        "size. On a terminal a progress bar; otherwise one line: `export_audit: kind=<kind> format=<csv|jsonl> "
        "rows=<n> bytes=<n> file=<FILE> sig=<FILE.sig> key=<key id> in <s> s (<rate>)`. Exit codes: 0 written; "
        "1 a bad option or filter, an unknown case, policy or user, a file that cannot be written (nothing "
        "written); 78 no signing key (docs/AUDIT.md)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "kind",
            choices=sorted(exports.EXPORTS),
            metavar="KIND",
            help="cases, history, attempts, deliveries, proposals or decisions.",
        )
        parser.add_argument("--format", dest="fmt", choices=exports.Format.ALL, default=exports.Format.CSV)
        parser.add_argument("--output", "-o", required=True, metavar="FILE", help="Where to write; FILE.sig beside it.")
        parser.add_argument("--since", metavar="WHEN")
        parser.add_argument("--until", metavar="WHEN")
        parser.add_argument("--policy", metavar="NAME")
        parser.add_argument("--state", metavar="STATE")
        parser.add_argument("--reviewer", metavar="USERNAME")
        parser.add_argument("--case", metavar="CASE_ID")
        parser.add_argument("--force", action="store_true", help="Replace FILE and FILE.sig if they exist.")

    def handle(self, *args, kind, fmt, output, since, until, policy, state, reviewer, case, force, **options):
        export = exports.EXPORTS[kind]
        filters = exports.filters_parse(
            export, since=since, until=until, policy=policy, state=state, reviewer=reviewer, case=case
        )
        path = Path(output)
        sig = sig_path(path)
        if not force:
            for existing in (path, sig):
                if existing.exists():
                    raise InvalidInput(f"export_audit: {existing} exists (give --force to replace it)")
        record = export_begin(export=export, fmt=fmt, filters=filters, actor=None, channel=SignedExport.Channel.COMMAND)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        bar = bar_wanted(self.stdout)
        rows_read = export.rows(filters, None)
        total = rows_read.count() if bar and isinstance(rows_read, QuerySet) else None
        rows = 0
        try:
            with CommandProgress(self.stdout, label=f"export {kind}", total=total, bar=bar, unit="rows") as progress:

                def counted(n: int) -> None:
                    nonlocal rows
                    rows += n
                    progress.advance(n)

                with partial.open("wb") as out:
                    for _chunk in export_stream(
                        record=record, export=export, fmt=fmt, filters=filters, counter=counted, sink=out.write
                    ):
                        pass
                sig.write_text(record.signature)
                os.replace(partial, path)
                elapsed = progress.elapsed
        except OSError as exc:
            raise InvalidInput(f"export_audit: cannot write {exc.filename or path}: {exc.strerror}") from None
        finally:
            partial.unlink(missing_ok=True)
        self.stdout.write(
            f"export_audit: kind={kind} format={fmt} rows={rows} bytes={record.size} file={path} sig={sig} "
            f"key={record.key_id} in {elapsed:.1f} s ({rate_text(rows, elapsed, 'rows')})"
        )
