"""docs/CONFIGURATION.md lists every environment variable decisionflow/settings.py reads, and
nothing it does not: a setting missing from the page is one nobody finds, a row for a setting
that is gone sends a reader after nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READ_ELSEWHERE = "## Read elsewhere"


def _read_by_settings() -> set[str]:
    """The names passed to env.<cast>("NAME", ...) in decisionflow/settings.py."""
    tree = ast.parse((ROOT / "decisionflow" / "settings.py").read_text(encoding="utf-8"))
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "env"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    }


def _documented(text: str) -> set[str]:
    """The `NAME`s in the first column of the page's tables."""
    names = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([A-Z][A-Z0-9_]*)`", line.split("|")[1]))
    return names


def test_every_variable_settings_reads_is_in_the_configuration_page():
    text = (ROOT / "docs" / "CONFIGURATION.md").read_text(encoding="utf-8")
    settings_part = text.split(READ_ELSEWHERE, 1)[0]
    read = _read_by_settings()
    assert {"DATABASE_URL", "SECRET_KEY", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"} <= read
    assert sorted(read - _documented(settings_part)) == [], "docs/CONFIGURATION.md misses these settings"
    assert sorted(_documented(settings_part) - read) == [], "docs/CONFIGURATION.md lists settings that are not read"
