"""One vocabulary per concept: every copy of an enum's values says exactly the enum's values.

Each test takes one enum (core/outcomes.py, reviews/models.py) and reads every place that
lists its values: the model's choices and migrations, the API's OpenAPI document, the metric
labels, the admin's filters, the picture's words, the commands' help, and the docs' tables.
A value added, removed or renamed in the enum fails here until each copy says the same. Our
code names a state or a receipt status by its enum member, never by a string of its own.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tomllib
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from core import errors, observability
from core.outcomes import DECIDED, RETURNED, DecisionOutcome, Failure, OperationState, ReceiptStatus, error_outcome
from effects.models import CommitAttempt
from effects.services import CommitResult, operation_state
from reviews.models import HUMAN_DECLINE_REASONS, Channel, DeclineReason, PendingReview

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _doc(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _ticked(text: str) -> list[str]:
    """The `code` spans of a piece of Markdown, in order."""
    return re.findall(r"`([^`]+)`", text)


def _line(doc: str, starting: str) -> str:
    """The one line of ``doc`` that starts with ``starting``."""
    found = [line for line in _doc(doc).splitlines() if line.startswith(starting)]
    assert len(found) == 1, f"{doc}: {len(found)} lines start with {starting!r}"
    return found[0]


def _table(doc: str, header: str, after: str = "") -> list[str]:
    """The first column of the Markdown table under ``header`` (after the line ``after``)."""
    text = _doc(doc)
    text = text[text.index(after) :] if after else text
    lines = text[text.index(header) :].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1].strip())
    return rows


def _listed(text: str, label: str) -> list[str]:
    """The `code` spans of the parenthesis that follows ``label`` in ``text``."""
    found = re.search(re.escape(label) + r"\s*\(([^)]*)\)", text)
    assert found, f"no list after {label!r}"
    return _ticked(found.group(1))


@pytest.fixture
def openapi(client, db) -> dict:
    return client.get("/api/openapi.json").json()["components"]["schemas"]


def _enum(schema: dict, model: str, field: str) -> list[str]:
    """A schema field's allowed values, whether the field may also be null or not."""
    prop = schema[model]["properties"][field]
    for choice in [prop, *prop.get("anyOf", [])]:
        if "enum" in choice:
            return choice["enum"]
    raise AssertionError(f"{model}.{field} lists no values: {prop}")


# --- the decision's outcome --------------------------------------------------------------


def test_the_attempt_row_stores_the_outcome_enum_and_its_migrations_agree(db):
    assert CommitAttempt.Outcome is DecisionOutcome
    assert CommitAttempt._meta.get_field("outcome").choices == DecisionOutcome.choices
    # The migrations hold the same choices: no enum change goes unmigrated.
    call_command("makemigrations", "effects", "reviews", "--check", "--dry-run", stdout=io.StringIO())


def test_the_service_returns_the_decided_outcomes_and_the_api_lists_them(openapi):
    assert _enum(openapi, "DecisionOut", "outcome") == [outcome.value for outcome in RETURNED]
    assert set(DECIDED) < set(RETURNED) < set(DecisionOutcome)
    # docs/API.md says what each returned outcome means.
    paragraph = _doc("API.md").split("`outcome` is what this request did", 1)[1].split("\n- ", 1)[0]
    assert _ticked(paragraph) == [outcome.value for outcome in RETURNED]


def test_the_metric_labels_are_the_outcomes_and_the_docs_list_them():
    counted = [outcome.value for outcome in DecisionOutcome if outcome != DecisionOutcome.FAILED]
    assert sorted(observability.OUTCOMES) == sorted([*counted, *Failure.values])
    assert len(set(observability.OUTCOMES)) == len(observability.OUTCOMES)
    # Every refusal class is counted under one of them.
    for refusal in errors.REFUSALS:
        assert error_outcome(refusal("x")) in observability.OUTCOMES, refusal
    assert error_outcome(RuntimeError("a bug")) == Failure.ERROR
    metric = _line("DEPLOY.md", "| `decisionflow_decisions_total` |")
    assert _ticked(metric)[3:] == list(observability.OUTCOMES)
    event = _line("DEPLOY.md", "| `outcome` | as the metric:")
    assert _ticked(event)[1:] == list(observability.OUTCOMES)


def test_the_admin_filters_and_colours_every_outcome(admin_client):
    from workplace.effects import REFUSED_OUTCOMES

    page = admin_client.get(reverse("admin:effects_commitattempt_changelist")).content.decode()
    for outcome in DecisionOutcome:
        assert f"?outcome__exact={outcome.value}" in page and outcome.label in page, outcome
    # Every outcome is either one the decision took effect in (a tick) or not (red).
    assert REFUSED_OUTCOMES | set(RETURNED) == set(DecisionOutcome)
    assert not REFUSED_OUTCOMES & set(RETURNED)


