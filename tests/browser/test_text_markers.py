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


def test_each_marked_character_has_a_badge_and_the_banner_counts_them(demo, login, live_server, screenshot_dir):
    from cases.services import case_import
    from tests.conftest import load_fixture
    from workflow.begin import review_begin

    case = case_import(data=dict(load_fixture("t1042.json"), case_id="T-2001", draft=draft())).case
    in_thread(review_begin, case=case)
    case.refresh_from_db()
    proposal = case.current_proposal
    context, page = login(*REVIEWER)
    page.goto(f"{live_server.url}/admin/reviews/proposal/{proposal.pk}/review/")
    page.wait_for_selector("#df-review")

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
