"""The text policy: which characters may enter the text a reviewer approves or reads as
evidence, and which are shown with a visible marker (docs/TEXT.md).

The operation identity binds an approval to exact code points, but the reviewer reads
rendered text. The two must not be able to tell different stories, so:

- **Refused** (``check_text`` raises ``InvalidInput`` naming the code point and where it
  stands; nothing is written): the bidirectional embedding, override and isolate controls
  (U+202A-U+202E, U+2066-U+2069), tag characters (U+E0000-U+E007F), NUL and every other
  C0 and C1 control (and DEL) except ``\\n`` and ``\\t``, and lone surrogates. The check
  runs after the protocol's newline normalisation, so CRLF and a lone CR are accepted (they
  become LF, as in ``identity.normalize_newlines``).
- **Kept, but marked where it stands** (``markers``): the directional marks (U+200E, U+200F,
  U+061C) and every other invisible or format character: zero-width space and joiners,
  soft hyphen, variation selectors, the other default-ignorable code points, and the line
  and paragraph separators. A zero-width joiner or an emoji variation selector inside an
  emoji sequence is ordinary text and is not marked.
- **Flagged**: a word that mixes Latin, Cyrillic and Greek letters, as in "pаypal" with a
  Cyrillic "а".

The policy decides what may enter, never what is hashed: the identity still hashes the
exact code points (core/identity.py), markers included.

This module is the one place the policy lives. ``load_case``, the admin's edit form, the API
and ``manage.py edit`` all reach it through the services (``case_import``,
``proposal_revise``); the pages and the API show ``markers`` and ``warnings``.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from core.errors import InvalidInput
from core.identity import normalize_newlines

# --- case ids -------------------------------------------------------------------------------

# One pattern for every case id: it appears in URLs, file names and the commands' status
# lines, so it is kept to characters that need no quoting anywhere.
CASE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
CASE_ID_RE = re.compile(CASE_ID_PATTERN)
CASE_ID_MAX = 64

# --- what is refused ------------------------------------------------------------------------


def _class(ranges: Iterable[tuple[int, int]]) -> str:
    return "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" if a != b else re.escape(chr(a)) for a, b in ranges)


BIDI_CONTROLS = ((0x202A, 0x202E), (0x2066, 0x2069))
TAG_CHARACTERS = ((0xE0000, 0xE007F),)
# C0 without TAB (09) and LF (0A), DEL, and C1. CR (0D) never gets here: it is normalised to
# LF first.
CONTROLS = ((0x00, 0x08), (0x0B, 0x1F), (0x7F, 0x9F))
SURROGATES = ((0xD800, 0xDFFF),)

_REFUSED_RE = re.compile(f"[{_class(BIDI_CONTROLS + TAG_CHARACTERS + CONTROLS + SURROGATES)}]")

# --- what is kept but marked ----------------------------------------------------------------

# Unicode's format characters (category Cf) and default-ignorable code points, less the
# refused ones, plus the line and paragraph separators. tests/decisionflow/test_text.py
# checks this table against the unicodedata of the running Python.
MARKED = (
    (0x00AD, 0x00AD),  # soft hyphen
    (0x034F, 0x034F),  # combining grapheme joiner
    (0x0600, 0x0605),  # Arabic number signs (prepended format characters)
    (0x061C, 0x061C),  # Arabic letter mark
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x115F, 0x1160),  # Hangul fillers
    (0x17B4, 0x17B5),  # Khmer inherent vowels
    (0x180B, 0x180F),  # Mongolian variation selectors and vowel separator
    (0x200B, 0x200F),  # zero-width space, non-joiner, joiner; LRM, RLM
    (0x2028, 0x2029),  # line and paragraph separators
    (0x2060, 0x2065),  # word joiner, invisible operators
    (0x206A, 0x206F),  # deprecated format characters
    (0x3164, 0x3164),  # Hangul filler
    (0xFE00, 0xFE0F),  # variation selectors 1-16
    (0xFEFF, 0xFEFF),  # zero-width no-break space (BOM)
    (0xFFA0, 0xFFA0),  # halfwidth Hangul filler
    (0xFFF0, 0xFFFB),  # interlinear annotation controls (and unassigned neighbours)
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),  # Egyptian hieroglyph format controls
    (0x1BCA0, 0x1BCA3),  # shorthand format controls
    (0x1D173, 0x1D17A),  # musical symbol format controls
    (0xE0080, 0xE00FF),  # default ignorable, unassigned
    (0xE0100, 0xE01EF),  # variation selectors 17-256
    (0xE01F0, 0xE0FFF),  # default ignorable, unassigned
)
_MARKED_RE = re.compile(f"[{_class(MARKED)}]")

ZWJ = "\u200d"
_EMOJI_VARIATION = ("\ufe0e", "\ufe0f")
_KEYCAP = "\u20e3"
_SKIN_TONES = (0x1F3FB, 0x1F3FF)

# Extended_Pictographic, approximately (the standard library has no emoji property): the
# characters an emoji ZWJ sequence joins.
_PICTOGRAPHIC = (
    (0x00A9, 0x00A9),
    (0x00AE, 0x00AE),
    (0x203C, 0x203C),
    (0x2049, 0x2049),
    (0x2122, 0x2122),
    (0x2139, 0x2139),
    (0x2194, 0x21AA),
    (0x231A, 0x23FF),
    (0x24C2, 0x24C2),
    (0x25AA, 0x25FE),
    (0x2600, 0x27BF),
    (0x2934, 0x2935),
    (0x2B05, 0x2B55),
    (0x3030, 0x3030),
    (0x303D, 0x303D),
    (0x3297, 0x3299),
    (0x1F000, 0x1FAFF),
    (0x1FC00, 0x1FFFD),
)

SHORT_NAMES = {
    0x00AD: "SHY",
    0x034F: "CGJ",
    0x061C: "ALM",
    0x115F: "HCF",
    0x1160: "HJF",
    0x180E: "MVS",
    0x200B: "ZWSP",
    0x200C: "ZWNJ",
    0x200D: "ZWJ",
    0x200E: "LRM",
    0x200F: "RLM",
    0x2028: "LSEP",
    0x2029: "PSEP",
    0x2060: "WJ",
    0x3164: "HF",
    0xFEFF: "ZWNBSP",
    0xFFA0: "HWHF",
}

# unicodedata.name() has no name for controls; these are their formal aliases.
_CONTROL_NAMES = [
    "NULL",
    "START OF HEADING",
    "START OF TEXT",
    "END OF TEXT",
    "END OF TRANSMISSION",
    "ENQUIRY",
    "ACKNOWLEDGE",
    "ALERT",
    "BACKSPACE",
    "CHARACTER TABULATION",
    "LINE FEED",
    "LINE TABULATION",
    "FORM FEED",
    "CARRIAGE RETURN",
    "SHIFT OUT",
    "SHIFT IN",
    "DATA LINK ESCAPE",
    "DEVICE CONTROL ONE",
    "DEVICE CONTROL TWO",
    "DEVICE CONTROL THREE",
    "DEVICE CONTROL FOUR",
    "NEGATIVE ACKNOWLEDGE",
    "SYNCHRONOUS IDLE",
    "END OF TRANSMISSION BLOCK",
    "CANCEL",
    "END OF MEDIUM",
    "SUBSTITUTE",
    "ESCAPE",
    "INFORMATION SEPARATOR FOUR",
    "INFORMATION SEPARATOR THREE",
    "INFORMATION SEPARATOR TWO",
    "INFORMATION SEPARATOR ONE",
]
_C1_NAMES = [
    "PADDING CHARACTER",
    "HIGH OCTET PRESET",
    "BREAK PERMITTED HERE",
    "NO BREAK HERE",
    "INDEX",
    "NEXT LINE",
    "START OF SELECTED AREA",
    "END OF SELECTED AREA",
    "CHARACTER TABULATION SET",
    "CHARACTER TABULATION WITH JUSTIFICATION",
    "LINE TABULATION SET",
    "PARTIAL LINE FORWARD",
    "PARTIAL LINE BACKWARD",
    "REVERSE LINE FEED",
    "SINGLE SHIFT TWO",
    "SINGLE SHIFT THREE",
    "DEVICE CONTROL STRING",
    "PRIVATE USE ONE",
    "PRIVATE USE TWO",
    "SET TRANSMIT STATE",
    "CANCEL CHARACTER",
    "MESSAGE WAITING",
    "START OF GUARDED AREA",
    "END OF GUARDED AREA",
    "START OF STRING",
    "SINGLE GRAPHIC CHARACTER INTRODUCER",
    "SINGLE CHARACTER INTRODUCER",
    "CONTROL SEQUENCE INTRODUCER",
    "STRING TERMINATOR",
    "OPERATING SYSTEM COMMAND",
    "PRIVACY MESSAGE",
    "APPLICATION PROGRAM COMMAND",
]


def code_point(ch: str) -> str:
    """``U+202E`` for one character."""
    return f"U+{ord(ch):04X}"


def char_name(ch: str) -> str:
    """The Unicode name, the formal alias of a control, or what the code point is."""
    cp = ord(ch)
    if cp < 0x20:
        return _CONTROL_NAMES[cp]
    if cp == 0x7F:
        return "DELETE"
    if 0x80 <= cp <= 0x9F:
        return _C1_NAMES[cp - 0x80]
    if 0xD800 <= cp <= 0xDFFF:
        return "LONE SURROGATE"
    if 0xFE00 <= cp <= 0xFE0F:
        return f"VARIATION SELECTOR-{cp - 0xFE00 + 1}"
    if 0xE0100 <= cp <= 0xE01EF:
        return f"VARIATION SELECTOR-{cp - 0xE0100 + 17}"
    fallback = "UNASSIGNED TAG CHARACTER" if 0xE0000 <= cp <= 0xE007F else "UNASSIGNED (DEFAULT IGNORABLE)"
    return unicodedata.name(ch, fallback)


def short_name(ch: str) -> str:
    cp = ord(ch)
    if 0xFE00 <= cp <= 0xFE0F:
        return f"VS{cp - 0xFE00 + 1}"
    if 0xE0100 <= cp <= 0xE01EF:
        return f"VS{cp - 0xE0100 + 17}"
    return SHORT_NAMES.get(cp, "")


def _why(ch: str) -> str:
    cp = ord(ch)
    if any(a <= cp <= b for a, b in BIDI_CONTROLS):
        return "a bidirectional control: it can make the text read differently from what is stored and hashed"
    if any(a <= cp <= b for a, b in TAG_CHARACTERS):
        return "a tag character: invisible text"
    if 0xD800 <= cp <= 0xDFFF:
        return "a lone surrogate: it cannot be stored or hashed"
    return "a control character: only line feed and tab are allowed"


def position(text: str, index: int) -> tuple[int, int]:
    """Line and column (both from 1, in code points) of ``text[index]``."""
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return line, column


class _Lines:
    """Line and column of one text's indexes, asked for in increasing order: one scan of the
    text from its start, however many are asked for (``position`` scans from the start each
    time)."""

    def __init__(self, text: str):
        self.text = text
        self.at = 0  # scanned up to here
        self.line = 1
        self.line_start = 0

    def of(self, index: int) -> tuple[int, int]:
        if index < self.at:  # a caller out of order starts again rather than answer wrong
            self.at, self.line, self.line_start = 0, 1, 0
        breaks = self.text.count("\n", self.at, index)
        if breaks:
            self.line += breaks
            self.line_start = self.text.rfind("\n", self.at, index) + 1
        self.at = index
        return self.line, index - self.line_start + 1


def _where(text: str, index: int) -> str:
    line, column = position(text, index)
    return f"line {line}, column {column}" if "\n" in text else f"position {index + 1}"


def _refuse(field: str, problem: str, **details) -> InvalidInput:
    return InvalidInput(f"{field}: {problem}; nothing was written", field=field, **details)


def check_text(value: object, *, field: str, one_line: bool = False, max_length: int | None = None) -> str:
    """Refuse text the policy does not let in; return ``value`` unchanged otherwise.

    Checks, in order: a string; no refused code point (after newline normalisation);
    with ``one_line``, no line break or tab at all; at most ``max_length`` code points (the
    schema's limit, counted as PostgreSQL counts ``varchar``). Raises ``InvalidInput`` whose
    message names the field, the code point, its name and where it stands.
    """
    if not isinstance(value, str):
        raise _refuse(field, f"must be a string, not {type(value).__name__}")
    text = normalize_newlines(value) if "\r" in value else value
    found = _REFUSED_RE.search(text)
    if found is not None:
        ch, index = found.group(), found.start()
        line, column = position(text, index)
        raise _refuse(
            field,
            f"{code_point(ch)} {char_name(ch)} at {_where(text, index)} is refused ({_why(ch)})",
            code_point=code_point(ch),
            index=index,
            line=line,
            column=column,
        )
    if one_line:
        for ch in ("\n", "\t"):
            index = text.find(ch)
            if index != -1:
                what = "a line break" if ch == "\n" else "a tab"
                raise _refuse(field, f"must be one line, but has {what} at position {index + 1}", index=index)
    if max_length is not None and len(value) > max_length:
        raise _refuse(field, f"is {len(value)} characters long; at most {max_length} are allowed")
    return value


def max_body_chars() -> int:
    """The longest draft body accepted, in code points (``DECISIONFLOW_MAX_BODY_CHARS``)."""
    return settings.DECISIONFLOW_MAX_BODY_CHARS


def check_body(value: object, *, field: str = "body") -> str:
    """A draft body: the text policy, and at most ``max_body_chars()`` code points.

    The one check of a body's length, for every way one comes in (an edit, a case file):
    a body past it would be marked, hashed and shown in full on every page and answer.
    """
    return check_text(value, field=field, max_length=max_body_chars())


def check_case_id(value: object, *, field: str = "case_id") -> str:
    """A case id: one documented pattern (``CASE_ID_PATTERN``), nothing else."""
    if not isinstance(value, str):
        raise _refuse(field, f"must be a string, not {type(value).__name__}")
    if not value.strip():
        raise _refuse(field, "must not be empty")
    if CASE_ID_RE.fullmatch(value) is None:
        if len(value) > CASE_ID_MAX:
            problem = f"is {len(value)} characters long; at most {CASE_ID_MAX} are allowed"
        else:
            bad = next((ch for ch in value if not (ch.isascii() and (ch.isalnum() or ch in "._-"))), None)
            if bad is not None:
                problem = f"has {code_point(bad)} {char_name(bad)}, which a case id may not contain"
            else:
                problem = "must start with a letter or a digit"
        raise _refuse(
            field,
            f"{shown(value if len(value) <= 80 else value[:80] + '…')} {problem} (a case id is 1 to {CASE_ID_MAX} of A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit)",
        )
    return value


def check_integer(value: object, *, field: str, minimum: int, maximum: int) -> int:
    """An integer (not a bool) within the schema's range."""
    if not isinstance(value, int) or isinstance(value, bool):
        kind = "a non-negative integer" if minimum == 0 else "an integer"
        raise _refuse(field, f"must be {kind} (from {minimum} to {maximum}), not {value!r}"[:300])
    if not minimum <= value <= maximum:
        raise _refuse(field, f"{value} is out of range; it must be from {minimum} to {maximum}")
    return value


# --- markers --------------------------------------------------------------------------------

INVISIBLE = "invisible_character"
MIXED_SCRIPT = "mixed_script_word"

_WORD_RE = re.compile(r"[^\W\d_]+")
_SCRIPTS = (("LATIN ", "Latin"), ("FULLWIDTH LATIN ", "Latin"), ("CYRILLIC ", "Cyrillic"), ("GREEK ", "Greek"))


@functools.lru_cache(maxsize=8192)
def _script(ch: str) -> str | None:
    if ch.isascii():
        return "Latin"
    name = unicodedata.name(ch, "")
    for prefix, script in _SCRIPTS:
        if name.startswith(prefix):
            return script
    return None


def _in(ch: str, ranges) -> bool:
    cp = ord(ch)
    return any(a <= cp <= b for a, b in ranges)


def _emoji_before(text: str, index: int) -> bool:
    """Whether an emoji (with its own variation selector or skin tone) ends just before ``index``."""
    i = index - 1
    while i >= 0 and (text[i] in _EMOJI_VARIATION or _in(text[i], (_SKIN_TONES,))):
        i -= 1
    return i >= 0 and _in(text[i], _PICTOGRAPHIC)


def _ordinary(text: str, index: int) -> bool:
    """A marked character that is ordinary here: a joiner or variation selector of an emoji."""
    ch = text[index]
    nxt = text[index + 1] if index + 1 < len(text) else ""
    if ch == ZWJ:
        return _emoji_before(text, index) and nxt != "" and _in(nxt, _PICTOGRAPHIC)
    if ch in _EMOJI_VARIATION:
        prev = text[index - 1] if index else ""
        return (prev != "" and _in(prev, _PICTOGRAPHIC)) or (prev in "0123456789#*" and prev != "" and nxt == _KEYCAP)
    return False


@dataclass(frozen=True)
class Marker:
    """One thing a page marks where it stands: an invisible character or a mixed-script word."""

    kind: str  # INVISIBLE or MIXED_SCRIPT
    start: int  # code point index in the text
    end: int
    line: int
    column: int
    text: str  # the character, or the word
    code_point: str  # "U+200B"; for a word, the code points of its letters in the minority scripts
    name: str  # "ZERO WIDTH SPACE"; for a word, what it mixes
    label: str  # the badge: "ZWSP U+200B", "Latin+Cyrillic"

    def describe(self) -> str:
        where = f"line {self.line}, column {self.column}"
        if self.kind == INVISIBLE:
            return f"{self.code_point} {self.name} at {where}"
        return f'{self.name} at {where}: "{self.text}" ({self.code_point})'


def _invisible_at(text: str) -> Iterator[int]:
    """The index of each marked character of ``text``, in order."""
    for match in _MARKED_RE.finditer(text):
        if not _ordinary(text, match.start()):
            yield match.start()


def _invisible_marker(text: str, index: int, lines: _Lines) -> Marker:
    ch = text[index]
    line, column = lines.of(index)
    cp = code_point(ch)
    label = f"{short_name(ch)} {cp}".strip()
    return Marker(INVISIBLE, index, index + 1, line, column, ch, cp, char_name(ch), label)


def _mixed_words(text: str) -> Iterator[tuple[re.Match, list[tuple[str, str | None]], list[str]]]:
    """Each word of ``text`` that mixes scripts: the match, its letters' scripts, the scripts
    (the most used first), in order."""
    for match in _WORD_RE.finditer(text):
        word = match.group()
        if word.isascii():
            continue
        letters = [(ch, _script(ch)) for ch in word]
        counts: dict[str, int] = {}
        for _ch, script in letters:
            if script is not None:
                counts[script] = counts.get(script, 0) + 1
        if len(counts) >= 2:
            yield match, letters, sorted(counts, key=lambda s: (-counts[s], s))


def _mixed_marker(found: tuple[re.Match, list[tuple[str, str | None]], list[str]], lines: _Lines) -> Marker:
    match, letters, scripts = found
    minority = [ch for ch, script in letters if script is not None and script != scripts[0]]
    line, column = lines.of(match.start())
    return Marker(
        MIXED_SCRIPT,
        match.start(),
        match.end(),
        line,
        column,
        match.group(),
        " ".join(dict.fromkeys(f"{code_point(ch)} {char_name(ch)}" for ch in minority)),
        f"a word mixing {' and '.join(scripts)} letters",
        "+".join(scripts),
    )


def marked(text: str, *, listed: int | None = None) -> tuple[list[Marker], dict[str, int]]:
    """The first ``listed`` markers of ``text`` in order (all of them with None), and how
    many there are of each kind (``{INVISIBLE: n, MIXED_SCRIPT: m}``).

    Linear in the text: each kind is found in one pass, and its lines and columns in one
    more scan (``_Lines``); only the markers listed are built.
    """
    counts = {INVISIBLE: 0, MIXED_SCRIPT: 0}
    if text.isascii():
        return [], counts  # the common case: nothing to mark (ASCII controls are refused at entry)
    found: list[Marker] = []
    lines = _Lines(text)
    for index in _invisible_at(text):
        if listed is None or counts[INVISIBLE] < listed:
            found.append(_invisible_marker(text, index, lines))
        counts[INVISIBLE] += 1
    lines = _Lines(text)
    for word in _mixed_words(text):
        if listed is None or counts[MIXED_SCRIPT] < listed:
            found.append(_mixed_marker(word, lines))
        counts[MIXED_SCRIPT] += 1
    # The first ``listed`` of each kind hold the first ``listed`` of both.
    found.sort(key=lambda m: m.start)
    return (found if listed is None else found[:listed]), counts


def markers(text: str) -> list[Marker]:
    """Every invisible or format character and every mixed-script word of ``text``, in order."""
    return marked(text)[0]


# The markers listed per field (the API's ``warnings``, a banner's "Where"): a text can hold
# one on every other character, and a list of them all is larger than the text. The counts
# stay whole (``summary``), and a cut list says how many more there are.
MARKERS_LISTED = 50


class Warnings(list):
    """The listed markers of several named texts (at most ``MARKERS_LISTED`` per field),
    with the counts of all of them: ``counts[field]`` is ``{INVISIBLE: n, MIXED_SCRIPT: m}``."""

    def __init__(self, listed: Iterable[dict] = (), counts: dict[str, dict[str, int]] | None = None):
        super().__init__(listed)
        self.counts: dict[str, dict[str, int]] = dict(counts or {})

    def __add__(self, other):
        return Warnings([*self, *other], {**self.counts, **_counts_of(other)})

    def __iadd__(self, other):
        self.counts.update(_counts_of(other))
        self.extend(other)
        return self

    @property
    def total(self) -> int:
        """How many markers there are in all, listed or not."""
        return sum(sum(n.values()) for n in self.counts.values())

    def prefixed(self, prefix: str) -> Warnings:
        """The same markers, their fields named with ``prefix`` (the message starts with it)."""
        return Warnings(
            [{**w, "field": prefix + w["field"], "message": prefix + w["message"]} for w in self],
            {prefix + field: n for field, n in self.counts.items()},
        )

    def omitted(self) -> list[dict]:
        """Each field whose list was cut: how many of its markers are not listed."""
        listed: dict[str, int] = {}
        for w in self:
            listed[w["field"]] = listed.get(w["field"], 0) + 1
        out = []
        for field, n in sorted(self.counts.items()):
            more = sum(n.values()) - listed.get(field, 0)
            if more > 0:
                out.append({"field": field, "count": more, "message": f"{field}: and {more} more"})
        return out


def _counts_of(found: Iterable[dict]) -> dict[str, dict[str, int]]:
    if isinstance(found, Warnings):
        return found.counts
    counts: dict[str, dict[str, int]] = {}
    for w in found:
        field = counts.setdefault(w["field"], {INVISIBLE: 0, MIXED_SCRIPT: 0})
        field[w["kind"]] += 1
    return counts


def warnings(fields: Iterable[tuple[str, str]]) -> Warnings:
    """The markers of several named texts, as the API and the pages' banners report them:
    at most ``MARKERS_LISTED`` listed per field, all of them counted."""
    out = Warnings()
    for field, value in fields:
        if not isinstance(value, str):
            continue
        found, counts = marked(value, listed=MARKERS_LISTED)
        if not found:
            continue
        into = out.counts.setdefault(field, {INVISIBLE: 0, MIXED_SCRIPT: 0})
        for kind, n in counts.items():
            into[kind] += n
        for m in found:
            out.append(
                {
                    "field": field,
                    "kind": m.kind,
                    "index": m.start,
                    "line": m.line,
                    "column": m.column,
                    "text": m.text,
                    "code_point": m.code_point,
                    "name": m.name,
                    "label": m.label,
                    "message": f"{field}: {m.describe()}",
                }
            )
    return out


def summary(found: Iterable[dict]) -> dict:
    """Counts for a banner: how many of each kind, and in which fields, all of them (a
    ``Warnings`` counts the markers it does not list), and where the list was cut."""
    found = found if isinstance(found, Warnings) else Warnings(found, _counts_of(found))
    counts = found.counts
    return {
        "total": found.total,
        "invisible": sum(n[INVISIBLE] for n in counts.values()),
        "mixed": sum(n[MIXED_SCRIPT] for n in counts.values()),
        "fields": sorted((field, sum(n.values())) for field, n in counts.items()),
        "labels": sorted({w["label"] for w in found}),
        "listed": len(found),
        "omitted": found.omitted(),
    }


# --- text in the commands' output -----------------------------------------------------------

_SAFE_VALUE = re.compile(r"[A-Za-z0-9._:/@+=,-]+")
_UNSAFE_IN_LINE = re.compile(f"[\\n\\r\\t{_class(BIDI_CONTROLS + TAG_CHARACTERS + CONTROLS + SURROGATES + MARKED)}]")


def shown(value: object) -> str:
    """A value as a status line prints it: as is when it is a plain token, else JSON-quoted
    (ASCII escapes), so that no value can end the line or forge another one."""
    text = str(value)
    if _SAFE_VALUE.fullmatch(text):
        return text
    return json.dumps(text, ensure_ascii=True)


def _escape_char(match: re.Match) -> str:
    ch = match.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch) or (
        f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}"
    )


def one_line(message: str) -> str:
    """A message as one line of output: line breaks, controls and invisible characters escaped."""
    return _UNSAFE_IN_LINE.sub(_escape_char, message)


def when(value: datetime | None) -> str:
    """A timestamp as reviewers read it in messages and command lines: seconds, with the zone named."""
    if value is None:
        return "-"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")
