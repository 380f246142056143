"""Exports in a browser (docs/AUDIT.md): the support lead ticks every case on the list and
runs "Export selected as CSV (signed)", opens a case's history and clicks "Export this
history: CSV"; both download a file, and the signature downloaded from Signed exports
verifies it with the public key alone. Screenshots go to docs/screenshots/ under
``make screenshots``."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from playwright.sync_api import expect

from audit.signature import export_verify
from cases.models import Case
from core import signing
from tests.browser.conftest import LEAD

pytestmark = pytest.mark.django_db(transaction=True)


def saved(download, folder: Path) -> Path:
    path = folder / download.suggested_filename
    download.save_as(path)
    return path


def signature_for(page, url: str, export: Path) -> Path:
    """The .sig of ``export``, downloaded from the Signed exports list."""
    page.goto(f"{url}/admin/audit/signedexport/")
    link = page.locator(f"a.df-sig-link:has-text('{export.name}.sig')")
    expect(link).to_be_visible()
    with page.expect_download() as info:
        link.click()
    return saved(info.value, export.parent)


def test_the_lead_exports_the_case_list_and_a_history(demo, login, live_server, tmp_path, screenshot_dir):
    url = live_server.url
    _context, page = login(*LEAD)

    page.goto(f"{url}/admin/cases/case/")
    page.check("#action-toggle")
    page.select_option("select[name=action]", "export_csv")
    with page.expect_download() as info:
        page.click("button[name=index]")
    cases_csv = saved(info.value, tmp_path)
    assert cases_csv.name.startswith("decisionflow-cases-") and cases_csv.suffix == ".csv"
    rows = list(csv.DictReader(io.StringIO(cases_csv.read_text(encoding="utf-8"), newline="")))
    assert sorted(r["case_id"] for r in rows) == sorted(Case.objects.values_list("case_id", flat=True))
    assert all(r["state"] for r in rows)
    assert export_verify(cases_csv, public_pem=signing.public_key_pem(), sig=signature_for(page, url, cases_csv))

    page.goto(f"{url}/admin/cases/case/{demo.pk}/history/")
    links = page.locator("#df-history-export")
    expect(links).to_contain_text("Export this history")
    page.screenshot(path=str(screenshot_dir / "history-export.png"), full_page=False)
    with page.expect_download() as info:
        links.get_by_role("link", name="CSV").click()
    history_csv = saved(info.value, tmp_path)
    assert history_csv.name.startswith("decisionflow-history-T-1042-")
    events = [r["event"] for r in csv.DictReader(io.StringIO(history_csv.read_text(encoding="utf-8"), newline=""))]
    assert events[:2] == ["proposal", "review_begun"]
    sig = signature_for(page, url, history_csv)
    assert export_verify(history_csv, public_pem=signing.public_key_pem(), sig=sig).size == history_csv.stat().st_size
    expect(page.locator("#result_list")).to_contain_text("lead")
    page.screenshot(path=str(screenshot_dir / "signed-exports.png"), full_page=False)
