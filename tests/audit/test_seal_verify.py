"""Seals and the live database's verification (audit/seals.py, audit/verify.py, docs/AUDIT.md):
a seal covers every chained row, verify passes on an untouched database, and each
tampering of a sealed row is found and named: an update (with or without its hash made
again), a delete, an insert out of order, a reorder, a truncate and re-insert, all with the
triggers off (PostgreSQL's `session_replication_role = replica`; on SQLite, the triggers
dropped, as anyone who can write the file can). Rows after the latest seal are unsealed."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import Seal
from audit.seals import seal_write
from audit.verify import case_verify, database_verify
from core import chain, signing
from core.errors import AuditMismatch
from effects.models import CommitAttempt, Delivery, DeliveryTry, EffectRecord
from effects.services import effect_commit
from reviews.models import Approval, ReviewDecision
from reviews.services import proposal_create

pytestmark = pytest.mark.django_db

APPEND_ONLY = (
    "reviews_proposal",
    "reviews_reviewdecision",
    "effects_effectrecord",
    "effects_commitattempt",
    "effects_deliverytry",
    "reviews_notificationevent",
    "reviews_approval",
    "audit_seal",
)


def keys():
    return [signing.public_key_pem()]


@contextmanager
def triggers_off():
    """What someone who may bypass the append-only triggers can do: on PostgreSQL a superuser's
    replica role (no trigger fires, foreign keys included); on SQLite, drop them."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The foreign-key checks this test's own inserts left pending run now, before
            # the tampering (as they would have at those inserts' commit).
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
            cursor.execute("SET LOCAL session_replication_role = replica")
            yield cursor
            cursor.execute("SET LOCAL session_replication_role = origin")
            return
        cursor.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name IN ({})".format(
                ", ".join(f"'{t}'" for t in APPEND_ONLY)
            )
        )
        saved = cursor.fetchall()
        for name, _ in saved:
            cursor.execute(f'DROP TRIGGER "{name}"')
        yield cursor
        for _, sql in saved:
            cursor.execute(sql)


@pytest.fixture
def decided(case, reviewer, make_user):
    """Approvals and a decline on the case, and a refusal: rows in four chained tables."""
    proposal = proposal_create(case=case)
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)  # a replay
    with pytest.raises(Exception):  # noqa: B017, PT011 - a refusal of any kind, its attempt row is what counts
        effect_commit(operation_id="op-v1-" + "0" * 64, approved=True, reviewer=reviewer)
    return proposal


def first(report) -> str:
    assert not report.ok
    return str(report.problems[0])


def test_an_untouched_database_verifies_and_newer_rows_are_unsealed(decided, reviewer):
    assert seal_write().seal.number == 1
    report = database_verify(public_keys=keys())
    assert report.ok, report.problems
    assert (report.seal.number, report.unsealed_count, report.sealed) == (1, 0, report.rows)
    assert report.rows == 1 + 1 + 1 + 3  # a proposal, a decision, an effect, three attempts
    effect_commit(operation_id=decided.operation_id, approved=True, reviewer=reviewer)
    report = database_verify(public_keys=keys())
    assert report.ok
    assert report.unsealed == {**dict.fromkeys(report.unsealed, 0), "effects.commitattempt": 1}


def test_a_seal_is_written_once_per_run_and_only_when_something_is_new(decided, reviewer):
    one = seal_write()
    again = seal_write()
    assert (one.seal.number, again.seal, Seal.objects.count()) == (1, None, 1)
    effect_commit(operation_id=decided.operation_id, approved=True, reviewer=reviewer)
    two = seal_write()
    assert (two.seal.number, two.seal.previous, two.new_rows) == (2, one.seal.seal_hash, 1)
    assert two.seal.covers["effects.commitattempt"]["count"] == 4
    assert database_verify(public_keys=keys()).ok


def test_no_seal_means_nothing_sealed(decided):
    report = database_verify(public_keys=keys())
    assert report.ok and report.seal is None
    assert report.unsealed_count == report.rows == 6


