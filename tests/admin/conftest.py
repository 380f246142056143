"""Fixtures for the admin workplace tests: logged-in clients and begun reviews."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.staticfiles import finders
from django.test import Client


def stylesheets(html: str) -> str:
    """The text of every stylesheet the page links from the static files, in page order.

    A page's styles are all in files (the Content-Security-Policy allows no inline style).
    """
    prefix = "/" + settings.STATIC_URL.strip("/") + "/"
    texts = []
    for href in re.findall(r'<link rel="stylesheet"[^>]*href="([^"]+)"', html):
        assert href.startswith(prefix), href
        found = finders.find(href.removeprefix(prefix))
        assert found, href
        texts.append(Path(found).read_text(encoding="utf-8"))
    return "\n".join(texts)


@pytest.fixture
def reviewer_client(reviewer):
    client = Client()
    client.force_login(reviewer)
    return client


@pytest.fixture
def lead_client(lead):
    client = Client()
    client.force_login(lead)
    return client


@pytest.fixture
def begun(case, reviewer):
    """T-1042 with its review begun, as `manage.py begin T-1042` leaves it."""
    from workflow.begin import review_begin

    result = review_begin(case=case, actor=None)
    case.refresh_from_db()
    return result


@pytest.fixture
def load_case():
    """Import one of the demo cases by file name, e.g. ``load_case("t1150.json")``."""
    from cases.services import case_import
    from tests.conftest import load_fixture

    def load(name: str, **overrides):
        return case_import(data={**load_fixture(name), **overrides}).case

    return load


def messages_of(response) -> list[str]:
    """The messages shown, as the reader sees them (entities decoded, links kept)."""
    import html

    return [html.unescape(str(m)) for m in response.context["messages"]] if response.context else []


@pytest.fixture
def raised(monkeypatch) -> list:
    """The errors the decision service raises while the test runs, to compare each page's
    message with the error's own ``message``."""
    from workplace import review

    seen: list = []
    service = review.decision_record

    def recording(**kwargs):
        try:
            return service(**kwargs)
        except Exception as exc:
            seen.append(exc)
            raise

    monkeypatch.setattr(review, "decision_record", recording)
    return seen


def counts() -> dict:
    """Rows in every table a decision or an edit could write."""
    from effects.models import CommitAttempt, EffectRecord
    from reviews.models import PendingReview, Proposal, ReviewDecision

    return {
        "proposals": Proposal.objects.count(),
        "decisions": ReviewDecision.objects.count(),
        "effects": EffectRecord.objects.count(),
        "pending": PendingReview.objects.count(),
        "attempts": CommitAttempt.objects.count(),
    }
