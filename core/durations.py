"""Durations, one rule for all of them (docs/DEPLOY.md, "Durations").

A number with an optional unit: ``90s``, ``15m``, ``1.5h``, ``2d``; a bare number is seconds
in a setting (a command's argument may name another unit for it: ``prune_checkpoints
--older-than 30`` is days). Units are lower-case (``M`` could be read as months). Settings
made in Python may also be a ``timedelta`` or a number. Zero, a negative and anything else
raise ``ImproperlyConfigured`` naming the setting, before the value is used.
"""

from __future__ import annotations

import re
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_UNIT_NAMES = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def duration_form(bare: str = "s") -> str:
    """How to write a duration, for an error message or a help text."""
    return f"a number with s, m, h or d, such as 90s, 15m, 1.5h or 2d (a bare number is {_UNIT_NAMES[bare]})"


def duration_parse(value: object, *, setting: str, bare: str = "s") -> timedelta:
    """``value`` as a positive timedelta; ``setting`` names it in the error, ``bare`` is the
    unit of a number written without one."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value) * _SECONDS[bare]
    else:
        match = _DURATION.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise ImproperlyConfigured(f"{setting}: {value!r} is not a duration: write {duration_form(bare)}")
        seconds = float(match[1]) * _SECONDS[match[2] or bare]
    if not seconds > 0:
        raise ImproperlyConfigured(f"{setting}: {value!r} must be longer than zero")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ImproperlyConfigured(f"{setting}: {value!r} is longer than a timedelta holds") from None


def duration_setting(name: str, default: str) -> timedelta:
    """The setting ``name`` (``default`` when unset) as a positive timedelta."""
    return duration_parse(getattr(settings, name, default), setting=name)
