"""The text policy itself (core/text.py, docs/TEXT.md): what is refused, what is
marked, what is flagged, and that the identity still hashes the exact code points."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

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


# --- each kind of marker, by example (docs/TEXT.md) -------------------------------------------
#
# Each example is kept (check_text returns it unchanged) and gets exactly the marker listed:
# its kind (as the API names it), the part of the text it covers, and its badge.

MARKED_EXAMPLES = {
    # Characters without a standard meaning.
    "noncharacter U+FDD0": ("a\ufdd0b", [("undefined_character", "\ufdd0", "NONCHAR U+FDD0")]),
    "noncharacter U+FFFE": ("a\ufffeb", [("undefined_character", "\ufffe", "NONCHAR U+FFFE")]),
    "noncharacter U+10FFFF": ("a\U0010ffffb", [("undefined_character", "\U0010ffff", "NONCHAR U+10FFFF")]),
    "private use U+E000": ("logo \ue000 here", [("undefined_character", "\ue000", "PUA U+E000")]),
    "private use U+F0000": ("x\U000f0000", [("undefined_character", "\U000f0000", "PUA U+F0000")]),
    "unassigned U+0378": ("x\u0378y", [("undefined_character", "\u0378", "UNASSIGNED U+0378")]),
    "object replacement U+FFFC": ("see \ufffc here", [("undefined_character", "\ufffc", "OBJ U+FFFC")]),
    # Marks stacked on one character: more than four, counted in NFD.
    "200 marks on a letter": (
        "Hello z" + "\u0301" * 200 + "algo",
        [("stacked_marks", "z" + "\u0301" * 200, "200 stacked marks")],
    ),
    "five marks": (
        "e\u0301\u0302\u0303\u0304\u0306",
        [("stacked_marks", "e\u0301\u0302\u0303\u0304\u0306", "5 stacked marks")],
    ),
    "three on a precomposed letter": (
        "\u1ec7\u0301\u0301\u0301",
        [("stacked_marks", "\u1ec7\u0301\u0301\u0301", "5 stacked marks")],
    ),
    # Struck through or overlaid (combining class 1, Overlay).
    "struck-through number": (
        "pay 1\u03360\u03360\u03360\u0336 EUR",
        [("overlay_mark", "1\u03360\u03360\u03360\u0336", "struck through")],
    ),
    "slashed letter": ("a\u0338b", [("overlay_mark", "a\u0338", "struck through")]),
    "long vertical line overlay": ("x\u20d2", [("overlay_mark", "x\u20d2", "struck through")]),
    # Numbers in digits that are not ASCII.
    "full-width digits": (
        "pay \uff11\uff10\uff10\uff10 EUR",
        [("non_ascii_digits", "\uff11\uff10\uff10\uff10", "Fullwidth digits: 1000")],
    ),
    "Arabic-Indic digits": (
        "\u0661\u0660\u0660\u0660",
        [("non_ascii_digits", "\u0661\u0660\u0660\u0660", "Arabic-Indic digits: 1000")],
    ),
    "mathematical digits": (
        "\U0001d7cf\U0001d7ce\U0001d7ce\U0001d7ce",
        [("non_ascii_digits", "\U0001d7cf\U0001d7ce\U0001d7ce\U0001d7ce", "Mathematical Bold digits: 1000")],
    ),
    "a Bengali four that looks like 8": ("\u09ea EUR", [("non_ascii_digits", "\u09ea", "Bengali digits: 4")]),
    "digits of two systems": ("1\u066000", [("non_ascii_digits", "1\u066000", "ASCII+Arabic-Indic digits: 1000")]),
    # A word in another script that looks Latin.
    "all-Cyrillic paypal": (
        "Log in at \u0440\u0430\u0443\u0440\u0430\u04cf now",
        [("confusable_word", "\u0440\u0430\u0443\u0440\u0430\u04cf", "Cyrillic look-alike")],
    ),
    # Words mixing scripts, across every script.
    "Armenian": ("g\u0585\u0585gle.com", [("mixed_script_word", "g\u0585\u0585gle", "Latin+Armenian")]),
    "Cherokee": ("\u13e2AYPAL", [("mixed_script_word", "\u13e2AYPAL", "Latin+Cherokee")]),
    "Coptic": ("micr\u2c9fsoft", [("mixed_script_word", "micr\u2c9fsoft", "Latin+Coptic")]),
    "Lisu": ("\ua4d1AYPAL", [("mixed_script_word", "\ua4d1AYPAL", "Latin+Lisu")]),
    "Hiragana in Hangul": ("\ud55c\u3042\uad6d", [("mixed_script_word", "\ud55c\u3042\uad6d", "Hangul+Hiragana")]),
    # Mathematical letters.
    "mathematical italic p": ("pay\U0001d45dal", [("mathematical_letters", "pay\U0001d45dal", "math letters")]),
    "all mathematical bold": (
        "\U0001d429\U0001d41a\U0001d432",
        [("mathematical_letters", "\U0001d429\U0001d41a\U0001d432", "math letters")],
    ),
}


def found(value: str) -> list[tuple[str, str, str]]:
    return [(m.kind, m.text, m.label) for m in text.markers(value)]


@pytest.mark.parametrize("example", MARKED_EXAMPLES)
def test_each_example_is_kept_and_gets_its_marker(example):
    value, expected = MARKED_EXAMPLES[example]
    assert text.check_text(value, field="body") == value
    assert found(value) == expected


@pytest.mark.parametrize("example", MARKED_EXAMPLES)
def test_the_page_shows_the_hashed_text_with_each_marker(example):
    import html

    value, expected = MARKED_EXAMPLES[example]
    out = str(marked_html(value))
    assert html.unescape(re.sub(r"<[^>]+>", "", out)) == value  # the badges are CSS, not text
    assert re.findall(r'data-label="([^"]+)"', out) == [html.escape(label) for _k, _t, label in expected]


@pytest.mark.parametrize(
    "value",
    [
        "東京タワーへ行きました",  # Japanese: Han, Katakana, Hiragana
        "한국어와 漢字를 섞은 문장",  # Korean: Hangul and Han in one word
        "ㄅㄆㄇ漢字",  # Han with Bopomofo
        "Wi-Fiを使う",  # Latin with Japanese, as UTS #39's highly restrictive level allows
        "Vie\u0323\u0302t Nam, tie\u0302\u0301ng Vie\u0323\u0302t",  # Vietnamese, decomposed: two or three marks
        "\u05e9\u05c1\u05bc\u05b8",  # Hebrew: a letter with three marks
        "Привет, а у вас о чём?",  # Russian: "а", "у", "о" look Latin but the text writes Cyrillic
        "Ο κ. Παπαδόπουλος",  # Greek, likewise
        "café 10:30 №5 ½ ①",  # numbers and Latin with ASCII digits
    ],
)
def test_ordinary_text_of_other_scripts_is_not_marked(value):
    assert text.markers(value) == []


def test_a_word_in_another_script_that_looks_latin_is_marked_only_where_that_script_writes_nothing_else():
    lookalike = "\u0440\u0430\u0443\u0440\u0430\u04cf"  # раураӏ
    assert [m.kind for m in text.markers(f"Pay via {lookalike} today")] == ["confusable_word"]
    assert text.markers(f"Оплатите через {lookalike}") == []  # a Russian text: a Russian word
    cherokee = "\u13e2\u13aa\u13a9\u13e2\u13aa\u13de"  # ᏢᎪᎩᏢᎪᏞ
    assert found(f"Log in at {cherokee}") == [("confusable_word", cherokee, "Cherokee look-alike")]


def test_overlapping_markers_nest_on_the_page_and_each_keeps_one_badge():
    import html

    value = (
        "p\u0430\u0336ypal 1\u0336\uff12\u0336"  # a struck Cyrillic letter in a mixed word; struck full-width digits
    )
    assert [(m.kind, m.text) for m in text.markers(value)] == [
        ("mixed_script_word", "p\u0430\u0336ypal"),
        ("overlay_mark", "\u0430\u0336"),
        ("overlay_mark", "1\u0336\uff12\u0336"),
        ("non_ascii_digits", "\uff12"),
    ]
    out = str(marked_html(value))
    assert html.unescape(re.sub(r"<[^>]+>", "", out)) == value
    assert out.count("<mark") == out.count("</mark>") == 4 and "df-tm-part" not in out
    # A marker that crosses another is cut in pieces: the badge stays on its last one.
    crossing = str(marked_html("ab \u0430\u0336b", wrap=[(0, 5, "<i>", "</i>")]))
    assert crossing.count("df-tm-part") == 1 and html.unescape(re.sub(r"<[^>]+>", "", crossing)) == "ab \u0430\u0336b"


def test_summary_counts_every_kind_and_says_each():
    values = [("zwsp", "a\u200bb"), *((name, value) for name, (value, _expected) in MARKED_EXAMPLES.items())]
    summary = text.summary(text.warnings(values))
    assert summary["total"] == 1 + sum(len(expected) for _v, expected in MARKED_EXAMPLES.values())
    assert set(summary["kinds"]) == set(text.MarkerKind) and all(summary["kinds"].values())
    assert summary["said"].startswith("1 invisible or format character, 7 characters without a standard meaning, 3 ")
    assert summary["said"].endswith(", 2 words with mathematical letters and 1 word in another script that looks Latin")


def test_the_marker_kinds_are_one_vocabulary(client, db):
    """The API's ``kind``, the pages' classes and the banner's words each list every kind."""
    from workplace.display import MARKER_CLASSES

    openapi = client.get("/api/openapi.json").json()["components"]["schemas"]
    assert openapi["TextWarningOut"]["properties"]["kind"]["enum"] == [kind.value for kind in text.MarkerKind]
    assert set(MARKER_CLASSES) == set(text.MarkerKind) == set(text._SAID)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "TEXT.md").read_text(encoding="utf-8")
    table = doc.split("| kind |", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^\| `([a-z_]+)` \|", table, re.M) == [kind.value for kind in text.MarkerKind]


def test_regex_lists_the_scripts_the_policy_names():
    """The script names come from regex's own table: an upgrade that moves it fails here."""
    for script in ("LATIN", "CYRILLIC", "GREEK", "ARMENIAN", "CHEROKEE", "COPTIC", "LISU", "HAN", "HIRAGANA"):
        assert script in text.SCRIPTS
    assert text.SCRIPTS["LATIN"] == "Latin" and len(text.SCRIPTS) > 150
    assert {"KATAKANA", "HANGUL", "BOPOMOFO"} <= set(text.SCRIPTS)
