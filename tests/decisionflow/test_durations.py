"""One rule for every duration setting (core/durations.py), both ways, through each reader."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured

from core.durations import duration_parse, duration_setting


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("1.5h", timedelta(minutes=90)),
        ("2d", timedelta(days=2)),
        ("0.5s", timedelta(milliseconds=500)),
        ("45", timedelta(seconds=45)),
        (" 4 h ", timedelta(hours=4)),
        (30, timedelta(seconds=30)),
        (2.5, timedelta(seconds=2.5)),
        (timedelta(minutes=3), timedelta(minutes=3)),
    ],
)
def test_a_good_duration_is_read(value, expected):
    assert duration_parse(value, setting="DECISIONFLOW_X") == expected


@pytest.mark.parametrize(
    "value",
    ["", "4x", "15M", "1h30m", "-1h", "1,5h", ".5h", "h", "1e3s", "nan", None, True, [], "999999999999d"],
)
def test_a_bad_duration_is_refused_naming_the_setting_and_the_form(value):
    with pytest.raises(ImproperlyConfigured, match=r"^DECISIONFLOW_X: ") as refused:
        duration_parse(value, setting="DECISIONFLOW_X")
    assert repr(value) in str(refused.value)
    if value != "999999999999d":
        assert "such as 90s, 15m, 1.5h or 2d (a bare number is seconds)" in str(refused.value)


@pytest.mark.parametrize("value", ["0", "0s", "0.0h", 0, 0.0, -5, timedelta(0), timedelta(seconds=-1), float("nan")])
def test_zero_and_less_are_refused(value):
    with pytest.raises(ImproperlyConfigured, match=r"^DECISIONFLOW_X: .* (must be longer than zero|is not a duration)"):
        duration_parse(value, setting="DECISIONFLOW_X")


def test_a_bare_number_takes_the_unit_its_reader_names():
    assert duration_parse("7", setting="--older-than", bare="d") == timedelta(days=7)
    assert duration_parse(7, setting="--older-than", bare="d") == timedelta(days=7)
    assert duration_parse("12h", setting="--older-than", bare="d") == timedelta(hours=12)
    with pytest.raises(ImproperlyConfigured, match=r"\(a bare number is days\)$"):
        duration_parse("7 days", setting="--older-than", bare="d")


def test_an_unset_setting_takes_its_default(settings):
    assert duration_setting("DECISIONFLOW_NO_SUCH_SETTING", "5m") == timedelta(minutes=5)
    settings.DECISIONFLOW_NO_SUCH_SETTING = "1.5h"
    assert duration_setting("DECISIONFLOW_NO_SUCH_SETTING", "5m") == timedelta(minutes=90)


def _readers():
    from effects import delivery
    from reviews import notifications
    from workflow import queue

    return {
        "DECISIONFLOW_DELIVERY_LEASE": delivery.lease,
        "DECISIONFLOW_NOTIFY_LEASE": notifications.lease,
        "DECISIONFLOW_REVIEW_SLA": queue.sla_default,
        "DECISIONFLOW_REVIEW_CLAIM_LEASE": queue.claim_lease,
    }


@pytest.mark.parametrize(
    "name",
    [
        "DECISIONFLOW_DELIVERY_LEASE",
        "DECISIONFLOW_NOTIFY_LEASE",
        "DECISIONFLOW_REVIEW_SLA",
        "DECISIONFLOW_REVIEW_CLAIM_LEASE",
    ],
)
def test_every_duration_setting_takes_the_one_rule(name, settings):
    read = _readers()[name]
    setattr(settings, name, "1.5h")
    assert read() == timedelta(minutes=90)
    setattr(settings, name, "90")
    assert read() == timedelta(seconds=90)
    setattr(settings, name, "1h30m")
    with pytest.raises(ImproperlyConfigured, match=f"^{name}: '1h30m' is not a duration"):
        read()


def test_a_policy_target_is_refused_naming_its_policy(settings):
    from workflow import queue

    settings.DECISIONFLOW_REVIEW_SLA_BY_POLICY = {"refunds": "2.5h"}
    assert queue.sla_target("refunds") == timedelta(hours=2.5)
    settings.DECISIONFLOW_REVIEW_SLA_BY_POLICY = {"refunds": "soon"}
    with pytest.raises(ImproperlyConfigured, match=r"^DECISIONFLOW_REVIEW_SLA_BY_POLICY\['refunds'\]: 'soon'"):
        queue.sla_target("refunds")


@pytest.mark.parametrize("name", ["DECISIONFLOW_DELIVERY_UNKNOWN_ALERT", "DECISIONFLOW_DELIVERY_QUEUED_ALERT"])
def test_the_reconcile_alerts_take_the_one_rule(name, settings):
    from effects.services import delivery_alert

    setattr(settings, name, "0.5h")
    assert delivery_alert([]) == (0, 0, 0, 0)
    setattr(settings, name, "fifteen minutes")
    with pytest.raises(ImproperlyConfigured, match=f"^{name}: 'fifteen minutes' is not a duration"):
        delivery_alert([])
