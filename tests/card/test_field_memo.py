"""Card decoding memoized by field text gives the whole-text decoder's result, or declines."""

from __future__ import annotations

import json

from conformance.cards import cards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cards import base_card as demo_card
from workerset_admission.card import jsonio
from workerset_admission.card.fast.field_memo import clear_memo, decode_card_fields
from workerset_admission.card.model import decode_card_value
from workerset_admission.card.schema import Ctx
from workerset_admission.errors import CardDecodeError

CTX = Ctx(strict_dups=False, check_strings=False)


def whole_text(text: str) -> str | None:
    """The decoded card as the record path decodes it, spelled with types; None if refused."""
    try:
        value = jsonio.loads(text)
    except jsonio.JsonError:
        return None
    if jsonio.has_overflow(value) or 1 + jsonio.depth_of(value) > jsonio.MAX_DEPTH:
        return None
    try:
        card = decode_card_value(value, strict_dups=False, check_strings=False)
    except CardDecodeError:
        return None
    return repr(card.fields)


def memoized(text: str) -> str | None:
    card = decode_card_fields(text, CTX)
    return None if card is None else repr(card.fields)


def compact(card: dict[str, object]) -> str:
    return json.dumps(card, separators=(",", ":"))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(cards(), st.booleans())
def test_memoized_decoding_agrees_with_the_whole_text_or_declines(text: str, warm: bool) -> None:
    if jsonio.has_lone_surrogate_escape(text):
        return  # the caller never offers such text
    if not warm:
        clear_memo()
    expected = whole_text(text)
    first = memoized(text)
    again = memoized(text)  # every field now comes from the memo
    for got in (first, again):
        assert got is None or got == expected
    if expected is None:
        assert first is None
        assert again is None


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(cards(), cards())
def test_fields_reused_from_another_card_give_that_cards_own_decoding(a: str, b: str) -> None:
    for text in (a, b):
        if jsonio.has_lone_surrogate_escape(text):
            return
    memoized(a)
    got = memoized(b)
    assert got is None or got == whole_text(b)


def test_a_compact_fleet_card_is_decoded_by_field_and_equals_the_whole_text() -> None:
    clear_memo()
    for blocks in (16, 32, 16):
        text = compact(demo_card(blocks))
        got = memoized(text)
        assert got is not None
        assert got == whole_text(text)


def test_cards_differing_in_one_field_keep_their_own_value() -> None:
    clear_memo()
    first = decode_card_fields(compact(demo_card(16)), CTX)
    second = decode_card_fields(compact(demo_card(64)), CTX)
    assert first is not None
    assert second is not None
    assert (first.fields["kv_cache_block_size"], second.fields["kv_cache_block_size"]) == (16, 64)
    assert first.fields["display_name"] is second.fields["display_name"]


def test_spacing_a_repeated_key_or_a_refusal_is_left_to_the_whole_text_decoder() -> None:
    text = compact(demo_card())
    assert decode_card_fields(text.replace(":", ": ", 1), CTX) is None
    assert decode_card_fields(text[:-1] + ',"slug":"x"}', CTX) is None
    assert decode_card_fields(text.replace('"Tokens"', '"Bytes"'), CTX) is None
    assert decode_card_fields(text[:-1] + ',"x":1e999}', CTX) is None
    assert decode_card_fields(text[:-1] + ',"x":' + "[" * 126 + "]" * 126 + "}", CTX) is None


def test_checked_contexts_are_left_to_the_whole_text_decoder() -> None:
    text = compact(demo_card())
    assert decode_card_fields(text, Ctx(strict_dups=True)) is None
    assert decode_card_fields(text, Ctx(strict_dups=False, check_strings=True)) is None


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    cards(),
    st.integers(0, 10_000),
    st.integers(0, 40),
    st.text(alphabet='{}[],:"0123456789.-eabnrtu ', max_size=12),
)
def test_a_card_edited_anywhere_after_another_decodes_as_its_own_whole_text(
    text: str, at: int, length: int, insert: str
) -> None:
    # The second card shares a prefix and a suffix with the first: members inside them are
    # reused from the first card's walk, the ones between are walked.
    at %= len(text) + 1
    edited = text[:at] + insert + text[at + length :]
    if jsonio.has_lone_surrogate_escape(text) or jsonio.has_lone_surrogate_escape(edited):
        return
    clear_memo()
    memoized(text)
    got = memoized(edited)
    expected = whole_text(edited)
    assert got is None or got == expected
    if expected is None:
        assert got is None


def test_fleet_cards_differing_in_a_middle_field_reuse_the_others_and_stay_exact() -> None:
    clear_memo()
    base = demo_card()
    for blocks in (16, 32, 1024, 7):
        card = dict(base, kv_cache_block_size=blocks, extra_field={"n": blocks})
        text = compact(card)
        got = memoized(text)
        assert got is not None
        assert got == whole_text(text)
