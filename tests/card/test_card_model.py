"""Card decoding and mdcsum: known answers from Dynamo 1.6.1, wire generations, serde rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from workerset_admission import CardDecodeError, mdcsum
from workerset_admission.card import decode_card, mdc_local_path, slug

H = "ab" * 32


def card(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "display_name": "foo",
        "slug": "foo",
        "model_info": None,
        "tokenizer": None,
        "kv_cache_block_size": 16,
        "migration_limit": 0,
        "model_type": "Chat|Completions",
        "model_input": "Tokens",
    }
    base.update(changes)
    return base


def checked(path: str, digest: str = H, **extra: object) -> dict[str, object]:
    return {"path": path, "checksum": f"blake3:{digest}", **extra}


FULL = card(
    source_path="Org/M",
    model_info={"hf_config_json": checked("/a/config.json")},
    tokenizer={"hf_tokenizer_json": checked("/a/t.json", "cd" * 32)},
    prompt_formatter={"hf_chat_template": {"is_custom": False, "file": checked("/x", "ef" * 32)}},
    prompt_context=["oai_chat", "llama3_date_time"],
    context_length=4096,
    worker_type="decode",
    needs=[["prefill"]],
    aliases=["a", "bb"],
    extra_files=[checked("/q/z.json"), checked("hf://Org/M/a.txt")],
)

# Checksums computed by Dynamo 1.6.1 (ModelDeploymentCard.from_json_str(...).local_dir()).
KNOWN = [
    (card(), "b8482a3fe7bb16f0ad9e79674b957d007a11ba1698236ffe3a9723305acd2480"),
    (FULL, "d7cc013779826b2cbadb009da155f735eb75ec0a19ca2727eafea58c9a33b173"),
    (
        card(
            router_config={
                "router_mode": "k_v",
                "kv_router_config": {"router_ttl_secs": 1e-7},
                "load_threshold_config": {"active_decode_blocks_threshold": 0.85},
            }
        ),
        "95032f4f0075c987669722f64f5d364c41de48f4f63db376c68c425aa59e9e51",
    ),
    (
        card(indexer_identity={"semantics": {"k": "v"}, "routing_scope": None}),
        "1b7a53f5aab0016115b3925233498e9ed2a786cc7d6d5ff01eebf05ac782cd63",
    ),
    (
        card(
            runtime_config={
                "runtime_data": {
                    "vllm_inference_v1_generate": " TRUE ",
                    "vllm_enable_tower_connector_lora": True,
                    "vllm_nemotron_video_processor_contract": {"b": 1, "a": [1.0, None]},
                }
            }
        ),
        "fac9227f53a6336fec8757e2a93c368532334fd382bb29a8e5334a2e99dbfddb",
    ),
]


@pytest.mark.parametrize(("value", "expected"), KNOWN)
def test_checksums_equal_dynamo_for_text_bytes_and_mappings(
    value: dict[str, object], expected: str
) -> None:
    text = json.dumps(value)
    assert mdcsum(text) == expected
    assert mdcsum(text.encode()) == expected
    assert mdcsum(value) == expected


def test_n1_and_n2_spellings_hash_like_the_current_ones() -> None:
    current = card(
        prompt_formatter={
            "hf_chat_template": {"is_custom": True, "file": checked("/t", "0" * 64, size=9)}
        }
    )
    old = card(
        prompt_formatter={
            "hf_chat_template_jinja": {"is_custom": True, "file": checked("/t", "0" * 64)}
        }
    )
    assert mdcsum(current) == mdcsum(old)


def test_the_top_level_context_length_is_the_last_fallback() -> None:
    n1 = card(context_length=8192)
    assert mdcsum(n1) == mdcsum(card(architectural_max_context_length=8192))
    assert mdcsum(card(context_length=8192, architectural_max_context_length=4096)) == mdcsum(
        card(architectural_max_context_length=4096)
    )
    assert mdcsum(card(runtime_config={"context_length": 1}, context_length=8192)) == mdcsum(
        card(architectural_max_context_length=1)
    )


def test_overlap_score_weight_is_read_as_prefill_load_scale() -> None:
    def router(kv: dict[str, object]) -> dict[str, object]:
        return card(
            router_config={
                "router_mode": "k_v",
                "kv_router_config": kv,
                "load_threshold_config": {},
            }
        )

    assert mdcsum(router({"overlap_score_weight": 2})) == mdcsum(router({"prefill_load_scale": 2}))
    assert mdcsum(router({"overlap_score_weight": 0})) == mdcsum(
        router({"prefill_load_scale": 0, "overlap_score_credit": 0})
    )


def test_absent_and_explicit_router_defaults_differ_as_in_dynamo() -> None:
    explicit = card(
        router_config={"router_mode": "k_v", "kv_router_config": {}, "load_threshold_config": {}}
    )
    assert mdcsum(explicit) != mdcsum(card())
    spelled_out = card(
        router_config={
            "router_mode": "k_v",
            "kv_router_config": {"router_ttl_secs": 120, "use_kv_events": True},
            "load_threshold_config": {},
            "session_affinity_mode": "hard",
        }
    )
    assert mdcsum(spelled_out) == mdcsum(explicit)


def test_unhashed_fields_do_not_change_the_checksum() -> None:
    assert mdcsum(
        card(migration_limit=3, model_type="Chat", user_data={"x": 1}, lora={"name": "l"})
    ) == mdcsum(card())


def test_extra_files_order_does_not_matter() -> None:
    a, b = checked("/x/one.json"), checked("https://h/two.json", "cd" * 32)
    assert mdcsum(card(extra_files=[a, b])) == mdcsum(card(extra_files=[b, a]))


def test_structs_may_be_given_as_arrays() -> None:
    as_array = [
        "foo",
        "foo",
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        16,
        0,
        "Chat|Completions",
        "Tokens",
    ]
    assert mdcsum(json.dumps(as_array)) == mdcsum(card())
    short = card(model_info={"hf_config_json": ["/a/config.json", f"blake3:{H}"]})
    assert mdcsum(short) == mdcsum(card(model_info={"hf_config_json": checked("/b/config.json")}))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"display_name":"a","display_name":"b"}', "duplicate_field"),
        (json.dumps(card(kv_cache_block_size=2**32)), "out_of_range"),
        (json.dumps(card(slug="Foo")), "invalid_slug"),
        (json.dumps(card(model_type="Chat||Completions")), "invalid_model_type"),
        (
            json.dumps(card(model_info={"hf_config_json": checked("/a", "AB" * 32)})),
            "invalid_checksum",
        ),
        (json.dumps(card())[:-1] + ',"user_data":' + "[" * 127 + "]" * 127 + "}", "depth_limit"),
        (json.dumps(card())[:-1] + ',"user_data":1e400}', "number_out_of_range"),
        (json.dumps(card())[:-1] + ',"kv_cache_block_size":-0}', "duplicate_field"),
        (json.dumps(card(migration_limit=-0.0)), "invalid_type"),
        (json.dumps(card(runtime_config={"runtime_data": None})), "invalid_type"),
        (json.dumps(card(display_name="\\ud800")).replace("\\\\", "\\"), "invalid_string"),
    ],
)
def test_cards_dynamo_refuses_raise_card_decode_error(text: str, reason: str) -> None:
    with pytest.raises(CardDecodeError) as info:
        mdcsum(text)
    assert info.value.reason == reason


def test_what_serde_skips_is_accepted() -> None:
    base = json.dumps(card())[:-1]
    deep = "[" * 300 + "]" * 300
    assert mdcsum(base + f',"unknown":{deep}}}') == mdcsum(card())
    assert mdcsum(base + ',"unknown":1e400,"other":"\\ud800"}') == mdcsum(card())
    assert mdcsum(base + ',"user_data":' + "[" * 125 + "]" * 125 + "}") == mdcsum(card())
    repeated = json.dumps(card(runtime_config={}))[:-2] + '"runtime_data":{"a":1,"a":2}}}'
    assert mdcsum(repeated) == mdcsum(card())


def test_router_policy_files_are_read_while_decoding(tmp_path: Path) -> None:
    def with_policy(path: Path) -> dict[str, object]:
        kv = {"router_policy_config": str(path)}
        return card(
            router_config={
                "router_mode": "k_v",
                "kv_router_config": kv,
                "load_threshold_config": {},
            }
        )

    good = tmp_path / "policy.yaml"
    good.write_text("router: {}\n")
    assert len(mdcsum(with_policy(good))) == 64
    for name, content in (
        ("empty.yaml", "{}\n"),
        ("bad.yaml", ": : :\n- x"),
        ("odd.yaml", "x: 1\n"),
    ):
        bad = tmp_path / name
        bad.write_text(content)
        with pytest.raises(CardDecodeError):
            mdcsum(with_policy(bad))
    with pytest.raises(CardDecodeError) as info:
        mdcsum(with_policy(tmp_path / "missing.yaml"))
    assert info.value.reason == "router_policy_config"


def test_a_decoded_card_exposes_its_normalized_fields() -> None:
    decoded = decode_card(json.dumps(FULL))
    assert decoded.display_name == "foo"
    assert decoded.worker_type == "decode"
    assert decoded.needs == [["prefill"]]
    assert decoded.runtime_config["data_parallel_size"] == 1


@pytest.mark.parametrize(
    ("name", "expected"),
    # Slugs Dynamo 1.6.1's register_model produced for these names.
    [
        ("Org/Name_X.v2 Ü", "org_name_x_v2__"),
        ("Tenant/A.B_c D", "tenant_a_b_c_d"),
        ("my-lora", "my-lora"),
        ("KELVIN\u212a", "kelvink"),
        ("İstanbul", "i_stanbul"),
        ("Straße ẞ", "stra_e__"),
        ("ÀÉ", ""),
        ("_a", "a"),
        ("é-é", "-_"),
        ("ÜÜ1", "1"),
    ],
)
def test_slugs_match_dynamo(name: str, expected: str) -> None:
    assert slug(name) == expected


def test_the_metadata_cache_path_is_rooted_in_home() -> None:
    assert (
        mdc_local_path("foo", "ab" * 32, home="/h")
        == f"/h/.cache/dynamo/mdc/by-slug/foo/{'ab' * 32}"
    )


@pytest.mark.parametrize(
    "kv",
    [
        # Each combination is refused by Dynamo 1.6.1 while each field alone is accepted.
        {"use_kv_events": False, "router_predicted_ttl_secs": 1},
        {"router_track_prefill_tokens": False, "router_prefill_load_model": "aic"},
        {"router_track_active_blocks": False, "router_track_output_blocks": True},
        {"use_remote_indexer": True, "serve_indexer": True},
        {"use_kv_events": False, "enable_session_prefix_index": True},
        {"use_remote_indexer": True, "enable_session_prefix_index": True},
        {"conditional_disagg_enabled": True, "conditional_disagg_policy": "prefill_load"},
        {"router_tracking_hash": "keyed-xxh3-v1", "router_tracking_key_file": "/k"},
        {"router_tracking_key_id": "k"},
    ],
)
def test_router_settings_that_contradict_each_other_are_refused(kv: dict[str, object]) -> None:
    router = {"router_mode": "k_v", "kv_router_config": kv, "load_threshold_config": {}}
    with pytest.raises(CardDecodeError) as info:
        mdcsum(card(router_config=router))
    assert info.value.reason == "invalid_router_config"
    for name, value in kv.items():
        alone = {
            "router_mode": "k_v",
            "kv_router_config": {name: value},
            "load_threshold_config": {},
        }
        if name not in (
            "router_tracking_key_id",
            "router_tracking_key_file",
            "router_tracking_hash",
        ):
            assert len(mdcsum(card(router_config=alone))) == 64
