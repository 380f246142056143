"""reconcile and deliveries: each delivery's state on its operation's line,
one exit bit per finding (16 Unknown past the threshold, 32 Rejected, 64 Queued past the
threshold, 128 NeedsCheck, on top of NoLocalEffectRecorded's 1), nothing written without --repair, and
--repair settling Unknown by a lookup or a resend with the same key, in agreement with the
helpdesk's own table."""

from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from effects.models import Delivery, DeliveryState, DeliveryTry
from effects.services import effect_commit
from effects.tasks import deliver


def reconcile(*args) -> tuple[int, list[str], str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("reconcile", *args, stdout=out, stderr=err)
        code = 0
    except CommandError as exc:
        code = exc.returncode
    return code, out.getvalue().splitlines(), err.getvalue()


@pytest.fixture
def approved(proposal, reviewer, delivering):
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    return proposal.operation_id


def test_a_delivered_reply_is_on_its_line_with_the_helpdesk_reference(approved, delivering):
    deliver.call(approved)
    reference = delivering.lookup(approved).json["reference"]
    code, lines, err = reconcile("T-1042")
    assert code == 0 and err == ""
    assert lines == [
        f"reconcile: case=T-1042 op={approved} state=Committed effects=1 delivery=Delivered reference={reference}"
    ]
    code, lines, _ = reconcile("--all", "--json")
    row, summary = (json.loads(line) for line in lines)
    assert (row["delivery"], row["delivery_reference"]) == ("Delivered", reference)
    assert summary["deliveries"] == {"Delivered": 1}


def test_unknown_is_alerted_only_past_the_threshold_and_plain_reconcile_writes_nothing(approved, delivering, settings):
    delivering.set_faults(drop_after_commit=1)
    deliver.call(approved)
    before = (list(Delivery.objects.values()), DeliveryTry.objects.count())
    settings.DECISIONFLOW_DELIVERY_UNKNOWN_ALERT = "1h"
    assert reconcile("T-1042")[0] == 0
    settings.DECISIONFLOW_DELIVERY_UNKNOWN_ALERT = "1s"
    time.sleep(1.05)
    code, lines, err = reconcile("T-1042")
    assert code == 16 and lines[0].endswith("delivery=Unknown")
    assert "1 delivery(ies) Unknown past DECISIONFLOW_DELIVERY_UNKNOWN_ALERT" in err and "--repair" in err
    assert (list(Delivery.objects.values()), DeliveryTry.objects.count()) == before


def test_repair_looks_the_unknown_delivery_up_and_finds_it(approved, delivering, settings):
    delivering.set_faults(drop_after_commit=1)
    deliver.call(approved)
    settings.DECISIONFLOW_DELIVERY_UNKNOWN_ALERT = "1s"
    time.sleep(1.05)
    code, lines, err = reconcile("T-1042", "--repair")
    assert (code, err) == (0, "")
    reference = delivering.lookup(approved).json["reference"]
    assert lines[-1] == (
        f"repaired: case=T-1042 op={approved} state=Committed effects=1 delivery=Delivered reference={reference}"
    )
    kinds = list(DeliveryTry.objects.order_by("id").values_list("kind", "outcome", "worker"))
    assert [k[:2] for k in kinds] == [("send", "unknown"), ("lookup", "delivered")]
    assert kinds[1][2].startswith("reconcile@")
    stats = delivering.stats()
    assert (stats["replies"], stats["duplicate_replies"], stats["posts"]) == (1, 0, 1)
    # Settled: a second repair has nothing to do, and nothing is left to alert on.
    code, again, err = reconcile("T-1042", "--repair")
    assert (code, err, len(again)) == (0, "", 1) and again[0].startswith("reconcile:")
    assert DeliveryTry.objects.count() == 2


def test_repair_resends_with_the_same_key_when_the_lookup_lags(approved, delivering):
    delivering.set_faults(drop_after_commit=1, lookup_lag_s=60)
    deliver.call(approved)
    code, lines, _ = reconcile("T-1042", "--repair")
    assert code == 0 and "delivery=Delivered" in lines[-1]
    assert list(DeliveryTry.objects.order_by("id").values_list("kind", "outcome")) == [
        ("send", "unknown"),
        ("lookup", "not_found"),
        ("send", "delivered"),
    ]
    stats = delivering.stats()
    assert (stats["replies"], stats["duplicate_replies"], stats["outcomes"].get("replayed")) == (1, 0, 1)
    delivering.set_faults(reset=True)  # the lookup catches up: it agrees with reconcile
    assert Delivery.objects.get().reference == delivering.lookup(approved).json["reference"]


def test_repair_that_cannot_settle_keeps_unknown_and_says_so(approved, delivering, settings):
    delivering.set_faults(drop_after_commit=1)
    deliver.call(approved)
    delivering.stop()
    settings.DECISIONFLOW_DELIVERY_UNKNOWN_ALERT = "1s"
    time.sleep(1.05)
    code, lines, err = reconcile("T-1042", "--repair")
    assert code == 16 and lines[-1].endswith("delivery=Unknown")
    assert "could not settle" in err
    assert Delivery.objects.get().state == DeliveryState.UNKNOWN


def test_needs_check_is_its_own_state_and_bit_and_repair_leaves_it_to_a_person(approved, delivering):
    # Stored, the answer lost; the lookup lags; the resend with the same key is refused.
    delivering.set_faults(drop_after_commit=1, lookup_lag_s=600)
    deliver.call(approved)
    delivering.set_faults(ticket_closed_count=5)
    code, lines, err = reconcile("T-1042", "--repair")
    assert code == 128
    assert lines[-1] == f"repaired: case=T-1042 op={approved} state=Committed effects=1 delivery=NeedsCheck"
    assert "1 delivery(ies) NeedsCheck" in err and "may already be on the ticket" in err
    assert "Rejected" not in err and "did not get the reply" not in err
    assert Delivery.objects.get().state == DeliveryState.NEEDS_CHECK
    tried = DeliveryTry.objects.count()
    # Plain reconcile reports it; --repair again leaves it alone (no resend, no guess).
    code, lines, _ = reconcile("T-1042", "--repair")
    assert code == 128 and lines == [
        f"reconcile: case=T-1042 op={approved} state=Committed effects=1 delivery=NeedsCheck"
    ]
    assert DeliveryTry.objects.count() == tried
    code, lines, _ = reconcile("--all", "--json")
    assert code == 128 and json.loads(lines[-1])["deliveries"] == {"NeedsCheck": 1}
    assert delivering.stats()["replies"] == 1


def test_each_finding_has_its_own_bit(case, proposal, reviewer, delivering, settings, make_user):
    from cases.services import case_import
    from reviews.models import ReviewDecision
    from reviews.services import proposal_create
    from tests.conftest import load_fixture

    def another(n):
        other = case_import(data=dict(load_fixture("t1042.json"), case_id=f"T-20{n}")).case
        return proposal_create(case=other)

    # Rejected: the key already holds another body on the helpdesk.
    effect_commit(operation_id=proposal.operation_id, approved=True, reviewer=reviewer)
    other_body = {
        "case_id": "x",
        "operation_id": proposal.operation_id,
        "body": "other",
        "evidence_id": "e",
        "policy_id": "p",
        "source_versions": {},
    }
    delivering.post_reply(other_body)
    assert deliver.call(proposal.operation_id) == "rejected"
    assert reconcile("--all")[0] == 32
    # Queued (never tried: no worker) past its threshold.
    queued = another(1)
    effect_commit(operation_id=queued.operation_id, approved=True, reviewer=reviewer)
    settings.DECISIONFLOW_DELIVERY_QUEUED_ALERT = "1s"
    settings.DECISIONFLOW_DELIVERY_UNKNOWN_ALERT = "1s"
    # Unknown: dropped after the helpdesk committed.
    unknown = another(2)
    effect_commit(operation_id=unknown.operation_id, approved=True, reviewer=reviewer)
    delivering.set_faults(drop_after_commit=1)
    assert deliver.call(unknown.operation_id) == "unknown"
    # NoLocalEffectRecorded: a decision without its effect.
    missing = another(3)
    ReviewDecision.objects.create(operation_id=missing.operation_id, proposal=missing, approved=True, reviewer=reviewer)
    time.sleep(1.05)
    code, lines, err = reconcile("--all")
    assert code == 1 | 16 | 32 | 64
    assert len(err.strip().splitlines()) == 4
    assert "Rejected 1" in lines[-1] and "Unknown 1" in lines[-1] and "Queued 1" in lines[-1]
