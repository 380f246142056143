"""The text policy's markers in a real browser (docs/TEXT.md): a draft holding each kind of
kept-but-marked character shows a badge where each one stands and a banner that counts them,
while the text on the page stays exactly the text that was hashed."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import REVIEWER, in_thread

pytestmark = pytest.mark.django_db(transaction=True)

# Each kind the policy keeps but marks, and one word mixing scripts.
MARKED = [
    ("\u200b", "ZWSP U+200B"),
    ("\u200c", "ZWNJ U+200C"),
    ("\u200d", "ZWJ U+200D"),
    ("\u200e", "LRM U+200E"),
    ("\u200f", "RLM U+200F"),
    ("\u061c", "ALM U+061C"),
    ("\u00ad", "SHY U+00AD"),
    ("\ufe01", "VS2 U+FE01"),
    ("\u2060", "WJ U+2060"),
    ("\ufeff", "ZWNBSP U+FEFF"),
]
MIXED = "p\u0430ypal"
FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # an emoji ZWJ sequence: ordinary text


def draft() -> str:
    lines = ["Hello,", "", "Please check each marked place before you approve:"]
    for ch, label in MARKED:
        lines.append(f"- {label.split()[0]}: cred{ch}it")
    lines += [f"- a look-alike: pay via {MIXED}.com", f"- an emoji sequence, not marked: {FAMILY}", "", "Kind regards,"]
    return "\n".join(lines)


def review_page(login, live_server, case_id: str, body: str):
    """A case with ``body`` as its draft, begun, and its review page open for the reviewer."""
    from cases.services import case_import
    from tests.conftest import load_fixture
    from workflow.begin import review_begin

    case = case_import(data=dict(load_fixture("t1042.json"), case_id=case_id, draft=body)).case
    in_thread(review_begin, case=case)
    case.refresh_from_db()
    proposal = case.current_proposal
    _context, page = login(*REVIEWER)
    page.goto(f"{live_server.url}/admin/reviews/proposal/{proposal.pk}/review/")
    page.wait_for_selector("#df-review")
    return page, proposal


def test_each_marked_character_has_a_badge_and_the_banner_counts_them(demo, login, live_server, screenshot_dir):
    page, proposal = review_page(login, live_server, "T-2001", draft())

    total = len(MARKED) + 1
    banner = page.locator("#df-text-markers")
    expect(banner).to_be_visible()
    expect(banner).to_have_attribute("data-count", str(total))
    expect(banner).to_contain_text(f"{total} marked places on this page")
    expect(banner).to_contain_text(f"{len(MARKED)} invisible or format characters and 1 word mixing scripts")

    body = page.locator("#df-body")
    invisible = body.locator(".df-tm-invisible")
    expect(invisible).to_have_count(len(MARKED))
    # Each badge is drawn where its character stands, with the character's label, and is
    # visible (CSS draws it from data-label: it has a size on the page).
    labels = invisible.evaluate_all(
        "els => els.map(e => [e.dataset.label, getComputedStyle(e, '::after').content, e.getBoundingClientRect().width])"
    )
    assert [label for label, _css, _w in labels] == [label for _ch, label in MARKED]
    assert all(css == f'"{label}"' and width > 10 for label, css, width in labels), labels
    mixed = body.locator(".df-tm-mixed")
    expect(mixed).to_have_count(1)
    expect(mixed).to_have_text(MIXED)
    assert mixed.evaluate("e => getComputedStyle(e, '::after').content") == '"Latin+Cyrillic"'
    # The page's text is exactly the hashed body: the badges are not part of it.
    assert body.evaluate("e => e.textContent") == proposal.body
    page.locator("#df-text-markers details summary").click()
    page.screenshot(path=str(screenshot_dir / "text-markers.png"), full_page=True)


# One of each other kind, with its badge; the stack has 60 marks, enough to paint over the
# lines around it if the page let it.
KINDS = [
    ("logo \ue000 here", "undefined", "PUA U+E000"),
    ("see \ufffc there", "undefined", "OBJ U+FFFC"),
    ("z" + "\u0301" * 60 + "algo", "stacked", "60 stacked marks"),
    ("was 1\u03360\u03360\u03360\u0336 EUR", "overlay", "struck through"),
    ("now \uff11\uff10\uff10\uff10 EUR", "digits", "Fullwidth digits: 1000"),
    ("at g\u0585\u0585gle.com", "mixed", "Latin+Armenian"),
    ("via pay\U0001d45dal", "math", "math letters"),
    ("or \u0440\u0430\u0443\u0440\u0430\u04cf", "confusable", "Cyrillic look-alike"),
]


def test_each_kind_has_its_badge_and_a_stack_of_marks_stays_on_its_line(demo, login, live_server, screenshot_dir):
    lines = ["Hello,", "", *(f"- {value}" for value, _css, _label in KINDS), "", "Kind regards,"]
    page, proposal = review_page(login, live_server, "T-2002", "\n".join(lines))

    banner = page.locator("#df-text-markers")
    expect(banner).to_contain_text(f"{len(KINDS)} marked places on this page")
    expect(banner).to_contain_text("2 characters without a standard meaning, 1 character with stacked combining marks")
    pre = page.locator("#df-body")
    drawn = pre.locator(".df-tm").evaluate_all(
        "els => els.map(e => [e.className.replace('df-tm df-tm-', ''), getComputedStyle(e, '::after').content])"
    )
    assert drawn == [[css, f'"{label}"'] for _value, css, label in KINDS], drawn
    # The stack is clipped to its line: its box is no taller than a line of the body.
    stack, line_height = pre.locator(".df-tm-stacked").evaluate(
        "e => [e.getBoundingClientRect().height, parseFloat(getComputedStyle(e.parentElement).lineHeight) || 20]"
    )
    assert stack <= 2 * line_height, (stack, line_height)
    assert pre.evaluate("e => e.textContent") == proposal.body
    page.locator("#df-text-markers details summary").click()
    # The banner names the stack by its base: its marks are not in the list.
    expect(banner).to_contain_text('a character carrying 60 combining marks (more than 4) at line 5, column 3: "z"')
    page.screenshot(path=str(screenshot_dir / "text-markers-kinds.png"), full_page=True)