def test_an_updated_row_is_named(decided):
    seal_write()
    decision = ReviewDecision.objects.get()
    with triggers_off() as cursor:
        cursor.execute("UPDATE reviews_reviewdecision SET approved = %s WHERE id = %s", [False, decision.pk])
    assert first(database_verify(public_keys=keys())) == (
        f"reviews.reviewdecision {decision.pk} does not match its hash: it was changed after it was written"
    )


def test_an_updated_row_with_its_hash_made_again_breaks_the_link_and_the_seal(decided):
    seal_write()
    decision = ReviewDecision.objects.get()
    decision.decline_note = None
    decision.approved = False
    forged = chain.hash_of(decision)
    with triggers_off() as cursor:
        cursor.execute(
            "UPDATE reviews_reviewdecision SET approved = %s, row_hash = %s WHERE id = %s", [False, forged, decision.pk]
        )
    report = database_verify(public_keys=keys())
    effect = EffectRecord.objects.get()
    through = Seal.objects.get().covers["reviews.reviewdecision"]["through"]
    assert first(report) == (
        f"reviews.reviewdecision 1-{through} (sealed by seal 1) do not match its digest: rows in it "
        "were changed with their hashes recomputed, swapped or reordered"
    )
    assert any(
        str(p) == f"effects.effectrecord {effect.pk} does not follow the row it names: that row was changed, "
        "replaced or deleted"
        for p in report.problems
    )


def test_a_deleted_row_is_named(decided):
    seal_write()
    attempt = CommitAttempt.objects.order_by("id")[1]
    with triggers_off() as cursor:
        cursor.execute("DELETE FROM effects_commitattempt WHERE id = %s", [attempt.pk])
    assert first(database_verify(public_keys=keys())) == (
        f"effects.commitattempt {attempt.pk} was sealed by seal 1 and is missing: deleted"
    )


@pytest.mark.postgres  # on SQLite the test's own foreign-key check at its end refuses the orphan
def test_a_deleted_decision_is_named_by_the_effect_that_follows_it(decided):
    seal_write()
    decision = ReviewDecision.objects.get()
    with triggers_off() as cursor:
        cursor.execute("DELETE FROM reviews_reviewdecision WHERE id = %s", [decision.pk])
    report = database_verify(public_keys=keys())
    assert f"reviews.reviewdecision {decision.pk} was sealed by seal 1 and is missing: deleted" in map(
        str, report.problems
    )
    effect = EffectRecord.objects.get()
    assert f"effects.effectrecord {effect.pk} follows review decision {decision.pk}, which is missing: deleted" in map(
        str, report.problems
    )


def _attempt_copy(attempt: CommitAttempt, **changes) -> list:
    names = [f.column for f in CommitAttempt._meta.concrete_fields]
    values = {f.column: getattr(attempt, f.attname) for f in CommitAttempt._meta.concrete_fields}
    values.update(changes)
    return names, [values[n] for n in names]


def _insert(cursor, names, values) -> None:
    db = connection
    fields = {f.column: f for f in CommitAttempt._meta.concrete_fields}
    params = [fields[n].get_db_prep_save(v, connection=db) for n, v in zip(names, values, strict=True)]
    cursor.execute(
        f"INSERT INTO effects_commitattempt ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})", params
    )


