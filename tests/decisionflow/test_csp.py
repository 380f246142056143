"""The Content-Security-Policy header: on every page, strict, and the templates need nothing more.

What the browser makes of it (no violation on any page) is tests/browser/test_csp.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from django.urls import reverse

from tests.conftest import ROOT

POLICY = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}


def directives(header: str) -> dict[str, list[str]]:
    parsed = {}
    for part in header.split(";"):
        name, *values = part.split()
        assert name not in parsed, f"{name} twice in {header!r}"
        parsed[name] = values
    return parsed


@pytest.mark.django_db
def test_the_login_page_carries_the_strict_policy(client):
    response = client.get(reverse("admin:login"))
    assert response.status_code == 200
    assert directives(response["Content-Security-Policy"]) == POLICY


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "admin:index",
        "admin:cases_case_changelist",
        "admin:reviews_reviewqueueitem_changelist",
        "admin:cases_policy_publish",
    ],
)
def test_every_admin_page_carries_the_strict_policy(admin_client, url):
    response = admin_client.get(reverse(url))
    assert response.status_code == 200
    assert directives(response["Content-Security-Policy"]) == POLICY
    assert "Content-Security-Policy-Report-Only" not in response


@pytest.mark.django_db
def test_the_api_docs_alone_add_data_images(admin_client):
    response = admin_client.get("/api/docs")
    assert response.status_code == 200
    assert directives(response["Content-Security-Policy"]) == {**POLICY, "img-src": ["'self'", "data:"]}
    # The JSON API answers under the plain policy.
    assert directives(admin_client.get("/api/openapi.json")["Content-Security-Policy"]) == POLICY


def test_no_inline_script_style_or_handler_in_our_templates():
    """The policy allows scripts and styles from files only: a template that brings its own
    <style>, style="...", inline <script> or on...= handler would be blocked in the browser."""
    inline = re.compile(
        r"<style\b|\sstyle\s*=|\son[a-z]+\s*=|javascript:|<script\b(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")",
        re.I,
    )
    found = [
        f"{path.relative_to(ROOT)}:{text[: match.start()].count(chr(10)) + 1}: {match.group(0).strip()}"
        for path in sorted((ROOT / "templates").rglob("*.html"))
        for text in [path.read_text(encoding="utf-8")]
        for match in inline.finditer(text)
    ]
    assert not found, "inline script or style in templates:\n" + "\n".join(found)


def test_report_only_and_report_uri_come_from_the_environment():
    code = (
        "import json, django; django.setup(); from django.test import Client; "
        "r = Client().get('/admin/login/', HTTP_HOST='localhost'); "
        "print(json.dumps({k: v for k, v in r.headers.items() if 'security-policy' in k.lower()}))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECISIONFLOW_CSP_")}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "decisionflow.settings",
            "DEBUG": "1",
            "DECISIONFLOW_CSP_REPORT_ONLY": "1",
            "DECISIONFLOW_CSP_REPORT_URI": "/csp-reports",
        }
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    headers = json.loads(result.stdout.strip().splitlines()[-1])
    assert list(headers) == ["Content-Security-Policy-Report-Only"]
    assert directives(headers["Content-Security-Policy-Report-Only"]) == {**POLICY, "report-uri": ["/csp-reports"]}
