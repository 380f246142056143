"""core/signing.py: the key from settings (text, file, the development key), sign and verify
with the public key alone, the key's short name; and the two commands around it."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from django.core.management import CommandError, call_command

from audit.signature import signature_text
from core import signing
from core.errors import AuditMismatch, SigningKeyMissing
from tests.workflow.conftest import manage_argv


@pytest.fixture
def no_key(settings):
    settings.DECISIONFLOW_AUDIT_SIGNING_KEY = ""
    settings.DECISIONFLOW_AUDIT_SIGNING_KEY_FILE = ""
    settings.DECISIONFLOW_AUDIT_DEV_KEY_FILE = None
    return settings


def pem_of(key) -> str:
    return signing.private_key_pem(key).decode()


def test_sign_and_verify_with_the_public_key_alone():
    public = signing.public_key_pem()
    signature = signing.sign(b"the exported bytes")
    assert len(signature) == 64
    assert signing.verify(public, b"the exported bytes", signature)
    assert not signing.verify(public, b"the exported byteS", signature)
    assert not signing.verify(public, b"the exported bytes", bytes(64))
    other = signing.public_key_pem(signing.generate_key())
    assert not signing.verify(other, b"the exported bytes", signature)


def test_the_key_id_names_the_public_key_and_nothing_else():
    key = signing.generate_key()
    public = signing.public_key_pem(key)
    assert signing.key_id(public) == signing.key_id(public)
    assert len(signing.key_id(public)) == 16 and int(signing.key_id(public), 16) >= 0
    assert signing.key_id(public) != signing.key_id(signing.public_key_pem(signing.generate_key()))


def test_the_key_comes_from_the_text_first_then_the_file(no_key, tmp_path):
    text_key, file_key = signing.generate_key(), signing.generate_key()
    path = tmp_path / "key.pem"
    path.write_text(pem_of(file_key))
    no_key.DECISIONFLOW_AUDIT_SIGNING_KEY_FILE = str(path)
    assert signing.public_key_pem() == signing.public_key_pem(file_key)
    no_key.DECISIONFLOW_AUDIT_SIGNING_KEY = pem_of(text_key)
    assert signing.public_key_pem() == signing.public_key_pem(text_key)


def test_no_key_is_a_configuration_error(no_key):
    with pytest.raises(SigningKeyMissing, match="no audit signing key: set DECISIONFLOW_AUDIT_SIGNING_KEY") as caught:
        signing.sign(b"x")
    assert (caught.value.exit_code, caught.value.http_status, caught.value.code) == (78, 503, "signing_key_missing")


@pytest.mark.parametrize(
    "pem, why",
    [
        ("not a key", "not an unencrypted PEM private key"),
        (
            generate_private_key(SECP256R1())
            .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
            .decode(),
            "an Ed25519 key is needed, this is",
        ),
    ],
)
def test_a_key_that_cannot_be_used_is_refused_naming_where_it_came_from(no_key, pem, why):
    no_key.DECISIONFLOW_AUDIT_SIGNING_KEY = pem
    with pytest.raises(SigningKeyMissing, match=f"in DECISIONFLOW_AUDIT_SIGNING_KEY cannot be used: {why}") as caught:
        signing.signing_key()
    assert "PRIVATE KEY" not in caught.value.message


def test_a_missing_key_file_is_refused_naming_it(no_key, tmp_path):
    no_key.DECISIONFLOW_AUDIT_SIGNING_KEY_FILE = str(tmp_path / "absent.pem")
    with pytest.raises(SigningKeyMissing, match=r"absent\.pem\) cannot be used: No such file"):
        signing.signing_key()


def test_the_development_key_is_made_once_owner_only(no_key, tmp_path):
    path = tmp_path / "var" / "dev.pem"
    no_key.DECISIONFLOW_AUDIT_DEV_KEY_FILE = path
    first = signing.public_key_pem()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert signing.public_key_pem() == first  # the same key the second time
    assert [p.name for p in path.parent.iterdir()] == ["dev.pem"]


def test_the_development_key_exists_only_with_debug():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECISIONFLOW_AUDIT_SIGNING_KEY")}
    code = "from django.conf import settings; print(settings.DECISIONFLOW_AUDIT_DEV_KEY_FILE)"
    argv = manage_argv("shell", "-c", code)
    debug = subprocess.run(argv, env={**env, "DEBUG": "1"}, capture_output=True, text=True, check=True)
    assert debug.stdout.strip().splitlines()[-1].endswith("var/audit-signing-key.dev.pem")
    production = subprocess.run(
        argv, env={**env, "DEBUG": "0", "SECRET_KEY": "x" * 50}, capture_output=True, text=True, check=True
    )
    assert production.stdout.strip().splitlines()[-1] == "None"


def test_a_public_key_that_is_not_one_is_the_callers_error():
    with pytest.raises(ValueError, match="not a PEM public key"):
        signing.verify(b"nonsense", b"x", bytes(64))


def test_audit_keygen_writes_a_pair_and_never_overwrites(tmp_path, capsys):
    call_command("audit_keygen", str(tmp_path / "keys"))
    out = capsys.readouterr().out
    private, public = tmp_path / "keys" / "audit-signing-key.pem", tmp_path / "keys" / "audit-public-key.pem"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    key = signing.load_private_key(private.read_bytes(), source="test")
    assert signing.public_key_pem(key) == public.read_bytes()
    assert out.strip() == f"audit_keygen: key={signing.key_id(public.read_bytes())} private={private} public={public}"
    before = private.read_bytes()
    with pytest.raises(CommandError, match="exists; a key is never overwritten") as caught:
        call_command("audit_keygen", str(tmp_path / "keys"))
    assert caught.value.returncode == 1
    assert private.read_bytes() == before


def test_the_error_classes_carry_their_codes():
    assert (AuditMismatch.exit_code, AuditMismatch.code) == (12, "audit_mismatch")


def test_commands_help(tmp_path):
    for name, words in {
        "audit_keygen": "Run once per key",
        "audit_verify": "Run by an auditor, with the public key alone",
    }.items():
        out = subprocess.run(manage_argv(name, "--help"), capture_output=True, text=True, check=True).stdout
        assert words in " ".join(out.split()), out


def test_a_signature_file_verifies_with_openssl_alone(tmp_path):
    """The .sig is checked with standard tools, as docs/AUDIT.md shows."""
    exported = tmp_path / "cases.csv"
    exported.write_bytes(b"case_id,state\r\nT-1,Pending\r\n")
    data = exported.read_bytes()
    sig = signature_text(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    line, b64 = sig.split(b"\n")[:2]
    (tmp_path / "statement").write_bytes(line + b"\n")
    (tmp_path / "sig.bin").write_bytes(base64.b64decode(b64))
    (tmp_path / "public.pem").write_bytes(signing.public_key_pem())
    if not Path("/usr/bin/openssl").exists():
        pytest.skip("no openssl here")
    done = subprocess.run(
        [
            "openssl",
            "pkeyutl",
            "-verify",
            "-pubin",
            "-inkey",
            "public.pem",
            "-rawin",
            "-in",
            "statement",
            "-sigfile",
            "sig.bin",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "Signature Verified Successfully" in done.stdout, done.stdout + done.stderr


def test_the_development_key_made_by_many_at_once_is_one_key(no_key, tmp_path):
    """Eight threads (as eight processes would, each with its own temporary file) make the
    key at the same moment: every one of them signs with the key that was linked first."""
    import threading

    path = tmp_path / "var" / "dev.pem"
    no_key.DECISIONFLOW_AUDIT_DEV_KEY_FILE = path
    barrier, found = threading.Barrier(8), []

    def make():
        barrier.wait()
        found.append(signing.public_key_pem(signing._dev_key(path)))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == 8 and len(set(found)) == 1
    assert found[0] == signing.public_key_pem()
    assert [p.name for p in path.parent.iterdir()] == ["dev.pem"]
