"""Shared pieces of the admin: the view-only base class, and text as a page shows it (HTML)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.core.exceptions import FieldDoesNotExist
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from cases.models import Case
from core.identity import short
from core.text import Marker, MarkerKind, markers, when
from workplace.links import case_history_url


class ViewOnlyAdmin(admin.ModelAdmin):
    """Write-once and engine-owned rows are read here, never written: the services write them.

    No add, change or delete, and no actions (``delete_selected`` would bypass
    ``Model.delete()`` and meet the append-only triggers anyway).
    """

    # Typed as ModelAdmin.actions is, so that a subclass may list its own actions.
    actions: Sequence[Callable[..., Any] | str] | None = None

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        # Nothing here is changed through the admin, so Django's History (its LogEntry log)
        # would always say "This object doesn't have a change history". The detail page
        # links the case's own timeline instead, or no history at all
        # (admin/change_form_object_tools.html).
        case_pk = case_of(obj)
        context.update(no_change_history=True, case_history_url=case_history_url(case_pk) if case_pk else None)
        return super().render_change_form(request, context, add, change, form_url, obj)


def case_of(obj) -> int | None:
    """The primary key of the case a row belongs to: the case itself, its ``case``, or its
    proposal's case; None for rows of no one case (sources, policies, checkpoints)."""
    if obj is None:
        return None
    if isinstance(obj, Case):
        return obj.pk
    for name in ("case", "proposal"):
        try:
            field = obj._meta.get_field(name)
        except FieldDoesNotExist:
            continue
        if name == "case":
            return getattr(obj, field.attname)
        proposal = getattr(obj, name)
        return proposal.case_id if proposal is not None else None
    return None


def op_html(operation_id: str | None):
    """The short identity, with the full one on hover and in the copyable title."""
    if not operation_id:
        return "-"
    return format_html('<code class="df-op" title="{}">{}</code>', operation_id, short(operation_id))


def pre_html(text: str | None):
    """Text exactly as stored, line breaks kept, HTML escaped, the text policy's markers
    drawn where they stand (docs/TEXT.md)."""
    return format_html('<pre class="df-pre">{}</pre>', marked_html(text or ""))


def when_html(value: datetime | None):
    """``when`` for a narrow list column: the date and the time of day each kept whole, so
    the cell breaks between them instead of pushing the last columns off a 1280 px screen."""
    if value is None:
        return "-"
    date, time_of_day = when(value).split(" ", 1)
    return format_html('<span class="df-nowrap">{}</span> <span class="df-nowrap">{}</span>', date, time_of_day)


# Each kind's class on the page (``df-tm-<class>``). A character is outlined where it stands;
# a stack, run, number or word is highlighted.
MARKER_CLASSES = {
    MarkerKind.INVISIBLE: "invisible",
    MarkerKind.UNDEFINED: "undefined",
    MarkerKind.STACKED_MARKS: "stacked",
    MarkerKind.OVERLAY: "overlay",
    MarkerKind.NON_ASCII_DIGITS: "digits",
    MarkerKind.MIXED_SCRIPT: "mixed",
    MarkerKind.MATHEMATICAL: "math",
    MarkerKind.CONFUSABLE: "confusable",
}
_CHARACTERS = (MarkerKind.INVISIBLE, MarkerKind.UNDEFINED)


def _marker_tags(m: Marker) -> tuple[str, str, str]:
    """The opening tag, the closing tag, and the opening of a piece that is not the marker's
    last (a marker cut by another it overlaps: its badge goes on the last piece only)."""
    css = f"df-tm df-tm-{MARKER_CLASSES[m.kind]}"
    extra: str = ""
    if m.kind in _CHARACTERS:
        title = f"{m.code_point} {m.name}: kept in the text and in its identity"
        tag, extra = "span", format_html(' data-cp="{}"', m.code_point)
    else:
        title, tag = f"{m.name}: {m.code_point}", "mark"
    opening = '<{tag} class="{css}"{extra} data-label="{label}" title="{title}">'
    values = {"tag": tag, "extra": extra, "label": m.label, "title": title}
    return (
        format_html(opening, css=css, **values),
        f"</{tag}>",
        format_html(opening, css=f"{css} df-tm-part", **values),
    )


