"""Importing cases from the pipeline's JSON format (see docs/CASE_FORMAT.md)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, NoReturn

from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.db.backends.base.operations import BaseDatabaseOperations

from cases.models import (
    APPROVALS_REQUIRED,
    ASSIGNEE_ONLY,
    GROUP_SEPARATOR,
    MOST_APPROVALS,
    REVIEWER_GROUPS,
    Case,
    Finding,
    Policy,
    SelectedPassage,
    Source,
    SourceVersion,
    reviewer_groups,
    reviewer_groups_value,
)
from cases.selectors import current_policy
from core import identity, text
from core.errors import InvalidInput, NotFound
from core.locks import policy_lock
from core.text import shown as text_shown

_REQUIRED = {
    "": [
        "case_id",
        "subject",
        "customer_message",
        "action",
        "sources",
        "selected_evidence",
        "findings",
        "policy",
        "draft",
    ],
    "sources[]": ["source_id", "title", "versions"],
    "versions[]": ["version", "text"],
    "selected_evidence[]": ["source_id", "version", "quotation"],
    "findings[]": ["finding", "licensed_clause", "source_id", "version"],
    "policy": ["name", "label", "parameters"],
}


@dataclass(frozen=True)
class ImportResult:
    case: Case
    created: bool


def _fail(field: str, problem: str) -> NoReturn:
    # Every channel (the admin, the API, load_case, publish_policy) shows this message as it
    # is, so the message itself says that the refusal wrote nothing, as core/text.py's do.
    raise InvalidInput(f"{field}: {problem}; nothing was written", field=field)


def _limit(model, name: str) -> int | None:
    """The schema's own limit for a column, so that the check and the table never disagree."""
    return model._meta.get_field(name).max_length


# PositiveIntegerField's range where it is narrowest (PostgreSQL's integer); SQLite would
# store more, so the check is the same on every database.
VERSION_RANGE = BaseDatabaseOperations.integer_field_ranges["PositiveIntegerField"]

# One-line fields and their schema limits: (model, column) for each key of the file.
_ONE_LINE = {
    "subject": (Case, "subject"),
    "action": (Case, "action"),
    "source_id": (Source, "source_id"),
    "title": (Source, "title"),
    "name": (Policy, "name"),
    "label": (Policy, "label"),
    "group": (Group, "name"),
}


def _check_text(value: Any, field: str, column: str | None = None) -> str:
    """The text policy (core/text.py); for a one-line column, one line within its limit."""
    if column is None:
        return text.check_text(value, field=field)
    model, name = _ONE_LINE[column]
    return text.check_text(value, field=field, one_line=True, max_length=_limit(model, name))


def _check_everywhere(value: Any, field: str) -> None:
    """Every string anywhere in the file, keys included, must pass the text policy."""
    if isinstance(value, str):
        _check_text(value, field or "file")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_everywhere(item, f"{field}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, f"{field} key" if field else "key")
            # The key was just checked: it cannot forge anything in the path shown.
            _check_everywhere(item, f"{field}.{text.shown(key)}" if field else text.shown(key))


def _check_keys(obj: Any, kind: str, field: str) -> None:
    if not isinstance(obj, dict):
        _fail(field or "file", "must be a JSON object")
    for key in _REQUIRED[kind]:
        if key not in obj:
            _fail(f"{field}.{key}" if field else key, "is required but missing")


def _check_version(value: Any, field: str) -> int:
    return text.check_integer(value, field=field, minimum=VERSION_RANGE[0], maximum=VERSION_RANGE[1])


# The most items a case file may list: what a public intake bounds (docs/CASE_FORMAT.md),
# so one request cannot make a case whose review page and proposal grow without end.
MOST_SOURCES = 20
MOST_VERSIONS = 20  # per source
MOST_PASSAGES = 50
MOST_FINDINGS = 50
MOST_PARAMETERS = 50  # of a policy, and named in depends_on


def _check_list(value: Any, field: str, most: int) -> list:
    if not isinstance(value, list):
        _fail(field, "must be a list")
    if len(value) > most:
        _fail(field, f"lists {len(value)} items; at most {most} are allowed")
    return value


def parse_case_file(raw: bytes) -> dict:
    """Decode and validate a case file; returns the data or raises ``InvalidInput``."""
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"file: not valid UTF-8 (byte {exc.start}); nothing was written") from None
    try:
        data = json.loads(decoded)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"file: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); nothing was written"
        ) from None
    except (ValueError, RecursionError) as exc:
        # A number too long to convert, or nesting deeper than the parser's recursion.
        raise InvalidInput(
            f"file: not valid JSON ({type(exc).__name__}: {str(exc)[:200]}); nothing was written"
        ) from None
    validate_case_data(data)
    return data


