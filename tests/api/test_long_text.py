"""A 250 KB adversarial body (docs/TEXT.md): refused past the body limit, and, where one is
stored, marked in one scan and listed at most ``MARKERS_LISTED`` per field.

The assertions are on the work, not the time: how much of the text the marking scans, how
many markers are listed, how large the answers are. A guard (``bounded``) turns a run that
would take tens of seconds into a failure after a few.
"""

from __future__ import annotations

import contextlib
import json
import signal

import pytest
from django.test import override_settings

from core import text
from reviews.models import Proposal
from tests.api.conftest import DEMO_OP, assert_error
from tests.conftest import snapshot
from workplace.links import review_url

EDITS = "/api/cases/T-1042/edits"
SHY = "\u00ad"
# 250,000 bytes of UTF-8, inside the API's 256 KiB request limit: soft hyphens, a line break
# after every 79.
ADVERSARIAL = "\n".join([SHY * 79] * 1572)
MARKED = ADVERSARIAL.count(SHY)


def edit(api, body: str):
    """The edit as a client sends it: UTF-8 JSON, not ASCII escapes (six bytes a character)."""
    payload = json.dumps({"expected_operation_id": DEMO_OP, "body": body}, ensure_ascii=False)
    return api.post(EDITS, raw=payload)


@contextlib.contextmanager
def bounded(seconds: float):
    """Fail, rather than hang, when the block runs past ``seconds`` (quadratic work would)."""

    def expired(_signum, _frame):
        raise AssertionError(f"still running after {seconds} s: the work grows faster than the text")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Scanned(str):
    """A text that counts the characters its ``count`` and ``rfind`` scan, and refuses to
    scan more than ``budget`` in all."""

    def __new__(cls, value: str, budget: int):
        self = super().__new__(cls, value)
        self.scanned, self.budget = 0, budget
        return self

    def _scan(self, start, end):
        self.scanned += (len(self) if end is None else end) - (start or 0)
        if self.scanned > self.budget:
            raise AssertionError(f"scanned {self.scanned} characters of a {len(self)}-character text")

    def count(self, sub, start=None, end=None):
        self._scan(start, end)
        return super().count(sub, start, end)

    def rfind(self, sub, start=None, end=None):
        self._scan(start, end)
        return super().rfind(sub, start, end)


def texts_carried(proposal: dict) -> int:
    """The bytes of an answer's proposal texts, as the API's JSON writes them."""
    return len(json.dumps(proposal["body"])) + len(json.dumps(proposal["unchecked_sentences"]))


def test_the_adversarial_body_is_250_kb_of_markers():
    assert 249_000 <= len(ADVERSARIAL.encode()) <= 256 * 1024
    assert MARKED > 120_000


def test_markers_scan_the_text_a_bounded_number_of_times():
    body = Scanned(ADVERSARIAL, budget=4 * len(ADVERSARIAL))
    with bounded(10):
        found = text.markers(body)
    assert len(found) == MARKED
    assert body.scanned <= 4 * len(ADVERSARIAL)
    # The positions are those of the one-at-a-time rule.
    for m in (found[0], found[len(found) // 2], found[-1]):
        assert (m.line, m.column) == text.position(ADVERSARIAL, m.start)


# 250 KB of each other kind, at its densest: a marker on every few characters.
DENSE = {
    "undefined_character": "\ue000",
    "stacked_marks": "a" + "\u0301" * 5 + " ",
    "overlay_mark": "1\u0336 ",
    "non_ascii_digits": "\uff11 ",
    "mixed_script_word": "p\u0430 ",
    "mathematical_letters": "\U0001d45d ",
    "confusable_word": "\u0440\u0430 ",
}


@pytest.mark.parametrize("kind", DENSE)
def test_every_kind_is_found_in_one_scan_of_a_dense_250_kb_text(kind):
    unit = DENSE[kind]
    line = unit * max(1, 79 // len(unit))
    dense = "\n".join([line] * (250_000 // len((line + "\n").encode())))
    body = Scanned(dense, budget=4 * len(dense))
    with bounded(10):
        found, counts = text.marked(body)
    assert {m.kind for m in found} == {kind} and counts[kind] == len(found) > 10_000
    assert body.scanned <= 4 * len(dense)
    for m in (found[0], found[len(found) // 2], found[-1]):
        assert (m.line, m.column) == text.position(dense, m.start)


@pytest.mark.django_db(transaction=False)
def test_a_body_past_the_limit_is_refused_and_writes_nothing(api, proposal):
    before = snapshot()
    with bounded(10):
        response = edit(api, ADVERSARIAL)
    error = assert_error(response, 400, "invalid_request")
    assert error["message"] == (
        f"body: is {len(ADVERSARIAL)} characters long; at most 20000 are allowed; nothing was written"
    )
    assert snapshot() == before


@pytest.mark.django_db(transaction=False)
def test_a_stored_adversarial_body_is_listed_at_most_markers_listed_times(api, proposal):
    # A deployment that raised the limit (or a body stored before it): the answers stay small.
    with override_settings(DECISIONFLOW_MAX_BODY_CHARS=len(ADVERSARIAL)), bounded(20):
        edited = edit(api, ADVERSARIAL)
        assert edited.status_code == 201, edited.content[:300]
        case = api.get("/api/cases/T-1042")
        new = edited.json()["proposal"]
    body_listed = [w for w in new["warnings"] if w["field"] == "body"]
    assert len(body_listed) == 50 == text.MARKERS_LISTED  # the list first: the old code listed all
    assert new["warnings_total"] == MARKED
    assert new["warnings_omitted"] == [
        {
            "field": "body",
            "count": MARKED - text.MARKERS_LISTED,
            "message": f"body: and {MARKED - text.MARKERS_LISTED} more",
        }
    ]
    # The answer is the texts it carries (the body, and the sentences a person wrote) and a
    # bounded list: not a list as long as the text.
    assert len(edited.content) - texts_carried(new) < 100_000

    data = case.json()
    assert data["warnings_total"] == MARKED
    assert len(data["warnings"]) == text.MARKERS_LISTED
    assert len(data["proposal"]["warnings"]) == text.MARKERS_LISTED
    assert len(case.content) - texts_carried(data["proposal"]) < 100_000


@pytest.mark.django_db(transaction=False)
def test_the_review_page_lists_markers_listed_and_counts_all(api, proposal, client, reviewer):
    # The longest body allowed, all soft hyphens: the page draws each where it stands (in
    # the body, the diff and the sentences a person wrote), and its banner lists 50.
    body = "\n".join([SHY * 79] * (text.max_body_chars() // 80))
    marked = body.count(SHY)
    with bounded(20):
        edited = edit(api, body)
        assert edited.status_code == 201, edited.content[:300]
        client.force_login(reviewer)
        page = client.get(review_url(Proposal.objects.get(operation_id=edited.json()["proposal"]["operation_id"]).pk))
    assert page.status_code == 200
    html = page.content.decode()
    assert f'id="df-text-markers" data-count="{marked}"' in html  # the banner counts them all
    assert html.count("<li>body: U+00AD SOFT HYPHEN") == text.MARKERS_LISTED
    assert f"body: and {marked - text.MARKERS_LISTED} more" in html
