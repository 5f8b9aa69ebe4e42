"""The shared-card fast path decides every record exactly as the whole-record path does."""

from __future__ import annotations

from typing import Any

from conformance.cards import cards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from workerset_admission.card import BoundarySettings, decode_model_record, model_kv_key, parse_key
from workerset_admission.card.boundary import decode_whole_record
from workerset_admission.errors import CardDecodeError, InvalidRecordError
from workerset_admission.identity import EndpointId

EP = EndpointId("ns", "workers", "generate")


def outcome(
    raw: bytes | str, suffix: str | None, decode: Any = decode_model_record
) -> tuple[str, ...]:
    key = parse_key(model_kv_key(EP, 0x2A, suffix))
    try:
        reg = decode(key, raw, BoundarySettings())
    except (CardDecodeError, InvalidRecordError) as exc:
        return (type(exc).__name__, exc.reason)
    assert reg is not None
    return ("ok", reg.mdc_checksum, reg.lora_fingerprint, reg.group.id, reg.key)


def envelope(card_text: str, suffix: str | None, spaced: bool) -> str:
    sep = " : " if spaced else ":"
    head = (
        '{"type":"Model","namespace":"ns","component":"workers","endpoint":"generate",'
        f'"instance_id":42,"card_json"{sep}'
    )
    tail = f',"model_suffix":"{suffix}"}}' if suffix else "}"
    return head + card_text + tail


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(cards(), st.sampled_from([None, "my-lora"]), st.booleans())
def test_fast_and_whole_record_paths_agree(
    card_text: str, suffix: str | None, as_bytes: bool
) -> None:
    fast = envelope(card_text, suffix, spaced=False)
    whole = envelope(card_text, suffix, spaced=True)  # the spacing defeats the fast path
    first = outcome(fast.encode() if as_bytes else fast, suffix)
    again = outcome(fast.encode() if as_bytes else fast, suffix)  # now from the cache
    general = outcome(fast.encode() if as_bytes else fast, suffix, decode_whole_record)
    assert first == again == outcome(whole, suffix) == general
