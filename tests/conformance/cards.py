"""Hypothesis strategies for model deployment cards, valid and invalid, written as JSON text.

Cards are built as trees in which a few marker nodes control the exact text: ``Lit`` writes a
literal (``-0``, ``1e400``, a 25-digit decimal), ``Dup`` writes an object with a repeated key,
``Arr`` writes a struct in its array form. ``render`` turns the tree into JSON text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

HASHES = ["ab" * 32, "0123456789abcdef" * 4, "f" * 64, "0" * 64]


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Dup:
    pairs: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Arr:
    items: tuple[Any, ...]


def render(node: Any) -> str:
    if isinstance(node, Lit):
        return node.text
    if isinstance(node, Dup):
        return "{" + ",".join(f"{json.dumps(k)}:{render(v)}" for k, v in node.pairs) + "}"
    if isinstance(node, Arr):
        return "[" + ",".join(render(v) for v in node.items) + "]"
    if isinstance(node, dict):
        return (
            "{"
            + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{render(v)}" for k, v in node.items())
            + "}"
        )
    if isinstance(node, list):
        return "[" + ",".join(render(v) for v in node) + "]"
    if isinstance(node, float):
        return repr(node) if node == node and abs(node) != float("inf") else "0"
    return json.dumps(node, ensure_ascii=False)


ABSENT = object()

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
names = st.one_of(st.sampled_from(["foo", "Org/Model-7B", "", "Ünï ☃", "a b", "x" * 40]), texts)

numbers_odd = st.one_of(
    st.integers(-(2**65), 2**65),
    st.sampled_from(
        [
            Lit("-0"),
            Lit("1e400"),
            Lit("-1e400"),
            Lit("1e-400"),
            Lit("0.1000000000000000055511151231257827"),
            Lit("123456789.123456789123456789"),
            Lit("18446744073709551616"),
            Lit("-9223372036854775809"),
            Lit("1E2"),
            Lit("2.5e-5"),
            Lit("1.0"),
            Lit("4294967296"),
            Lit("4294967295"),
        ]
    ),
    st.floats(allow_nan=False, allow_infinity=False),
)


def rare(
    valid: st.SearchStrategy[Any], invalid: st.SearchStrategy[Any], one_in: int = 12
) -> st.SearchStrategy[Any]:
    """Mostly ``valid``; one draw in ``one_in`` from ``invalid``."""
    # Hypothesis favours boundary integers, so pick the branch from an explicit list.
    return st.sampled_from([True] * (one_in - 1) + [False]).flatmap(
        lambda ok: valid if ok else invalid
    )


numbers_any = numbers_odd


def u32s() -> st.SearchStrategy[Any]:
    return rare(
        st.one_of(
            st.integers(0, 2**32 - 1),
            st.integers(0, 100_000),
            st.sampled_from([0, 1, 16, 4096, 2**32 - 1]),
        ),
        numbers_odd,
    )


def floats_field() -> st.SearchStrategy[Any]:
    return rare(
        st.one_of(
            st.sampled_from([0, 1, 0.5, 0.25, 0.7, 0.1, Lit("0.3333333333333333333333333")]),
            st.floats(0, 1, allow_nan=False),
            st.sampled_from(
                [Lit("0.1000000000000000055511151231257827"), Lit("1e-7"), Lit("2.5e-5")]
            ),
        ),
        st.one_of(
            numbers_odd,
            st.sampled_from(
                [
                    1.5,
                    120,
                    1e16,
                    Lit("1.000000000000000000001"),
                    Lit("123456789.123456789123456789"),
                ]
            ),
            st.floats(0, 1e20, allow_nan=False),
        ),
        one_in=4,
    )


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
json_values = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)),
    max_leaves=8,
)


def deep(levels: int) -> Lit:
    return Lit("[" * levels + "]" * levels)


def checked_files(paths: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[Any]:
    path = paths if paths is not None else file_paths
    checksum = st.one_of(
        st.sampled_from(HASHES).map(lambda h: f"blake3:{h}"),
        st.sampled_from([f"blake3:{'AB' * 32}", "sha256:" + "ab" * 32, "blake3:abc", "blake3"]),
    )
    checksum = rare(st.sampled_from(HASHES).map(lambda h: f"blake3:{h}"), checksum, 20)

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        p, c = draw(path), draw(checksum)
        size = draw(
            rare(
                st.sampled_from([ABSENT, ABSENT, 0, 1234, None]),
                st.sampled_from([-1, 2**64, "1"]),
                20,
            )
        )
        form = draw(st.sampled_from(["map", "map", "map", "arr"]))
        if form == "arr":
            return Arr((p, c) if size is ABSENT else (p, c, size))
        out: dict[str, Any] = {"path": p, "checksum": c}
        if size is not ABSENT:
            out["size"] = size
        return out

    return build()


file_paths = st.one_of(
    st.sampled_from(
        [
            "/models/m/config.json",
            "hf://Org/Model/tokenizer.json",
            "https://host:8080/v1/metadata/ns/c/e/slug/_base/preprocessor_config.json",
            "https://h/a/b/",
            "https://h/a/%7Bx%7D.json",
            "https://h/a/{x} y.json",
            "https://h/a/../b/./c.json",
            "https://h/a/b/..",
            "https://h/a/b/.",
            "https://h/a\\b\\c.json",
            "http://h",
            "http://h?x=1#f",
            "file:///tmp/x/y.json",
            "file:///tmp/x/",
            "tok:en.json",
            "tok:/a/b.json",
            "s3://bucket/key/obj.bin",
            "relative/dir/file.txt",
            "dir/",
            "a/..",
            "a/.",
            ".",
            "/",
            "",
            "C:\\x\\y.json",
            "weird name ü.json",
            "x/%41.json",
            "https://h/ü/é.json",
            "HTTPS://H/A/B.JSON",
            "  https://h/a.json  ",
            "https://h/a%2e%2e/b",
            "https://h/%2e%2E/z.json",
            "mailto:a@b",
            "a:b:c",
            "1http://x/y",
            "http:foo",
            "https:///x.json",
            "http://h:99999/a.json?x",
            "http://1.2.3.4.5/x.json?q",
            "http://0x7f.1/x.json?q",
            "http://[::1]:80/z.json",
            "http://[zz]/z.json?q",
            "https://a b/c.json?q",
            "file://host/x.json?q",
            "http://user:pw@h/a.json",
            "https:?x",
            "data:text/plain,hi",
            "http://h/tab\there.json",
        ]
    ),
    texts,
)

SLOT_VARIANTS = {
    "model_info": ["hf_config_json"],
    "tokenizer": ["hf_tokenizer_json", "tik_token_model"],
    "gen_config": ["hf_generation_config_json"],
}
FORMATTER_VARIANTS = [
    "hf_tokenizer_config_json",
    "hf_chat_template",
    "hf_chat_template_jinja",
    "hf_chat_template_json",
]


@st.composite
def slot(draw: st.DrawFn, field: str) -> Any:
    kind = draw(rare(st.sampled_from(["null", "variant", "variant"]), st.just("bad"), 20))
    if kind == "null":
        return None
    if kind == "bad":
        return draw(st.sampled_from(["hf_config_json", {}, {"nope": {}}, [], 3]))
    if field in ("prompt_formatter", "chat_template_file"):
        variant = draw(st.sampled_from(FORMATTER_VARIANTS))
        if variant == "hf_tokenizer_config_json":
            return {variant: draw(checked_files())}
        inner: Any = {"is_custom": draw(st.booleans()), "file": draw(checked_files())}
        if draw(st.booleans()) and draw(st.booleans()):
            inner = Arr((inner["is_custom"], inner["file"]))
        return {variant: inner}
    variant = draw(st.sampled_from(SLOT_VARIANTS[field]))
    return {variant: draw(checked_files())}


MODEL_TYPES = [
    "Chat",
    "Chat|Completions",
    "Completions | Chat",
    "",
    " ",
    "Prefill",
    "Embedding",
    "TensorBased",
    "Images|Videos|Audios",
    "Classify | Pooling",
    "Rerank",
    "Realtime",
    "0x3",
    "0x1000",
    "0x+1",
    "chat",
    "Chat||Completions",
    "Chat|",
    "Empty",
    "0xffffff",
    "\tChat ",
]

KV_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "overlap_score_credit": floats_field(),
    "overlap_score_credit_decay": floats_field(),
    "prefill_load_scale": floats_field(),
    "decode_active_request_weight": floats_field(),
    "overlap_score_weight": st.one_of(st.none(), floats_field()),
    "host_cache_hit_weight": floats_field(),
    "disk_cache_hit_weight": floats_field(),
    "router_temperature": floats_field(),
    "use_kv_events": st.booleans(),
    "durable_kv_events": rare(st.just(False), st.just(True)),
    "router_replica_sync": st.booleans(),
    "router_track_active_blocks": st.booleans(),
    "router_track_output_blocks": st.booleans(),
    "router_assume_kv_reuse": st.booleans(),
    "router_track_prefill_tokens": st.booleans(),
    "router_tracking_hash": rare(
        st.sampled_from(["public-xxh3-v1", "keyed-xxh3-v1"]), st.just("xx")
    ),
    "router_tracking_key_id": st.one_of(st.none(), texts),
    "router_prefill_load_model": rare(st.sampled_from(["none", "aic", "ais"]), st.just("bad")),
    "router_snapshot_threshold": st.one_of(st.none(), u32s()),
    "router_reset_states": st.booleans(),
    "router_ttl_secs": floats_field(),
    "router_queue_threshold": st.one_of(st.none(), floats_field()),
    "router_event_threads": u32s(),
    "skip_initial_worker_wait": st.booleans(),
    "router_queue_policy": rare(st.sampled_from(["fcfs", "lcfs", "wspt"]), st.just("x")),
    "use_remote_indexer": st.booleans(),
    "serve_indexer": st.booleans(),
    "enable_session_prefix_index": st.booleans(),
    "shared_cache_multiplier": st.one_of(st.none(), floats_field()),
    "shared_cache_type": rare(st.sampled_from(["none", "hicache"]), st.just("x")),
    "router_predicted_ttl_secs": st.one_of(st.none(), floats_field()),
    "conditional_disagg_enabled": st.booleans(),
    "conditional_disagg_policy": st.sampled_from(
        ["isl_bounding", "prefill_load", "isl_or_load", "x"]
    ),
    "conditional_disagg_eff_isl_threshold": u32s(),
    "conditional_disagg_eff_isl_ratio_threshold": floats_field(),
    "conditional_disagg_prefill_busy_threshold": st.one_of(st.none(), floats_field()),
    "conditional_disagg_decode_busy_threshold": st.one_of(st.none(), floats_field()),
}


@st.composite
def router_configs(draw: st.DrawFn, files: dict[str, str]) -> Any:
    kv: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(sorted(KV_FIELDS)), max_size=8, unique=True)):
        kv[name] = draw(KV_FIELDS[name])
    if files and draw(st.integers(0, 5)) == 0:
        kv["router_policy_config"] = draw(st.sampled_from(sorted(files.values())))
    if files and draw(st.integers(0, 8)) == 0:
        kv["router_tracking_hash"] = "keyed-xxh3-v1"
        kv["router_tracking_key_file"] = draw(st.sampled_from(sorted(files.values())))
        kv["router_tracking_key_id"] = draw(st.sampled_from(["k1", ""]))
    if draw(st.integers(0, 60)) == 0:
        kv["not_a_field"] = 1
    load: dict[str, Any] = {}
    if draw(st.booleans()):
        load["active_decode_blocks_threshold"] = draw(st.one_of(st.none(), floats_field()))
    if draw(st.booleans()):
        load["active_prefill_tokens_threshold"] = draw(st.one_of(st.none(), u32s()))
    if draw(st.booleans()):
        load["active_prefill_tokens_threshold_frac"] = draw(st.one_of(st.none(), floats_field()))
    out: dict[str, Any] = {
        "router_mode": draw(
            st.sampled_from(
                [
                    "k_v",
                    "round_robin",
                    "random",
                    "power_of_two_choices",
                    "direct",
                    "least_loaded",
                    "device_aware_weighted",
                    "kv",
                ]
            )
        ),
        "kv_router_config": kv,
        "load_threshold_config": load,
    }
    for name, strat in (
        ("enforce_disagg", st.booleans()),
        ("session_affinity_ttl_secs", st.one_of(st.none(), u32s())),
        ("session_affinity_mode", rare(st.sampled_from(["hard", "soft"]), st.just("x"))),
    ):
        if draw(st.booleans()):
            out[name] = draw(strat)
    drop = draw(st.integers(0, 40))
    if drop == 0:
        out.pop("kv_router_config")
    elif drop == 1:
        out.pop("load_threshold_config")
    return out


TRUTHY = [
    "true",
    " TRUE ",
    "1",
    "yes",
    "On",
    "no",
    "0",
    "",
    "\x1ftrue",
    "true\u00a0",
    "\u3000on",
    1,
    True,
    False,
    None,
]


@st.composite
def runtime_configs(draw: st.DrawFn) -> Any:
    rc: dict[str, Any] = {}
    options: dict[str, st.SearchStrategy[Any]] = {
        "context_length": st.one_of(st.none(), u32s()),
        "total_kv_blocks": st.one_of(st.none(), u32s()),
        "max_num_seqs": st.one_of(st.none(), u32s()),
        "tool_call_parser": st.one_of(st.none(), texts),
        "tool_call_arguments_format": rare(
            st.sampled_from(["json_string", "json_object"]), st.just("x")
        ),
        "tokenizer_backend": rare(
            st.sampled_from([None, "default", "fastokens", "basetenkenizer"]), st.just("x")
        ),
        "tokenizer_fallback_enabled": st.one_of(st.none(), st.booleans()),
        "structural_tag_mode": rare(st.sampled_from(["off", "on"]), st.just("x")),
        "exclude_tools_when_tool_choice_none": st.booleans(),
        "data_parallel_size": u32s(),
        "enable_local_indexer": st.booleans(),
        "kv_state_endpoint": st.sampled_from(
            [None, {"namespace": "a", "component": "b", "name": "c"}, {"namespace": "a"}]
        ),
        "enable_eagle": st.booleans(),
        "taints": st.lists(texts, max_size=3),
        "stable_routing_id": st.one_of(st.none(), texts),
        "topology_domains": st.dictionaries(texts, texts, max_size=2),
        "structural_tag": st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {},
                optional={
                    "scope": rare(st.sampled_from(["auto", "always"]), st.just("x")),
                    "schema": rare(st.sampled_from(["auto", "strict"]), st.just("x")),
                    "allow_tool_calls_with_structured_output": st.booleans(),
                    "exclude_special_tokens": st.one_of(st.none(), st.booleans()),
                    "reasoning_boundary": rare(
                        st.sampled_from(["auto", "structural_tag", "backend"]), st.just(None)
                    ),
                    "tool_arguments_any_order": rare(st.booleans(), st.just(1)),
                },
            ),
        ),
        "disaggregated_endpoint": st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {},
                optional={
                    "bootstrap_host": st.one_of(st.none(), texts),
                    "bootstrap_port": st.one_of(st.none(), st.integers(-1, 70000)),
                },
            ),
            st.just(Arr(("h", 1))),
        ),
        "kv_transfer_enforcement": rare(
            st.sampled_from([None, "required", "preferred"]), st.just("x")
        ),
        "kv_transfer_preferred_weight": st.one_of(st.none(), st.floats(-10, 10)),
        "max_gpu_lora_count": st.one_of(st.none(), u32s()),
    }
    for name in draw(st.lists(st.sampled_from(sorted(options)), max_size=5, unique=True)):
        rc[name] = draw(options[name])
    if draw(st.booleans()):
        data: dict[str, Any] = {}
        for key in draw(
            st.lists(
                st.sampled_from(
                    [
                        "vllm_enable_tower_connector_lora",
                        "vllm_inference_v1_generate",
                        "vllm_nemotron_video_processor_contract",
                        "other",
                    ]
                ),
                max_size=3,
                unique=True,
            )
        ):
            if key == "vllm_nemotron_video_processor_contract":
                data[key] = draw(
                    st.one_of(
                        json_values,
                        st.sampled_from(
                            [
                                Lit("1.0"),
                                Lit("1"),
                                Lit("-1180591620717411303424"),
                                {"b": 1, "a": [1.5, {"z": None, "y": 2}]},
                            ]
                        ),
                    )
                )
            else:
                data[key] = draw(st.sampled_from(TRUTHY))
        rc["runtime_data"] = data
        if draw(st.integers(0, 15)) == 0:
            rc["runtime_data"] = Dup(
                (("vllm_inference_v1_generate", "false"), ("vllm_inference_v1_generate", "true"))
            )
        if draw(st.integers(0, 50)) == 0:
            rc["runtime_data"] = None
    return rc


CARD_ORDER = (
    "display_name",
    "slug",
    "source_path",
    "model_info",
    "tokenizer",
    "prompt_formatter",
    "chat_template_file",
    "gen_config",
    "prompt_context",
    "architectural_max_context_length",
    "context_length",
    "kv_cache_block_size",
    "migration_limit",
    "model_type",
    "model_input",
    "worker_type",
    "needs",
    "lora",
    "aliases",
    "user_data",
    "runtime_config",
    "tensor_model_config",
    "media_decoder",
    "media_fetcher",
    "router_config",
    "indexer_identity",
    "extra_files",
)
CARD_DEFAULTS: dict[str, Any] = {
    "needs": [],
    "aliases": [],
    "runtime_config": {},
    "extra_files": [],
}
LTC_ORDER = (
    "active_decode_blocks_threshold",
    "active_prefill_tokens_threshold",
    "active_prefill_tokens_threshold_frac",
)

LIMITS = st.fixed_dictionaries(
    {},
    optional={
        "max_image_width": st.one_of(st.none(), u32s()),
        "max_image_height": st.one_of(st.none(), u32s()),
        "max_alloc": st.one_of(st.none(), st.integers(0, 2**64)),
    },
)
MEDIA_DECODERS = st.one_of(
    st.none(),
    st.just({}),
    st.just([]),
    st.fixed_dictionaries(
        {},
        optional={
            "image": st.one_of(
                st.none(),
                st.fixed_dictionaries({}, optional={"limits": st.one_of(st.none(), LIMITS)}),
            )
        },
    ),
    st.sampled_from(
        [
            {"image": {"zz": 1}},
            {"image": True},
            {"video": {}},
            {"image": {"limits": {"zz": 1}}},
            True,
        ]
    ),
)
MEDIA_FETCHERS = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "user_agent": texts,
            "allow_direct_ip": st.booleans(),
            "allow_direct_port": st.booleans(),
            "allow_private_ips": st.booleans(),
        },
        optional={
            "allowed_media_domains": st.one_of(st.none(), st.lists(texts, max_size=2)),
            "timeout": st.one_of(
                st.none(),
                st.fixed_dictionaries(
                    {"secs": st.integers(0, 2**64), "nanos": st.integers(0, 2**32)}
                ),
                st.just(Arr((1, 2))),
                st.just({"secs": 1}),
                st.just(5),
            ),
        },
    ),
    st.just({}),
    st.just({"user_agent": "u"}),
)
TENSOR_META = st.fixed_dictionaries(
    {
        "name": texts,
        "data_type": st.sampled_from(
            ["Bool", "Uint8", "Int64", "Float32", "BFloat16", "Bytes", "x"]
        ),
        "shape": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3),
    },
    optional={
        "parameters": st.one_of(
            st.sampled_from([None, {}]),
            st.dictionaries(
                texts,
                st.sampled_from(
                    [
                        {"bool": True},
                        {"int64": -5},
                        {"int64": 2**63},
                        {"string": "s"},
                        {"double": 1.5},
                        {"uint64": 2**64 - 1},
                        {"zz": 1},
                        "bool",
                    ]
                ),
                max_size=2,
            ),
        )
    },
)
TENSOR_CONFIGS = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "name": texts,
            "inputs": st.lists(TENSOR_META, max_size=2),
            "outputs": st.lists(TENSOR_META, max_size=2),
        },
        optional={
            "triton_model_config": st.one_of(st.none(), st.lists(st.integers(0, 256), max_size=3))
        },
    ),
    st.sampled_from([{}, {"name": "x"}, {"name": "x", "inputs": [], "outputs": [], "zz": 1}]),
)


@st.composite
def cards(draw: st.DrawFn, files: dict[str, str] | None = None) -> str:
    """A card as JSON text: mostly valid, sometimes not, in every field."""
    files = files or {}
    c: dict[str, Any] = {}
    c["display_name"] = draw(names)
    c["slug"] = draw(
        rare(
            st.sampled_from(["foo", "org_model-7b", "a", ""]),
            st.sampled_from(["Foo", "a.b", "ü"]),
            20,
        )
    )
    if draw(st.booleans()):
        c["source_path"] = draw(st.one_of(st.none(), names))
    for field in (
        "model_info",
        "tokenizer",
        "prompt_formatter",
        "chat_template_file",
        "gen_config",
    ):
        if draw(st.booleans()):
            c[field] = draw(slot(field))
        elif field in ("model_info", "tokenizer") and draw(st.booleans()):
            c[field] = None
    if draw(st.booleans()):
        c["prompt_context"] = draw(
            st.one_of(
                st.none(),
                st.lists(st.sampled_from(["oai_chat", "llama3_date_time", "bad"]), max_size=3),
            )
        )
    for field in ("architectural_max_context_length", "context_length"):
        if draw(st.booleans()):
            c[field] = draw(st.one_of(st.none(), u32s()))
    c["kv_cache_block_size"] = draw(st.one_of(st.sampled_from([16, 0, 64]), u32s()))
    c["migration_limit"] = draw(st.one_of(st.just(0), u32s()))
    c["model_type"] = draw(
        rare(
            st.sampled_from(MODEL_TYPES[:13]),
            st.one_of(st.sampled_from(MODEL_TYPES[13:]), st.just(3)),
        )
    )
    c["model_input"] = draw(
        rare(st.sampled_from(["Tokens", "Tokens", "Text", "Tensor"]), st.just("tokens"), 30)
    )
    if draw(st.booleans()):
        c["worker_type"] = draw(
            st.sampled_from([None, "prefill", "decode", "encode", "aggregated", "Prefill"])
        )
    if draw(st.booleans()):
        wt = st.sampled_from(["prefill", "decode", "encode", "aggregated"])
        c["needs"] = draw(st.lists(st.lists(wt, max_size=3), max_size=3))
    if draw(st.integers(0, 3)) == 0:
        c["lora"] = draw(
            st.one_of(
                st.none(),
                st.fixed_dictionaries(
                    {"name": names}, optional={"max_gpu_lora_count": st.one_of(st.none(), u32s())}
                ),
                st.just(Arr(("x",))),
                rare(st.just({"name": "n"}), st.just({}), 10),
            )
        )
    if draw(st.booleans()):
        c["aliases"] = draw(st.lists(names, max_size=3))
    if draw(st.integers(0, 3)) == 0:
        c["user_data"] = draw(
            st.one_of(json_values, st.sampled_from([deep(126), deep(127), Lit("1e400")]))
        )
    if draw(st.booleans()):
        c["runtime_config"] = draw(runtime_configs())
    if draw(st.integers(0, 3)) == 0:
        c["media_decoder"] = draw(MEDIA_DECODERS)
    if draw(st.integers(0, 3)) == 0:
        c["media_fetcher"] = draw(MEDIA_FETCHERS)
    if draw(st.integers(0, 3)) == 0:
        c["tensor_model_config"] = draw(TENSOR_CONFIGS)
    if draw(st.booleans()):
        c["router_config"] = draw(st.one_of(st.none(), router_configs(files)))
    if draw(st.integers(0, 3)) == 0:
        ident = st.one_of(
            st.none(), st.dictionaries(texts, texts, min_size=1, max_size=3), st.just({})
        )
        c["indexer_identity"] = draw(
            st.one_of(
                st.none(),
                st.fixed_dictionaries({}, optional={"semantics": ident, "routing_scope": ident}),
            )
        )
    if draw(st.booleans()):
        c["extra_files"] = draw(st.lists(checked_files(), max_size=4))
    if draw(st.integers(0, 4)) == 0:
        c[draw(st.sampled_from(["unknown_field", "forward_inline_media_in_messages", "zz"]))] = (
            draw(
                st.one_of(json_values, st.sampled_from([deep(200), Lit("1e400"), Lit('"\\ud800"')]))
            )
        )
    if draw(st.integers(0, 15)) == 0 and isinstance(c.get("router_config"), dict):
        router = c["router_config"]
        head = [
            router.get("router_mode"),
            router.get("kv_router_config", {}),
            router.get("load_threshold_config", {}),
        ]
        ltc = head[2]
        if isinstance(ltc, dict) and draw(st.booleans()):
            head[2] = Arr(tuple(ltc.get(k) for k in LTC_ORDER))
        c["router_config"] = Arr(tuple(head))
    if draw(st.integers(0, 15)) == 0:
        values = [c.get(name, CARD_DEFAULTS.get(name)) for name in CARD_ORDER]
        return render(
            Arr(
                tuple(
                    values[: draw(rare(st.sampled_from(range(15, len(values) + 1)), st.just(14)))]
                )
            )
        )
    twist = draw(st.integers(0, 30))
    if twist == 0 and c:
        key = draw(st.sampled_from(sorted(c)))
        pairs = [*c.items(), (key, c[key])]
        return render(Dup(tuple(pairs)))
    if twist == 1:
        del c[draw(st.sampled_from(sorted(c)))]
    items = list(c.items())
    if draw(st.booleans()):
        items = draw(st.permutations(items))
    return render(dict(items))
