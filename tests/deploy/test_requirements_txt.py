"""The top-level requirements.txt only points at the locked runtime set in requirements/, so
`pip install -r requirements.txt` (a buildpack, a scanner) checks hashes as `make run` does,
and the file cannot grow into a second list of packages without hashes."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _lines() -> list[str]:
    text = (ROOT / "requirements.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_requirements_txt_installs_the_runtime_lock():
    assert "-r requirements/runtime.txt" in _lines()


def test_every_line_of_requirements_txt_includes_a_hashed_lock_in_requirements():
    for line in _lines():
        option, _, target = line.partition(" ")
        assert option == "-r", f"requirements.txt: {line!r} is not a -r include; packages go in requirements/*.in"
        lock = ROOT / target.strip()
        assert lock.parent == ROOT / "requirements" and lock.suffix == ".txt", f"{line!r}: not a lock in requirements/"
        assert "--hash=sha256:" in lock.read_text(encoding="utf-8"), f"{lock.name} is not locked with hashes"
