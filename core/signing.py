"""Ed25519 signatures for what leaves the building: audit exports and the chain's seals.

An auditor verifies with the public key alone (``verify``), so the private key never has to
be shared. It comes from settings: ``DECISIONFLOW_AUDIT_SIGNING_KEY`` (the PEM text) or
``DECISIONFLOW_AUDIT_SIGNING_KEY_FILE`` (a PEM file). With ``DEBUG`` on and neither set, a
development key is made once under ``var/`` (``DECISIONFLOW_AUDIT_DEV_KEY_FILE``), so that a
new checkout's demo signs; production has no such default and refuses (``SigningKeyMissing``).

``key_id`` names a public key in a few hex digits, so that a signature or a seal says which
key made it and a verifier can pick the right one after a rotation (docs/DEPLOY.md).
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings

from core.errors import SigningKeyMissing

KEY_ID_HEX = 16  # 64 bits of the SHA-256 of the raw public key: a name, not a secret


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )


def generate_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def load_private_key(pem: bytes, *, source: str) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``pem``; ``SigningKeyMissing`` naming ``source`` otherwise."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise SigningKeyMissing.unreadable(source, f"not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyMissing.unreadable(source, f"an Ed25519 key is needed, this is {type(key).__name__}")
    return key


def load_public_key(pem: bytes) -> Ed25519PublicKey:
    """The Ed25519 public key in ``pem`` (a ``ValueError`` that says why otherwise)."""
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"an Ed25519 public key is needed, this is {type(key).__name__}")
    return key


def _dev_key(path: Path) -> Ed25519PrivateKey:
    """The development key at ``path``, made on first use (owner-only; two processes racing
    to make it keep whichever was linked first)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(private_key_pem(generate_key()))
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    return load_private_key(path.read_bytes(), source=f"the development key file {path}")


def signing_key() -> Ed25519PrivateKey:
    """The configured private key: the PEM text, else the PEM file, else (DEBUG only) the
    development key; ``SigningKeyMissing`` when there is none or it cannot be used."""
    text = getattr(settings, "DECISIONFLOW_AUDIT_SIGNING_KEY", "")
    if text:
        return load_private_key(text.encode(), source="DECISIONFLOW_AUDIT_SIGNING_KEY")
    file = getattr(settings, "DECISIONFLOW_AUDIT_SIGNING_KEY_FILE", "")
    if file:
        try:
            pem = Path(file).read_bytes()
        except OSError as exc:
            raise SigningKeyMissing.unreadable(
                f"DECISIONFLOW_AUDIT_SIGNING_KEY_FILE ({file})", str(exc.strerror)
            ) from None
        return load_private_key(pem, source=f"DECISIONFLOW_AUDIT_SIGNING_KEY_FILE ({file})")
    dev = getattr(settings, "DECISIONFLOW_AUDIT_DEV_KEY_FILE", None)
    if dev:
        return _dev_key(Path(dev))
    raise SigningKeyMissing.not_configured()


def sign(data: bytes, key: Ed25519PrivateKey | None = None) -> bytes:
    """The 64-byte Ed25519 signature of ``data`` by ``key`` (the configured key by default)."""
    return (key or signing_key()).sign(data)


def public_key_pem(key: Ed25519PrivateKey | None = None) -> bytes:
    """The public half of ``key`` (the configured key by default), as PEM (SubjectPublicKeyInfo)."""
    return (
        (key or signing_key())
        .public_key()
        .public_bytes(encoding=serialization.Encoding.PEM, format=serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def key_id(public_pem: bytes) -> str:
    """A short name of the public key: hex of the SHA-256 of its 32 raw bytes."""
    raw = load_public_key(public_pem).public_bytes(
        encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
    )
    return hashlib.sha256(raw).hexdigest()[:KEY_ID_HEX]


def verify(public_pem: bytes, data: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is the Ed25519 signature of ``data`` by the key in ``public_pem``.

    A public key that cannot be read raises ``ValueError``: that is the caller's input, not a
    bad signature.
    """
    key = load_public_key(public_pem)
    try:
        key.verify(signature, data)
    except InvalidSignature:
        return False
    return True
