"""The identity protocol against PROTOCOL.md's vectors, plus properties with hypothesis."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from core import identity

T1042_EVIDENCE = "ev-v1-591fc0a25303d0b774098bffd7d6fd2eb216fde208acd1d4554c93075dd24f9e"
T1042_POLICY = "pol-v1-7df3c55cc3b2a9c77010eba24d6ca49777e5626e98dc79e789209c7ba090cd7f"
T1042_OPERATION = "op-v1-e3976ac9e004f816de8a7695aa8b5bf99b16b3f893063045153b2a114922fbfc"


@pytest.mark.parametrize(
    "fields, framed",
    [
        (["ab", "c"], "0000000261620000000163"),
        (["a", "bc"], "0000000161000000026263"),
        (
            ["Proszę zebrać eksport diagnostyczny."],
            "0000002650726f737ac499207a65627261c48720656b73706f727420646961676e6f737479637a6e792e",
        ),
        (["line one\r\nline two"], "000000116c696e65206f6e650a6c696e652074776f"),
        (["line one\nline two"], "000000116c696e65206f6e650a6c696e652074776f"),
    ],
)
def test_framing_vectors(fields, framed):
    assert identity.encode_fields(fields).hex() == framed


def test_polish_vector_counts_bytes_not_characters():
    text = "Proszę zebrać eksport diagnostyczny."
    assert len(text) == 36
    assert identity.encode_fields([text])[:4] == (38).to_bytes(4, "big")


def _t1042(data, **changes):
    passages = changes.get("passages", data["selected_evidence"])
    policy = changes.get("policy", data["policy"])
    ev = identity.evidence_id(passages)
    pol = identity.policy_id(policy["name"], policy["parameters"])
    body = changes.get("draft", data["draft"])
    return ev, pol, identity.operation_id(data["case_id"], data["action"], body, ev, pol)


def test_t1042_fixture_yields_the_protocol_identities(t1042_data):
    assert _t1042(t1042_data) == (T1042_EVIDENCE, T1042_POLICY, T1042_OPERATION)


def test_t1042_variations(t1042_data):
    data = t1042_data
    assert _t1042(data, draft=data["draft"].replace("\n", "\r\n"))[2] == T1042_OPERATION
    assert _t1042(data, policy=dict(data["policy"], label="v4"))[2] == T1042_OPERATION
    moved = [dict(p, version=4) if p["source_id"] == "HOLD-7" else p for p in data["selected_evidence"]]
    raised = dict(data["policy"], parameters=dict(data["policy"]["parameters"], allowance_units=10))
    others = {
        _t1042(data, draft=data["draft"] + " One more sentence.")[2],
        _t1042(data, passages=moved)[2],
        _t1042(data, policy=raised)[2],
    }
    assert T1042_OPERATION not in others and len(others) == 3


def test_evidence_order_of_input_does_not_matter(t1042_data):
    passages = t1042_data["selected_evidence"]
    assert identity.evidence_id(list(reversed(passages))) == T1042_EVIDENCE


def test_evidence_orders_versions_numerically():
    a = {"source_id": "S", "version": 10, "quotation": "x"}
    b = {"source_id": "S", "version": 9, "quotation": "y"}
    expected = (
        "ev-v1-"
        + hashlib.sha256(
            identity.encode_fields(["decisionflow.evidence.v1", "S", "9", "y", "S", "10", "x"])
        ).hexdigest()
    )
    assert identity.evidence_id([a, b]) == expected


@pytest.mark.parametrize(
    "call",
    [
        lambda: identity.encode_fields(["ok", "bad\ud800"]),
        lambda: identity.operation_id("T-1", "act", "body \udfff", "ev", "pol"),
        lambda: identity.evidence_id([{"source_id": "S", "version": 1, "quotation": "\ud800"}]),
        lambda: identity.policy_id("p", {"k": "\ud800"}),
        lambda: identity.evidence_id(
            [
                {"source_id": "S", "version": 1, "quotation": "a"},
                {"source_id": "S", "version": 1, "quotation": "b"},
            ]
        ),
        lambda: identity.evidence_id([{"source_id": "S", "version": True, "quotation": "a"}]),
        lambda: identity.evidence_id([{"source_id": "S", "quotation": "a"}]),
    ],
    ids=[
        "surrogate-field",
        "surrogate-body",
        "surrogate-quotation",
        "surrogate-policy",
        "same-version-twice",
        "bool-version",
        "missing-version",
    ],
)
def test_bad_input_is_refused_with_value_error(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("value", [1.5, None, [1], {"a": 1}, b"bytes"])
def test_policy_value_types_other_than_int_str_bool_are_refused(value):
    with pytest.raises(TypeError, match="only int, str and bool"):
        identity.policy_id("p", {"k": value})


def test_policy_typed_values_distinguish_types():
    assert identity.policy_id("p", {"k": 1}) != identity.policy_id("p", {"k": "1"})
    assert identity.policy_id("p", {"k": True}) != identity.policy_id("p", {"k": 1})
    assert identity.typed_value(False) == "bool:false"


text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(text, max_size=6), st.lists(text, max_size=6))
def test_framing_is_injective(a, b):
    norm = lambda fields: [identity.normalize_newlines(f) for f in fields]  # noqa: E731
    assume(norm(a) != norm(b))
    assert identity.encode_fields(a) != identity.encode_fields(b)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab .", max_size=20), min_size=1, max_size=6))
def test_crlf_lf_and_lone_cr_give_the_same_identity(lines):
    bodies = ["\n".join(lines), "\r\n".join(lines), "\r".join(lines)]
    ids = {identity.operation_id("T-1", "act", body, "ev", "pol") for body in bodies}
    assert len(ids) == 1


@settings(max_examples=300, deadline=None)
@given(text.filter(lambda s: "\r" not in s), st.data())
def test_any_other_one_character_change_gives_a_new_identity(body, data):
    position = data.draw(st.integers(min_value=0, max_value=len(body)))
    kind = data.draw(st.sampled_from(["insert", "replace", "delete"]))
    char = data.draw(st.characters(blacklist_categories=("Cs",)).filter(lambda c: c not in "\r\n"))
    if kind == "insert":
        changed = body[:position] + char + body[position:]
    elif kind == "replace" and position < len(body):
        assume(body[position] != char and body[position] != "\n")
        changed = body[:position] + char + body[position + 1 :]
    elif kind == "delete" and position < len(body):
        changed = body[:position] + body[position + 1 :]
    else:
        assume(False)
    assert identity.operation_id("T-1", "act", changed, "ev", "pol") != identity.operation_id(
        "T-1", "act", body, "ev", "pol"
    )


def test_short_and_format_helpers():
    assert identity.short(T1042_OPERATION) == "op-v1-e3976ac9e004…"
    assert identity.is_operation_id(T1042_OPERATION)
    assert not identity.is_operation_id(T1042_OPERATION.upper())
    assert not identity.is_operation_id(T1042_OPERATION[:-1])
