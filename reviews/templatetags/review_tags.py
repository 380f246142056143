"""Small display filters for the review and history pages."""

from django import template

from decisionflow.core.admin_base import when as _when
from decisionflow.core.identity import short as _short

register = template.Library()


@register.filter
def diff_class(line: str) -> str:
    """The CSS class of one unified-diff line."""
    if line.startswith(("+++", "---")):
        return "df-hunk"
    if line.startswith("@@"):
        return "df-hunk"
    if line.startswith("+"):
        return "df-add"
    if line.startswith("-"):
        return "df-del"
    return "df-ctx"


@register.filter
def short_op(value) -> str:
    return _short(value) if value else "-"


@register.filter
def when(value) -> str:
    return _when(value)
