"""Benchmark fixtures: many fresh cases and proposals, built fast and consistently.

Everything here runs inside a configured Django process against the benchmark's own
database (never a test database of the suite, except in the smoke test's own one).
Proposals are built with the same identity functions ``proposal_create`` uses, so an
operation here is indistinguishable from one a reviewer would see.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

DEMO_CASE = Path(__file__).resolve().parent.parent / "cases" / "demo" / "t1042.json"


def run_token() -> str:
    """A prefix that keeps case IDs of separate runs (and processes) apart."""
    return f"B{os.getpid():x}{int(time.time() * 1000) % 10**9:x}"


def template_case():
    """The demo case T-1042, imported once; every benchmark case copies its content."""
    from cases.services import case_import

    return case_import(data=json.loads(DEMO_CASE.read_text())).case


def bench_reviewer(username: str = "bench-reviewer"):
    """An active staff user in the Reviewers group, with the permission cache warmed."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission

    from reviews.groups import ensure_review_groups

    reviewers, _ = ensure_review_groups(Group, Permission)
    user, created = get_user_model().objects.get_or_create(username=username, defaults={"is_staff": True})
    if created:
        user.groups.add(reviewers)
    user = get_user_model().objects.get(pk=user.pk)
    assert user.has_perm("reviews.review_proposal")
    return user


def make_cases(n: int, *, prefix: str, proposals: bool):
    """``n`` fresh cases like T-1042 (passages and findings included), in bulk.

    With ``proposals``, each gets its prepared proposal as the current one, exactly what
    ``proposal_create`` would have built (same body, evidence and policy identities; the
    operation identity differs by case ID).
    """
    from django.db import transaction

    from cases.models import Case, Finding, SelectedPassage
    from core import identity
    from reviews.models import Origin, Proposal
    from reviews.services import prepared_content

    template = template_case()
    passages = list(template.passages.all())
    findings = list(template.findings.all())
    with transaction.atomic():
        cases = Case.objects.bulk_create(
            [
                Case(
                    case_id=f"{prefix}-{i:07d}",
                    subject=template.subject,
                    customer_message=template.customer_message,
                    action=template.action,
                    policy=template.policy,
                    draft=template.draft,
                    import_digest=template.import_digest,
                )
                for i in range(n)
            ],
            batch_size=1000,
        )
        SelectedPassage.objects.bulk_create(
            [
                SelectedPassage(
                    case=c, source_version_id=p.source_version_id, quotation=p.quotation, position=p.position
                )
                for c in cases
                for p in passages
            ],
            batch_size=1000,
        )
        Finding.objects.bulk_create(
            [
                Finding(
                    case=c,
                    finding=f.finding,
                    licensed_clause=f.licensed_clause,
                    source_version_id=f.source_version_id,
                    position=f.position,
                )
                for c in cases
                for f in findings
            ],
            batch_size=1000,
        )
        if proposals:
            content = prepared_content(template)
            content.pop("case")
            rows = Proposal.objects.bulk_create(
                [
                    Proposal(
                        **{
                            **content,
                            "operation_id": identity.operation_id(
                                c.case_id, c.action, content["body"], content["evidence_id"], content["policy_id"]
                            ),
                        },
                        case=c,
                        origin=Origin.PREPARED,
                    )
                    for c in cases
                ],
                batch_size=1000,
            )
            for c, p in zip(cases, rows, strict=True):
                c.current_proposal = p
            Case.objects.bulk_update(cases, ["current_proposal"], batch_size=1000)
    analyze()
    return cases


def analyze() -> None:
    """Fresh planner statistics, as autovacuum keeps them on a production server. This
    machine's PostgreSQL runs without autovacuum (its CI settings), so a table filled in bulk
    is otherwise planned from guesses: a lookup of two passages by case started two parallel
    workers (8.5 ms against 0.4 ms), and a commit took 2.2 ms against 1.2 ms once analysed."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def raw_connect():
    """A raw DB-API connection to the same database Django uses, outside Django."""
    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "postgresql":
        import psycopg

        return psycopg.connect(
            dbname=s["NAME"],
            user=s["USER"] or None,
            password=s["PASSWORD"] or None,
            host=s["HOST"] or None,
            port=s["PORT"] or None,
        )
    import sqlite3

    # Autocommit at the driver level; transactions are begun explicitly like Django's
    # ``transaction_mode: IMMEDIATE`` does, so the baseline takes the same write lock.
    conn = sqlite3.connect(s["NAME"], timeout=30, isolation_level=None)
    return conn
