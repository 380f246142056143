"""Every pointer to a project file, in the docs and in each command's help, is to a file the
project has: a reader sent to a missing file is left with nothing."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class

ROOT = Path(__file__).resolve().parents[2]
# A project path in prose: docs/X.md, README.md, CONTRIBUTING.md, DESIGN.md, …
MENTIONED = re.compile(r"(?<![\w/.-])((?:docs/)?[A-Z][A-Z_]+\.md)\b")
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+\.(?:md|png))(?:#[^)]*)?\)")


def _docs():
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def _exists(name: str, relative_to: Path) -> bool:
    return (relative_to / name).exists() or (ROOT / name).exists() or (ROOT / "docs" / name).exists()


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: p.name)
def test_the_docs_point_only_to_files_that_exist(doc):
    text = doc.read_text()
    missing = [name for name in MENTIONED.findall(text) + MARKDOWN_LINK.findall(text) if "://" not in name]
    missing = [name for name in missing if not _exists(name, doc.parent)]
    assert missing == [], f"{doc.name} points to files the project does not have: {missing}"


def test_every_command_help_points_only_to_files_that_exist():
    ours = {name: app for name, app in get_commands().items() if not app.startswith("django.")}
    assert {"begin", "resume", "edit", "reconcile", "demo", "load_demo"} <= set(ours)
    for name, app in ours.items():
        command = load_command_class(app, name)
        out = io.StringIO()
        command.create_parser("manage.py", name).print_help(out)
        missing = [f for f in MENTIONED.findall(out.getvalue()) if not _exists(f, ROOT)]
        assert missing == [], f"`{name} --help` points to {missing}"