def validate_case_data(data: Any) -> None:
    """Structural and referential checks. Nothing here touches the database."""
    _check_keys(data, "", "")
    _check_everywhere(data, "")
    text.check_case_id(data["case_id"])
    _check_text(data["subject"], "subject", "subject")
    _check_text(data["action"], "action", "action")
    _check_text(data["customer_message"], "customer_message")
    text.check_body(data["draft"], field="draft")

    texts: dict[tuple[str, int], str] = {}
    for i, source in enumerate(_check_list(data["sources"], "sources", MOST_SOURCES)):
        field = f"sources[{i}]"
        _check_keys(source, "sources[]", field)
        _check_text(source["source_id"], f"{field}.source_id", "source_id")
        _check_text(source["title"], f"{field}.title", "title")
        for j, version in enumerate(_check_list(source["versions"], f"{field}.versions", MOST_VERSIONS)):
            vfield = f"{field}.versions[{j}]"
            _check_keys(version, "versions[]", vfield)
            number = _check_version(version["version"], f"{vfield}.version")
            key = (source["source_id"], number)
            if key in texts:
                _fail(f"{vfield}.version", f"{key[0]} version {number} is listed twice")
            texts[key] = _check_text(version["text"], f"{vfield}.text")

    _check_evidence(data["selected_evidence"], data["findings"], texts, "does not exist in sources")
    validate_policy_data(data["policy"], "policy")
    if "depends_on" in data:
        _check_depends_on(data["depends_on"])


def _check_evidence(passages: Any, findings: Any, texts: dict[tuple[str, int], str], missing: str) -> None:
    """The selected evidence and the findings: each quotation and licensed clause in the text
    of the source version it cites (``texts``), each finding citing selected evidence.
    ``missing``: how a cited version that ``texts`` lacks is refused."""
    selected: set[tuple[str, int]] = set()
    for i, passage in enumerate(_check_list(passages, "selected_evidence", MOST_PASSAGES)):
        field = f"selected_evidence[{i}]"
        _check_keys(passage, "selected_evidence[]", field)
        key = (
            _check_text(passage["source_id"], f"{field}.source_id", "source_id"),
            _check_version(passage["version"], f"{field}.version"),
        )
        if key not in texts:
            _fail(f"{field}.version", f"{key[0]} version {key[1]} {missing}")
        if key in selected:
            _fail(f"{field}.version", f"{key[0]} version {key[1]} is selected twice")
        selected.add(key)
        quotation = _check_text(passage["quotation"], f"{field}.quotation")
        if not quotation or quotation not in texts[key]:
            _fail(f"{field}.quotation", f"is not in the text of {key[0]} version {key[1]}")

    for i, finding in enumerate(_check_list(findings, "findings", MOST_FINDINGS)):
        field = f"findings[{i}]"
        _check_keys(finding, "findings[]", field)
        _check_text(finding["finding"], f"{field}.finding")
        key = (
            _check_text(finding["source_id"], f"{field}.source_id", "source_id"),
            _check_version(finding["version"], f"{field}.version"),
        )
        if key not in selected:
            _fail(f"{field}.source_id", f"cites {key[0]} version {key[1]}, which is not among the selected evidence")
        clause = _check_text(finding["licensed_clause"], f"{field}.licensed_clause")
        if not clause or clause not in texts[key]:
            _fail(f"{field}.licensed_clause", f"is not in the text of {key[0]} version {key[1]}")


