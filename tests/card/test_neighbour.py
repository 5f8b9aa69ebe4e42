"""A card decoded as a respelling of the previous one gives the record path's exact verdict."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from workerset_admission.card import fast
from workerset_admission.card.boundary import (
    BoundarySettings,
    decode_model_record,
    decode_whole_record,
    encode_model_record,
    model_kv_key,
    parse_key,
)
from workerset_admission.card.fast import card_cache, neighbour
from workerset_admission.errors import RemoteDataError
from workerset_admission.identity import EndpointId, Registration

EP = EndpointId("ns", "backend", "generate")
BASE: dict[str, Any] = {
    "display_name": "Qwen/Qwen3-8B",
    "slug": "qwen_qwen3-8b",
    "source_path": "Qwen/Qwen3-8B",
    "model_info": None,
    "tokenizer": None,
    "context_length": 40960,
    "kv_cache_block_size": 16,
    "migration_limit": 0,
    "model_type": "Chat | Completions",
    "model_input": "Tokens",
    "worker_type": "aggregated",
    "needs": [],
    "aliases": ["qwen"],
    "user_data": {"team": "a"},
    "runtime_config": {
        "total_kv_blocks": 4096,
        "max_num_seqs": 256,
        "context_length": 32768,
        "tool_call_parser": "hermes",
        "tool_call_arguments_format": "json_string",
        "data_parallel_size": 1,
        "enable_local_indexer": True,
        "runtime_data": {"vllm_inference_v1_generate": "no"},
        "taints": ["gpu-a"],
        "kv_transfer_preferred_weight": 0.5,
        "max_gpu_lora_count": 4,
        "unknown_member": 1,
    },
    "unknown_field": [1, 2],
}
TOP = list(BASE)
MEMBERS = list(BASE["runtime_config"])
SPELLINGS = [
    "0",
    "1",
    "-0",
    "-1",
    "4097",
    "65536",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "1e400",
    "1e-400",
    "1.5",
    "1.0",
    "2.5e3",
    "0.30000000000000000000001",
    "true",
    "false",
    "null",
    '"x"',
    '"aggregated"',
    '"json_object"',
    '"Chat | Completions"',
    '"\\u00e9"',
    '"\\ud800"',
    '"caf\u00e9"',
    "[]",
    "{}",
    '["a","b"]',
    '[["decode"]]',
    '{"a":1,"a":2}',
    '{"a":1e400,"a":2}',
    '{"a":' + "[" * 130 + "]" * 130 + ',"a":2}',
    '{"total_kv_blocks":1e400,"total_kv_blocks":5}',
    '{"vllm_inference_v1_generate":"yes"}',
    '{"vllm_inference_v1_generate":true,"vllm_inference_v1_generate":false}',
    "[" * 130 + "]" * 130,
    "[" * 120 + "]" * 120,
    " 1",
    "1 ",
    "NaN",
    "Infinity",
    "1,",
    '"a" "b"',
]


def record(card_text: str, instance_id: int = 7) -> tuple[str, bytes]:
    return model_kv_key(EP, instance_id), encode_model_record(EP, instance_id, "{}").replace(
        b'"card_json":{}', b'"card_json":' + card_text.encode()
    )


def respell(path: str, spelling: str) -> str:
    """The base card's compact text with the value at ``path`` replaced by ``spelling``."""
    marker = "\u0000MARK\u0000"
    card = json.loads(json.dumps(BASE))
    top, _, member = path.partition(".")
    if member:
        card[top][member] = marker
    else:
        card[top] = marker
    return json.dumps(card, separators=(",", ":"), ensure_ascii=False).replace(
        json.dumps(marker), spelling
    )


def verdict(key: str, value: bytes | str) -> object:
    try:
        reg = decode_model_record(parse_key(key), value, BoundarySettings())
    except RemoteDataError as exc:
        return ("refused", type(exc).__name__, exc.reason)
    assert isinstance(reg, Registration)
    return (reg, repr(reg.card.fields))


def forget() -> None:
    fast.clear_caches()


def slow_verdict(key: str, value: bytes) -> object:
    """The whole-record decoder's verdict: the record parsed whole, then its card typed."""
    forget()
    try:
        reg = decode_whole_record(parse_key(key), value, BoundarySettings())
    except RemoteDataError as exc:
        return ("refused", type(exc).__name__, exc.reason)
    assert isinstance(reg, Registration)
    return (reg, repr(reg.card.fields))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.one_of(st.sampled_from(TOP), st.sampled_from([f"runtime_config.{m}" for m in MEMBERS])),
    st.sampled_from(SPELLINGS),
)
def test_a_respelled_value_gets_the_verdict_of_a_fresh_decode(path: str, spelling: str) -> None:
    key, base = record(respell("kv_cache_block_size", "16"))
    changed_key, changed = record(respell(path, spelling))
    forget()
    assert not isinstance(verdict(key, base), tuple) or verdict(key, base)[0] != "refused"
    got = verdict(changed_key, changed)
    assert got == slow_verdict(changed_key, changed)


def test_a_fleet_whose_cards_differ_in_one_member_is_decoded_by_difference() -> None:
    forget()
    texts = [respell("runtime_config.total_kv_blocks", str(4096 + i)) for i in range(20)]
    used = 0
    for i, text in enumerate(texts):
        key, value = record(text, i + 1)
        card = value[value.index(b'"card_json":') + 12 : -1]
        used += neighbour.decode_near(card, card_cache._FAST_CTX) is not None
        got = verdict(key, value)
        assert got == slow_verdict(key, value)
        forget() if i == 0 else None
        verdict(key, value)  # the reference for the next card
    assert used >= len(texts) - 2


def test_the_facts_of_a_neighbour_are_reused_only_for_a_value_they_never_read() -> None:
    forget()
    key, value = record(respell("runtime_config.total_kv_blocks", "1"))
    verdict(key, value)
    note = neighbour._reference[0].note
    assert isinstance(note, card_cache._NearFacts)
    assert "runtime_config.total_kv_blocks" not in note.reads
    assert {"display_name", "runtime_config.runtime_data", "aliases"} <= note.reads
    assert note.reusable("runtime_config.total_kv_blocks", (None, None, "1.6"))
    assert not note.reusable("runtime_config.runtime_data", (None, None, "1.6"))
    assert not note.reusable("runtime_config.total_kv_blocks", ("fastokens", None, "1.6"))
    assert not note.reusable("runtime_config.total_kv_blocks", (None, None, "1.7"))
    changed_key, changed = record(respell("runtime_config.runtime_data", '{"x":1}'))
    got = verdict(changed_key, changed)
    assert got == slow_verdict(changed_key, changed)
