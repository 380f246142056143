"""The history page says where the case's chain stands (docs/AUDIT.md): verified up to the
latest seal, not sealed yet, or broken with the first broken row; and /metrics counts each
check, the failures by verdict=broken."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from prometheus_client import REGISTRY

from audit.seals import seal_write
from effects.services import effect_commit
from reviews.models import ReviewDecision
from reviews.services import proposal_create
from tests.audit.test_seal_verify import triggers_off

pytestmark = pytest.mark.django_db


@pytest.fixture
def lead_client(lead):
    client = Client()
    client.force_login(lead)
    return client


def chain_line(client, case) -> str:
    page = client.get(reverse("admin:cases_case_history", args=[case.pk])).content.decode()
    start = page.index('<tr id="df-chain">')
    return page[start : page.index("</tr>", start)]


def broken_count() -> float:
    return (
        REGISTRY.get_sample_value("decisionflow_audit_verifications_total", {"scope": "case", "verdict": "broken"})
        or 0.0
    )


def test_the_history_page_shows_the_chain_verified_up_to_the_seal_then_the_break(lead_client, case, reviewer):
    proposal = proposal_create(case=case)
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    assert "Chain intact, not sealed yet: the 4 rows of this case hash and link as written" in chain_line(
        lead_client, case
    )
    seal = seal_write().seal
    line = chain_line(lead_client, case)
    assert "Chain verified up to seal 1 at " in line and "the 4 rows of this case hash and link as written." in line
    assert "df-chain-verified" in line
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)  # a replay: one more attempt
    assert "; 1 written since, not sealed yet." in chain_line(lead_client, case)
    assert seal.number == 1

    before = broken_count()
    decision = ReviewDecision.objects.get()
    with triggers_off() as cursor:
        cursor.execute("UPDATE reviews_reviewdecision SET approved = %s WHERE id = %s", [False, decision.pk])
    line = chain_line(lead_client, case)
    assert "df-chain-broken" in line
    assert (
        f"Chain broken: reviews.reviewdecision {decision.pk} does not match its hash: it was changed after it was "
        "written. Run manage.py audit_verify." in line
    )
    assert broken_count() == before + 1
