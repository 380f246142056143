"""Shared pieces of the admin: the view-only base class, and text as a page shows it (HTML)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from core.identity import short
from core.text import INVISIBLE, Marker, markers, when


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


def _marker_html(m: Marker, piece: str) -> str:
    if m.kind == INVISIBLE:
        return format_html(
            '<span class="df-tm df-tm-invisible" data-cp="{}" data-label="{}" title="{}">{}</span>',
            m.code_point,
            m.label,
            f"{m.code_point} {m.name}: an invisible character, kept in the text and in its identity",
            piece,
        )
    return format_html(
        '<mark class="df-tm df-tm-mixed" data-label="{}" title="{}">{}</mark>',
        m.label,
        f"{m.name}: {m.code_point}",
        piece,
    )


def _chunk(text: str, start: int, end: int, found: list[Marker], starts: list[int]) -> str:
    out: list[str] = []
    pos = start
    # The markers are in order and do not overlap (a marked character is no letter of a
    # word), so only the one before ``start`` can reach into the chunk: each chunk reads its
    # own markers, not the text's.
    for i in range(max(bisect.bisect_left(starts, start) - 1, 0), len(found)):
        m = found[i]
        if m.start >= end:
            break
        a, b = max(m.start, start), min(m.end, end)
        if a >= b or a < pos:
            continue
        out.append(escape(text[pos:a]))
        out.append(_marker_html(m, text[a:b]))
        pos = b
    out.append(escape(text[pos:end]))
    return "".join(out)


def marked_html(text: str | None, *, wrap: Iterable[tuple[int, int, str, str]] = ()) -> SafeString:
    """``text`` HTML-escaped, every marker shown where it stands.

    The characters themselves stay in the page, exactly as stored (the badge is drawn by CSS
    from ``data-label``, so it is not part of the text a reader copies). ``wrap`` adds
    non-overlapping spans ``(start, end, opening HTML, closing HTML)`` around parts of the
    text, e.g. the sentences a person wrote.
    """
    text = text or ""
    found = markers(text)
    starts = [m.start for m in found]
    out, pos = [], 0
    for start, end, opening, closing in sorted(wrap):
        if start < pos:  # overlapping: already inside a wrap
            continue
        out += [_chunk(text, pos, start, found, starts), opening, _chunk(text, start, end, found, starts), closing]
        pos = end
    out.append(_chunk(text, pos, len(text), found, starts))
    return mark_safe("".join(out))  # noqa: S308 - every piece of text above is escaped
