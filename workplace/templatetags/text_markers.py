"""Showing the text policy's markers (docs/TEXT.md) on the admin pages.

``{{ value|marked }}`` escapes a text and draws each of the text policy's markers where it
stands; ``{% text_banner warnings %}`` counts them at the top of a page.
"""

from __future__ import annotations

from django import template

from core import text
from workplace.display import marked_html, proposal_body_html

register = template.Library()


@register.filter
def marked(value):
    """The text, HTML-escaped, with every marker drawn where it stands (text unchanged)."""
    return marked_html("" if value is None else str(value))


@register.filter
def proposal_body(proposal):
    """A proposal's body exactly as the review page shows it (``proposal_body_html``)."""
    return proposal_body_html(proposal)


@register.inclusion_tag("admin/decisionflow/text_banner.html")
def text_banner(warnings, where="on this page"):
    """The banner that counts the markers of a page; nothing when there are none."""
    return banner_context(warnings, where)


def banner_context(warnings, where: str) -> dict:
    """What the banner shows: the summary of ``warnings`` and where they stand."""
    return {"summary": text.summary(warnings or []), "warnings": warnings or [], "where": where}


@register.inclusion_tag("admin/decisionflow/text_markers_cell.html")
def text_markers_cell(warnings):
    """A compact per-row list of markers (the bulk confirmation)."""
    return {"summary": text.summary(warnings or [])}


@register.simple_tag
def history_warnings(history):
    """The markers of every diff and person-written sentence shown in a case's history."""
    fields = []
    for event in history.events:
        if event.kind != "proposal":
            continue
        op = event.obj.short_operation_id
        if event.obj.parent_id is None:  # shown whole: it has no parent to diff against
            fields.append((f"{op} text", event.obj.body))
        fields += [(f"{op} diff line {i + 1}", line) for i, line in enumerate(event.diff)]
        fields += [(f"{op} sentence {i + 1}", s) for i, s in enumerate(event.obj.unchecked_sentences or [])]
    return text.warnings(fields)
