"""Shared pieces of the admin: the view-only base class and small display helpers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html

from decisionflow.core.identity import short
from decisionflow.core.text import marked_html


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


def when(value: datetime | None) -> str:
    """A timestamp as reviewers read it in messages: seconds, with the zone named."""
    if value is None:
        return "-"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")


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
