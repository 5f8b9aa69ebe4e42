"""The fast paths' memos answer what the functions they stand for answer, cold and warm."""

from __future__ import annotations

import json
from typing import Any

from conformance.cards import cards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cards import base_card, lora_card
from workerset_admission.card import BoundarySettings, encode_model_record
from workerset_admission.card.card_facts import card_facts, lora_projection_fingerprint
from workerset_admission.card.fast import memo
from workerset_admission.card.model import (
    MODEL_TYPE_NAMES,
    DecodedCard,
    decode_card,
    model_type_names,
)
from workerset_admission.errors import CardDecodeError
from workerset_admission.identity import EndpointId

EP = EndpointId("ns", "workers", "generate")
OTHER_EP = EndpointId("ns", "workers", "prefill")


def decoded(text: str | dict[str, Any]) -> DecodedCard | None:
    try:
        return decode_card(text if isinstance(text, str) else json.dumps(text))
    except CardDecodeError:
        return None


def facts_or_refusal(card: DecodedCard, boundary: BoundarySettings) -> object:
    try:
        return memo.facts_of(card, boundary)
    except CardDecodeError as exc:
        return (exc.reason, exc.detail)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(cards(), st.sampled_from([(None, None), ("fastokens", None), (None, True)]))
def test_memoized_facts_equal_the_general_facts_cold_and_warm(
    text: str, overrides: tuple[str | None, bool | None]
) -> None:
    card = decoded(text)
    if card is None:
        return
    boundary = BoundarySettings(
        tokenizer_backend=overrides[0], tokenizer_fallback_enabled=overrides[1]
    )
    try:
        expected: object = card_facts(card, boundary)
    except CardDecodeError as exc:
        expected = (exc.reason, exc.detail)
    memo.clear()
    assert facts_or_refusal(card, boundary) == expected  # cold
    assert facts_or_refusal(card, boundary) == expected  # warm
    assert memo.fingerprint(card) == lora_projection_fingerprint(card)


def test_a_fingerprint_memo_hit_is_the_fingerprint_of_the_card_asked_about() -> None:
    memo.clear()
    cards_seen = [
        decoded(base_card()),
        decoded(base_card(display_name="other")),
        decoded(lora_card("a", capacity=2)),
        decoded(lora_card("a", capacity=3)),
        decoded(lora_card("b", capacity=2)),
        decoded(base_card(aliases=["x"])),
    ]
    for _ in range(2):
        for card in cards_seen:
            assert card is not None
            assert memo.fingerprint(card) == lora_projection_fingerprint(card)
    assert len({memo.fingerprint(c) for c in cards_seen if c is not None}) == len(cards_seen)


def test_model_type_names_are_memoized_as_spelled() -> None:
    memo.clear()
    for _ in range(2):
        for bits in range(1 << len(MODEL_TYPE_NAMES)):
            assert memo.model_types(bits) == model_type_names(bits)


def test_a_group_key_is_the_cards_group_and_one_object_per_group() -> None:
    memo.clear()
    card = decoded(base_card())
    assert card is not None
    facts = card_facts(card, BoundarySettings())
    first = memo.group_key(facts, EP)
    assert first == facts.group_key(EP)
    assert memo.group_key(facts, EP) is first
    other = memo.group_key(facts, OTHER_EP)
    assert other == facts.group_key(OTHER_EP) != first


def test_a_canonical_head_is_what_the_encoder_writes_before_the_instance_id() -> None:
    memo.clear()
    for endpoint in (EP, EndpointId("n\u00e9s", 'c"o', "e\\p")):
        record = encode_model_record(endpoint, 0x2A, "{}")
        head = memo.canonical_head(endpoint)
        assert record.startswith(head + b"42,")
        assert memo.canonical_head(endpoint) == head


def test_every_memo_stays_within_its_limit() -> None:
    memo.clear()
    for bits in range(memo.CACHE_LIMIT + 10):
        memo.model_types(bits)
        memo.canonical_head(EndpointId("ns", "c", f"e{bits}"))
    assert len(memo._MODEL_TYPES) <= memo.CACHE_LIMIT
    assert len(memo._HEADS) <= memo.CACHE_LIMIT