def evidence_check(*, selected_evidence: Any, findings: Any) -> tuple[list[dict], list[dict]]:
    """Selected evidence and findings sent without their sources (a re-draft): the case
    file's rules, against the source versions stored here. Returns both cut to their keys.

    Source versions are immutable, so the texts read now are the texts a proposal cites.
    """
    _check_everywhere({"selected_evidence": selected_evidence, "findings": findings}, "")
    items = [
        item
        for group in (selected_evidence, findings)
        if isinstance(group, list)
        for item in group
        if isinstance(item, dict)
    ]
    # Only well-typed references are looked up; the checks below refuse the others by name.
    cited = {
        (item["source_id"], item["version"])
        for item in items
        if isinstance(item.get("source_id"), str) and type(item.get("version")) is int
    }
    names = {source_id for source_id, _ in cited}
    texts = {
        (source_id, version): body
        for source_id, version, body in SourceVersion.objects.filter(source__source_id__in=names).values_list(
            "source__source_id", "version", "text"
        )
        if (source_id, version) in cited
    }
    _check_evidence(selected_evidence, findings, texts, "does not exist")
    return (
        [{k: p[k] for k in _REQUIRED["selected_evidence[]"]} for p in selected_evidence],
        [{k: f[k] for k in _REQUIRED["findings[]"]} for f in findings],
    )


def validate_policy_data(policy: Any, field: str = "policy") -> None:
    """A policy version: ``{"name", "label", "parameters"}`` with typed parameter values."""
    _check_keys(policy, "policy", field)
    _check_everywhere(policy, field)
    unknown = sorted(set(policy) - set(_REQUIRED["policy"]))
    if field != "policy" and unknown:
        _fail(f"{field}.{text.shown(unknown[0])}", "is not a field of a policy (name, label, parameters)")
    _check_text(policy["name"], f"{field}.name", "name")
    _check_text(policy["label"], f"{field}.label", "label")
    if not isinstance(policy["parameters"], dict):
        _fail(f"{field}.parameters", "must be an object")
    if len(policy["parameters"]) > MOST_PARAMETERS:
        _fail(
            f"{field}.parameters", f"has {len(policy['parameters'])} parameters; at most {MOST_PARAMETERS} are allowed"
        )
    for key, value in policy["parameters"].items():
        text.check_text(key, field=f"{field}.parameters key", one_line=True)
        try:
            identity.typed_value(value)
        except TypeError as exc:
            _fail(f"{field}.parameters.{key}", str(exc))
    if REVIEWER_GROUPS in policy["parameters"]:
        _check_reviewer_groups(policy["parameters"][REVIEWER_GROUPS], f"{field}.parameters.{REVIEWER_GROUPS}")
    if APPROVALS_REQUIRED in policy["parameters"]:
        _check_approvals_required(policy["parameters"][APPROVALS_REQUIRED], f"{field}.parameters.{APPROVALS_REQUIRED}")
    if ASSIGNEE_ONLY in policy["parameters"] and policy["parameters"][ASSIGNEE_ONLY] is not True:
        # One spelling for the default too: "assignee first" is said by leaving it out.
        _fail(
            f"{field}.parameters.{ASSIGNEE_ONLY}",
            f"must be true; a policy where others may decide too (assignee first) leaves {ASSIGNEE_ONLY} out",
        )


def _check_reviewer_groups(value: Any, field: str) -> None:
    """One canonical spelling per set of groups, so that two policies naming the same groups
    have one identity: the names sorted, each once, joined by commas with no space around
    them. No groups at all is said by leaving the parameter out (the identity of today)."""
    if not isinstance(value, str):
        _fail(field, "must be a string: the group names, sorted and joined by commas")
    if value == "":
        _fail(field, f"is empty; a policy every reviewer may decide leaves {REVIEWER_GROUPS} out")
    names = value.split(GROUP_SEPARATOR)
    for name in names:
        if name != name.strip() or not name:
            _fail(field, f"{text.shown(value)} has an empty name or a space around a comma")
        _check_text(name, field, "group")
    canonical = reviewer_groups_value(names)
    if canonical != value:
        _fail(field, f"must list each group once, sorted: {text.shown(canonical)}")


def _check_approvals_required(value: Any, field: str) -> None:
    """A whole number from 2 to ``MOST_APPROVALS``. One approver, the default, is said by
    leaving the parameter out, so that the default has one identity (today's)."""
    if type(value) is not int:
        _fail(field, "must be a whole number: how many distinct reviewers must approve")
    if value == 1:
        _fail(field, f"is 1; a policy one approval decides leaves {APPROVALS_REQUIRED} out")
    if not 2 <= value <= MOST_APPROVALS:
        _fail(field, f"is {value}; it must be from 2 to {MOST_APPROVALS}")


