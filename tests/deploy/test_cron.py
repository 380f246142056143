"""deploy/decisionflow.cron runs every command the docs say runs from cron, with their flags.

The claims are read from the docs' own text (docs/*.md): each "from cron" names a command
next to it, in a code span of its sentence or in the code block its sentence introduces
("Run it from cron:"). The commands' help texts that start their cron advice with "Run from
cron" are claims too. A new claim without its cron line fails here, and so does a cron line
naming a command or an option that does not exist.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class

ROOT = Path(__file__).resolve().parents[2]
CRON = ROOT / "deploy" / "decisionflow.cron"
DOCS = ROOT / "docs"
DEPLOY = DOCS / "DEPLOY.md"
CLAIM = re.compile(r"from cron", re.IGNORECASE)
# Where a command's own argument list ends in a cron line: the shell takes over.
SHELL_WORDS = {">", ">>", "2>&1", "|", "&&", ";", "||"}
SENTENCE_END = re.compile(r"[.!?](?:\s|$)")


@dataclass(frozen=True)
class Invocation:
    command: str
    flags: frozenset[str]
    args: tuple[str, ...]


def invocation(text: str) -> Invocation | None:
    """The manage.py command a piece of shell or a code span names, or None if it names none.

    ``manage.py reconcile --all`` and ``reconcile --all`` both name reconcile; the flags are
    the ``--options`` (without ``=value``), the args everything up to the shell's own words.
    """
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    if "manage.py" in words:
        words = words[words.index("manage.py") + 1 :]
    if not words or words[0] not in get_commands():
        return None
    args = []
    for word in words[1:]:
        if word in SHELL_WORDS or word.startswith((">", "2>")):
            break
        args.append(word)
    flags = frozenset(word.split("=", 1)[0] for word in args if word.startswith("--"))
    return Invocation(words[0], flags, tuple(args))


def cron_jobs() -> list[tuple[str, Invocation]]:
    """Each job line of the cron file (five time fields, the user, the shell) and its command."""
    jobs = []
    for line in CRON.read_text().splitlines():
        if not line.strip() or line.startswith("#") or re.match(r"^[A-Z_]+=", line):
            continue
        fields = line.split(None, 6)
        assert len(fields) == 7, f"not a cron.d job line (five time fields, a user, a command): {line}"
        found = invocation(fields[6])
        assert found is not None, f"a cron line that runs no manage.py command: {line}"
        jobs.append((line, found))
    return jobs


def blocks(markdown: str) -> list[tuple[str, str]]:
    """The doc as ("code", text) fenced blocks and ("text", text) paragraphs (lines joined),
    a table row or a list item being a paragraph of its own."""
    found: list[tuple[str, str]] = []
    lines = markdown.splitlines()
    index, paragraph = 0, []

    def close():
        if paragraph:
            found.append(("text", " ".join(part.strip() for part in paragraph)))
            paragraph.clear()

    while index < len(lines):
        line = lines[index]
        if line.startswith("```"):
            close()
            end = index + 1
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            found.append(("code", "\n".join(lines[index + 1 : end])))
            index = end + 1
            continue
        if not line.strip():
            close()
        elif line.startswith(("|", "- ", "* ", "#")) or re.match(r"^\d+\. ", line):
            close()
            paragraph.append(line)
            if line.startswith(("|", "#")):
                close()
        else:
            paragraph.append(line)
        index += 1
    close()
    return found


def _spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def doc_claims() -> list[tuple[str, Invocation]]:
    """Every (where, command) that docs/*.md says is run from cron."""
    claims = []
    for path in sorted(DOCS.glob("*.md")):
        parts = blocks(path.read_text(encoding="utf-8"))
        for number, (kind, text) in enumerate(parts):
            if kind != "text":
                continue
            for match in CLAIM.finditer(text):
                where = f"{path.name}: …{text[max(0, match.start() - 60) : match.end() + 40]}…"
                before, after = text[: match.start()], text[match.end() :]
                # The rest of the sentence: "from cron: `…`" or "from cron, nightly:" + a block.
                rest = after[: m.start()] if (m := SENTENCE_END.search(after)) else after
                named: list[Invocation] = []
                if ":" in rest:
                    following = rest.split(":", 1)[1]
                    if following.strip():
                        named = [i for span in _spans(following)[:1] if (i := invocation(span))]
                    elif number + 1 < len(parts) and parts[number + 1][0] == "code":
                        lines = parts[number + 1][1].splitlines()
                        named = [i for line in lines if "manage.py" in line and (i := invocation(line))]
                else:
                    # "`reconcile --repair` (run from cron) …": the spans earlier in its sentence.
                    starts = [m.end() for m in SENTENCE_END.finditer(before)]
                    sentence = before[starts[-1] :] if starts else before
                    named = [i for span in _spans(sentence) if (i := invocation(span))]
                assert named, f"{where}: says 'from cron' but names no manage.py command the test can read"
                claims += [(where, i) for i in named]
    return claims


def help_claims() -> list[tuple[str, Invocation]]:
    """Our commands whose help says "Run from cron", with the example line it gives, if any."""
    claims = []
    for name, app in sorted(get_commands().items()):
        if app.startswith("django"):
            continue
        text = str(load_command_class(app, name).help)
        if "run from cron" not in text.lower():
            continue
        examples = [i for span in _spans(text) if "manage.py" in span and (i := invocation(span))]
        claims += [(f"manage.py {name} --help", i) for i in examples if i.command == name]
        if not examples:
            claims.append((f"manage.py {name} --help", Invocation(name, frozenset(), ())))
    return claims


def test_the_claims_are_read_from_the_docs():
    """The reader finds the claims the docs make today (so a reader that finds none fails)."""
    found = {(claim.command, claim.flags) for _, claim in doc_claims()}
    assert ("reconcile", frozenset({"--repair"})) in found  # DELIVERY.md, the Unknown row
    assert ("sla_report", frozenset({"--expire", "--json"})) in found  # COMMANDS.md
    assert ("notify_sweep", frozenset()) in found  # DEPLOY.md's block
    assert {command for command, _ in found} >= {"reconcile", "sla_report", "notify_sweep", "prune_checkpoints"}


@pytest.mark.parametrize("source", ["docs", "help"])
def test_the_cron_file_runs_every_command_said_to_run_from_cron(source):
    claims = doc_claims() if source == "docs" else help_claims()
    assert claims
    jobs = [job for _, job in cron_jobs()]
    for where, claim in claims:
        lines = [job for job in jobs if job.command == claim.command]
        assert lines, f"{where}: {claim.command} is said to run from cron; deploy/decisionflow.cron has no line"
        assert any(claim.flags <= job.flags for job in lines), (
            f"{where}: {claim.command} {' '.join(sorted(claim.flags))} is said to run from cron; "
            f"the cron file runs it with {[' '.join(sorted(job.flags)) for job in lines]}"
        )


def test_every_cron_line_names_a_command_and_options_that_exist():
    for line, job in cron_jobs():
        command = load_command_class(get_commands()[job.command], job.command)
        parser = command.create_parser("manage.py", job.command)
        # The command's own parser: an unknown option or a bad value is a usage error here.
        parser.parse_args(list(job.args))
        assert ". /etc/decisionflow/env" in line, f"a cron line without the settings: {line}"


def test_deploy_md_shows_the_cron_file_as_it_is():
    shown = [text for kind, text in blocks(DEPLOY.read_text()) if kind == "code" and "manage.py reconcile" in text]
    assert len(shown) == 1, "DEPLOY.md shows the cron lines in one block"
    assert shown[0].splitlines() == [line for line, _ in cron_jobs()]


def test_deploy_md_documents_every_exit_bit_of_reconcile():
    """Each exit code reconcile's code can set has its row in DEPLOY.md's cron table."""
    from core.commandline import EXIT_BUSY
    from effects.management.commands import reconcile

    bits = {value for name, value in vars(reconcile).items() if name.startswith("EXIT_")} | {EXIT_BUSY}
    assert {1, 16, 32, 64, 128} <= bits
    rows = [text for kind, text in blocks(DEPLOY.read_text()) if kind == "text" and text.startswith("|")]
    # The exit table's first row for reconcile: its second cell is a code.
    start = next(
        i for i, row in enumerate(rows) if row.startswith("| `reconcile --all") and row.split("|")[2].strip() == "0"
    )
    documented = set()
    for row in rows[start:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if cells[0] and not cells[0].startswith("`reconcile"):
            break  # the next command's rows
        documented |= {int(code) for code in re.findall(r"\d+", cells[1])}
    assert bits <= documented, f"DEPLOY.md's cron table lacks reconcile's exit code(s) {sorted(bits - documented)}"