def _nested(text: str, spans: list[tuple[int, int, str, str, str]]) -> str:
    """``text`` escaped, each span ``(start, end, opening, closing, opening of a piece)``
    around its part. Spans come outer first. A span that runs past the end of one around it
    is closed there and opened again after it, so the HTML nests. Linear: a span is opened
    again once for each span it crosses."""
    out: list[str] = []
    stack: list[list] = []  # open spans, outermost first: [end, opening, closing, piece, where in out]
    pos = 0

    def close_until(limit: int) -> None:
        nonlocal pos
        while stack:
            end = min(item[0] for item in stack)
            if end > limit:
                return
            out.append(escape(text[pos:end]))
            pos = end
            deepest = next(i for i, item in enumerate(stack) if item[0] == end)
            cut = stack[deepest:]
            del stack[deepest:]
            out.extend(item[2] for item in reversed(cut))
            for item in cut:
                if item[0] > end:  # cut by a span ending inside it: this piece is not its last
                    out[item[4]] = item[3]
                    item[4] = len(out)
                    out.append(item[1])
                    stack.append(item)

    for start, end, opening, closing, piece in spans:
        close_until(start)
        out.append(escape(text[pos:start]))
        pos = start
        stack.append([end, opening, closing, piece, len(out)])
        out.append(opening)
    close_until(len(text))
    out.append(escape(text[pos:]))
    return "".join(out)


def marked_html(text: str | None, *, wrap: Iterable[tuple[int, int, str, str]] = ()) -> SafeString:
    """``text`` HTML-escaped, every marker shown where it stands.

    The characters themselves stay in the page, exactly as stored (the badge is drawn by CSS
    from ``data-label``, so it is not part of the text a reader copies). ``wrap`` adds
    non-overlapping spans ``(start, end, opening HTML, closing HTML)`` around parts of the
    text, e.g. the sentences a person wrote; a marker that crosses one is shown in pieces.
    """
    text = text or ""
    spans: list[tuple[int, int, int, str, str, str]] = []
    pos = 0
    for start, end, opening, closing in sorted(wrap):
        if start < pos:  # overlapping: already inside a wrap
            continue
        spans.append((start, end, 0, opening, closing, opening))
        pos = end
    spans += [(m.start, m.end, 1, *_marker_tags(m)) for m in markers(text)]
    # Outer first: the earlier start, then the longer span, then a wrap before a marker.
    spans.sort(key=lambda s: (s[0], -s[1], s[2]))
    html = _nested(text, [(start, end, opening, closing, piece) for start, end, _r, opening, closing, piece in spans])
    return mark_safe(html)  # noqa: S308 - every piece of text above is escaped


def mark_sentences(body: str, sentences: list[str]):
    """The body, escaped, with each unchecked sentence wrapped in <mark>; text unchanged.

    The text policy's markers (invisible characters, mixed-script words) are drawn where
    they stand, inside or outside the marked sentences (docs/TEXT.md).
    """
    spans = []
    # Each sentence once: finding a repeated one again would list its places again.
    for sentence in dict.fromkeys(sentences):
        start = body.find(sentence)
        while start != -1:
            spans.append((start, start + len(sentence)))
            start = body.find(sentence, start + len(sentence))
    opening = '<mark class="df-unchecked" title="written by a person: not covered by licensed-clause checks">'
    # Overlapping matches are skipped by marked_html: already inside a mark.
    return marked_html(body, wrap=[(start, end, opening, "</mark>") for start, end in spans])


def proposal_body_html(proposal) -> SafeString:
    """A proposal's body as every page shows it: exactly the text that was hashed, escaped,
    the sentences a person wrote marked, the text policy's markers drawn (the review page
    and the history's timeline alike)."""
    if proposal.unchecked_sentences:
        return mark_sentences(proposal.body, proposal.unchecked_sentences)
    return marked_html(proposal.body)
