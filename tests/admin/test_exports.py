"""The admin's exports: the action on each changelist and "Export this history" stream a
signed file to whoever may read the page (the support lead too), and the signature is a
second download that audit_verify accepts."""

from __future__ import annotations

import csv
import io

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.http import StreamingHttpResponse
from django.test import Client
from django.urls import reverse

from audit.models import SignedExport
from audit.signature import export_verify
from cases.models import Case
from core import signing
from effects.models import CommitAttempt
from reviews.models import Proposal

pytestmark = pytest.mark.django_db


def body(response) -> bytes:
    assert isinstance(response, StreamingHttpResponse), type(response)
    return b"".join(response.streaming_content)


def action(client, url_name: str, fmt: str, pks, **extra):
    return client.post(
        reverse(url_name),
        {"action": f"export_{fmt}", ACTION_CHECKBOX_NAME: [str(pk) for pk in pks], "index": "0", **extra},
    )


def signature_of(client, response) -> bytes:
    url = response["X-Audit-Signature"]
    assert url.startswith("http://testserver/admin/audit/signedexport/") and url.endswith("/signature/")
    got = client.get(url.removeprefix("http://testserver"))
    assert got.status_code == 200
    assert got["Content-Disposition"].endswith('.csv.sig"') or got["Content-Disposition"].endswith('.jsonl.sig"')
    return got.content


def verified(tmp_path, data: bytes, sig: bytes):
    (tmp_path / "f").write_bytes(data)
    (tmp_path / "f.sig").write_bytes(sig)
    return export_verify(tmp_path / "f", public_pem=signing.public_key_pem())


@pytest.mark.parametrize(
    "url_name, model",
    [
        ("admin:cases_case_changelist", Case),
        ("admin:effects_commitattempt_changelist", CommitAttempt),
        ("admin:reviews_proposal_changelist", Proposal),
    ],
)
def test_the_lead_exports_the_selected_rows_streamed_and_signed(lead_client, begun, tmp_path, url_name, model):
    CommitAttempt.objects.create(operation_id="=cmd|' /C calc'!A0", outcome="refused", channel="api", detail="@SUM(1)")
    pks = list(model.objects.values_list("pk", flat=True))
    response = action(lead_client, url_name, "csv", pks)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="decisionflow-')
    data = body(response)
    rows = list(csv.reader(io.StringIO(data.decode(), newline="")))
    assert len(rows) == 1 + len(pks)
    assert not any(cell[:1] in "=+-@\t\r" and cell for row in rows for cell in row)
    found = verified(tmp_path, data, signature_of(lead_client, response))
    assert found.size == len(data)
    record = SignedExport.objects.get()
    assert (record.exported_by.username, record.channel, record.size) == ("lead", "admin", len(data))


def test_json_lines_from_the_deliveries_and_decisions_lists(lead_client, begun, reviewer, tmp_path, settings):
    from workflow.decide import decision_record

    settings.DECISIONFLOW_DELIVERY_URL = "http://127.0.0.1:9"
    begun_case = Case.objects.get(case_id="T-1042")
    decision_record(
        case=begun_case,
        operation_id=begun_case.current_proposal.operation_id,
        approved=True,
        reviewer=reviewer,
        channel="admin",
    )
    from effects.models import Delivery
    from reviews.models import ReviewDecision

    for url_name, model in (
        ("admin:effects_delivery_changelist", Delivery),
        ("admin:reviews_reviewdecision_changelist", ReviewDecision),
    ):
        response = action(lead_client, url_name, "jsonl", model.objects.values_list("pk", flat=True))
        assert response.status_code == 200 and response["Content-Type"].startswith("application/x-ndjson")
        data = body(response)
        assert data.count(b"\n") == 1 and b'"operation_id":"op-v1-' in data
        verified(tmp_path, data, signature_of(lead_client, response))