def test_a_row_inserted_out_of_order_is_named(decided):
    # An id left free below the seal's highest (a rolled-back insert leaves one, too).
    last = CommitAttempt.objects.order_by("-id").first()
    names, values = _attempt_copy(last, id=last.pk + 5, detail="a later click")
    values[names.index("row_hash")] = None
    CommitAttempt.objects.create(
        **{f.attname: v for f, v in zip(CommitAttempt._meta.concrete_fields, values, strict=True)}
    )
    seal = seal_write().seal
    # (On PostgreSQL, earlier tests' ids are gone too: sequences are not rolled back.)
    assert seal.covers["effects.commitattempt"]["missing"][-1] == [last.pk + 1, last.pk + 4]
    assert database_verify(public_keys=keys()).ok
    with triggers_off() as cursor:
        names, values = _attempt_copy(last, id=last.pk + 2, detail="approved, honest")
        forged = CommitAttempt(
            **{f.attname: v for f, v in zip(CommitAttempt._meta.concrete_fields, values, strict=True)}
        )
        values[names.index("row_hash")] = chain.hash_of(forged)
        _insert(cursor, names, values)
    assert first(database_verify(public_keys=keys())) == (
        f"effects.commitattempt {last.pk + 2} was not there when seal 1 was made: inserted afterwards, out of order"
    )


def test_reordered_rows_are_found_by_the_seal(decided):
    seal_write()
    one, two = CommitAttempt.objects.order_by("id")[:2]
    columns = [f.column for f in CommitAttempt._meta.concrete_fields if not f.primary_key]
    with triggers_off() as cursor:
        for row, other in ((one, two), (two, one)):
            sets = ", ".join(f"{c} = %s" for c in columns)
            fields = [f for f in CommitAttempt._meta.concrete_fields if not f.primary_key]
            cursor.execute(
                f"UPDATE effects_commitattempt SET {sets} WHERE id = %s",
                [f.get_db_prep_save(getattr(other, f.attname), connection=connection) for f in fields] + [row.pk],
            )
    report = database_verify(public_keys=keys())
    last = CommitAttempt.objects.order_by("-id").first()
    assert first(report) == (
        f"effects.commitattempt 1-{last.pk} (sealed by seal 1) do not match its digest: rows in it were changed "
        "with their hashes recomputed, swapped or reordered"
    )


def test_a_truncate_and_re_insert_is_found(decided):
    seal_write()
    kept = list(CommitAttempt.objects.order_by("id"))
    hidden = kept.pop(1)
    with triggers_off() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("TRUNCATE effects_commitattempt")
        else:
            cursor.execute("DELETE FROM effects_commitattempt")
        for row in kept:  # the others back, each with its own hash, under new ids
            names, values = _attempt_copy(row)
            del values[names.index("id")]
            names.remove("id")
            _insert(cursor, names, values)
    report = database_verify(public_keys=keys())
    assert first(report) == (
        f"effects.commitattempt {kept[0].pk} was sealed by seal 1 and is missing: deleted (and 2 more)"
    ), hidden


def test_a_changed_seal_is_named(decided):
    seal_write()
    with triggers_off() as cursor:
        cursor.execute("UPDATE audit_seal SET sealed_at = sealed_at, key_id = %s", ["0" * 16])
    assert first(database_verify(public_keys=keys())) == (
        "seal 1 does not match its hash: it was changed after it was signed"
    )


def test_a_seal_of_another_key_names_that_key(decided):
    seal_write()
    other = signing.public_key_pem(signing.generate_key())
    report = database_verify(public_keys=[other])
    ours = signing.key_id(signing.public_key_pem())
    assert first(report).startswith(f"seal 1 was signed by key {ours}, not by a key given")
    assert database_verify(public_keys=[other, *keys()]).ok  # both keys after a rotation


def test_a_broken_row_is_not_sealed(decided):
    decision = ReviewDecision.objects.get()
    with triggers_off() as cursor:
        cursor.execute("UPDATE reviews_reviewdecision SET approved = %s WHERE id = %s", [False, decision.pk])
    with pytest.raises(AuditMismatch, match=f"reviews.reviewdecision {decision.pk}"):
        seal_write()
    assert not Seal.objects.exists()


def test_the_case_check_sees_its_rows_and_the_seal(decided, reviewer):
    seal_write()
    report = case_verify(decided.case_id, public_keys=keys())
    assert report.ok and report.seal.number == 1
    assert (report.rows, report.sealed, report.unsealed_count) == (5, 5, 0)  # the not-found refusal has no case
    decision = ReviewDecision.objects.get()
    with triggers_off() as cursor:
        cursor.execute("UPDATE reviews_reviewdecision SET approved = %s WHERE id = %s", [False, decision.pk])
    assert first(case_verify(decided.case_id, public_keys=keys())).startswith(f"reviews.reviewdecision {decision.pk}")


