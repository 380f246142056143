"""The seal (docs/AUDIT.md, "Seals"): what the chained tables held at one moment, signed.

A seal covers, per chained table, every row up to its highest id then: the ids missing since
the previous seal (ids never committed: a rolled-back insert still takes one), the count, and a
digest that extends the previous seal's over the new rows in id order, each as its id and
its hash recomputed from its values (so a row from before the chain is covered by its
content as well). A seal's statement, the bytes signed, frames every one of these values
as in docs/PROTOCOL.md; ``seal_hash`` is its SHA-256 and the next seal names it.

"Up to its highest id" must mean every row that will ever have such an id: an insert takes
its id before it commits, so a row with a lower id may still be on its way. On PostgreSQL
the seal first takes a SHARE lock on the chained tables, which waits for the inserts under
way to end (and holds new ones back for as long as it reads the highest ids, a moment), with
a short lock timeout; on SQLite a write holds the whole database, so any read sees every
id taken. Commit attempts are covered the same way as every other row: a refusal's row waits
for no case lock, only, once a seal run, for the inserts then under way.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Max
from django.utils import timezone

from audit.chain import TABLES, Table, recomputed, row_problem
from audit.models import Seal
from core import signing
from core.chain import canonical
from core.errors import AuditMismatch, LockBusy
from core.identity import encode_exact
from core.locks import lock_not_available

SEAL_TAG = "decisionflow.seal.v1"
ROWS_TAG = "decisionflow.sealed-rows.v1"
SEAL_PREFIX = "seal-v1-"
# How long a seal waits, on PostgreSQL, for the inserts under way into the chained tables
# (new inserts wait behind it meanwhile).
HEADS_LOCK_TIMEOUT = "2s"


class Digest:
    """One table's digest, extended row by row from the previous seal's."""

    def __init__(self, label: str, previous: str):
        self._hash = hashlib.sha256(encode_exact([ROWS_TAG, label, previous]))

    def add(self, row_id: int, row_hash: str) -> None:
        self._hash.update(encode_exact([str(row_id), row_hash]))

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


EMPTY: dict[str, Any] = {"through": 0, "count": 0, "missing": [], "digest": "", "chained_from": None}


def covered(seal: Seal | None, label: str) -> dict[str, Any]:
    """What ``seal`` says of one table (the empty coverage before the first seal)."""
    return EMPTY if seal is None else {**EMPTY, **seal.covers.get(label, {})}


def statement(*, number: int, sealed_at, previous: str, key_id: str, covers: dict[str, dict]) -> bytes:
    """The bytes a seal signs: every value it holds, framed, the tables in their fixed order."""
    fields = [SEAL_TAG, str(number), canonical(sealed_at), previous, key_id]
    for table in TABLES:
        if table.label not in covers:
            continue  # a table added after this seal was made (see audit.chain.TABLES)
        c = {**EMPTY, **covers[table.label]}
        fields += [table.label, str(c["through"]), str(c["count"]), canonical(c["missing"]), c["digest"]]
        fields.append(canonical(c["chained_from"]))
    return encode_exact(fields)


def hash_of_statement(data: bytes) -> str:
    return SEAL_PREFIX + hashlib.sha256(data).hexdigest()


def seal_statement(seal: Seal) -> bytes:
    return statement(
        number=seal.number, sealed_at=seal.sealed_at, previous=seal.previous, key_id=seal.key_id, covers=seal.covers
    )


def _heads() -> dict[str, int]:
    """Each chained table's highest id, once no insert that took a lower one is under way."""
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [HEADS_LOCK_TIMEOUT])
            tables = ", ".join(connection.ops.quote_name(t.model._meta.db_table) for t in TABLES)
            try:
                cursor.execute(f"LOCK TABLE {tables} IN SHARE MODE")
            except OperationalError as exc:
                if lock_not_available(exc):
                    raise LockBusy(
                        f"audit_seal: inserts into the chained tables ran longer than {HEADS_LOCK_TIMEOUT}; "
                        "the next run seals them"
                    ) from None
                raise
        return {t.label: t.model._default_manager.aggregate(top=Max("id"))["top"] or 0 for t in TABLES}


@dataclass(frozen=True)
class Sealed:
    seal: Seal | None  # None: nothing new since ``latest``
    latest: Seal | None
    new_rows: int


def _covers_table(table: Table, before: dict[str, Any], through: int) -> tuple[dict[str, Any], int]:
    """One table's coverage from ``before`` on to ``through``; a row that is already broken
    is refused (AuditMismatch): a seal must not vouch for it."""
    digest = Digest(table.label, before["digest"])
    missing: list[list[int]] = []  # this seal's own: the ids of (before, through] never committed
    chained_from = before["chained_from"]
    expected, count = before["through"] + 1, 0
    rows = table.model._default_manager.filter(id__gt=before["through"], id__lte=through)
    for row in table.rows(rows):
        computed = recomputed(row)
        problem = row_problem(table, row, computed, chained_from=chained_from)
        if problem:
            raise AuditMismatch.unsealable(table.label, row.id, problem)
        if chained_from is None and row.row_hash is not None:
            chained_from = row.id
        if row.id > expected:
            missing.append([expected, row.id - 1])
        digest.add(row.id, computed)
        expected, count = row.id + 1, count + 1
    if through >= expected:
        missing.append([expected, through])
    covers = {
        "through": through,
        "count": before["count"] + count,
        "missing": missing,
        "digest": digest.hexdigest(),
        "chained_from": chained_from,
    }
    return covers, count


def seal_write(*, now=None) -> Sealed:
    """Seal every chained row written since the latest seal, signed with the audit key.

    Invariant: seals form one line (number n+1 names seal n's hash, both unique keys), each
    covers everything the one before covered and what was written since, and a seal is
    written only when there is something new. Transactions: the heads are read in one (under
    the tables' SHARE lock on PostgreSQL), the seal is inserted in another; a second run
    that raced this one past the command's lock is refused by the unique keys and writes
    nothing (``LockBusy``). Refuses to seal a row that is already broken (``AuditMismatch``)
    and to seal without a key (``SigningKeyMissing``), before anything is written.
    """
    key = signing.signing_key()
    latest = Seal.objects.order_by("-number").first()
    heads = _heads()
    covers: dict[str, dict] = {}
    new_rows = 0
    for table in TABLES:
        before = covered(latest, table.label)
        covers[table.label], count = _covers_table(table, before, max(heads[table.label], before["through"]))
        new_rows += count
    if latest is not None and all(covers[t.label]["through"] == covered(latest, t.label)["through"] for t in TABLES):
        return Sealed(seal=None, latest=latest, new_rows=0)
    number = 1 if latest is None else latest.number + 1
    previous = "" if latest is None else latest.seal_hash
    sealed_at = now or timezone.now()
    key_id = signing.key_id(signing.public_key_pem(key))
    data = statement(number=number, sealed_at=sealed_at, previous=previous, key_id=key_id, covers=covers)
    try:
        with transaction.atomic():
            seal = Seal.objects.create(
                number=number,
                sealed_at=sealed_at,
                covers=covers,
                previous=previous,
                seal_hash=hash_of_statement(data),
                key_id=key_id,
                signature=base64.b64encode(signing.sign(data, key)).decode("ascii"),
            )
    except IntegrityError:
        raise LockBusy(f"audit_seal: seal {number} was written by another run meanwhile; nothing written") from None
    return Sealed(seal=seal, latest=latest, new_rows=new_rows)
