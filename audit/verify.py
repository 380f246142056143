"""``audit_verify`` of the live database, and the history page's check of one case
(docs/AUDIT.md, "Verifying").

The whole database: every seal in turn (its number, the seal before it that it names, the
hash of its statement, its signature by one of the public keys given), then every chained
row in id order (its hash recomputed from its values, its link to the row it follows), and,
per seal, the rows it covers: exactly the ids it sealed (a sealed id gone: deleted; an id it
had as never committed, or a row with no id then: inserted afterwards) and, over them, its
digest (rows changed with their hashes recomputed, swapped or put back in another order).
Rows above the latest seal are counted as unsealed: their hashes and links are checked, but
nothing signed says they existed, so deleting one of them cannot be proven.

One case: its rows of every chained table, each hash and link, and the latest seal's own
signature; whether a row of the case was deleted is the whole database's check.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Min
from django.utils import timezone

from audit.chain import TABLES, Table, recomputed, row_problem
from audit.models import Seal
from audit.seals import Digest, covered, hash_of_statement, seal_statement
from core import signing
from core.errors import DecisionflowError, InvalidInput
from core.observability import AuditResult, AuditScope, audit_observed

# How many problems a report keeps (it counts them all).
KEPT = 20


@dataclass(frozen=True)
class Problem:
    where: str  # "reviews.proposal 42", "seal 3", "reviews.proposal 40-57 (seal 3)"
    what: str

    def __str__(self) -> str:
        return f"{self.where} {self.what}"


@dataclass
class Report:
    seal: Seal | None = None  # the latest seal, as verified
    seals: int = 0
    rows: int = 0
    sealed: int = 0
    unsealed: dict[str, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    @property
    def unsealed_count(self) -> int:
        return sum(self.unsealed.values())

    def add(self, where: str, what: str) -> None:
        self.problem_count += 1
        if len(self.problems) < KEPT:
            self.problems.append(Problem(where, what))


def _keys(public_pems: Iterable[bytes]) -> dict[str, bytes]:
    """The public keys given, by key id (ValueError names one that is not a key)."""
    return {signing.key_id(pem): pem for pem in public_pems}


def seal_problem(seal: Seal, keys: dict[str, bytes]) -> str | None:
    """What is wrong with one seal by itself, or None."""
    data = seal_statement(seal)
    if hash_of_statement(data) != seal.seal_hash:
        return "does not match its hash: it was changed after it was signed"
    pem = keys.get(seal.key_id)
    if pem is None:
        given = ", ".join(sorted(keys)) or "none"
        return f"was signed by key {seal.key_id}, not by a key given ({given}): give its public key"
    try:
        signature = base64.b64decode(seal.signature, validate=True)
    except (binascii.Error, ValueError):
        return "has a signature that is not base64: it was changed"
    if not signing.verify(pem, data, signature):
        return f"does not verify with the public key {seal.key_id}: it was changed or forged"
    return None


def _seals_verified(report: Report, keys: dict[str, bytes], expected: dict[int, str]) -> list[Seal]:
    seals = list(Seal.objects.order_by("number"))
    by_number = {seal.number: seal for seal in seals}
    for number, seal_hash in sorted(expected.items()):
        found = by_number.get(number)
        if found is None:
            report.add(f"seal {number}", f"is missing, though it was written ({seal_hash}): seals were deleted")
        elif found.seal_hash != seal_hash:
            report.add(f"seal {number}", f"is not the seal written ({seal_hash}): it was replaced")
    previous: Seal | None = None
    for index, seal in enumerate(seals, start=1):
        where = f"seal {seal.number}"
        if seal.number != index:
            report.add(f"seal {index}", f"is missing: deleted (the seals go on at {seal.number})")
        if seal.previous != ("" if previous is None else previous.seal_hash):
            report.add(where, "does not name the seal before it: a seal was removed, replaced or reordered")
        problem = seal_problem(seal, keys)
        if problem:
            report.add(where, problem)
        for table in TABLES:
            if previous is not None and table.label in previous.covers and table.label not in seal.covers:
                report.add(where, f"says nothing of {table.label}, which the seal before it covered")
            elif covered(seal, table.label)["through"] < covered(previous, table.label)["through"]:
                report.add(where, f"covers fewer {table.label} rows than the seal before it")
        previous = seal
    report.seals = len(seals)
    report.seal = previous
    return seals


def _expected_ids(low: int, high: int, missing: list[list[int]]) -> Iterator[int]:
    """The ids a seal covers in (low, high]: all but the ones it had as never committed."""
    gaps = sorted((a, b) for a, b in missing)
    at = low + 1
    for a, b in gaps:
        yield from range(at, a)
        at = max(at, b + 1)
    yield from range(at, high + 1)


def _interval_check(
    report: Report, table: Table, seal: Seal, low: int, ids: list[int], digest: Digest, *, named: bool
) -> None:
    """The rows of one seal's interval against what it sealed. ``named``: a row of it was
    named already (its digest cannot match then, and says nothing more)."""
    if table.label not in seal.covers:
        return  # the seal was made before the table was chained: it vouches for none of its rows
    c = covered(seal, table.label)
    where = f"{table.label}"
    expected = list(_expected_ids(low, c["through"], c["missing"]))
    if ids != expected:
        seen, wanted = set(ids), set(expected)
        gone = sorted(wanted - seen)
        new = sorted(seen - wanted)
        if gone:
            more = f" (and {len(gone) - 1} more)" if len(gone) > 1 else ""
            report.add(f"{where} {gone[0]}", f"was sealed by seal {seal.number} and is missing: deleted{more}")
        if new:
            more = f" (and {len(new) - 1} more)" if len(new) > 1 else ""
            report.add(
                f"{where} {new[0]}",
                f"was not there when seal {seal.number} was made: inserted afterwards, out of order{more}",
            )
        return
    if digest.hexdigest() != c["digest"] and not named:
        report.add(
            f"{where} {low + 1}-{c['through']}",
            f"(sealed by seal {seal.number}) do not match its digest: rows in it were changed with their "
            "hashes recomputed, swapped or reordered",
        )


def _table_verified(report: Report, table: Table, seals: list[Seal]) -> None:
    # A row from the first hashed one on must have a hash: the seals say where that is, or
    # (before any seal covers one) the table itself.
    chained_from = next(
        (covered(s, table.label)["chained_from"] for s in seals if covered(s, table.label)["chained_from"]), None
    )
    if chained_from is None:
        chained_from = table.model._default_manager.filter(row_hash__isnull=False).aggregate(first=Min("id"))["first"]
    k, low = 0, 0
    ids: list[int] = []
    digest = Digest(table.label, "")
    unsealed = 0
    problems_before = report.problem_count

    def close() -> None:
        nonlocal k, low, ids, digest, problems_before
        seal = seals[k]
        _interval_check(report, table, seal, low, ids, digest, named=report.problem_count > problems_before)
        low = covered(seal, table.label)["through"]
        k += 1
        ids = []
        digest = Digest(table.label, covered(seal, table.label)["digest"])
        problems_before = report.problem_count

    for row in table.rows():
        while k < len(seals) and row.id > covered(seals[k], table.label)["through"]:
            close()
        report.rows += 1
        computed = recomputed(row)
        problem = row_problem(table, row, computed, chained_from=chained_from)
        if problem:
            report.add(f"{table.label} {row.id}", problem)
        if k < len(seals):
            ids.append(row.id)
            digest.add(row.id, computed)
            report.sealed += 1
        else:
            unsealed += 1
    while k < len(seals):
        close()
    report.unsealed[table.label] = unsealed


def database_verify(*, public_keys: Iterable[bytes], expected_seals: dict[int, str] | None = None) -> Report:
    """Verify every seal and every chained row of the live database (read only).
    ``expected_seals``: seal number to seal hash, as ``audit_seal`` printed them: each must
    still be there, unchanged (the latest seals deleted would otherwise pass as unsealed rows)."""
    report = Report()
    keys = _keys(public_keys)
    seals = _seals_verified(report, keys, expected_seals or {})
    for table in TABLES:
        _table_verified(report, table, seals)
    return report


def _case_rows(table: Table, case_pk: int) -> Any:
    path = {"reviewdecision": "proposal__case_id", "deliverytry": "delivery__case_id", "approval": "proposal__case_id"}
    return table.model._default_manager.filter(**{path.get(str(table.model._meta.model_name), "case_id"): case_pk})


def case_verify(case_pk: int, *, public_keys: Iterable[bytes]) -> Report:
    """Verify the latest seal and the rows of one case: their hashes, their links, and
    which of them the latest seal covers (read only)."""
    report = Report()
    keys = _keys(public_keys)
    latest = Seal.objects.order_by("-number").first()
    report.seal = latest
    if latest is not None:
        report.seals = 1
        problem = seal_problem(latest, keys)
        if problem:
            report.add(f"seal {latest.number}", problem)
    for table in TABLES:
        through = covered(latest, table.label)["through"]
        chained_from = covered(latest, table.label)["chained_from"]
        unsealed = 0
        for row in table.rows(_case_rows(table, case_pk)):
            report.rows += 1
            problem = row_problem(table, row, recomputed(row), chained_from=chained_from)
            if problem:
                report.add(f"{table.label} {row.id}", problem)
            if row.id <= through:
                report.sealed += 1
            else:
                unsealed += 1
        report.unsealed[table.label] = unsealed
    return report


def configured_public_keys() -> list[bytes]:
    """The public keys a check uses when none are given: the PEM files of
    DECISIONFLOW_AUDIT_PUBLIC_KEY_FILES (every key that signed a seal still kept, after a
    rotation), else the public half of the configured signing key. ``SigningKeyMissing``
    when there is neither; ``InvalidInput`` for a file that cannot be read."""
    files = list(getattr(settings, "DECISIONFLOW_AUDIT_PUBLIC_KEY_FILES", []) or [])
    if not files:
        return [signing.public_key_pem()]
    pems = []
    for name in files:
        try:
            pems.append(Path(name).read_bytes())
        except OSError as exc:
            raise InvalidInput(f"DECISIONFLOW_AUDIT_PUBLIC_KEY_FILES: cannot read {name}: {exc.strerror}") from None
    return pems


@dataclass(frozen=True)
class CaseChain:
    """What the history page says of a case's chain."""

    verified: bool
    text: str
    report: Report | None = None