def reviewer_groups_exist_check(parameters: dict, field: str = "policy.parameters") -> None:
    """Every group a policy names exists, so that a published policy never names a group
    nobody can be in (a typo would leave its cases undecidable)."""
    wanted = reviewer_groups(parameters)
    if not wanted:
        return
    found = set(Group.objects.filter(name__in=wanted).values_list("name", flat=True))
    missing = [name for name in wanted if name not in found]
    if missing:
        _fail(
            f"{field}.{REVIEWER_GROUPS}",
            f"names no such group: {', '.join(text.shown(name) for name in missing)} (create it in the admin, "
            "under Authentication and Authorization, Groups, and add its members first)",
        )


def _check_depends_on(value: Any) -> None:
    """Optional: the policy parameters the findings depend on (docs/CASE_FORMAT.md)."""
    names = _check_list(value, "depends_on", MOST_PARAMETERS)
    for i, name in enumerate(names):
        if not isinstance(name, str):
            _fail(f"depends_on[{i}]", "must be a policy parameter name (a string)")
        text.check_text(name, field=f"depends_on[{i}]", one_line=True)
    if len(set(names)) != len(names):
        _fail("depends_on", "names a parameter twice")


def parse_policy_file(raw: bytes) -> dict:
    """Decode and validate a policy file (``publish_policy``); returns it or raises ``InvalidInput``."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"file: not valid UTF-8 (byte {exc.start}); nothing was written") from None
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"file: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); nothing was written"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(
            f"file: not valid JSON ({type(exc).__name__}: {str(exc)[:200]}); nothing was written"
        ) from None
    validate_policy_data(data, "file")
    return {"name": data["name"], "label": data["label"], "parameters": data["parameters"]}


def policy_version_get_or_create(*, data: dict) -> tuple[Policy, bool]:
    """The policy version for ``data`` (name, label, parameters): found, or created now."""
    validate_policy_data(data, "policy")
    return Policy.objects.get_or_create(
        policy_id=identity.policy_id(data["name"], data["parameters"]),
        label=data["label"],
        defaults={"name": data["name"], "parameters": data["parameters"]},
    )


def policy_current_check(policy: dict, field: str = "policy") -> None:
    """A case comes in under its policy's current version (the last published), or under
    any version while none is published. A superseded version is refused, naming the
    current one: the publish that superseded it has already moved every undecided case
    off it, and a case let in under it would be reviewed under rules no longer in force."""
    current = current_policy(policy["name"])
    if current is None or current.policy_id == identity.policy_id(policy["name"], policy["parameters"]):
        return
    _fail(
        field,
        f"{text.shown(policy['name'])} {text.shown(policy['label'])} is not the current version of "
        f"{text.shown(policy['name'])}: {text.shown(current.label)} was published at {text.when(current.published_at)} "
        f"and supersedes it; prepare the case under {text.shown(current.label)} ({current.policy_id})",
    )


def _import_digest(data: dict) -> str:
    canonical = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _existing(case: Case, digest: str) -> ImportResult:
    """An import of a case id that exists: a no-op for the same content, else refused."""
    if case.import_digest == digest:
        return ImportResult(case, False)
    raise InvalidInput(
        f"case {case.case_id} already exists with different content; "
        "a case is never changed by an import (edit its proposal in the admin instead)",
        field="case_id",
    )


def case_import(*, data: dict) -> ImportResult:
    """Import one case with its sources, evidence, findings and policy, all or nothing.

    Identical content again is a no-op. A file that would change an existing case, or an
    existing source version's text, is refused and nothing is written.
    """
    validate_case_data(data)
    data = dict(data, draft=identity.normalize_newlines(data["draft"]))
    digest = _import_digest(data)
    # Under the policy's shared lock: a publish switches the cases of a policy while no import
    # into it is running, so an import is either switched with the rest or checked after it.
    with policy_lock(data["policy"]["name"], shared=True):
        existing = Case.objects.filter(case_id=data["case_id"]).first()
        if existing is not None:
            return _existing(existing, digest)

        versions: dict[tuple[str, int], SourceVersion] = {}
        for src in data["sources"]:
            source, created = Source.objects.get_or_create(source_id=src["source_id"], defaults={"title": src["title"]})
            if not created and source.title != src["title"]:
                raise InvalidInput(f"sources: {src['source_id']} already exists with another title", field="sources")
            for ver in src["versions"]:
                sv, created = SourceVersion.objects.get_or_create(
                    source=source, version=ver["version"], defaults={"text": ver["text"]}
                )
                if not created and sv.text != ver["text"]:
                    raise InvalidInput(
                        f"sources: {src['source_id']} version {ver['version']} already exists with "
                        "different text; source versions are immutable, add a new version instead",
                        field="sources",
                    )
                versions[(src["source_id"], ver["version"])] = sv

        pol = data["policy"]
        policy_current_check(pol)
        policy, _ = Policy.objects.get_or_create(
            policy_id=identity.policy_id(pol["name"], pol["parameters"]),
            label=pol["label"],
            defaults={"name": pol["name"], "parameters": pol["parameters"]},
        )
        try:
            with transaction.atomic():
                case = Case.objects.create(
                    case_id=data["case_id"],
                    subject=data["subject"],
                    customer_message=data["customer_message"],
                    action=data["action"],
                    policy=policy,
                    draft=data["draft"],
                    depends_on=data.get("depends_on"),
                    import_digest=digest,
                )
        except IntegrityError:
            # The same case id, imported concurrently: the same content is that import's
            # no-op, other content the same refusal as when it came first.
            existing = Case.objects.filter(case_id=data["case_id"]).first()
            if existing is None:
                raise
            return _existing(existing, digest)
        SelectedPassage.objects.bulk_create(
            SelectedPassage(
                case=case,
                source_version=versions[(p["source_id"], p["version"])],
                quotation=p["quotation"],
                position=i,
            )
            for i, p in enumerate(data["selected_evidence"])
        )
        Finding.objects.bulk_create(
            Finding(
                case=case,
                finding=f["finding"],
                licensed_clause=f["licensed_clause"],
                source_version=versions[(f["source_id"], f["version"])],
                position=i,
            )
            for i, f in enumerate(data["findings"])
        )
    return ImportResult(case, True)


@dataclass(frozen=True)
class NewSourceVersion:
    """A version of an existing source, checked and not yet written (``source_version_check``)."""

    source: Source
    version: int
    text: str
    existing: SourceVersion | None  # this number with this very text is there already

    def unsaved(self) -> SourceVersion:
        """The version as it will be, for the checks a dry run makes against its text."""
        return self.existing or SourceVersion(source=self.source, version=self.version, text=self.text)


def source_version_check(*, source_id: Any, version: Any, text: Any) -> NewSourceVersion:
    """A new version of an existing source, checked as a case file's source versions are
    (the text policy, the version range, at most ``MOST_VERSIONS`` per source). The same
    number with the same text is the version already there (``existing``); with other text
    it is refused (``field: version``): versions are immutable. Reads only."""
    _check_text(source_id, "source_id", "source_id")
    number = _check_version(version, "version")
    body = _check_text(text, "text")
    source = Source.objects.filter(source_id=source_id).first()
    if source is None:
        raise NotFound(f"no source {text_shown(source_id)}: a version is added to an existing source")
    existing = SourceVersion.objects.filter(source=source, version=number).first()
    if existing is not None and existing.text != body:
        _fail("version", f"{source_id} version {number} already exists with different text; add a new version instead")
    if existing is None and source.versions.count() >= MOST_VERSIONS:
        _fail("version", f"{source_id} has {MOST_VERSIONS} versions already; at most {MOST_VERSIONS} are allowed")
    return NewSourceVersion(source, number, body, existing)


def source_version_create(*, new: NewSourceVersion) -> tuple[SourceVersion, bool]:
    """Write the version ``source_version_check`` passed, or find it; whether it is new.
    The unique key on (source, version) decides between two concurrent adds: the loser finds
    the winner's row, and is refused as above if its text is another."""
    try:
        with transaction.atomic():
            sv, created = SourceVersion.objects.get_or_create(
                source=new.source, version=new.version, defaults={"text": new.text}
            )
    except IntegrityError:
        sv, created = SourceVersion.objects.get(source=new.source, version=new.version), False
    if not created and sv.text != new.text:
        _fail("version", f"{new.source.source_id} version {new.version} already exists with different text")
    return sv, created


PUBLISH_POLICY_PERMISSION = "cases.publish_policy"


def can_publish(user) -> bool:
    """Whether ``user`` may publish a policy version (support leads; reviewers may not)."""
    return bool(getattr(user, "is_active", False) and user.has_perm(PUBLISH_POLICY_PERMISSION))
