"""Durations in settings, one rule for all of them (docs/DEPLOY.md, "Durations").

A number with an optional unit: ``90s``, ``15m``, ``1.5h``, ``2d``; a bare number is seconds.
Units are lower-case (``M`` could be read as months). Settings made in Python may also be a
``timedelta`` or a number of seconds. Zero, a negative and anything else stop the process
with ``ImproperlyConfigured`` naming the setting, before the value is used.
"""

from __future__ import annotations

import re
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

FORM = "a number with s, m, h or d, such as 90s, 15m, 1.5h or 2d (a bare number is seconds)"
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_parse(value: object, *, setting: str) -> timedelta:
    """``value`` as a positive timedelta; ``setting`` names it in the error."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise ImproperlyConfigured(f"{setting}: {value!r} is not a duration: write {FORM}")
        seconds = float(match[1]) * _SECONDS[match[2]]
    if not seconds > 0:
        raise ImproperlyConfigured(f"{setting}: {value!r} must be longer than zero")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ImproperlyConfigured(f"{setting}: {value!r} is longer than a timedelta holds") from None


def duration_setting(name: str, default: str) -> timedelta:
    """The setting ``name`` (``default`` when unset) as a positive timedelta."""
    return duration_parse(getattr(settings, name, default), setting=name)
