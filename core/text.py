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
- **Kept, but marked where it stands** (``markers``; each kind a ``MarkerKind``):

  - invisible and format characters: the directional marks (U+200E, U+200F, U+061C), the
    zero-width space and joiners, soft hyphen, variation selectors, every other format (Cf)
    and default-ignorable code point, and the line and paragraph separators. A zero-width
    joiner or an emoji variation selector inside an emoji sequence is ordinary text;
  - characters without a standard meaning: private use, unassigned, the noncharacters
    (U+FDD0-U+FDEF, U+xFFFE, U+xFFFF) and U+FFFC OBJECT REPLACEMENT CHARACTER;
  - a character carrying more than ``MAX_COMBINING_MARKS`` (4) nonspacing marks, counted in
    NFD, as UTS #39 suggests: a stack of them paints over the lines around it;
  - a run of characters struck through or overlaid by a combining mark of class Overlay
    (U+0334-U+0338, U+20D2, U+20D3, U+20E5, U+20E6, U+20EA, U+20EB), as in 1̶0̶0̶0̶;
  - a number written with a digit that is not ASCII (full-width, Arabic-Indic, mathematical):
    its badge gives the value in ASCII digits;
  - a word mixing scripts, by Script_Extensions as UTS #39 resolves them (Common and
    Inherited ignored; Japanese, Korean and Han with Bopomofo, each also with Latin, are one
    script), across every script: "pаypal", "gօօgle", "ᏢAYPAL";
  - a word with mathematical letters, which look like others: "pay𝑝al";
  - a word in another script every letter of which looks like a Latin letter or digit
    (Unicode's confusables), as "раураӏ" in Cyrillic, where that script writes nothing else
    in the text.

  They are marked, not refused: each has real uses (Hebrew and Arabic need the directional
  marks, a font its private-use icons, a text in Arabic its digits), a character unassigned
  in this Unicode version may be assigned in the writer's, and a case file that imports
  today must import tomorrow. The Unicode data is ``regex``'s and Unicode's confusables
  (confusable-homoglyphs), not lists kept here.

The policy decides what may enter, never what is hashed: the identity still hashes the
exact code points (core/identity.py), markers included.

This module is the one place the policy lives. ``load_case``, the admin's edit form, the API
and ``manage.py edit`` all reach it through the services (``case_import``,
``proposal_revise``); the pages and the API show ``markers`` and ``warnings``. A marker
never changes the text: a page shows the stored code points with badges drawn beside them.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import regex
from django.conf import settings
from django.utils import timezone
from regex import _regex_core

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
    """A character class's ranges, as escapes that ``re`` and ``regex`` both read."""
    return "".join(f"\\U{a:08X}-\\U{b:08X}" for a, b in ranges)


BIDI_CONTROLS = ((0x202A, 0x202E), (0x2066, 0x2069))
TAG_CHARACTERS = ((0xE0000, 0xE007F),)
# C0 without TAB (09) and LF (0A), DEL, and C1. CR (0D) never gets here: it is normalised to
# LF first.
CONTROLS = ((0x00, 0x08), (0x0B, 0x1F), (0x7F, 0x9F))
SURROGATES = ((0xD800, 0xDFFF),)

_REFUSED_CLASS = _class(BIDI_CONTROLS + TAG_CHARACTERS + CONTROLS + SURROGATES)
_REFUSED_RE = re.compile(f"[{_REFUSED_CLASS}]")

# --- what is kept but marked ----------------------------------------------------------------

# Unicode's format characters (Cf) and default-ignorable code points, less the refused ones,
# plus the line and paragraph separators: invisible, or nearly, wherever they stand. The
# properties come from ``regex``'s Unicode data, newer than the standard library's.
_INVISIBLE_CLASS = r"[\p{Cf}\p{Default_Ignorable_Code_Point}\u2028\u2029]"
_MARKED_RE = regex.compile(rf"[{_INVISIBLE_CLASS}--[{_REFUSED_CLASS}]]", regex.V1)

# Code points whose meaning the standard leaves open: private use, unassigned (in ``regex``'s
# Unicode version), the noncharacters (U+FDD0-U+FDEF and the last two of every plane), and
# U+FFFC, which stands for an object that is not in the text. Default-ignorable unassigned
# code points are marked as invisible instead.
_NONCHARACTER_RE = regex.compile(r"\p{Noncharacter_Code_Point}")
_PRIVATE_USE_RE = regex.compile(r"\p{Co}")
_UNASSIGNED_RE = regex.compile(r"\p{Cn}")
_UNDEFINED_RE = regex.compile(rf"[[\p{{Co}}\p{{Cn}}\uFFFC]--{_INVISIBLE_CLASS}]", regex.V1)

ZWJ = "\u200d"
_EMOJI_VARIATION = ("\ufe0e", "\ufe0f")
_MAYBE_ORDINARY = frozenset((ZWJ, *_EMOJI_VARIATION))
_KEYCAP = "\u20e3"
_EMOJI_MODIFIER_RE = regex.compile(r"\p{Emoji_Modifier}")
# The characters an emoji ZWJ sequence joins.
_PICTOGRAPHIC_RE = regex.compile(r"\p{Extended_Pictographic}")

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
    0xFFFC: "OBJ",
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
    name = unicodedata.name(ch, "")
    if name:
        return name
    if 0xE0000 <= cp <= 0xE007F:
        return "UNASSIGNED TAG CHARACTER"
    if _NONCHARACTER_RE.match(ch):
        return "NONCHARACTER"
    if _PRIVATE_USE_RE.match(ch):
        return "PRIVATE USE CHARACTER"
    if _UNASSIGNED_RE.match(ch):
        return "UNASSIGNED (DEFAULT IGNORABLE)" if _MARKED_RE.match(ch) else "UNASSIGNED"
    # Assigned in regex's Unicode data, which is newer than this Python's names.
    return f"NO NAME IN UNICODE {unicodedata.unidata_version}"


def short_name(ch: str) -> str:
    cp = ord(ch)
    if 0xFE00 <= cp <= 0xFE0F:
        return f"VS{cp - 0xFE00 + 1}"
    if 0xE0100 <= cp <= 0xE01EF:
        return f"VS{cp - 0xE0100 + 17}"
    if cp in SHORT_NAMES:
        return SHORT_NAMES[cp]
    if _NONCHARACTER_RE.match(ch):
        return "NONCHAR"
    if _PRIVATE_USE_RE.match(ch):
        return "PUA"
    if _UNDEFINED_RE.match(ch):
        return "UNASSIGNED"
    return ""


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


class MarkerKind(StrEnum):
    """What a marker marks (docs/TEXT.md): the API's ``kind``, the pages' badges and the
    banners' counts all read this one list, in this order."""

    INVISIBLE = "invisible_character"
    UNDEFINED = "undefined_character"
    STACKED_MARKS = "stacked_marks"
    OVERLAY = "overlay_mark"
    NON_ASCII_DIGITS = "non_ascii_digits"
    MIXED_SCRIPT = "mixed_script_word"
    MATHEMATICAL = "mathematical_letters"
    CONFUSABLE = "confusable_word"


# How a banner counts each kind: one and many.
_SAID = {
    MarkerKind.INVISIBLE: ("invisible or format character", "invisible or format characters"),
    MarkerKind.UNDEFINED: ("character without a standard meaning", "characters without a standard meaning"),
    MarkerKind.STACKED_MARKS: ("character with stacked combining marks", "characters with stacked combining marks"),
    MarkerKind.OVERLAY: ("struck-through run", "struck-through runs"),
    MarkerKind.NON_ASCII_DIGITS: ("number in non-ASCII digits", "numbers in non-ASCII digits"),
    MarkerKind.MIXED_SCRIPT: ("word mixing scripts", "words mixing scripts"),
    MarkerKind.MATHEMATICAL: ("word with mathematical letters", "words with mathematical letters"),
    MarkerKind.CONFUSABLE: ("word in another script that looks Latin", "words in other scripts that look Latin"),
}


def said(counts: Mapping[MarkerKind, int]) -> str:
    """``{INVISIBLE: 4, MIXED_SCRIPT: 1}`` as a banner says it: "4 invisible or format
    characters and 1 word mixing scripts"."""
    parts = [f"{n} {_SAID[kind][n != 1]}" for kind in MarkerKind if (n := counts.get(kind, 0))]
    return " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)


def no_markers() -> dict[str, int]:
    """A count of each kind, all zero."""
    return dict.fromkeys(MarkerKind, 0)


# More nonspacing or enclosing marks than this on one character are marked: UTS #39 (5.4,
# "Optional Detection") suggests refusing sequences of more than four, counted in NFD. Hebrew
# and Vietnamese reach three; a stack of dozens paints over the lines around it.
MAX_COMBINING_MARKS = 4

# A run of marks long enough on its own, or marks on a precomposed character, to which NFD
# adds its own. Each pattern here starts with its rarest class: a pattern that starts with a
# class most characters match costs a try at every character.
_STACK_RE = regex.compile(
    rf"[\p{{Mn}}\p{{Me}}]{{{MAX_COMBINING_MARKS + 1},}}+|(?<=\p{{Decomposition_Type=Canonical}})[\p{{Mn}}\p{{Me}}]++"
)
_NONSPACING_RE = regex.compile(r"[\p{Mn}\p{Me}]")
_MARK_RE = regex.compile(r"\p{M}")

# Characters carrying an overlay mark (combining class 1, Overlay: the strokes and slashes
# drawn through a character, as in 1̶0̶0̶0̶), a run of them as one marker: from the first
# overlay mark on, each further character carrying one (its base is found before the match).
_OVERLAY_RE = regex.compile(
    r"\p{Canonical_Combining_Class=Overlay}\p{M}*+"
    r"(?:[^\p{M}\n][\p{M}--\p{Canonical_Combining_Class=Overlay}]*+\p{Canonical_Combining_Class=Overlay}\p{M}*+)*+",
    regex.V1,
)
_OVERLAY_MARK_RE = regex.compile(r"\p{Canonical_Combining_Class=Overlay}")

# A number (a run of decimal digits) with a digit that is not ASCII: full-width, Arabic-Indic,
# Bengali, mathematical digits; from its first such digit on (the ASCII ones before it are
# found before the match).
_DIGITS_RE = regex.compile(r"[\p{Nd}--[0-9]]\p{Nd}*+", regex.V1)

# A word is a letter and the letters and marks after it. Only the words with a character
# beyond ASCII are looked at: from that character on (the ASCII letters before it are found
# before the match). Marks after a digit or a space are no word.
_WORD_RE = regex.compile(r"(?:[\p{L}--[A-Za-z]]|(?<=\p{L})\p{M})[\p{L}\p{M}]*+", regex.V1)
_NON_ASCII_RE = re.compile(r"[^\x00-\x7f]")
_ASCII_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
# Mathematical alphanumerics and letterlike symbols (𝑝, 𝐀, ℎ): Common script, so no script
# mixes with them, but each is another character than the letter it looks like.
_MATH_RE = regex.compile(r"\p{Decomposition_Type=Font}")


def _script_names() -> dict[str, str]:
    """Every script of regex's Unicode data but Common, Inherited and Unknown: the name its
    patterns take, and the name a label shows.

    regex lists its property values in this table only; a test pins the scripts it must hold,
    so an upgrade that moves the table fails there.
    """
    names: dict[int, list[str]] = {}
    table = _regex_core.PROPERTIES  # type: ignore[attr-defined]  # regex's stubs leave its private table out
    for name, value in table["SCRIPTEXTENSIONS"][1].items():
        names.setdefault(value, []).append(name)
    out = {}
    for aliases in names.values():
        # The long name, not the four-letter code: HAN rather than HANI.
        long = sorted(aliases, key=lambda n: (len(n) == 4 and len(aliases) > 1, -len(n)))[0]
        if long not in ("COMMON", "INHERITED", "UNKNOWN"):
            out[long] = long.replace("_", " ").title()
    return out


SCRIPTS = _script_names()


# The patterns below take a tenth of a second to compile: each is compiled on first use, by
# the first text with a word beyond ASCII, not by every process that imports the policy.


@functools.cache
def _script_re(name: str) -> regex.Pattern:
    return regex.compile(rf"\p{{Script_Extensions={name}}}")


@functools.cache
def _first_script_re() -> regex.Pattern:
    """The first script of a character's Script_Extensions, in one match."""
    return regex.compile("|".join(rf"(?P<{n}>\p{{Script_Extensions={n}}})" for n in SCRIPTS))


@functools.cache
def _extended_re() -> regex.Pattern:
    """The characters with more than one script (or another than their Script): U+30FC, used
    in Hiragana and Katakana; the Arabic comma, used in Arabic, Syriac, Thaana and more."""
    return regex.compile(
        "[" + "||".join(rf"[\p{{Script_Extensions={n}}}--\p{{Script={n}}}]" for n in SCRIPTS) + "]", regex.V1
    )


@functools.lru_cache(maxsize=65536)
def _scripts(ch: str) -> tuple[str, ...]:
    """A character's Script_Extensions, less Common and Inherited (UTS #39 ignores them)."""
    if _extended_re().match(ch):
        return tuple(name for name in SCRIPTS if _script_re(name).match(ch))
    found = _first_script_re().match(ch)
    return (found.lastgroup,) if found and found.lastgroup else ()


# UTS #39's augmented script sets: Han with the scripts written beside it (Japanese, Korean,
# Han with Bopomofo), and, as its "highly restrictive" level allows, each with Latin.
_AUGMENTED = {
    "JAPANESE": ("HAN", "HIRAGANA", "KATAKANA", "LATIN"),
    "KOREAN": ("HANGUL", "HAN", "LATIN"),
    "HAN_WITH_BOPOMOFO": ("HAN", "BOPOMOFO", "LATIN"),
}
# The covers a word whose first scripted letter is of a script may fit: the script itself,
# then each augmented set that holds it.
_COVER_OF = {name: [name, *(aug for aug, scripts in _AUGMENTED.items() if name in scripts)] for name in SCRIPTS}


@functools.cache
def _cover_re(cover: str) -> regex.Pattern:
    """A word wholly in one script or augmented set. Common and Inherited characters fit
    every cover; mathematical letters fit none (``_word_kind`` looks at them apart)."""
    listed = "".join(rf"\p{{Script_Extensions={n}}}" for n in _AUGMENTED.get(cover, (cover,)))
    return regex.compile(
        rf"[[{listed}\p{{Script_Extensions=Common}}\p{{Script_Extensions=Inherited}}]--\p{{Decomposition_Type=Font}}]++",
        regex.V1,
    )


@functools.cache
def _latin_lookalikes() -> regex.Pattern:
    """A word every letter of which looks like an ASCII letter or digit (Unicode's
    confusables.txt, UTS #39), marks allowed. Loaded on first use: the data is 900 KB of JSON,
    which a process that shows no text beyond ASCII never needs."""
    from confusable_homoglyphs import confusables

    letters = sorted(
        ch
        for ch, alikes in confusables.confusables_data.items()
        if len(ch) == 1 and not ch.isascii() and any(a["c"].isascii() and a["c"].isalnum() for a in alikes)
    )
    return regex.compile(f"[{''.join(regex.escape(ch) for ch in letters)}\\p{{M}}]++")


def _cover(word: str) -> str | None:
    """The script, or augmented script set, the whole word is written in; None when it mixes."""
    first: tuple[str, ...] = ()
    for ch in word:
        first = _scripts(ch)
        if first:
            break
    else:  # Common and Inherited characters only: they fit any cover
        return "COMMON" if _cover_re("LATIN").fullmatch(word) else None
    for script in first:
        for cover in _COVER_OF[script]:
            if _cover_re(cover).fullmatch(word):
                return cover
    return None


@functools.lru_cache(maxsize=65536)
def _word_kind(word: str) -> tuple[MarkerKind | None, str | None]:
    """What a word is marked as, if anything, and the script it is written in. A confusable
    word is only a candidate: ``_words`` decides."""
    cover = _cover(word)
    if cover is None:
        plain = _MATH_RE.sub("", word)
        if plain != word and (not plain or _cover(plain)):
            return MarkerKind.MATHEMATICAL, None
        return MarkerKind.MIXED_SCRIPT, None
    if cover in SCRIPTS and cover != "LATIN" and _latin_lookalikes().fullmatch(word):
        return MarkerKind.CONFUSABLE, cover
    return None, cover


def _in(ch: str, pattern: regex.Pattern) -> bool:
    return pattern.match(ch) is not None


def _emoji_before(text: str, index: int) -> bool:
    """Whether an emoji (with its own variation selector or skin tone) ends just before ``index``."""
    i = index - 1
    while i >= 0 and (text[i] in _EMOJI_VARIATION or _in(text[i], _EMOJI_MODIFIER_RE)):
        i -= 1
    return i >= 0 and _in(text[i], _PICTOGRAPHIC_RE)


def _ordinary(text: str, index: int) -> bool:
    """A marked character that is ordinary here: a joiner or variation selector of an emoji."""
    ch = text[index]
    nxt = text[index + 1] if index + 1 < len(text) else ""
    if ch == ZWJ:
        return _emoji_before(text, index) and nxt != "" and _in(nxt, _PICTOGRAPHIC_RE)
    if ch in _EMOJI_VARIATION:
        prev = text[index - 1] if index else ""
        return (prev != "" and _in(prev, _PICTOGRAPHIC_RE)) or (
            prev in "0123456789#*" and prev != "" and nxt == _KEYCAP
        )
    return False


@dataclass(frozen=True)
class Marker:
    """One thing a page marks where it stands: a character, a stack or run, a number, a word."""

    kind: MarkerKind
    start: int  # code point index in the text
    end: int
    line: int
    column: int
    text: str  # the character, or the run, number or word
    code_point: str  # "U+200B"; for more, the code points (and names) of the characters that count
    name: str  # "ZERO WIDTH SPACE"; for more, what it is
    label: str  # the badge: "ZWSP U+200B", "Latin+Cyrillic"

    def describe(self) -> str:
        where = f"line {self.line}, column {self.column}"
        if self.kind in (MarkerKind.INVISIBLE, MarkerKind.UNDEFINED):
            return f"{self.code_point} {self.name} at {where}"
        # A stack is named by its base alone: the marks would paint over the message's lines.
        shown = self.text[:1] if self.kind == MarkerKind.STACKED_MARKS else self.text
        return f'{self.name} at {where}: "{shown}" ({self.code_point})'


def _named(chars: Iterable[str]) -> str:
    return " ".join(f"{code_point(ch)} {char_name(ch)}" for ch in dict.fromkeys(chars))


# What each kind's finder yields, in order: ``(start, end, detail)``. Only the markers listed
# are built from them (``_BUILDERS``).
Found = Iterator[tuple[int, int, object]]


def _invisible(text: str, begin: int) -> Found:
    for match in _MARKED_RE.finditer(text, begin):
        start = match.start()
        if match.group() not in _MAYBE_ORDINARY or not _ordinary(text, start):
            yield start, start + 1, None


def _undefined(text: str, begin: int) -> Found:
    for match in _UNDEFINED_RE.finditer(text, begin):
        yield match.start(), match.end(), None


def _stacks(text: str, begin: int) -> Found:
    for match in _STACK_RE.finditer(text, begin):
        start = match.start()
        base = text[start - 1] if start and text[start - 1] != "\n" else ""
        marks = match.end() - start + len(_NONSPACING_RE.findall(unicodedata.normalize("NFD", base)))
        if marks > MAX_COMBINING_MARKS:
            yield start - len(base), match.end(), marks


def _overlays(text: str, begin: int) -> Found:
    for match in _OVERLAY_RE.finditer(text, begin):
        start = match.start()
        while start and _MARK_RE.match(text[start - 1]):  # the marks before it on the same base
            start -= 1
        if start and text[start - 1] != "\n":
            start -= 1
        yield start, match.end(), None


def _digits(text: str, begin: int) -> Found:
    for match in _DIGITS_RE.finditer(text, begin):
        start = match.start()
        while start and "0" <= text[start - 1] <= "9":
            start -= 1
        yield start, match.end(), None


def _words(text: str, begin: int) -> dict[MarkerKind, list[tuple[int, int, object]]]:
    """The words that mix scripts, hold mathematical letters, or look Latin in another script.

    A word of another script all of whose letters look like Latin letters (раураӏ) is marked
    only where its script writes nothing else in the text: in a Russian text, "а" and "о"
    are words, not disguises.
    """
    mixed: list[tuple[int, int, object]] = []
    math: list[tuple[int, int, object]] = []
    lookalikes: dict[str, list[tuple[int, int, object]]] = {}
    written: set[str] = set()
    for match in _WORD_RE.finditer(text, begin):
        start, end = match.start(), match.end()
        while start and text[start - 1] in _ASCII_LETTERS:
            start -= 1
        kind, script = _word_kind(text[start:end])
        if kind == MarkerKind.MIXED_SCRIPT:
            mixed.append((start, end, None))
        elif kind == MarkerKind.MATHEMATICAL:
            math.append((start, end, None))
        elif kind == MarkerKind.CONFUSABLE:
            lookalikes.setdefault(str(script), []).append((start, end, script))
        elif script is not None:
            written.add(script)
    confusable = sorted(found for script, words in lookalikes.items() if script not in written for found in words)
    return {MarkerKind.MIXED_SCRIPT: mixed, MarkerKind.MATHEMATICAL: math, MarkerKind.CONFUSABLE: confusable}


def _found(text: str) -> Iterator[tuple[MarkerKind, Iterable[tuple[int, int, object]]]]:
    # Every marker holds a character beyond ASCII: each pass starts at the first one (what a
    # marker takes in before it, such as a word's ASCII letters, is found by looking back).
    first = _NON_ASCII_RE.search(text)
    begin = first.start() if first else len(text)
    yield MarkerKind.INVISIBLE, _invisible(text, begin)
    yield MarkerKind.UNDEFINED, _undefined(text, begin)
    yield MarkerKind.STACKED_MARKS, _stacks(text, begin)
    yield MarkerKind.OVERLAY, _overlays(text, begin)
    yield MarkerKind.NON_ASCII_DIGITS, _digits(text, begin)
    yield from _words(text, begin).items()


def _character(text: str, start: int, end: int, detail: object) -> tuple[str, str, str]:
    return _character_named(text[start])


@functools.lru_cache(maxsize=4096)
def _character_named(ch: str) -> tuple[str, str, str]:
    cp = code_point(ch)
    return cp, char_name(ch), f"{short_name(ch)} {cp}".strip()


def _stack(text: str, start: int, end: int, detail: object) -> tuple[str, str, str]:
    distinct = list(dict.fromkeys(_NONSPACING_RE.findall(unicodedata.normalize("NFD", text[start:end]))))
    more = f" and {len(distinct) - 8} more" if len(distinct) > 8 else ""
    name = f"a character carrying {detail} combining marks (more than {MAX_COMBINING_MARKS})"
    return " ".join(code_point(ch) for ch in distinct[:8]) + more, name, f"{detail} stacked marks"


def _overlay(text: str, start: int, end: int, detail: object) -> tuple[str, str, str]:
    marks = _OVERLAY_MARK_RE.findall(text, start, end)
    return _named(marks), "characters struck through or overlaid by a combining mark", "struck through"


def _digit_family(ch: str) -> str:
    if ch.isascii():
        return "ASCII"
    name = unicodedata.name(ch, "")
    return name.split(" DIGIT ", 1)[0].title() if " DIGIT " in name else "Unnamed"


def _number(text: str, start: int, end: int, detail: object) -> tuple[str, str, str]:
    number = text[start:end]
    value = "".join(str(unicodedata.decimal(ch, "?")) for ch in number)
    families = "+".join(dict.fromkeys(_digit_family(ch) for ch in number))
    name = f"a number in {families} digits, {value} in ASCII digits"
    return _named(ch for ch in number if not ch.isascii()), name, f"{families} digits: {value}"


def _mixed(text: str, start: int, end: int, detail: object) -> tuple[str, str, str]:
    letters = [(ch, _scripts(ch)) for ch in text[start:end]]
    counts: dict[str, int] = {}
    for _ch, scripts in letters:
        if scripts:
            counts[scripts[0]] = counts.get(scripts[0], 0) + 1
    ranked = sorted(counts, key=lambda s: (-counts[s], s))
    minority = [ch for ch, scripts in letters if scripts and ranked[0] not in scripts]
    names = [SCRIPTS[s] for s in ranked]
    return _named(minority), f"a word mixing {' and '.join(names)} letters", "+".join(names)


def _math(text: str, start: int, end: int, detail: object) -> tuple[str, str, str]:
    word = text[start:end]
    name = f'a word with mathematical letters, which look like "{unicodedata.normalize("NFKC", word)}"'
    return _named(_MATH_RE.findall(word)), name, "math letters"


def _confusable(text: str, start: int, end: int, detail: object) -> tuple[str, str, str]:
    script = SCRIPTS[str(detail)]
    letters = [ch for ch in text[start:end] if not _NONSPACING_RE.match(ch)]
    name = f"a {script} word whose every letter looks like a Latin letter or digit"
    return _named(letters), name, f"{script} look-alike"


# Each kind's code points, name and label, from what its finder yielded.
_BUILDERS: dict[MarkerKind, Callable[[str, int, int, object], tuple[str, str, str]]] = {
    MarkerKind.INVISIBLE: _character,
    MarkerKind.UNDEFINED: _character,
    MarkerKind.STACKED_MARKS: _stack,
    MarkerKind.OVERLAY: _overlay,
    MarkerKind.NON_ASCII_DIGITS: _number,
    MarkerKind.MIXED_SCRIPT: _mixed,
    MarkerKind.MATHEMATICAL: _math,
    MarkerKind.CONFUSABLE: _confusable,
}


def marked(text: str, *, listed: int | None = None) -> tuple[list[Marker], dict[str, int]]:
    """The first ``listed`` markers of ``text`` of each kind, in order (all of them with
    None), and how many there are of each kind (``{INVISIBLE: n, MIXED_SCRIPT: m, …}``).

    Markers of one kind never overlap; markers of two kinds may nest or overlap (a struck
    letter in a mixed-script word). Linear in the text: each kind is found in one pass of
    one compiled pattern, and its lines and columns in one more scan (``_Lines``); only the
    markers listed are built.
    """
    counts = no_markers()
    if text.isascii():
        return [], counts  # the common case: nothing to mark (ASCII controls are refused at entry)
    built: list[Marker] = []
    kinds = 0
    for kind, found in _found(text):
        build, lines, n = _BUILDERS[kind], _Lines(text), 0
        for start, end, detail in found:
            if listed is None or n < listed:
                line, column = lines.of(start)
                cps, name, label = build(text, start, end, detail)
                built.append(Marker(kind, start, end, line, column, text[start:end], cps, name, label))
            n += 1
        counts[kind] = n
        kinds += n > 0
    if kinds > 1:
        # The first ``listed`` of each kind hold the first ``listed`` of all; an outer
        # marker comes before the ones it holds.
        built.sort(key=lambda m: (m.start, -m.end))
    return (built if listed is None else built[:listed]), counts


def markers(text: str) -> list[Marker]:
    """Every marker of ``text`` (docs/TEXT.md), in order."""
    return marked(text)[0]


# The markers listed per field (the API's ``warnings``, a banner's "Where"): a text can hold
# one on every other character, and a list of them all is larger than the text. The counts
# stay whole (``summary``), and a cut list says how many more there are.
MARKERS_LISTED = 50


class Warnings(list):
    """The listed markers of several named texts (at most ``MARKERS_LISTED`` per field),
    with the counts of all of them: ``counts[field]`` counts each ``MarkerKind``."""

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
        field = counts.setdefault(w["field"], no_markers())
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
        into = out.counts.setdefault(field, no_markers())
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
    kinds = {kind: sum(n.get(kind, 0) for n in counts.values()) for kind in MarkerKind}
    return {
        "total": found.total,
        "kinds": kinds,
        "said": said(kinds),
        "fields": sorted((field, sum(n.values())) for field, n in counts.items()),
        "labels": sorted({w["label"] for w in found}),
        "listed": len(found),
        "omitted": found.omitted(),
    }


# --- text in the commands' output -----------------------------------------------------------

_SAFE_VALUE = re.compile(r"[A-Za-z0-9._:/@+=,-]+")
_UNSAFE_IN_LINE = regex.compile(rf"[\n\r\t{_REFUSED_CLASS}{_INVISIBLE_CLASS}]", regex.V1)


def shown(value: object) -> str:
    """A value as a status line prints it: as is when it is a plain token, else JSON-quoted
    (ASCII escapes), so that no value can end the line or forge another one."""
    text = str(value)
    if _SAFE_VALUE.fullmatch(text):
        return text
    return json.dumps(text, ensure_ascii=True)


def _escape_char(match: regex.Match) -> str:
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
