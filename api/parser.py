"""A strict JSON body parser: UTF-8 only, no duplicate keys, no NaN, no lone surrogates.

ninja wraps any exception raised here into a 400; ``BodyRefused`` keeps our message so the
client reads exactly what was wrong. (A body over DATA_UPLOAD_MAX_MEMORY_SIZE never gets
here: ninja reads ``request.body`` before calling the parser, so Django's RequestDataTooBig
reaches the API's exception handler and becomes a 413.)
"""

from __future__ import annotations

import json

from ninja.parser import Parser

from core.errors import InvalidInput


class BodyRefused(InvalidInput):
    pass


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise BodyRefused(f"the JSON object has the key {key!r} twice")
        seen[key] = value
    return seen


def _no_constants(name):
    raise BodyRefused(f"{name} is not a JSON number")


def _check_text(value, where="body"):
    """Refuse a string that cannot be encoded as UTF-8: JSON can carry "\\ud800", we cannot."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BodyRefused(
                f"{where} contains a lone surrogate (a \\ud800-style escape); it is refused, not replaced"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, where)
            _check_text(item, f"{where}.{key}" if isinstance(key, str) and key.isprintable() else where)
    elif isinstance(value, list):
        for item in value:
            _check_text(item, where)


class StrictJsonParser(Parser):
    def parse_body(self, request):
        try:
            text = request.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BodyRefused(f"the body is not UTF-8 (byte {exc.start})") from None
        try:
            data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
        except BodyRefused:
            raise
        except (ValueError, RecursionError) as exc:
            raise BodyRefused(f"the body is not valid JSON: {str(exc)[:200]}") from None
        try:
            _check_text(data)
        except RecursionError:
            raise BodyRefused("the body is nested too deeply") from None
        return data
