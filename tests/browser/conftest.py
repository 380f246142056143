"""Browser tests: Playwright for Python driving Debian's Chromium against pytest-django's live server.

Playwright's sync API keeps an asyncio loop registered as running in this thread, so:
- Django would refuse ORM calls here (SynchronousOnlyOperation): ``allow_orm_beside_playwright``
  allows them, only while these tests run (elsewhere the check must keep catching real
  mistakes), which is safe because the test thread never awaits anything itself;
- the workflow host functions run the engine on an event loop of their own
  (``engine.driver.hosted``), which cannot run in a thread with a
  running loop: tests call them through ``in_thread``.

Screenshots go to a temporary folder, or to ``DECISIONFLOW_SCREENSHOT_DIR`` when set
(``make screenshots`` sets it to docs/screenshots).
"""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import pytest


def pytest_itemcollected(item):
    """What a person sees is the same page on either database: the browser tests run in the
    SQLite run only (tests/conftest.py, ``any_database``). The admin's pages are requested on
    both databases by tests/admin, and every decision they make is the services' own."""
    item.add_marker(pytest.mark.any_database)


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SKIP_REASON = f"browser tests skipped: {CHROMIUM} is missing (run `make browser` as root to install Debian's chromium)"

REVIEWER = ("reviewer", "review-T1042")
LEAD = ("lead", "lead-T1042")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    mine = [item for item in items if Path(str(item.fspath)).is_relative_to(here)]
    for item in mine:
        item.add_marker(pytest.mark.browser)
    if mine and not os.access(CHROMIUM, os.X_OK):
        print(f"\n{SKIP_REASON}")
        for item in mine:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(autouse=True, scope="module")
def allow_orm_beside_playwright():
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def in_thread(fn, *args, **kwargs):
    """Run ``fn`` in a fresh thread (no event loop there) on its own DB connection."""
    from django.db import connections

    box = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the test thread
            box["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def screenshot_dir(tmp_path_factory) -> Path:
    configured = os.environ.get("DECISIONFLOW_SCREENSHOT_DIR")
    path = Path(configured) if configured else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def demo(transactional_db, settings):
    """The demo data as `make run` loads it: every demo case begun (``load_demo`` begins them
    as `manage.py begin` does); T-1042 is returned."""
    from django.core.management import call_command

    from cases.models import Case

    # The live server speaks plain HTTP; development cookie settings, whatever the env says.
    settings.SESSION_COOKIE_SECURE = False
    settings.CSRF_COOKIE_SECURE = False
    settings.SECURE_SSL_REDIRECT = False
    # load_demo begins the reviews, which runs the engine: not in this thread (see above).
    in_thread(call_command, "load_demo", stdout=io.StringIO())
    case = Case.objects.get(case_id="T-1042")
    assert case.current_proposal_id is not None
    return case


@pytest.fixture(scope="module")
def browser():
    # Module scope: Chromium starts once per file (about 3 s saved per test), and Playwright's
    # loop is gone again before tests of other modules run.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def sign_in(page, live_server, username: str, password: str) -> None:
    """Sign ``page`` in to the admin as a demo user, and wait for the front page."""
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")


@pytest.fixture
def login(browser, live_server):
    """A logged-in browser context for a demo user: ``login(*REVIEWER)``."""
    contexts = []

    def make(username: str, password: str):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        contexts.append(context)
        page = context.new_page()
        sign_in(page, live_server, username, password)
        return context, page

    yield make
    for context in contexts:
        context.close()
