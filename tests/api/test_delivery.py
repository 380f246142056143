"""`GET /api/operations/{id}` says where the reply's delivery to the helpdesk stands
(docs/API.md): null when there is none, else its state, reference or reason, tries, and the
newest try."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from effects.models import DeliveryState, DeliveryTry
from effects.services import effect_commit
from tests.api.conftest import DEMO_OP
from tests.delivery_rows import approved, delivery_in

pytestmark = pytest.mark.django_db

OPERATION = f"/api/operations/{DEMO_OP}"


def test_no_delivery_is_null(api, proposal, reviewer):
    assert api.get(OPERATION).json()["delivery"] is None  # undecided
    effect_commit(operation_id=proposal.operation_id, approved=False, reviewer=reviewer)
    body = api.get(OPERATION).json()
    assert body["state"] == "Declined" and body["delivery"] is None  # a decline never has one


def test_delivered_names_the_reference_and_the_last_try(api, proposal, reviewer):
    start = timezone.now() - timedelta(minutes=3)
    delivery = delivery_in(approved(proposal, reviewer), DeliveryState.DELIVERED, tries=2, start=start)
    body = api.get(OPERATION).json()
    assert body["state"] == "Committed"
    delivery_json = body["delivery"]
    assert delivery_json["state"] == "delivered"
    assert delivery_json["reference"] == "HD-REPLY-77"
    assert delivery_json["reason"] is None
    assert delivery_json["tries"] == 2
    assert delivery_json["created_at"] and delivery_json["settled_at"]
    assert delivery_json["last_try"] == {
        "kind": "send",
        "outcome": "delivered",
        "worker": "host-a:101",
        "http_status": 201,
        "error": None,
        "latency_ms": 11,
        "started_at": delivery_json["last_try"]["started_at"],
    }
    assert delivery_json["last_try"]["started_at"].startswith(
        (start + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S")
    )
    # The case view carries the same operation, with the same delivery.
    assert api.get("/api/cases/T-1042").json()["reconcile"]["delivery"] == delivery_json
    # A lookup made later is the newest try, whatever was written first.
    DeliveryTry.objects.create(
        delivery=delivery,
        operation_id=delivery.operation_id,
        kind=DeliveryTry.Kind.LOOKUP,
        outcome=DeliveryTry.Outcome.DELIVERED,
        worker="reconcile:9",
        http_status=200,
        latency_ms=4,
        started_at=timezone.now(),
    )
    assert api.get(OPERATION).json()["delivery"]["last_try"]["kind"] == "lookup"


def test_unknown_is_said_as_such(proposal, reviewer, lead_api):
    delivery_in(approved(proposal, reviewer), DeliveryState.UNKNOWN, tries=1)
    unknown = lead_api.get(OPERATION).json()["delivery"]  # the view permission is enough
    assert unknown["state"] == "unknown" and unknown["reference"] is None and unknown["settled_at"] is None
    assert unknown["last_try"]["outcome"] == "unknown"
    assert unknown["last_try"]["http_status"] is None and unknown["last_try"]["error"].startswith("ReadTimeout")


def test_rejected_and_queued(api, proposal, reviewer):
    from cases.services import case_import
    from reviews.services import proposal_create
    from tests.conftest import load_fixture

    delivery_in(approved(proposal, reviewer), DeliveryState.REJECTED, tries=1)
    rejected = api.get(OPERATION).json()["delivery"]
    assert rejected["state"] == "rejected" and rejected["reason"] == "422: the ticket T-1042 is closed"
    other = proposal_create(case=case_import(data=load_fixture("t1077.json")).case)
    delivery_in(approved(other, reviewer), DeliveryState.QUEUED)
    queued = api.get(f"/api/operations/{other.operation_id}").json()["delivery"]
    assert queued["state"] == "queued" and queued["tries"] == 0 and queued["last_try"] is None


def test_the_schema_documents_the_delivery(client, db):
    components = client.get("/api/openapi.json").json()["components"]["schemas"]
    operation = components["OperationOut"]
    assert "delivery" in operation["required"]
    delivery = components["DeliveryOut"]
    assert set(delivery["required"]) == {
        "state",
        "reference",
        "reason",
        "tries",
        "created_at",
        "settled_at",
        "last_try",
    }
    assert delivery["properties"]["state"]["enum"] == [
        "queued",
        "sending",
        "unknown",
        "delivered",
        "rejected",
        "needs_check",
    ]
    assert set(components["DeliveryTryOut"]["properties"]) == {
        "kind",
        "outcome",
        "worker",
        "http_status",
        "error",
        "latency_ms",
        "started_at",
    }


def test_docs_api_md_documents_every_delivery_field(client, db):
    """docs/API.md's delivery table names every field the schema has, and every state."""
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "API.md").read_text()
    section = docs[docs.index("### `GET /api/operations/{operation_id}`") : docs.index("## Errors")]
    components = client.get("/api/openapi.json").json()["components"]["schemas"]
    for name in ("DeliveryOut", "DeliveryTryOut"):
        for field in components[name]["properties"]:
            assert f"`{field}`" in section, f"docs/API.md does not document delivery field {field}"
    for values in (
        components["DeliveryOut"]["properties"]["state"]["enum"],
        components["DeliveryTryOut"]["properties"]["outcome"]["enum"],
    ):
        for value in values:
            assert f"`{value}`" in section, f"docs/API.md does not name {value}"