def _tries(effect, outcomes):
    delivery = Delivery.objects.create(
        operation_id=effect.operation_id,
        case_id=effect.case_id,
        decision_id=effect.decision_id,
        effect=effect,
        next_try_at=timezone.now(),
    )
    return [
        DeliveryTry.objects.create(
            delivery=delivery, operation_id=effect.operation_id, kind="send", outcome=o, started_at=timezone.now()
        )
        for o in outcomes
    ]


def test_two_tries_after_the_same_one_are_a_fork_and_a_deleted_try_breaks_the_next(decided):
    """A worker whose claim lapsed still records its try: two tries may follow the same one."""
    first, second = _tries(EffectRecord.objects.get(), ("unknown", "unknown"))
    fork = DeliveryTry(
        delivery_id=first.delivery_id,
        operation_id=first.operation_id,
        kind="send",
        outcome="delivered",
        started_at=timezone.now(),
        prev_hash=first.row_hash,
    )
    fork.save()
    seal_write()
    assert database_verify(public_keys=keys()).ok
    with triggers_off() as cursor:
        cursor.execute("DELETE FROM effects_deliverytry WHERE id = %s", [first.pk])
    problems = list(map(str, database_verify(public_keys=keys()).problems))
    assert f"effects.deliverytry {first.pk} was sealed by seal 1 and is missing: deleted" in problems
    assert (
        f"effects.deliverytry {fork.pk} follows an earlier delivery try of its delivery, which is missing: deleted"
    ) in problems


def _approval(proposal, reviewer) -> Approval:
    """One approval of two, as a two-approver policy's first approver writes it."""
    return Approval.objects.create(
        operation_id=proposal.operation_id, proposal=proposal, reviewer=reviewer, ordinal=1, required=2, channel="api"
    )


def test_a_table_chained_later_keeps_the_older_seals_valid_and_is_sealed_from_then_on(
    decided, reviewer, make_user, monkeypatch
):
    """The approvals joined the chain after seals existed: a seal made before says nothing of
    them and still verifies; the next seal covers them, and a change to one is then named."""
    import audit.seals

    before = tuple(t for t in audit.seals.TABLES if t.label != "reviews.approval")
    with monkeypatch.context() as m:
        m.setattr(audit.seals, "TABLES", before)
        old = seal_write().seal
    assert "reviews.approval" not in old.covers
    approval = _approval(proposal_create(case=decided.case), make_user("second"))
    report = database_verify(public_keys=keys())
    assert report.ok, report.problems
    assert report.unsealed["reviews.approval"] == 1
    new = seal_write().seal
    assert (new.number, new.covers["reviews.approval"]["through"]) == (2, approval.pk)
    report = database_verify(public_keys=keys())
    assert report.ok, report.problems
    assert report.unsealed_count == 0
    with triggers_off() as cursor:
        cursor.execute("UPDATE reviews_approval SET channel = %s WHERE id = %s", ["admin", approval.pk])
    assert first(database_verify(public_keys=keys())) == (
        f"reviews.approval {approval.pk} does not match its hash: it was changed after it was written"
    )


def test_a_seal_that_drops_a_table_the_one_before_covered_is_named(decided, reviewer, monkeypatch):
    import audit.seals

    seal_write()
    effect_commit(operation_id=decided.operation_id, approved=True, reviewer=reviewer)  # a replay's attempt to seal
    with monkeypatch.context() as m:
        m.setattr(audit.seals, "TABLES", tuple(t for t in audit.seals.TABLES if t.label != "reviews.approval"))
        seal_write()
    assert first(database_verify(public_keys=keys())) == (
        "seal 2 says nothing of reviews.approval, which the seal before it covered"
    )
