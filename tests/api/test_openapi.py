"""The published schema: open to read, and saying what the endpoints really do."""

from __future__ import annotations


def test_openapi_json_describes_the_endpoints(client, db):
    response = client.get("/api/openapi.json")  # no credentials needed to read the schema
    assert response.status_code == 200
    schema = response.json()
    assert set(schema["paths"]) == {
        "/api/cases",
        "/api/cases/{case_id}",
        "/api/cases/{case_id}/decision",
        "/api/cases/{case_id}/drafts",
        "/api/cases/{case_id}/edits",
        "/api/cases/{case_id}/withdraw",
        "/api/cases/{case_id}/assignment",
        "/api/cases/{case_id}/hand-over",
        "/api/operations/{operation_id}",
        "/api/policies/publish",
        "/api/sources/{source_id}/versions",
        "/api/jobs/{job_id}",
    }
    decision = schema["paths"]["/api/cases/{case_id}/decision"]["post"]
    assert set(decision["responses"]) == {"200", "400", "401", "403", "404", "409", "413", "500"}
    assert {"TokenAuth", "SessionAuth"} == {k for s in decision["security"] for k in s}
    body = schema["components"]["schemas"]["DecisionIn"]
    assert body["additionalProperties"] is False
    assert body["properties"]["approved"]["type"] == "boolean"
    assert body["properties"]["operation_id"]["pattern"] == "^op-v1-[0-9a-f]{64}$"
    assert schema["components"]["securitySchemes"]["TokenAuth"] == {"type": "http", "scheme": "bearer"}
    # Every decision says its outcome; every edit says whether its review was begun.
    components = schema["components"]["schemas"]
    decided = components["DecisionOut"]
    assert "outcome" in decided["required"]
    assert decided["properties"]["outcome"]["enum"] == ["committed", "declined", "replay", "awaiting_approval"]
    edited = components["EditOut"]
    assert {"review_begun", "review_error"} <= set(edited["required"])
    assert edited["properties"]["review_begun"]["type"] == "boolean"
    # A move says whether it was a replay, and its kind from the one vocabulary.
    moved = components["MoveOut"]
    assert {"replay", "kind", "said"} <= set(moved["required"])
    assert moved["properties"]["kind"]["enum"] == ["assigned", "handed_over", "escalated"]
    assert components["HandOverIn"]["required"] == ["operation_id", "to_user", "note"]
    # The intake says what it answers, idempotency refusals included.
    intake = schema["paths"]["/api/cases"]["post"]
    assert set(intake["responses"]) == {"200", "201", "400", "401", "403", "409", "413", "422", "500"}
    assert components["CaseIn"]["additionalProperties"] is False
    assert {"created", "operation_id", "review_begun", "case"} <= set(components["IntakeOut"]["required"])
    # The withdrawal names the operation it withdraws; its reason is optional.
    withdraw = schema["paths"]["/api/cases/{case_id}/withdraw"]["post"]
    assert set(withdraw["responses"]) == {"200", "400", "401", "403", "404", "409", "413", "422", "500"}
    assert components["WithdrawIn"]["additionalProperties"] is False
    assert components["WithdrawIn"]["required"] == ["operation_id"]
    assert components["WithdrawOut"]["properties"]["status"]["const"] == "Declined"
    # A new source version answers 202 with a job, whose states are the model's own.
    versions = schema["paths"]["/api/sources/{source_id}/versions"]["post"]
    assert {"200", "201", "202", "400", "403", "404"} <= set(versions["responses"])
    assert components["JobOut"]["properties"]["state"]["enum"] == ["queued", "running", "done", "failed"]
    # The re-draft: strict, at least one thing to change, and the intake's answers.
    redraft = schema["paths"]["/api/cases/{case_id}/drafts"]["post"]
    assert set(redraft["responses"]) == {"200", "201", "400", "401", "403", "404", "409", "413", "422", "500"}
    assert components["DraftIn"]["additionalProperties"] is False
    assert components["DraftIn"]["required"] == ["expected_operation_id"]
    assert {"changed", "operation_id", "review_begun", "case"} <= set(components["DraftOut"]["required"])
    # The test-only fault header is not part of the public contract.
    assert "X-Decisionflow-Fault" not in response.content.decode()


def test_docs_page(client, db):
    assert client.get("/api/docs").status_code == 200


def test_the_docs_page_loads_nothing_from_another_host(client, db):
    """Swagger UI comes from the pinned django-ninja's static files, never a CDN."""
    import re

    page = client.get("/api/docs").content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert any(s.endswith("swagger-ui-bundle.js") for s in sources), sources
    assert all(s.startswith("/static/") for s in sources), sources
    assert "cdn" not in page.lower()
