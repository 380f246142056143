"""The text policy itself (core/text.py, docs/TEXT.md): what is refused, what is
marked, what is flagged, and that the identity still hashes the exact code points."""

from __future__ import annotations

import re
import unicodedata

import pytest

from core import identity, text
from core.errors import InvalidInput
from workplace.display import marked_html

# One representative of every refused family, and both ends of each range.
REFUSED = {
    "U+202A": "\u202a",
    "U+202E": "\u202e",
    "U+2066": "\u2066",
    "U+2069": "\u2069",
    "U+E0000": "\U000e0000",
    "U+E0041": "\U000e0041",
    "U+E007F": "\U000e007f",
    "U+0000": "\x00",
    "U+0008": "\x08",
    "U+000B": "\x0b",
    "U+001B": "\x1b",
    "U+007F": "\x7f",
    "U+0085": "\x85",
    "U+009F": "\x9f",
    "U+D800": "\ud800",
    "U+DFFF": "\udfff",
}

# Kept in the text, marked where they stand.
MARKED = {
    "U+200E": "\u200e",
    "U+200F": "\u200f",
    "U+061C": "\u061c",
    "U+200B": "\u200b",
    "U+200C": "\u200c",
    "U+200D": "\u200d",
    "U+00AD": "\u00ad",
    "U+FE0F": "\ufe0f",
    "U+E0100": "\U000e0100",
    "U+2060": "\u2060",
    "U+FEFF": "\ufeff",
    "U+2028": "\u2028",
}


@pytest.mark.parametrize("cp", REFUSED)
def test_each_refused_code_point_is_named_with_its_position(cp):
    value = f"Hello,\nwe credit you {REFUSED[cp]}1000 EUR."
    with pytest.raises(InvalidInput) as exc:
        text.check_text(value, field="draft")
    message = exc.value.message
    assert message.startswith(f"draft: {cp} ") and "line 2, column 15" in message, message
    assert text.char_name(REFUSED[cp]) in message and "nothing was written" in message
    assert exc.value.details["code_point"] == cp and exc.value.details["index"] == 21
    assert exc.value.code == "invalid_request" and exc.value.exit_code == 1 and exc.value.http_status == 400


def test_line_endings_are_normalised_before_the_policy_and_tab_is_allowed():
    for value in ("a\r\nb", "a\rb", "a\tb\n"):
        assert text.check_text(value, field="body") == value  # returned unchanged
    # The position is counted in the normalised text: CRLF is one line break.
    with pytest.raises(InvalidInput, match="line 3, column 2"):
        text.check_text("a\r\nb\r\nc\x00", field="body")


def test_one_line_fields_refuse_line_breaks_and_lengths_are_counted_in_code_points():
    with pytest.raises(InvalidInput, match="must be one line, but has a line break at position 2"):
        text.check_text("a\r\nb", field="subject", one_line=True)
    with pytest.raises(InvalidInput, match="has a tab"):
        text.check_text("a\tb", field="subject", one_line=True)
    astral = "\U0001f600" * 5  # five code points, twenty UTF-8 bytes: PostgreSQL counts five
    assert text.check_text(astral, field="label", one_line=True, max_length=5) == astral
    with pytest.raises(InvalidInput, match="is 6 characters long; at most 5 are allowed"):
        text.check_text(astral + "x", field="label", one_line=True, max_length=5)


def test_every_format_character_is_refused_or_marked():
    """Every Unicode format character (Cf), in this Python's data, is either refused or
    marked: none passes unseen."""
    uncovered = []
    for cp in range(0x110000):
        ch = chr(cp)
        if unicodedata.category(ch) != "Cf":
            continue
        refused = text._REFUSED_RE.match(ch) is not None
        marked = text._MARKED_RE.match(ch) is not None
        if refused == marked:  # neither, or (wrongly) both
            uncovered.append(f"U+{cp:04X}")
    assert uncovered == []


@pytest.mark.parametrize("cp", MARKED)
def test_marked_characters_are_kept_and_marked_where_they_stand(cp):
    ch = MARKED[cp]
    value = f"Thank you.\nWe credit{ch} you"
    assert text.check_text(value, field="body") == value
    [marker] = text.markers(value)
    assert (marker.kind, marker.code_point, marker.start, marker.line, marker.column) == (
        text.MarkerKind.INVISIBLE,
        cp,
        20,
        2,
        10,
    )
    assert cp in marker.label and marker.name == text.char_name(ch)


def test_joiners_and_variation_selectors_inside_emoji_are_ordinary_text():
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    rainbow = "\U0001f3f3\ufe0f\u200d\U0001f308"
    heart_on_fire = "\u2764\ufe0f\u200d\U0001f525"
    keycap = "1\ufe0f\u20e3"
    health_worker = "\U0001f9d1\U0001f3fd\u200d\u2695\ufe0f"
    assert text.markers(" ".join([family, rainbow, heart_on_fire, keycap, health_worker])) == []
    # The same joiner between letters, or dangling after an emoji, is marked.
    assert [m.label for m in text.markers("a\u200db \U0001f468\u200d x")] == ["ZWJ U+200D", "ZWJ U+200D"]