def test_the_picture_says_the_outcomes_words():
    from workplace.picture import OUTCOME_NODES, Standing

    assert (Standing.COMMITTED.value, Standing.COMMITTED.label) == (
        DecisionOutcome.COMMITTED.value,
        DecisionOutcome.COMMITTED.label,
    )
    assert (Standing.DECLINED.value, Standing.DECLINED.label) == (
        DecisionOutcome.DECLINED.value,
        DecisionOutcome.DECLINED.label,
    )
    assert Standing.UNCERTAIN.label == Failure.UNCERTAIN.label
    for standing, (node, label) in OUTCOME_NODES.items():
        assert node == standing.value and label.startswith(standing.label)


def test_the_case_list_status_says_the_outcomes_words():
    from workflow.selectors import STATUS_LABELS

    for outcome in (DecisionOutcome.COMMITTED, DecisionOutcome.DECLINED):
        assert STATUS_LABELS[outcome.value] == outcome.label


# --- an operation's reconcile state ------------------------------------------------------


def test_reconcile_classifies_into_the_states():
    found = {
        operation_state(approved, effect, approvals)
        for approved in (None, True, False)
        for effect in (True, False)
        for approvals in (0, 1)
    }
    assert found == set(OperationState)
    assert list(observability.RECONCILE_STATES) == OperationState.values


def test_the_api_lists_the_states(openapi):
    assert _enum(openapi, "OperationOut", "state") == OperationState.values
    assert _enum(openapi, "CaseOut", "status") == ["NotStarted", *OperationState.values]


def test_the_reconcile_command_and_the_docs_list_the_states():
    from effects.management.commands.reconcile import Command as Reconcile

    assert f"state=<{'|'.join(OperationState.values)}>" in Reconcile.help
    ticked = [f"`{state.value}`" for state in OperationState]
    assert _table("COMMANDS.md", "| state | meaning |") == ticked
    assert _table("API.md", "| state | meaning |") == ticked
    assert _listed(_line("DEPLOY.md", "| `decisionflow_reconcile_last_operations` |"), "`state`") == (
        OperationState.values
    )
    assert _listed(_doc("ADMIN.md"), "read from the decision and effect tables\n ") == OperationState.values
    assert _listed(_doc("DELIVERY.md"), "beside each operation's local state\n ") == OperationState.values


def test_the_docs_list_the_label_values_the_metrics_start_at_zero_with():
    """DEPLOY.md's metric table lists each label's values: the ones /metrics shows at 0."""
    for metric in ("decisionflow_lock_wait_seconds", "decisionflow_busy_refusals_total"):
        assert _listed(_line("DEPLOY.md", f"| `{metric}` |"), "`lock`") == list(observability.LockName)
    runs = _line("DEPLOY.md", "| `decisionflow_reconcile_runs_total` |")
    assert _listed(runs, "`result`") == list(observability.ReconcileResult)
    assert _listed(_line("DEPLOY.md", "| `decisionflow_sla_reviews_total` |"), "`action`") == list(
        observability.SlaAction
    )
    codes = _line("DEPLOY.md", "| `decisionflow_decision_refusals_total` |")
    assert _ticked(codes)[2:] == list(observability.REFUSAL_CODES)
    channels = re.search(r"and for `channel`: ((?:`\w+`(?:, )?)+)\)", _doc("DEPLOY.md"))
    assert channels and _ticked(channels.group(1)) == Channel.values


# --- the receipt's status ----------------------------------------------------------------


def test_the_receipt_is_byte_for_byte_the_documented_one():
    receipt = CommitResult(ReceiptStatus.COMMITTED, False, 1, "op").receipt()
    assert json.dumps(receipt, separators=(",", ":")) == '{"Status":"Committed","Replay":false,"EffectCount":1}'
    assert ReceiptStatus.COMMITTED == OperationState.COMMITTED and ReceiptStatus.DECLINED == OperationState.DECLINED
    lines = _table("COMMANDS.md", "| situation | result line | exit |")
    assert len(lines) == 6
    table = _doc("COMMANDS.md").split("| situation | result line | exit |", 1)[1].split("\n\n", 1)[0]
    assert sorted(set(re.findall(r'"Status":"(\w+)"', table))) == sorted(ReceiptStatus.values)


def _our_modules():
    """Our packages' Python files (the import layers in pyproject.toml), but for the reference
    helpdesk (another company's system, with words of its own) and the migrations (the
    choices' frozen copy, which makemigrations --check compares above)."""
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    for package in packages["root_packages"]:
        if package != "helpdesk":
            yield from (path for path in sorted((ROOT / package).rglob("*.py")) if "migrations" not in path.parts)


def _choice_labels(tree: ast.AST) -> set[int]:
    """The label of each ``NAME = value, label`` in a class body (``id`` of its node): display
    text of another enum, such as the pending review's ``"pending", "Pending"``."""
    return {
        id(statement.value.elts[1])
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for statement in cls.body
        if isinstance(statement, ast.Assign)
        and isinstance(statement.value, ast.Tuple)
        and len(statement.value.elts) == 2
    }