def case_chain(case_pk: int) -> CaseChain:
    """The history page's line: verified up to the latest seal, or the first break."""
    try:
        keys = configured_public_keys()
    except DecisionflowError as exc:
        return CaseChain(False, f"Not verified: {exc.message}")
    report = case_verify(case_pk, public_keys=keys)
    audit_observed(scope=AuditScope.CASE, result=audit_result(report))
    since = f"; {report.unsealed_count} written since, not sealed yet" if report.unsealed_count else ""
    if not report.ok:
        more = f" ({report.problem_count} problems)" if report.problem_count > 1 else ""
        return CaseChain(False, f"Chain broken: {report.problems[0]}{more}. Run manage.py audit_verify.", report)
    if report.seal is None:
        return CaseChain(
            True,
            f"Chain intact, not sealed yet: the {report.rows} rows of this case hash and link as written; "
            "no seal covers them (manage.py audit_seal).",
            report,
        )
    at = timezone.localtime(report.seal.sealed_at).strftime("%Y-%m-%d %H:%M:%S %Z")
    return CaseChain(
        True,
        f"Chain verified up to seal {report.seal.number} at {at}: the {report.rows} rows of this case hash and "
        f"link as written{since}.",
        report,
    )


def audit_result(report: Report) -> AuditResult:
    if not report.ok:
        return AuditResult.BROKEN
    return AuditResult.VERIFIED if report.seal is not None else AuditResult.NOT_SEALED