def test_export_this_history(lead_client, begun, tmp_path):
    case = Case.objects.get(case_id="T-1042")
    page = lead_client.get(reverse("admin:cases_case_history", args=[case.pk]))
    html = page.content.decode()
    export_url = reverse("admin:cases_case_history_export", args=[case.pk])
    assert f'href="{export_url}?format=csv"' in html and f'href="{export_url}?format=jsonl"' in html
    assert "Export this history" in html
    response = lead_client.get(f"{export_url}?format=csv")
    data = body(response)
    assert 'filename="decisionflow-history-T-1042-' in response["Content-Disposition"]
    events = [row["event"] for row in csv.DictReader(io.StringIO(data.decode(), newline=""))]
    assert events[:2] == ["proposal", "review_begun"]
    verified(tmp_path, data, signature_of(lead_client, response))
    assert lead_client.get(f"{export_url}?format=xlsx").status_code == 404


def test_the_signed_exports_list_offers_each_signature(lead_client, begun):
    case = Case.objects.get(case_id="T-1042")
    response = lead_client.get(reverse("admin:cases_case_history_export", args=[case.pk]))
    body(response)
    page = lead_client.get(reverse("admin:audit_signedexport_changelist")).content.decode()
    record = SignedExport.objects.get()
    assert f"{record.file_name}.sig" in page and record.key_id in page and "lead" in page


def test_a_download_not_finished_has_no_signature(lead_client, begun):
    case = Case.objects.get(case_id="T-1042")
    response = lead_client.get(reverse("admin:cases_case_history_export", args=[case.pk]))
    stream = iter(response.streaming_content)
    next(stream)  # the first chunk is out, and the browser goes away (nothing asks for more)
    record = SignedExport.objects.get()
    assert record.finished_at is None and record.signature == ""
    got = lead_client.get(response["X-Audit-Signature"].removeprefix("http://testserver"))
    assert got.status_code == 404
    page = lead_client.get(reverse("admin:audit_signedexport_changelist")).content.decode()
    assert "not finished: no signature" in page


def test_no_view_permission_no_export(make_user, begun):
    client = Client()
    client.force_login(make_user("nobody", group=None))
    case = Case.objects.get(case_id="T-1042")
    assert client.get(reverse("admin:cases_case_history_export", args=[case.pk])).status_code == 403
    response = action(client, "admin:cases_case_changelist", "csv", [case.pk])
    assert response.status_code == 403
    assert client.get(reverse("admin:audit_signedexport_changelist")).status_code == 403
    assert not SignedExport.objects.exists()


def test_no_signing_key_is_a_503_with_the_message(lead_client, begun, settings):
    settings.DECISIONFLOW_AUDIT_SIGNING_KEY = ""
    settings.DECISIONFLOW_AUDIT_SIGNING_KEY_FILE = ""
    settings.DECISIONFLOW_AUDIT_DEV_KEY_FILE = None
    case = Case.objects.get(case_id="T-1042")
    response = lead_client.get(reverse("admin:cases_case_history_export", args=[case.pk]))
    assert response.status_code == 503 and b"no audit signing key" in response.content
    assert not SignedExport.objects.exists()


def test_select_all_across_the_pages_exports_every_filtered_row(lead_client, begun):
    """Select all N on a list of many pages (the attempts list pages without a COUNT):
    the action gets the whole filtered list, not the page."""
    for n in range(120):
        CommitAttempt.objects.create(operation_id=f"op-{n}", outcome="refused", channel="api", detail="bad input")
    CommitAttempt.objects.create(operation_id="op-stale", outcome="stale", channel="api")
    response = lead_client.post(
        reverse("admin:effects_commitattempt_changelist") + "?outcome__exact=refused",
        {"action": "export_csv", ACTION_CHECKBOX_NAME: ["1"], "select_across": "1", "index": "0"},
    )
    rows = list(csv.DictReader(io.StringIO(body(response).decode(), newline="")))
    assert len(rows) == 120 and {r["outcome"] for r in rows} == {"refused"}
