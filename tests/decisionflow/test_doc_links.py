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


ANCHORED_LINK = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")


def _anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (lower case, punctuation
    dropped, spaces as hyphens, -1, -2 … for repeats); fenced code is not a heading."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if fenced or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: p.name)
def test_the_docs_link_only_to_sections_that_exist(doc):
    """A section moved to another page (the README's settings, roles, upgrade notes) leaves no
    link behind that opens the right page at the wrong place."""
    broken = []
    for target, anchor in ANCHORED_LINK.findall(doc.read_text()):
        path = (doc.parent / target) if target else doc
        if "://" in target or path.suffix != ".md" or not path.exists():
            continue  # another site, or a missing file (the test above names it)
        if anchor not in _anchors(path):
            broken.append(f"{target}#{anchor}")
    assert broken == [], f"{doc.name} links to sections that do not exist: {broken}"


def test_every_command_help_points_only_to_files_that_exist():
    ours = {name: app for name, app in get_commands().items() if not app.startswith("django.")}
    assert {"begin", "resume", "edit", "reconcile", "demo", "load_demo"} <= set(ours)
    for name, app in ours.items():
        command = load_command_class(app, name)
        out = io.StringIO()
        command.create_parser("manage.py", name).print_help(out)
        missing = [f for f in MENTIONED.findall(out.getvalue()) if not _exists(f, ROOT)]
        assert missing == [], f"`{name} --help` points to {missing}"
