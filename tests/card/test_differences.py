"""The inputs of mdcsum() two cards differ in: naming, rendering, and the checksum's own verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cards import base_card
from support.differences import normalized, reverted
from workerset_admission.card import BoundarySettings, card_checksum, card_differences
from workerset_admission.card.checksum import CHECKSUM_INPUTS, _layout
from workerset_admission.card.differences import (
    ABSENT,
    MAX_VALUE_CHARS,
    Difference,
    describe,
    summarize,
)
from workerset_admission.errors import CardDecodeError

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "parity_cards.jsonl"
DIGEST_A = "blake3:" + "a" * 64
DIGEST_B = "blake3:" + "b" * 64
ROUTER = {"router_mode": "k_v", "kv_router_config": {}, "load_threshold_config": {}}


def checked(path: str, digest: str) -> dict[str, Any]:
    return {"path": path, "checksum": digest}


def fields_between(incumbent: dict[str, Any], rejected: dict[str, Any]) -> list[str]:
    return [d.field for d in card_differences(normalized(incumbent), normalized(rejected))]


def checksum_of(card: dict[str, Any]) -> str:
    return card_checksum(normalized(card))


def only(incumbent: dict[str, Any], rejected: dict[str, Any]) -> Difference:
    (difference,) = card_differences(normalized(incumbent), normalized(rejected))
    return difference


# --------------------------------------------------------------------------- named cases


def test_a_block_size_change_is_named_with_both_values() -> None:
    assert only(base_card(16), base_card(32)) == Difference("kv_cache_block_size", "16", "32")


def test_an_absent_router_config_differs_from_an_explicit_default_one() -> None:
    difference = only(base_card(), base_card(router_config=ROUTER))
    assert difference.field == "router_config"
    assert difference.incumbent == ABSENT
    assert difference.rejected.startswith('{"router_mode":"k_v","kv_router_config":{')
    assert difference.rejected.endswith(" chars)")
    assert "even one of defaults" in describe(difference)


def test_a_router_member_is_named_by_its_path_with_the_default_filled_in() -> None:
    tuned = {**ROUTER, "kv_router_config": {"router_temperature": 0.5}}
    assert only(base_card(router_config=ROUTER), base_card(router_config=tuned)) == Difference(
        "router_config.kv_router_config.router_temperature", "0.0", "0.5"
    )


def test_a_router_member_spelled_as_its_default_is_no_difference() -> None:
    explicit = {**ROUTER, "kv_router_config": {"router_temperature": 0.0, "use_kv_events": True}}
    assert fields_between(base_card(router_config=ROUTER), base_card(router_config=explicit)) == []


def test_a_member_the_serialization_skips_at_its_default_is_shown_when_set() -> None:
    weighted = {**ROUTER, "kv_router_config": {"decode_active_request_weight": 2.0}}
    assert only(base_card(router_config=ROUTER), base_card(router_config=weighted)) == Difference(
        "router_config.kv_router_config.decode_active_request_weight", "0.0", "2.0"
    )


def test_an_unhashed_router_member_never_appears() -> None:
    snapshot = {**ROUTER, "kv_router_config": {"router_snapshot_threshold": 10}}
    incumbent, rejected = base_card(router_config=ROUTER), base_card(router_config=snapshot)
    assert checksum_of(incumbent) == checksum_of(rejected)
    assert fields_between(incumbent, rejected) == []


def test_the_old_overlap_weight_spelling_shows_as_the_scale_it_sets() -> None:
    old = {**ROUTER, "kv_router_config": {"overlap_score_weight": 2.0}}
    assert only(base_card(router_config=ROUTER), base_card(router_config=old)) == Difference(
        "router_config.kv_router_config.prefill_load_scale", "1.0", "2.0"
    )


@pytest.mark.parametrize(
    ("changes", "shown"),
    [
        ({"runtime_config": {"context_length": 8192}}, "8192 (runtime_config.context_length)"),
        ({"architectural_max_context_length": 8192}, "8192 (architectural_max_context_length)"),
        ({"context_length": 8192}, "8192 (context_length)"),
        ({"context_length": None}, "0 (none set)"),
    ],
)
def test_the_effective_context_length_names_the_field_it_came_from(
    changes: dict[str, Any], shown: str
) -> None:
    assert only(base_card(), base_card(**changes)) == Difference(
        "context_length", "4096 (context_length)", shown
    )


def test_the_same_effective_context_length_from_another_field_is_no_difference() -> None:
    moved = base_card(context_length=None, architectural_max_context_length=4096)
    assert fields_between(base_card(), moved) == []


def test_a_tokenizer_is_compared_by_its_checksum_whatever_its_path() -> None:
    incumbent = base_card(tokenizer={"hf_tokenizer_json": checked("a/tokenizer.json", DIGEST_A)})
    same = base_card(tokenizer={"hf_tokenizer_json": checked("b/tokenizer.json", DIGEST_A)})
    other = base_card(tokenizer={"hf_tokenizer_json": checked("a/tokenizer.json", DIGEST_B)})
    assert fields_between(incumbent, same) == []
    assert only(incumbent, other) == Difference("tokenizer", f'"{DIGEST_A}"', f'"{DIGEST_B}"')
    assert only(base_card(), other) == Difference("tokenizer", ABSENT, f'"{DIGEST_B}"')


def test_needs_are_shown_as_json() -> None:
    assert only(base_card(), base_card(needs=[["decode"]])) == Difference(
        "needs", "[]", '[["decode"]]'
    )


def test_a_runtime_contract_key_is_named_under_runtime_data() -> None:
    flagged = base_card(runtime_config={"runtime_data": {"vllm_inference_v1_generate": "yes"}})
    assert only(base_card(), flagged) == Difference(
        "runtime_config.runtime_data.vllm_inference_v1_generate", ABSENT, '"yes"'
    )


def test_a_runtime_contract_key_that_is_present_but_null_reads_null() -> None:
    key = "vllm_nemotron_video_processor_contract"
    present = base_card(runtime_config={"runtime_data": {key: None}})
    assert only(base_card(), present) == Difference(
        f"runtime_config.runtime_data.{key}", ABSENT, "null"
    )


def test_a_falsy_runtime_flag_hashes_like_an_absent_one() -> None:
    off = base_card(runtime_config={"runtime_data": {"vllm_inference_v1_generate": "no"}})
    assert fields_between(base_card(), off) == []


def test_aliases_are_listed_in_their_order() -> None:
    assert only(base_card(aliases=["a", "b"]), base_card(aliases=["b", "a"])) == Difference(
        "aliases", '["a","b"]', '["b","a"]'
    )


def test_fields_the_checksum_does_not_read_never_appear() -> None:
    incumbent = base_card()
    rejected = base_card(
        migration_limit=3,
        model_type="Chat",
        user_data={"team": "x"},
        slug="other",
        runtime_config={"max_num_seqs": 8, "taints": ["t"]},
    )
    assert checksum_of(incumbent) == checksum_of(rejected)
    assert fields_between(incumbent, rejected) == []


def test_differences_follow_the_checksums_order() -> None:
    incumbent = base_card(16)
    rejected = base_card(32, display_name="other", aliases=["x"], needs=[["decode"]])
    assert fields_between(incumbent, rejected) == [
        "display_name",
        "kv_cache_block_size",
        "needs",
        "aliases",
    ]


def test_a_legacy_prefill_card_is_compared_after_normalization() -> None:
    legacy = base_card(model_type="Chat | Prefill", worker_type=None)
    explicit = base_card(model_type="Chat | Prefill", worker_type="prefill", needs=[["decode"]])
    assert fields_between(legacy, explicit) == []
    assert [
        (d.field, d.incumbent, d.rejected)
        for d in card_differences(normalized(legacy), normalized(base_card()))
    ] == [("worker_type", '"prefill"', '"aggregated"'), ("needs", '[["decode"]]', "[]")]


def test_a_tokenizer_override_is_applied_before_comparing() -> None:
    # Overrides change only unhashed runtime fields: the cards stay equal for the checksum.
    overridden = normalized(base_card(), BoundarySettings(tokenizer_backend="fastokens"))
    assert overridden.fields["runtime_config"]["tokenizer_backend"] == "fastokens"
    assert card_differences(overridden, normalized(base_card())) == ()


def test_a_long_value_is_shortened_with_its_length() -> None:
    name = "m" * 200
    difference = only(base_card(), base_card(display_name=name))
    assert difference.rejected == f'"{name[:59]}… (202 chars)'
    assert len(difference.rejected) <= MAX_VALUE_CHARS


def test_a_summary_shows_five_differences_then_how_many_more() -> None:
    many = [Difference(f"f{i}", "1", "2") for i in range(7)]
    assert summarize(many) == "f0 1 -> 2; f1 1 -> 2; f2 1 -> 2; f3 1 -> 2; f4 1 -> 2; and 2 more"
    assert summarize(many[:2]) == "f0 1 -> 2; f1 1 -> 2"


# --------------------------------------------------------------------------- the table


def test_the_table_of_inputs_adds_up_to_the_checksums_layout() -> None:
    seen = 0
    for line in CORPUS.read_text().splitlines():
        case = json.loads(line)
        if case["expected"] is None:
            continue
        try:
            card = normalized(json.loads(case["card_text"]))
        except (CardDecodeError, ValueError):
            continue
        parts = b"".join(part(card.fields) for _name, part in CHECKSUM_INPUTS)
        assert parts == _layout(card), case["name"]
        assert blake3.blake3(parts).hexdigest() == card_checksum(card)
        seen += 1
    assert seen >= 10


# --------------------------------------------------------------------------- the property

FILES = [checked("config.json", DIGEST_A), checked("x/config.json", DIGEST_B)]
ROUTERS = [
    ROUTER,
    {**ROUTER, "router_mode": "round_robin"},
    {**ROUTER, "kv_router_config": {"router_temperature": 0.5}},
    {**ROUTER, "kv_router_config": {"decode_active_request_weight": 0.0}},
    {**ROUTER, "kv_router_config": {"conditional_disagg_enabled": True}},
    {**ROUTER, "load_threshold_config": {"active_decode_blocks_threshold": 0.5}},
    {**ROUTER, "session_affinity_ttl_secs": 30, "enforce_disagg": True},
]
LEAVE_OUT = object()

# Each field gets a few values, so random pairs often agree on it; LEAVE_OUT drops the key.
CHOICES: dict[str, list[Any]] = {
    "display_name": ["Qwen/Qwen3-0.6B", "Qwen/Qwen3", "Qwen"],
    "source_path": [LEAVE_OUT, None, "", "-0.6B", "Qwen/Qwen3-0.6B"],
    "model_info": [None, {"hf_config_json": checked("config.json", DIGEST_A)}],
    "tokenizer": [
        None,
        {"hf_tokenizer_json": checked("tokenizer.json", DIGEST_A)},
        {"tik_token_model": checked("t.model", DIGEST_A)},
        {"hf_tokenizer_json": checked("tokenizer.json", DIGEST_B)},
    ],
    "gen_config": [LEAVE_OUT, {"hf_generation_config_json": checked("g.json", DIGEST_B)}],
    "prompt_context": [LEAVE_OUT, None, [], ["oai_chat"], ["oai_chat", "llama3_date_time"]],
    "context_length": [LEAVE_OUT, None, 4096, 8192],
    "architectural_max_context_length": [LEAVE_OUT, 4096, 8192],
    "kv_cache_block_size": [16, 32],
    "worker_type": ["aggregated", "decode"],
    "needs": [[], [["decode"]], [["decode"], ["encode"]]],
    "router_config": [LEAVE_OUT, None, *ROUTERS],
    "indexer_identity": [LEAVE_OUT, {"semantics": {"k": "v"}}, {"routing_scope": {"k": "w"}}],
    "aliases": [LEAVE_OUT, ["a"], ["a", "b"]],
    "extra_files": [LEAVE_OUT, FILES[:1], FILES, FILES[::-1]],
    "migration_limit": [0, 3],
    "user_data": [LEAVE_OUT, {"x": 1}],
}
RUNTIME_DATA: list[dict[str, Any]] = [
    {},
    {"vllm_enable_tower_connector_lora": True},
    {"vllm_enable_tower_connector_lora": "on", "vllm_inference_v1_generate": "1"},
    {"vllm_nemotron_video_processor_contract": {"b": 1, "a": [2]}},
    {"vllm_nemotron_video_processor_contract": None, "other": 1},
]


@st.composite
def cards(draw: st.DrawFn) -> dict[str, Any]:
    card = base_card()
    for name, values in CHOICES.items():
        value = draw(st.sampled_from(values))
        if value is LEAVE_OUT:
            card.pop(name, None)
        else:
            card[name] = value
    runtime: dict[str, Any] = {"runtime_data": draw(st.sampled_from(RUNTIME_DATA))}
    if draw(st.booleans()):
        runtime["context_length"] = draw(st.sampled_from([4096, 8192]))
    if draw(st.booleans()):
        runtime["max_num_seqs"] = 4
    card["runtime_config"] = runtime
    return card


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cards(), cards())
def test_differences_are_exactly_what_the_checksum_needs_undone(
    incumbent: dict[str, Any], rejected: dict[str, Any]
) -> None:
    differences = card_differences(normalized(incumbent), normalized(rejected))
    fields = [d.field for d in differences]
    assert len(set(fields)) == len(fields)
    assert (not fields) == (checksum_of(incumbent) == checksum_of(rejected))
    # Nothing missing: undoing every listed input gives the incumbent's checksum.
    assert checksum_of(reverted(rejected, incumbent, fields)) == checksum_of(incumbent)
    # Nothing extra: leaving any one of them as it was keeps the checksums apart.
    for kept in fields:
        others = [f for f in fields if f != kept]
        assert checksum_of(reverted(rejected, incumbent, others)) != checksum_of(incumbent), kept
    for difference in differences:
        assert difference.incumbent != difference.rejected


@settings(max_examples=200, deadline=None)
@given(cards())
def test_the_table_of_inputs_adds_up_to_the_layout_of_any_card(card: dict[str, Any]) -> None:
    decoded = normalized(card)
    assert b"".join(part(decoded.fields) for _name, part in CHECKSUM_INPUTS) == _layout(decoded)
