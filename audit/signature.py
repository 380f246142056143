"""The detached signature of an export: the ``.sig`` file beside it (docs/AUDIT.md).

The signed message is the file's first line, a statement of what was exported:

    decisionflow-export-v1 sha256=<hex of the file's bytes> bytes=<size> key=<key id>

and the second line is the Ed25519 signature of that line (its newline included), in base64.
Ed25519 signs a message held whole in memory, and an export of a million rows is too large
for that, so the signature covers the SHA-256 of the bytes exactly as written, as minisign
and signify do for large files; anyone with the public key checks both with standard
tools (``sha256sum`` and ``openssl pkeyutl -verify``), no code of ours needed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from core import signing
from core.errors import AuditMismatch, InvalidInput

FORMAT = "decisionflow-export-v1"
STATEMENT = re.compile(rf"^{FORMAT} sha256=(?P<sha256>[0-9a-f]{{64}}) bytes=(?P<size>[0-9]+) key=(?P<key>[0-9a-f]+)\n$")


def statement(*, sha256: str, size: int, key_id: str) -> bytes:
    return f"{FORMAT} sha256={sha256} bytes={size} key={key_id}\n".encode()


def signature_text(*, sha256: str, size: int, key: Ed25519PrivateKey | None = None) -> bytes:
    """The ``.sig`` file's bytes for an export of ``size`` bytes whose SHA-256 is ``sha256``."""
    key = key or signing.signing_key()
    line = statement(sha256=sha256, size=size, key_id=signing.key_id(signing.public_key_pem(key)))
    return line + base64.b64encode(signing.sign(line, key)) + b"\n"


@dataclass(frozen=True)
class Verified:
    path: Path
    size: int
    sha256: str
    key_id: str


def sig_path(path: Path) -> Path:
    return path.with_name(path.name + ".sig")


def export_verify(path: Path, *, public_pem: bytes, sig: Path | None = None) -> Verified:
    """Check the export at ``path`` against its ``.sig`` with the public key alone.

    ``AuditMismatch`` names what does not match (the signature, the key, the size, the
    digest); ``InvalidInput`` when a file cannot be read or the ``.sig`` is not one.
    """
    sig = sig or sig_path(path)
    try:
        sig_bytes = sig.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"cannot read the signature {sig}: {exc.strerror}") from None
    first, _, rest = sig_bytes.partition(b"\n")
    line = first + b"\n"
    match = STATEMENT.match(line.decode("ascii", "replace"))
    if match is None:
        raise InvalidInput(f"{sig} is not a decisionflow export signature (its first line is not `{FORMAT} …`)")
    try:
        signature = base64.b64decode(rest.strip(), validate=True)
    except binascii.Error:
        raise InvalidInput(f"{sig}: its second line is not base64") from None
    try:
        ours = signing.key_id(public_pem)
    except ValueError as exc:
        raise InvalidInput(f"the public key: {exc}") from None
    if match["key"] != ours:
        raise AuditMismatch.export_key(sig, signed_by=match["key"], given=ours)
    if not signing.verify(public_pem, line, signature):
        raise AuditMismatch.export_signature(sig)
    digest, size = hashlib.sha256(), 0
    try:
        with path.open("rb") as exported:
            while chunk := exported.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise InvalidInput(f"cannot read the export {path}: {exc.strerror}") from None
    if size != int(match["size"]):
        raise AuditMismatch.export_edited(path, f"it has {size} bytes, {match['size']} were signed")
    if digest.hexdigest() != match["sha256"]:
        raise AuditMismatch.export_edited(path, "its SHA-256 is not the one signed (same size: bytes were changed)")
    return Verified(path=path, size=size, sha256=match["sha256"], key_id=ours)
