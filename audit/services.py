"""The export as one act: recorded when it starts, streamed, signed when its last byte is out.

The admin's download and ``manage.py export_audit`` both go through ``export_stream``; they
differ only in where the bytes go (a StreamingHttpResponse, a file).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from django.db.models import QuerySet
from django.utils import timezone

from audit import exports
from audit.models import SignedExport
from core import signing


def export_begin(
    *,
    export: exports.Export,
    fmt: str,
    filters: exports.Filters,
    actor,
    channel: str,
    selected: QuerySet | None = None,
) -> SignedExport:
    """Record that ``actor`` starts this export (its row, without a signature yet).

    Checks the signing key first: with none, ``SigningKeyMissing`` and nothing is written.
    """
    signing.signing_key()
    described = filters.describe() or ("the rows selected" if selected is not None else "everything")
    return SignedExport.objects.create(
        kind=export.name,
        format=fmt,
        filters=described[:500],
        file_name=exports.file_name(export, fmt, filters, datetime.now(UTC)),
        channel=channel,
        exported_by=actor,
    )


def export_stream(
    *,
    record: SignedExport,
    export: exports.Export,
    fmt: str,
    filters: exports.Filters,
    selected: QuerySet | None = None,
    counter: Callable[[int], None] = lambda n: None,
    sink: Callable[[bytes], object] | None = None,
) -> Iterator[bytes]:
    """The export's bytes; once the last is out, ``record`` gets its size, digest and
    signature (one UPDATE). Cut off before the end, the record stays unsigned. ``sink``: also
    write each chunk there (the command's file)."""
    key = signing.signing_key()
    signed = exports.Signed(exports.export_chunks(export, filters, fmt, selected=selected, counter=counter), sink=sink)
    yield from signed
    public = signing.public_key_pem(key)
    record.size, record.sha256 = signed.size, signed.sha256
    record.key_id = signing.key_id(public)
    record.signature = signed.signature(key).decode()
    record.finished_at = timezone.now()
    record.save(update_fields=["size", "sha256", "key_id", "signature", "finished_at"])
