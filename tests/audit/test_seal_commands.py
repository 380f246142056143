"""`manage.py audit_seal` and `manage.py audit_verify` of the live database: their lines and
exit codes (docs/COMMANDS.md), a seal written once per run whether the runs follow each
other or race (PostgreSQL), and verification failures counted in /metrics."""

from __future__ import annotations

import re

import pytest
from django.core.management import load_command_class
from prometheus_client import REGISTRY

from audit.models import Seal
from audit.seals import seal_write
from core import signing
from core.errors import LockBusy
from effects.services import effect_commit
from reviews.models import ReviewDecision
from reviews.services import proposal_create
from tests.audit.test_seal_verify import triggers_off
from tests.conftest import command_run, race

SEALED = re.compile(r"^audit_seal: seal (\d+) hash=(seal-v1-[0-9a-f]{64}) key=([0-9a-f]{16}) rows=(\d+) at=\S+$")


@pytest.fixture
def approved(case, reviewer):
    proposal = proposal_create(case=case)
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    return proposal


def verifications(verdict: str) -> float:
    sample = REGISTRY.get_sample_value(
        "decisionflow_audit_verifications_total", {"scope": "database", "verdict": verdict}
    )
    return sample or 0.0


@pytest.mark.django_db
def test_audit_seal_twice_seals_once_then_says_nothing_is_new(approved, reviewer):
    code, out, err = command_run("audit_seal")
    match = SEALED.match(out.strip())
    assert (code, err, bool(match)) == (0, "", True), out
    assert match[1] == "1" and match[4] == "4" and match[3] == signing.key_id(signing.public_key_pem())
    assert command_run("audit_seal") == (0, "audit_seal: nothing new since seal 1\n", "")
    effect_commit(operation_id=approved.operation_id, approved=True, reviewer=reviewer)
    code, out, _ = command_run("audit_seal")
    assert SEALED.match(out.strip()).group(1, 4) == ("2", "1")
    assert Seal.objects.count() == 2


@pytest.mark.django_db
def test_audit_verify_exit_codes_and_lines(approved, reviewer, tmp_path):
    code, out, err = command_run("audit_verify")
    assert code == 13 and "no seal yet: 4 rows hash and link as written" in err
    _, sealed, _ = command_run("audit_seal")
    number, seal_hash = SEALED.match(sealed.strip()).group(1, 2)
    assert number == "1"
    verified = verifications("verified")
    code, out, err = command_run("audit_verify")
    assert (code, err) == (0, "")
    assert out.startswith(f"audit_verify: ok seals=1 latest=1 hash={seal_hash} at=")
    assert out.rstrip().endswith("rows=4 sealed=4 unsealed=0")
    assert verifications("verified") == verified + 1

    effect_commit(operation_id=approved.operation_id, approved=True, reviewer=reviewer)
    code, out, _ = command_run("audit_verify", "--seal", f"1={seal_hash}")
    assert code == 0
    assert (
        "audit_verify: unsealed: 1 rows newer than seal 1 (effects.commitattempt 1); they hash and link as "
        "written, but no seal says they exist, so deleting one could not be proven"
    ) in out

    # Two keys, as after a rotation; the configured one among them.
    other = tmp_path / "other.pem"
    other.write_bytes(signing.public_key_pem(signing.generate_key()))
    ours = tmp_path / "ours.pem"
    ours.write_bytes(signing.public_key_pem())
    assert command_run("audit_verify", "--public-key", str(other), "--public-key", str(ours))[0] == 0
    code, _, err = command_run("audit_verify", "--public-key", str(other))
    assert code == 12 and "seal 1 was signed by key" in err

    code, _, err = command_run("audit_verify", "--seal", "1=seal-v1-" + "0" * 64)
    assert code == 12 and "seal 1 is not the seal written (seal-v1-000" in err
    code, _, err = command_run("audit_verify", "--seal", "2=seal-v1-" + "0" * 64)
    assert code == 12 and "seal 2 is missing, though it was written" in err
    assert command_run("audit_verify", "--seal", "one")[0] == 1

    broken = verifications("broken")
    decision = ReviewDecision.objects.get()
    with triggers_off() as cursor:
        cursor.execute("UPDATE reviews_reviewdecision SET approved = %s WHERE id = %s", [False, decision.pk])
    code, out, err = command_run("audit_verify")
    assert code == 12
    assert err.strip() == (
        f"audit_verify: broken: reviews.reviewdecision {decision.pk} does not match its hash: it was changed "
        "after it was written"
    )
    assert f"audit_verify: broken: reviews.reviewdecision {decision.pk} does not match its hash" in out
    assert verifications("broken") == broken + 1


@pytest.mark.django_db
def test_audit_seal_refuses_a_broken_row_and_writes_nothing(approved):
    decision = ReviewDecision.objects.get()
    with triggers_off() as cursor:
        cursor.execute("UPDATE reviews_reviewdecision SET approved = %s WHERE id = %s", [False, decision.pk])
    code, out, err = command_run("audit_seal")
    assert (code, out) == (12, "")
    assert f"audit_seal: reviews.reviewdecision {decision.pk} does not match its hash" in err
    assert not Seal.objects.exists()


def test_help_says_how_they_are_run():
    for name, start in (("audit_seal", "Run from cron"), ("audit_verify", "Run by an auditor")):
        assert load_command_class("audit", name).help.startswith(start)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_seals_at_once_write_one(approved):
    """Past the command's lock (two hosts on SQLite files, say), the unique keys decide: one
    seal 1, and the other run writes nothing."""
    results, errors = race([seal_write, seal_write])
    assert Seal.objects.count() == 1
    written = [r for r in results if r is not None and r.seal is not None]
    assert len(written) == 1
    # The other found seal 1 there already, or lost the insert to it.
    assert all(isinstance(e, LockBusy) for e in errors), errors
    assert len(written) + len(errors) + sum(1 for r in results if r is not None and r.seal is None) == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_audit_seal_runs_at_once_write_one(approved):
    results, errors = race([lambda: command_run("audit_seal"), lambda: command_run("audit_seal")])
    assert not errors
    codes = sorted(code for code, _, _ in results)
    assert Seal.objects.count() == 1
    # One sealed; the other found the lock held (exit 1) or, after it, nothing new.
    assert codes[0] == 0 and codes[1] in (0, 1)
    outs = [out for _, out, _ in results]
    assert sum(1 for out in outs if SEALED.match(out.strip())) == 1
