"""Reads of cases that more than one channel needs."""

from __future__ import annotations

import functools

from django.db import connection

from cases.models import Case, Finding, Policy, SelectedPassage, Source, SourceVersion
from core.errors import NotFound


def case_by_id(case_id: str) -> Case:
    """The case with this external id; ``NotFound`` saying how to load it otherwise."""
    case = Case.objects.filter(case_id=case_id).first()
    if case is None:
        raise NotFound(f"no case {case_id!r}; load it with `manage.py load_case FILE.json`")
    return case


def current_policy(name: str) -> Policy | None:
    """The version of policy ``name`` that governs now: the last one published (None: no
    version of it was ever published, and a case may come under any version)."""
    return Policy.objects.filter(name=name, published_at__isnull=False).order_by("-published_at", "-pk").first()


def case_text_fields(case: Case) -> list[tuple[str, str]]:
    """The case's own texts a reviewer reads, for the text policy's markers (docs/TEXT.md)."""
    return [("subject", case.subject), ("customer_message", case.customer_message)]


@functools.cache
def evidence_sql(placeholder: str = "%s") -> str:
    """The read of ``case_evidence``, its case pk written as ``placeholder`` (twice); for a
    caller that sends it in a query string of its own, then hands the rows to ``evidence_rows``."""
    # Raw SQL: every begin reads this, and the ORM's two queries (one per kind) spent more
    # time compiling than the database spent answering, and fetched each source's full text.
    passage, finding = SelectedPassage._meta.db_table, Finding._meta.db_table
    version, source = SourceVersion._meta.db_table, Source._meta.db_table
    joins = f"JOIN {version} v ON v.id = e.source_version_id JOIN {source} s ON s.id = v.source_id"
    return (
        f"SELECT 0, e.position, e.id, s.source_id, v.version, e.quotation, CAST(NULL AS TEXT), CAST(NULL AS TEXT) "
        f"FROM {passage} e {joins} WHERE e.case_id = {placeholder} "
        "UNION ALL "
        f"SELECT 1, e.position, e.id, s.source_id, v.version, CAST(NULL AS TEXT), e.finding, e.licensed_clause "
        f"FROM {finding} e {joins} WHERE e.case_id = {placeholder} "
        "ORDER BY 1, 2, 3"
    )


def case_evidence(case_pk: int) -> tuple[list[dict], list[dict]]:
    """The case's selected passages and its findings, in their positions' order, each naming
    its source and version: what a prepared proposal snapshots, in one query."""
    with connection.cursor() as cursor:
        cursor.execute(evidence_sql(), [case_pk, case_pk])
        return evidence_rows(cursor.fetchall())


def evidence_rows(rows) -> tuple[list[dict], list[dict]]:
    """The passages and the findings, from the rows of ``evidence_sql``."""
    passages: list[dict] = []
    findings: list[dict] = []
    for kind, _position, _pk, source_id, version, quotation, finding, clause in rows:
        if kind == 0:
            passages.append({"source_id": source_id, "version": version, "quotation": quotation})
        else:
            findings.append({"finding": finding, "licensed_clause": clause, "source_id": source_id, "version": version})
    return passages, findings