def test_no_module_of_ours_spells_a_state_or_a_receipt_status_itself():
    words = set(OperationState.values) | set(ReceiptStatus.values)
    copies = []
    for path in _our_modules():
        if path == ROOT / "core" / "outcomes.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        labels = _choice_labels(tree)
        copies += [
            f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in words and id(node) not in labels
        ]
    assert copies == [], "use the enum member (core/outcomes.py) instead"


def test_the_api_lists_the_statuses_a_decision_answers(openapi):
    # A conflict is a 409 with its receipt in the message, never a 200.
    assert _enum(openapi, "DecisionOut", "status") == [
        ReceiptStatus.COMMITTED,
        ReceiptStatus.DECLINED,
        ReceiptStatus.AWAITING_APPROVAL,
    ]


# --- decline reasons ---------------------------------------------------------------------


def test_every_channel_offers_the_human_decline_reasons(openapi):
    from workflow.management.commands.resume import Command as Resume
    from workplace.forms import DECLINE_REASON_CHOICES

    human = [reason.value for reason in DeclineReason if reason not in (DeclineReason.EXPIRED, DeclineReason.WITHDRAWN)]
    assert list(HUMAN_DECLINE_REASONS) == human
    assert _enum(openapi, "DecisionIn", "reason") == human
    assert [value for value, _label in DECLINE_REASON_CHOICES] == human
    parser = Resume().create_parser("manage.py", "resume")
    reason = next(action for action in parser._actions if action.dest == "reason")
    assert list(reason.choices) == human


def test_the_docs_list_the_decline_reasons():
    rows = _doc("QUEUE.md").split("| value | label | meaning |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    cells = [[cell.strip() for cell in row.split("|")[1:3]] for row in rows]
    assert cells == [[f"`{reason.value}`", reason.label] for reason in DeclineReason]
    human = list(HUMAN_DECLINE_REASONS)
    api = _doc("API.md").split('optionally `"reason"` (one of', 1)[1].split(";", 1)[0]
    assert _ticked(api) == human
    commands = _doc("COMMANDS.md").split("`--reason` is one of", 1)[1].split("(", 1)[0]
    assert _ticked(commands) == human


# --- channels ----------------------------------------------------------------------------


def test_every_copy_of_the_channels(openapi, admin_client):
    assert _enum(openapi, "PendingOut", "begun_channel") == Channel.values
    assert PendingReview._meta.get_field("begun_channel").choices == Channel.choices
    page = admin_client.get(reverse("admin:reviews_pendingreview_changelist")).content.decode()
    for channel in Channel:
        assert f"begun_channel__exact={channel.value}" in page, channel


# --- a delivery's state ------------------------------------------------------------------


def test_every_copy_of_the_delivery_states(openapi, admin_client):
    from effects.management.commands.reconcile import Command as Reconcile
    from effects.models import DELIVERY_TRANSITIONS, Delivery, DeliveryState
    from effects.selectors import STATE_SENTENCES
    from effects.services import _DELIVERY_LABELS

    assert Delivery._meta.get_field("state").choices == DeliveryState.choices
    assert _enum(openapi, "DeliveryOut", "state") == DeliveryState.values
    assert set(STATE_SENTENCES) == set(DeliveryState) and set(DELIVERY_TRANSITIONS) == set(DeliveryState)
    # reconcile prints the label as a token (delivery=NeedsCheck): no label may hold a space.
    assert {state.value: state.label for state in DeliveryState} == _DELIVERY_LABELS
    assert all(label.isalnum() for label in _DELIVERY_LABELS.values())
    assert DeliveryState.NEEDS_CHECK.label in Reconcile.help
    page = admin_client.get(reverse("admin:effects_delivery_changelist")).content.decode()
    for state in DeliveryState:
        assert f"?state__exact={state.value}" in page, state
    # The panel says something of its own for each state but Queued (its else branch), and
    # each has its badge colour.
    panel = (ROOT / "templates/admin/effects/delivery_panel.html").read_text(encoding="utf-8")
    styles = (ROOT / "workplace/static/workplace/workplace.css").read_text(encoding="utf-8")
    branches = re.findall(r'd\.state == "(\w+)"', panel)
    assert sorted(branches) == sorted(set(DeliveryState.values) - {DeliveryState.QUEUED})
    for state in DeliveryState:
        assert f".df-delivery-{state.value} " in styles, state


def test_the_docs_list_the_delivery_states():
    from effects.models import DeliveryState

    assert _table("DELIVERY.md", "| state | the panel says |") == [f"**{state.label}**" for state in DeliveryState]
    commands = _doc("COMMANDS.md").split("`delivery` is ", 1)[1].split(". With", 1)[0]
    assert _ticked(commands) == DeliveryState.labels
    api = _line("API.md", "| `state` | `queued`")
    # Each state in order, as it is first named (a meaning may name another state).
    named = [word for word in _ticked(api)[1:] if word.isidentifier()]
    assert list(dict.fromkeys(named)) == DeliveryState.values
