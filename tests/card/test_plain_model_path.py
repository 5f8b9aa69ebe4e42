"""The one-step decode of a plain, canonical record answers as the general path, or not at all."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conformance.cards import cards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cards import base_card, lora_card
from workerset_admission.card import (
    BoundarySettings,
    decode_plain_model,
    encode_model_record,
    fast,
    model_kv_key,
    parse_key,
)
from workerset_admission.card.boundary import decode_whole_record
from workerset_admission.errors import RemoteDataError
from workerset_admission.identity import EndpointId

EP = EndpointId("ns", "workers", "generate")
CARD = base_card()


def general(key: str, raw: bytes, boundary: BoundarySettings) -> object:
    try:
        return decode_whole_record(parse_key(key), raw, boundary)
    except RemoteDataError as exc:
        return (type(exc).__name__, exc.reason)


def agree(key: str, raw: bytes, boundary: BoundarySettings | None = None) -> bool:
    """Whether the one-step path answered; fails if it answered otherwise than the general one."""
    boundary = boundary or BoundarySettings()
    fast = decode_plain_model(key, raw, boundary)
    if fast is None:
        return False
    expected = general(key, raw, boundary)
    assert fast == expected
    assert fast.card == expected.card  # type: ignore[union-attr]
    return True


def canonical(card: dict[str, Any] | str, instance_id: int = 0x2A) -> tuple[str, bytes]:
    """A record spelled as 1.6.1 writes it, whatever the card text (generated ones included)."""
    text = card if isinstance(card, str) else json.dumps(card, separators=(",", ":"))
    head = encode_model_record(EP, instance_id, "{}")[: -len(b"{}}")]
    return model_kv_key(EP, instance_id), head + text.encode() + b"}"


def test_a_canonical_record_of_a_base_card_is_decoded_in_one_step_as_in_the_general_path() -> None:
    fast.clear_caches()
    for instance_id in (0, 1, 0x2A, 0xFFFF_FFFF_FFFF_FFFF):
        assert agree(*canonical(CARD, instance_id))
    # Distinct cards of a fleet, each new to the last-card memo.
    for blocks in range(3):
        assert agree(*canonical(base_card(16 + blocks), 7 + blocks))


@pytest.mark.parametrize(
    ("mangle", "why"),
    [
        (lambda k, v: (k, v.replace(b'"card_json":', b'"card_json" :')), "not spelled canonically"),
        (lambda k, v: (k, v.replace(b'"instance_id":42', b'"instance_id":43')), "id differs"),
        (lambda k, v: (k, v.replace(b'"instance_id":42', b'"instance_id":042')), "id respelled"),
        (lambda k, v: (k.replace("workers", "work=2Ders"), v), "escaped key"),
        (lambda k, v: (k + ".my-lora", v[:-1] + b',"model_suffix":"my-lora"}'), "an adapter"),
        (lambda k, v: (k.replace("v1.mdc", "v1.instances"), v), "not a model key"),
        (lambda k, v: (k, v + b" "), "trailing text"),
        (
            lambda k, v: (k, v.replace(b'"context_length":4096,', b'"context_length":-1,')),
            "refused",
        ),
    ],
)
def test_anything_but_the_plain_case_is_left_to_the_general_path(mangle: Any, why: str) -> None:
    fast.clear_caches()
    key, raw = mangle(*canonical(CARD))
    assert decode_plain_model(key, raw, BoundarySettings()) is None, why


def test_the_size_limit_and_the_namespace_filter_are_left_to_the_general_path() -> None:
    key, raw = canonical(CARD)
    small = BoundarySettings(max_value_size=len(raw) - 1)
    assert decode_plain_model(key, raw, small) is None
    assert general(key, raw, small) == ("InvalidRecordError", "value_too_large")
    elsewhere = BoundarySettings(namespace="other")
    assert decode_plain_model(key, raw, elsewhere) is None
    assert general(key, raw, elsewhere) is None
    assert agree(key, raw, BoundarySettings(namespace="ns"))


def test_a_card_with_lora_metadata_under_a_base_key_is_refused_by_the_general_path() -> None:
    fast.clear_caches()
    key, raw = canonical(lora_card("my-lora"))
    assert decode_plain_model(key, raw, BoundarySettings()) is None
    assert general(key, raw, BoundarySettings()) == ("InvalidRecordError", "lora_mismatch")


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(cards(), st.integers(0, 2**64 - 1), st.booleans())
def test_generated_cards_get_the_general_paths_answer_or_none(
    card_text: str, instance_id: int, fresh: bool
) -> None:
    if fresh:
        fast.clear_caches()
    key, raw = canonical(card_text, instance_id)
    if decode_plain_model(key, raw, BoundarySettings()) is None:
        return
    assert agree(key, raw)
    assert agree(key, raw)  # again, from the last-card memo
