"""Small display filters for the review and history pages."""

from django import template

from core.identity import short as _short
from workplace.display import when as _when

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
