"""Reads of cases that more than one channel needs."""

from __future__ import annotations

from decisionflow.core.errors import NotFound

from .models import Case


def case_by_id(case_id: str) -> Case:
    """The case with this external id; ``NotFound`` saying how to load it otherwise."""
    case = Case.objects.filter(case_id=case_id).first()
    if case is None:
        raise NotFound(f"no case {case_id!r}; load it with `manage.py load_case FILE.json`")
    return case


def case_text_fields(case: Case) -> list[tuple[str, str]]:
    """The case's own texts a reviewer reads, for the text policy's markers (docs/TEXT.md)."""
    return [("subject", case.subject), ("customer_message", case.customer_message)]