@pytest.mark.parametrize(
    "word, scripts, minority",
    [
        ("p\u0430ypal", "Latin+Cyrillic", "U+0430 CYRILLIC SMALL LETTER A"),
        ("\u0440aypal", "Latin+Cyrillic", "U+0440 CYRILLIC SMALL LETTER ER"),
        ("micr\u03bfsoft", "Latin+Greek", "U+03BF GREEK SMALL LETTER OMICRON"),
        ("\u0432\u0430\u0441\u0443a", "Cyrillic+Latin", "U+0061 LATIN SMALL LETTER A"),
    ],
)
def test_a_word_mixing_scripts_is_flagged(word, scripts, minority):
    value = f"Log in at {word} now"
    [marker] = text.markers(value)
    assert (marker.kind, marker.text, marker.label, marker.start) == (text.MarkerKind.MIXED_SCRIPT, word, scripts, 10)
    assert minority in marker.code_point


def test_single_script_words_are_not_flagged():
    assert text.markers("Привет, Ελλάδα, café, naïve, Straße, 東京, مرحبا") == []


def test_warnings_name_the_field_and_summary_counts_them():
    found = text.warnings([("body", "a\u200bb p\u0430ypal"), ("subject", "plain"), ("other", None)])
    assert [(w["field"], w["kind"], w["code_point"].split()[0]) for w in found] == [
        ("body", "invisible_character", "U+200B"),
        ("body", "mixed_script_word", "U+0430"),
    ]
    assert found[0]["message"] == "body: U+200B ZERO WIDTH SPACE at line 1, column 2"
    assert text.summary(found) | {"labels": None} == {
        "total": 2,
        "kinds": text.no_markers() | {text.MarkerKind.INVISIBLE: 1, text.MarkerKind.MIXED_SCRIPT: 1},
        "said": "1 invisible or format character and 1 word mixing scripts",
        "fields": [("body", 2)],
        "labels": None,
        "listed": 2,
        "omitted": [],
    }


def test_marked_html_escapes_keeps_every_character_and_badges_each_marker():
    import html
    import re

    value = "<b>p\u0430ypal</b>\u200b & \u200f"
    out = str(marked_html(value))
    assert "<b>" not in out and "&lt;b&gt;" in out
    assert out.count('class="df-tm df-tm-invisible"') == 2 and out.count('class="df-tm df-tm-mixed"') == 1
    # The text itself is all there, in order, once the markup is stripped: the badges are CSS.
    assert html.unescape(re.sub(r"<[^>]+>", "", out)) == value


def test_the_identity_hashes_the_exact_code_points_markers_included():
    """The policy decides what may enter, never what is hashed."""
    plain = "We credit you 1000 EUR."
    with_zwsp = "We credit you 10\u200b00 EUR."
    ev = identity.evidence_id([])
    pol = identity.policy_id("p", {})
    a = identity.operation_id("T-1", "act", plain, ev, pol)
    b = identity.operation_id("T-1", "act", with_zwsp, ev, pol)
    assert a != b
    framed = identity.encode_fields([with_zwsp])
    assert framed == len(with_zwsp.encode()).to_bytes(4, "big") + with_zwsp.encode()
    assert "\u200b".encode() in framed


@pytest.mark.parametrize(
    "value, problem",
    [
        ("", "must not be empty"),
        ("T 1042", "U+0020 SPACE"),
        ("T-1042\nreconcile: case=T-1077", "U+000A LINE FEED"),
        ("-T1042", "must start with a letter or a digit"),
        ("T" * 65, "is 65 characters long; at most 64"),
        ("T-1042\u202e", "U+202E"),
        (1042, "must be a string"),
    ],
)
def test_case_ids_follow_one_pattern(value, problem):
    with pytest.raises(InvalidInput, match=re.escape(problem)):
        text.check_case_id(value)


@pytest.mark.parametrize("value", ["T-1042", "T1", "a", "A.b_c-9", "T" * 64, "0"])
def test_good_case_ids(value):
    assert text.check_case_id(value) == value


def test_values_in_status_lines_cannot_forge_a_line():
    assert text.shown("T-1042") == "T-1042"
    assert text.shown("op-v1-ab") == "op-v1-ab"
    forged = "T-1\nreconcile: case=T-1077 state=Committed"
    assert text.shown(forged) == '"T-1\\nreconcile: case=T-1077 state=Committed"'
    assert "\n" not in text.shown(forged) and "\u202e" not in text.shown("a\u202eb")
    assert text.one_line("a\nb\r\u202ec\u200bd\x1b") == "a\\nb\\r\\u202ec\\u200bd\\x1b"
