"""Invariants in the database: unique operation identities, real booleans, write-once rows."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

from core.append_only import AppendOnlyError
from effects.models import CommitAttempt, EffectRecord
from effects.services import effect_commit
from reviews.models import Proposal, ReviewDecision


@pytest.fixture
def committed(proposal, reviewer):
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    return proposal


def _proposal_copy(proposal, **changes):
    fields = {
        f.name: getattr(proposal, f.name) for f in Proposal._meta.concrete_fields if f.name not in ("id", "created_at")
    }
    fields.update(changes)
    return Proposal(**fields)


def test_proposal_operation_id_is_unique_both_ways(proposal):
    duplicate = _proposal_copy(proposal)
    with pytest.raises(ValidationError, match="operation"):
        duplicate.full_clean()
    with pytest.raises(IntegrityError), transaction.atomic():
        Proposal.objects.create(
            **{
                f.name: getattr(duplicate, f.name)
                for f in Proposal._meta.concrete_fields
                if f.name not in ("id", "created_at")
            }
        )


def test_proposal_operation_id_format_is_checked(proposal):
    with pytest.raises(IntegrityError), transaction.atomic():
        _proposal_copy(proposal, operation_id="not-an-op").save()


def test_decision_is_unique_per_operation_both_ways(committed, reviewer):
    duplicate = ReviewDecision(
        operation_id=committed.operation_id, proposal=committed, approved=True, reviewer=reviewer
    )
    with pytest.raises(ValidationError):
        duplicate.full_clean()
    with pytest.raises(IntegrityError), transaction.atomic():
        ReviewDecision.objects.create(
            operation_id=committed.operation_id, proposal=committed, approved=False, reviewer=reviewer
        )


def test_decision_approved_cannot_be_null_both_ways(proposal, reviewer):
    decision = ReviewDecision(operation_id=proposal.operation_id, proposal=proposal, approved=None, reviewer=reviewer)
    with pytest.raises(ValidationError, match="approved"):
        decision.full_clean()
    with pytest.raises(IntegrityError), transaction.atomic():
        ReviewDecision.objects.create(
            operation_id=proposal.operation_id, proposal=proposal, approved=None, reviewer=reviewer
        )


def test_effect_is_unique_per_operation_both_ways(committed):
    effect = EffectRecord.objects.get()
    fields = {
        f.attname: getattr(effect, f.attname)
        for f in EffectRecord._meta.concrete_fields
        if f.name not in ("id", "recorded_at")
    }
    with pytest.raises(ValidationError):
        EffectRecord(**fields).full_clean()
    with pytest.raises(IntegrityError), transaction.atomic():
        EffectRecord.objects.create(**fields)


@pytest.mark.parametrize("model", [Proposal, ReviewDecision, EffectRecord, CommitAttempt])
def test_write_once_rows_refuse_orm_update_and_delete(committed, model):
    row = model.objects.first()
    with pytest.raises(AppendOnlyError):
        row.save()
    with pytest.raises(AppendOnlyError):
        row.delete()
    with pytest.raises(AppendOnlyError):
        model.objects.all().update(id=row.id)
    with pytest.raises(AppendOnlyError):
        model.objects.all().delete()
    assert model.objects.filter(pk=row.pk).exists()


@pytest.mark.parametrize(
    "table, column",
    [
        ("reviews_proposal", "body"),
        ("reviews_reviewdecision", "approved"),
        ("effects_effectrecord", "body"),
        ("effects_commitattempt", "outcome"),
    ],
)
def test_raw_sql_update_is_refused_by_a_trigger(committed, table, column):
    value = {"approved": False, "outcome": "'replay'"}.get(column, "'tampered'")
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = {value}")


@pytest.mark.postgres
@pytest.mark.parametrize(
    "table", ["reviews_proposal", "reviews_reviewdecision", "effects_effectrecord", "effects_commitattempt"]
)
def test_raw_sql_delete_is_refused_by_a_trigger_on_postgres(committed, table):
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table}")
