"""The chained tables, and how each row's link is checked (docs/AUDIT.md, "The chain").

The hashes themselves are core/chain.py's; this says which tables the seals cover, in the
order they are sealed and verified, and reads each one back with what its rows link to, in
one statement per table: a correlated subquery for the row a link names (NULL when it is
gone), or for the earlier rows of the same delivery or notification.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import Exists, Model, OuterRef, QuerySet, Subquery

from core.chain import row_hash
from effects.models import CommitAttempt, Delivery, DeliveryTry, EffectRecord
from reviews.models import Approval, NotificationEvent, Proposal, ReviewDecision

CHUNK = 2000


@dataclass(frozen=True)
class Row:
    """One chained row as stored, with what its link should be."""

    label: str
    id: int
    prev_hash: str | None
    row_hash: str | None
    values: tuple
    # The hash this row's prev_hash must equal; None when it cannot be known because the
    # row the link names is gone (``gone`` says which).
    expected_prev: str | None
    gone: str = ""


@dataclass(frozen=True)
class Table:
    model: type[Model]
    # How the link is read: a foreign key naming the row followed ("parent_id" may be NULL:
    # a root), or the partition whose previous row is followed (and, for a first row, the
    # row it follows instead).
    follows_fk: str = ""
    follows_model: type[Model] | None = None
    partition: str = ""

    @property
    def label(self) -> str:
        return self.model._meta.label_lower

    @property
    def fields(self) -> tuple[str, ...]:
        return self.model.CHAIN_FIELDS  # type: ignore[attr-defined]  # each chained model declares it

    @property
    def chained(self) -> bool:
        return any(f.attname == "prev_hash" for f in self.model._meta.concrete_fields)

    def rows(self, queryset: QuerySet | None = None) -> Iterator[Row]:
        """The table's rows (or ``queryset``'s), in id order, each with its expected link."""
        qs = (self.model._default_manager.all() if queryset is None else queryset).order_by("id")
        head = ["id", "prev_hash", "row_hash"] if self.chained else ["id", "row_hash"]
        annotations: dict[str, Any] = {}
        extra: list[str] = []
        if self.follows_fk:
            assert self.follows_model is not None
            linked = self.follows_model._default_manager.filter(pk=OuterRef(self.follows_fk))
            annotations = {"linked_hash": Subquery(linked.values("row_hash")[:1]), "linked_exists": Exists(linked)}
            extra = [self.follows_fk, "linked_hash", "linked_exists"]
        elif self.partition:
            # The rows before it in the same partition (correlated subqueries, which a WHERE
            # on the ids does not cut short as it would a window function).
            before = self.model._default_manager.filter(
                **{self.partition: OuterRef(self.partition)}, id__lt=OuterRef("id")
            )
            annotations = {
                "before_any": Exists(before),
                "follows_before": Exists(before.filter(row_hash=OuterRef("prev_hash"))),
                "before_unhashed": Exists(before.filter(row_hash__isnull=True)),
            }
            extra = ["before_any", "follows_before", "before_unhashed"]
            if self.model is DeliveryTry:
                delivery = Delivery.objects.filter(pk=OuterRef("delivery_id"))
                annotations["linked_hash"] = Subquery(delivery.values("effect__row_hash")[:1])
                annotations["linked_exists"] = Exists(delivery.filter(effect__isnull=False))
                extra += ["linked_hash", "linked_exists"]
        width = len(head) + len(self.fields)
        for values in qs.annotate(**annotations).values_list(*head, *self.fields, *extra).iterator(chunk_size=CHUNK):
            stored = dict(zip(head, values, strict=False))
            yield Row(
                label=self.label,
                id=stored["id"],
                prev_hash=stored.get("prev_hash"),
                row_hash=stored["row_hash"],
                values=tuple(values[len(head) : width]),
                **self._link({**dict(zip(extra, values[width:], strict=True)), "prev_hash": stored.get("prev_hash")}),
            )

    def _link(self, found: dict[str, Any]) -> dict[str, Any]:
        """The hash the row's ``prev_hash`` must be, or which row its link names is gone."""
        if self.follows_fk:
            fk = found[self.follows_fk]
            if fk is None:  # a proposal without a parent: a root
                return {"expected_prev": ""}
            if found["linked_exists"]:
                return {"expected_prev": found["linked_hash"] or ""}
            name = self.follows_model._meta.verbose_name  # type: ignore[union-attr]  # set with follows_fk
            return {"expected_prev": None, "gone": f"{name} {fk}"}
        if self.partition:
            # A row follows the partition's latest row its writer saw: an earlier row, or the
            # partition's root when it saw none. Two writers at once (a worker whose claim
            # lapsed still records its try) may follow the same row: a fork, not a break.
            # A row whose link names no earlier row (it was deleted) is a break.
            root = ""
            if self.model is DeliveryTry:
                if not found["linked_exists"]:
                    return {"expected_prev": None, "gone": "the effect of its delivery"}
                root = found["linked_hash"] or ""
            prev = found["prev_hash"]
            if prev == root or found["follows_before"] or (prev == "" and found["before_unhashed"]):
                return {"expected_prev": prev}
            if found["before_any"]:
                name, owner = self.model._meta.verbose_name, self.partition.removesuffix("_id")
                return {"expected_prev": None, "gone": f"an earlier {name} of its {owner}"}
            return {"expected_prev": root}
        return {"expected_prev": ""}


# Sealed and verified in this order; the order is part of a seal's signed statement. A table
# added later goes last, and a seal made before it says nothing of it (``seals.statement``
# frames only the tables a seal covers), so the seals already signed stay valid; the first
# seal after the upgrade covers the new table's rows from its first one.
TABLES: tuple[Table, ...] = (
    Table(Proposal, follows_fk="parent_id", follows_model=Proposal),
    Table(ReviewDecision, follows_fk="proposal_id", follows_model=Proposal),
    Table(EffectRecord, follows_fk="decision_id", follows_model=ReviewDecision),
    Table(CommitAttempt),
    Table(DeliveryTry, partition="delivery_id"),
    Table(NotificationEvent, partition="notification_id"),
    Table(Approval, follows_fk="proposal_id", follows_model=Proposal),
)
BY_LABEL = {table.label: table for table in TABLES}


def recomputed(row: Row) -> str:
    """The row's hash from its values as stored now."""
    return row_hash(row.label, row.prev_hash, row.values)


def row_problem(table: Table, row: Row, computed: str, *, chained_from: int | None) -> str | None:
    """What is wrong with ``row`` by itself and its link, or None. ``chained_from``: the
    table's first hashed row (every row from it on must have a hash)."""
    if row.row_hash is None:
        if chained_from is not None and row.id >= chained_from:
            return "has no hash, though the rows before it have theirs: its hash was removed"
        return None  # from before the chain: the seals cover it by its content
    if row.row_hash != computed:
        return "does not match its hash: it was changed after it was written"
    if table.chained:
        if row.gone:
            return f"follows {row.gone}, which is missing: deleted"
        if row.prev_hash != row.expected_prev:
            return "does not follow the row it names: that row was changed, replaced or deleted"
    return None
