"""Structure-aware card generator for differential fuzzing against Dynamo 1.6.1.

The 1.6.1 card schema is written out here on its own, as data (``CARD``), independently of the
decoder under test, so that the generator does not inherit the decoder's reading of the schema.
Every field of every section (router, runtime, LoRA, tokenizer and prompt slots, identity,
multimodal, tensor) gets a value drawn from a pool of boundary values for its type: lengths at
and around every limit, leading and trailing whitespace (Rust's and Python's, which differ),
non-ASCII and escaped text, integers at the edges of u8/u16/u32/u64/i64, floats in unusual
spellings and at the edges of f32/f64, every enum variant and misspelled ones. Around the
values the generator varies the structure: missing required fields, unknown and misspelled
field names, repeated keys, the array form of structs, key order and nesting depth.

Most values are valid for their type so that cards get deep into validation; a value is
invalid only now and then, so both verdicts are well represented. Hypothesis picks a seed and
a few knobs per card; a seeded ``random.Random`` fills in the leaves (see :func:`fuzz_cards`).
"""

from __future__ import annotations

import json
import random
import struct
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from .cards import Arr, Dup, Lit, render

# --------------------------------------------------------------------------- the 1.6.1 schema
# A type is one of: a scalar name ("str", "bool", "u8", "u16", "u32", "u64", "i64", "f32",
# "f64", "any"); a tuple ("opt", T), ("seq", T), ("map", T), ("enum", names),
# ("tagged", {variant: T}), ("struct", Struct); or a special name whose values obey an extra
# rule ("name", "slug", "checksum", "model_type", "identity_map", "policy_file", "key_file",
# "runtime_data"; "f64+" is a non-negative float, "f64%" one within [0, 1]).


@dataclass(frozen=True)
class F:
    """A struct field: name, type, and whether the generator always writes it (required)."""

    name: str
    type: Any
    required: bool = False


@dataclass(frozen=True)
class Struct:
    name: str
    fields: tuple[F, ...]
    deny_unknown: bool = False


def opt(t: Any) -> tuple[str, Any]:
    return ("opt", t)


def seq(t: Any) -> tuple[str, Any]:
    return ("seq", t)


def enum(*names: str) -> tuple[str, tuple[str, ...]]:
    return ("enum", names)


CHECKED_FILE = Struct(
    "CheckedFile",
    (F("path", "str", True), F("checksum", "checksum", True), F("size", opt("u64"))),
)
CHAT_TEMPLATE = Struct(
    "ChatTemplateFile", (F("is_custom", "bool", True), F("file", ("struct", CHECKED_FILE), True))
)
PROMPT_FORMATTER = (
    "tagged",
    {
        "hf_tokenizer_config_json": ("struct", CHECKED_FILE),
        "hf_chat_template": ("struct", CHAT_TEMPLATE),
        "hf_chat_template_jinja": ("struct", CHAT_TEMPLATE),
        "hf_chat_template_json": ("struct", CHAT_TEMPLATE),
    },
)
WORKER_TYPE = enum("prefill", "decode", "encode", "aggregated")
LORA = Struct("LoraInfo", (F("name", "str", True), F("max_gpu_lora_count", opt("u32"))))
ENDPOINT_ID = Struct(
    "EndpointId", (F("namespace", "str", True), F("component", "str", True), F("name", "str", True))
)
STRUCTURAL_TAG = Struct(
    "StructuralTagConfig",
    (
        F("scope", enum("auto", "always")),
        F("schema", enum("auto", "strict")),
        F("allow_tool_calls_with_structured_output", "bool"),
        F("exclude_special_tokens", opt("bool")),
        F("reasoning_boundary", enum("auto", "structural_tag", "backend")),
        F("tool_arguments_any_order", "bool"),
    ),
)
RUNTIME = Struct(
    "ModelRuntimeConfig",
    (
        F("context_length", opt("u32")),
        F("total_kv_blocks", opt("u64")),
        F("max_num_seqs", opt("u64")),
        F("max_num_batched_tokens", opt("u64")),
        F("tool_call_parser", opt("str")),
        F("reasoning_parser", opt("str")),
        F("tool_call_arguments_format", enum("json_string", "json_object")),
        F("tokenizer_backend", opt(enum("default", "fastokens", "basetenkenizer"))),
        F("tokenizer_fallback_enabled", opt("bool")),
        F("structural_tag", opt(("struct", STRUCTURAL_TAG))),
        F("structural_tag_mode", enum("off", "on")),
        F("structural_tag_scope", enum("auto", "always")),
        F("structural_tag_schema", enum("auto", "strict")),
        F("exclude_tools_when_tool_choice_none", "bool"),
        F("data_parallel_start_rank", "u32"),
        F("data_parallel_size", "u32"),
        F("enable_local_indexer", "bool"),
        F("kv_event_publishing_enabled", opt("bool")),
        F("kv_event_source_mode", opt("str")),
        F("kv_state_endpoint", opt(("struct", ENDPOINT_ID))),
        F("runtime_data", "runtime_data"),
        F(
            "disaggregated_endpoint",
            opt(
                (
                    "struct",
                    Struct(
                        "DisaggregatedEndpoint",
                        (F("bootstrap_host", opt("str")), F("bootstrap_port", opt("u16"))),
                    ),
                )
            ),
        ),
        F("enable_eagle", "bool"),
        F("taints", seq("str")),
        F("stable_routing_id", opt("str")),
        F("topology_domains", ("map", "str")),
        F("kv_transfer_domain", opt("str")),
        F("kv_transfer_enforcement", opt(enum("required", "preferred"))),
        F("kv_transfer_preferred_weight", opt("f32")),
        F("max_gpu_lora_count", opt("u32")),
    ),
)
# Router floats carry range rules (non-negative, or within [0, 1]): "f64+" and "f64%".
KV_ROUTER = Struct(
    "KvRouterConfig",
    (
        F("overlap_score_credit", "f64+"),
        F("overlap_score_credit_decay", "f64+"),
        F("prefill_load_scale", "f64+"),
        F("decode_active_request_weight", "f64+"),
        F("overlap_score_weight", opt("f64")),
        F("host_cache_hit_weight", "f64%"),
        F("disk_cache_hit_weight", "f64%"),
        F("router_temperature", "f64+"),
        F("use_kv_events", "bool"),
        F("durable_kv_events", "bool"),
        F("router_replica_sync", "bool"),
        F("router_track_active_blocks", "bool"),
        F("router_track_output_blocks", "bool"),
        F("router_assume_kv_reuse", "bool"),
        F("router_track_prefill_tokens", "bool"),
        F("router_tracking_hash", enum("public-xxh3-v1", "keyed-xxh3-v1")),
        F("router_tracking_key_file", opt("key_file")),
        F("router_tracking_key_id", opt("str")),
        F("router_prefill_load_model", enum("none", "aic", "ais")),
        F("router_snapshot_threshold", opt("u32")),
        F("router_reset_states", "bool"),
        F("router_ttl_secs", "f64+"),
        F("router_queue_threshold", opt("f64+")),
        F("router_policy_config", opt("policy_file")),
        F("router_event_threads", "u32"),
        F("skip_initial_worker_wait", "bool"),
        F("router_queue_policy", enum("fcfs", "lcfs", "wspt")),
        F("use_remote_indexer", "bool"),
        F("serve_indexer", "bool"),
        F("enable_session_prefix_index", "bool"),
        F("shared_cache_multiplier", opt("f64%")),
        F("shared_cache_type", enum("none", "hicache")),
        F("router_predicted_ttl_secs", opt("f64+")),
        F("conditional_disagg_enabled", "bool"),
        F("conditional_disagg_policy", enum("isl_bounding", "prefill_load", "isl_or_load")),
        F("conditional_disagg_eff_isl_threshold", "u64"),
        F("conditional_disagg_eff_isl_ratio_threshold", "f64%"),
        F("conditional_disagg_prefill_busy_threshold", opt("f64+")),
        F("conditional_disagg_decode_busy_threshold", opt("f64+")),
    ),
    deny_unknown=True,
)
LOAD_THRESHOLD = Struct(
    "LoadThresholdConfig",
    (
        F("active_decode_blocks_threshold", opt("f64")),
        F("active_prefill_tokens_threshold", opt("u64")),
        F("active_prefill_tokens_threshold_frac", opt("f64")),
    ),
)
ROUTER = Struct(
    "RouterConfig",
    (
        F(
            "router_mode",
            enum(
                "round_robin",
                "random",
                "power_of_two_choices",
                "k_v",
                "direct",
                "least_loaded",
                "device_aware_weighted",
            ),
            True,
        ),
        F("kv_router_config", ("struct", KV_ROUTER), True),
        F("load_threshold_config", ("struct", LOAD_THRESHOLD), True),
        F("enforce_disagg", "bool"),
        F("session_affinity_ttl_secs", opt("u64")),
        F("session_affinity_mode", enum("hard", "soft")),
    ),
)
IDENTITY = Struct(
    "IndexerIdentitySpec",
    (F("semantics", opt("identity_map")), F("routing_scope", opt("identity_map"))),
)
IMAGE_LIMITS = Struct(
    "ImageDecoderLimits",
    (
        F("max_image_width", opt("u32")),
        F("max_image_height", opt("u32")),
        F("max_alloc", opt("u64")),
    ),
    deny_unknown=True,
)
MEDIA_DECODER = Struct(
    "MediaDecoder",
    (
        F(
            "image",
            opt(
                (
                    "struct",
                    Struct("ImageDecoder", (F("limits", ("struct", IMAGE_LIMITS)),), True),
                )
            ),
        ),
    ),
)
MEDIA_FETCHER = Struct(
    "MediaFetcher",
    (
        F("user_agent", "str", True),
        F("allow_direct_ip", "bool", True),
        F("allow_direct_port", "bool", True),
        F("allow_private_ips", "bool", True),
        F("allowed_media_domains", opt(seq("str"))),
        F(
            "timeout",
            opt(
                (
                    "struct",
                    Struct("Duration", (F("secs", "u64", True), F("nanos", "u32", True)), True),
                )
            ),
        ),
    ),
)
TENSOR_META = Struct(
    "TensorMetadata",
    (
        F("name", "str", True),
        F(
            "data_type",
            enum(
                "Bool",
                "Uint8",
                "Uint16",
                "Uint32",
                "Uint64",
                "Int8",
                "Int16",
                "Int32",
                "Int64",
                "Float16",
                "BFloat16",
                "Float32",
                "Float64",
                "Bytes",
            ),
            True,
        ),
        F("shape", seq("i64"), True),
        F(
            "parameters",
            (
                "map",
                (
                    "tagged",
                    {
                        "bool": "bool",
                        "int64": "i64",
                        "string": "str",
                        "double": "f64",
                        "uint64": "u64",
                    },
                ),
            ),
        ),
    ),
    deny_unknown=True,
)
TENSOR_CONFIG = Struct(
    "TensorModelConfig",
    (
        F("name", "str", True),
        F("inputs", seq(("struct", TENSOR_META)), True),
        F("outputs", seq(("struct", TENSOR_META)), True),
        F("triton_model_config", opt(seq("u8"))),
    ),
    deny_unknown=True,
)
CARD = Struct(
    "ModelDeploymentCard",
    (
        F("display_name", "name", True),
        F("slug", "slug", True),
        F("source_path", opt("name")),
        F("model_info", opt(("tagged", {"hf_config_json": ("struct", CHECKED_FILE)})), True),
        F(
            "tokenizer",
            opt(
                (
                    "tagged",
                    {
                        "hf_tokenizer_json": ("struct", CHECKED_FILE),
                        "tik_token_model": ("struct", CHECKED_FILE),
                    },
                )
            ),
            True,
        ),
        F("prompt_formatter", opt(PROMPT_FORMATTER)),
        F("chat_template_file", opt(PROMPT_FORMATTER)),
        F("gen_config", opt(("tagged", {"hf_generation_config_json": ("struct", CHECKED_FILE)}))),
        F("prompt_context", opt(seq(enum("oai_chat", "llama3_date_time")))),
        F("architectural_max_context_length", opt("u32")),
        F("context_length", opt("u32")),
        F("kv_cache_block_size", "u32", True),
        F("migration_limit", "u32", True),
        F("model_type", "model_type", True),
        F("model_input", enum("Text", "Tokens", "Tensor"), True),
        F("worker_type", opt(WORKER_TYPE)),
        F("needs", seq(seq(WORKER_TYPE))),
        F("lora", opt(("struct", LORA))),
        F("aliases", seq("name")),
        F("user_data", opt("any")),
        F("runtime_config", ("struct", RUNTIME)),
        F("tensor_model_config", opt(("struct", TENSOR_CONFIG))),
        F("media_decoder", opt(("struct", MEDIA_DECODER))),
        F("media_fetcher", opt(("struct", MEDIA_FETCHER))),
        F("router_config", opt(("struct", ROUTER))),
        F("indexer_identity", opt(("struct", IDENTITY))),
        F("extra_files", seq(("struct", CHECKED_FILE))),
    ),
)

# --------------------------------------------------------------------------- boundary pools

# Rust trims U+0009..U+000D, U+0020, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029,
# U+202F, U+205F, U+3000; Python's isspace also counts U+001C..U+001F. U+200B is neither.
WHITESPACE = [
    " ",
    "\t",
    "\n",
    "\r",
    "\x0b",
    "\x0c",
    "\x85",
    "\xa0",
    "\u1680",
    "\u2003",
    "\u2028",
    "\u2029",
    "\u202f",
    "\u205f",
    "\u3000",
    "\x1c",
    "\x1f",
    "\u200b",
    "\ufeff",
]
CHARS = [
    "a",
    "Z",
    "0",
    "-",
    "_",
    ".",
    "/",
    ":",
    " ",
    "é",
    "ß",
    "☃",
    "中",
    "𝄞",
    "\u0301",
    "\x00",
    "\x7f",
    '"',
    "\\",
    "\u2028",
    "\ufffd",
]
WORDS = ["k1", "a b", "Org/Model-7B", "node", "zone-a", "x" * 40, "m", "Qwen/Qwen3-0.6B"]
# The identity map's byte limits, one byte either side, in 1-, 2-, 3- and 4-byte characters.
LIMIT_BYTES = (128, 1024)
SIZED_TEXTS = sorted(
    {
        c * (n // len(c.encode())) + tail
        for limit in LIMIT_BYTES
        for n in (limit - 1, limit, limit + 1)
        for c in ("k", "é", "中", "𝄞")
        for tail in ("", "k")
    }
)
INT_EDGES = sorted(
    {
        0,
        1,
        2,
        7,
        16,
        127,
        128,
        255,
        256,
        65535,
        65536,
        2**31 - 1,
        2**31,
        2**32 - 1,
        2**32,
        2**53,
        2**53 + 1,
        2**63 - 1,
        2**63,
        2**64 - 1,
        2**64,
        2**65,
        -1,
        -(2**31),
        -(2**63),
        -(2**63) - 1,
        -(2**64),
    }
)
INT_SPELLINGS = [
    "-0",
    "1.0",
    "1e2",
    "1E2",
    "16.0",
    "0e0",
    "1e0",
    "-0.0",
    "1.5",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775808",
    "-9223372036854775809",
    "4294967295",
    "4294967296",
    "1" + "0" * 30,
]
FLOAT_SPELLINGS = [
    "0",
    "-0",
    "0.0",
    "-0.0",
    "1",
    "1.0",
    "1e0",
    "1E+0",
    "10e-1",
    "0.1e1",
    "5e-1",
    "0.5",
    "0.7",
    "0.70000000000000001",
    "0.30000000000000004",
    "1e-7",
    "2.5e-5",
    "4.9e-324",
    "5e-324",
    "2e-324",
    "1e-400",
    "1e308",
    "1.7976931348623157e308",
    "1.7976931348623158e308",
    "1.7976931348623159e308",
    "1e309",
    "-1e309",
    "3.4028235e38",
    "3.4028236e38",
    "3.5e38",
    "1.4e-45",
    "1e-46",
    "-1e-7",
    "-1",
    "1.000000000000000000001",
    "123456789.123456789",
    "18446744073709551616",
    "-9223372036854775809",
    "0.99999999999999999",
]
UNSIGNED_BITS = {"u8": 8, "u16": 16, "u32": 32, "u64": 64}
WRONG_TYPES: list[Any] = [None, True, 0, -1, 1.5, "", "x", [], {}, [1], {"x": 1}]
RUNTIME_DATA_KEYS = [
    "vllm_enable_tower_connector_lora",
    "vllm_inference_v1_generate",
    "vllm_qwen_video_processor_contract",
    "sglang_qwen_video_processor_contract",
    "vllm_nemotron_video_processor_contract",
    "other",
]
TRUTHY: list[Any] = [
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
MODEL_TYPE_NAMES = [
    "Chat",
    "Completions",
    "Embedding",
    "TensorBased",
    "Prefill",
    "Images",
    "Audios",
    "Videos",
    "Realtime",
    "Classify",
    "Pooling",
    "Rerank",
]
BAD_MODEL_TYPES = [
    "",
    " ",
    "0x3",
    "0x1000",
    "0x+1",
    "0x10000",
    "Chat||Completions",
    "\u3000Chat",
    "Chat\x1c",
    "Empty",
    "0xG",
    "chat",
]
SLUGS = ["foo", "org_model-7b", "a", "", "qwen_qwen3-0_6b"]
BAD_SLUGS = ["x" * 200 + "A", "Foo", "a.b", "ü", " a"]
HASHES = ["ab" * 32, "0123456789abcdef" * 4, "f" * 64, "0" * 64]
BAD_CHECKSUMS = [
    "blake3:" + "AB" * 32,
    "sha256:" + "ab" * 32,
    "blake3:abc",
    "blake3",
    " blake3:" + "ab" * 32,
    "blake3:" + "ab" * 32 + " ",
    "BLAKE3:" + "ab" * 32,
]
SECTIONS = [
    "router_config",
    "runtime_config",
    "lora",
    "tokenizer",
    "indexer_identity",
    "media_decoder",
    "media_fetcher",
    "tensor_model_config",
    "prompt_formatter",
    "chat_template_file",
    "user_data",
    "extra_files",
]


@dataclass(frozen=True)
class Esc:
    """A string written with \\u escapes: all non-ASCII, or every character."""

    text: str
    every: bool = False


def render_text(node: Esc) -> str:
    if not node.every:
        return json.dumps(node.text, ensure_ascii=True)
    out = []
    for ch in node.text:
        code = ord(ch)
        if code > 0xFFFF:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04X}")
        else:
            out.append(f"\\u{code:04x}")
    return '"' + "".join(out) + '"'


def deep(levels: int, leaf: str = "1") -> Lit:
    return Lit("[" * levels + leaf + "]" * levels)


@dataclass(frozen=True)
class Files:
    """Files on disk that some string fields name: router policies (the first one valid, the
    others refused by 1.6.1 in some way) and router tracking keys."""

    policies: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()


def misspellings(name: str) -> list[str]:
    variants = {
        name.upper(),
        name.capitalize(),
        name + " ",
        " " + name,
        name.replace("_", "-"),
        name.replace("-", "_"),
        name[:-1],
        name + name[-1:],
        name + "\u200b",
    }
    return sorted(variants - {name})


class Gen:
    """Fills a card from the schema with a seeded ``random.Random``, at boundary values.

    ``invalid_one_in`` is the odds of any one choice going invalid for its type (a wrong
    JSON type, an out-of-range number, a misspelled variant or field, a repeated key, a
    missing required field); 0 makes a clean card, which only cross-field rules may refuse.
    """

    def __init__(self, rnd: random.Random, files: Files, invalid_one_in: int) -> None:
        self.rnd = rnd
        self.files = files
        self.one_in = invalid_one_in

    def bad(self) -> bool:
        return self.one_in > 0 and self.rnd.randrange(self.one_in) == 0

    def odds(self, n: int) -> bool:
        return self.rnd.randrange(n) == 0

    # ----------------------------------------------------------------- text and numbers

    def text(self) -> str:
        rnd = self.rnd
        kind = rnd.randrange(10)
        if kind <= 2:
            core = "".join(rnd.choice(CHARS) for _ in range(rnd.randint(1, 6)))
        elif kind == 3:
            core = rnd.choice(SIZED_TEXTS)
        elif kind == 4:
            core = ""
        elif kind == 5:
            core = "".join(self.any_char() for _ in range(rnd.randint(0, 8)))
        else:
            core = rnd.choice(WORDS)
        if self.odds(4):
            side = rnd.randrange(3)
            if side != 1:
                core = self.padding() + core
            if side != 0:
                core = core + self.padding()
        return core

    def padding(self) -> str:
        return "".join(self.rnd.choice(WHITESPACE) for _ in range(self.rnd.randint(1, 2)))

    def any_char(self) -> str:
        while True:
            code = self.rnd.choice((0x7F, 0x7FF, 0xFFFF, 0x10FFFF))
            ch = chr(self.rnd.randint(0, code))
            if not 0xD800 <= ord(ch) <= 0xDFFF:  # lone surrogates cannot be UTF-8 text
                return ch

    def string(self, text: str | None = None) -> Any:
        text = self.text() if text is None else text
        spelling = self.rnd.randrange(10)
        if spelling == 0:
            return Esc(text)
        if spelling == 1:
            return Esc(text, every=True)
        return text

    def integer(self, bits: int | None) -> Any:
        """Values that fit ``bits`` (unsigned) or i64 (None), mostly at their edges; now and
        then any width's edges or another spelling of an integer, most of which do not fit."""
        rnd = self.rnd
        if self.bad():
            return rnd.choice(INT_EDGES) if rnd.random() < 0.6 else Lit(rnd.choice(INT_SPELLINGS))
        low, high = (0, 2**bits - 1) if bits else (-(2**63), 2**63 - 1)
        if rnd.random() < 0.5:
            return rnd.choice([n for n in INT_EDGES if low <= n <= high])
        return rnd.randint(low, min(high, 100_000))

    def floating(self, rule: str) -> Any:
        """A float for a field with ``rule`` ("%": within [0, 1], "+": non-negative, "": any),
        now and then in an unusual spelling or at or past the edges of f32 and f64."""
        rnd = self.rnd
        if self.bad():
            if rnd.random() < 0.7:
                return Lit(rnd.choice(FLOAT_SPELLINGS))
            return rnd.choice([-1.0, -0.0, 1.0000000000000002, 0.9999999999999999, 1e16, 2**64])
        pick = rnd.randrange(4)
        if rule == "%":
            return [rnd.random(), 0, 1, Lit(rnd.choice(["0.5", "1e-7", "1.0", "0.7"]))][pick]
        if rule == "+":
            return [
                rnd.uniform(0, 1e6),
                rnd.randint(0, 1000),
                Lit(rnd.choice(["0", "2.5e-5", "1E+2", "0.30000000000000004", "5e-324"])),
                rnd.random(),
            ][pick]
        if pick == 0:
            bits = struct.unpack("<d", rnd.getrandbits(64).to_bytes(8, "little"))[0]
            if bits == bits and abs(bits) != float("inf"):
                return bits
        return rnd.uniform(-1e9, 1e9)

    def any_value(self, depth: int) -> Any:
        rnd = self.rnd
        if self.odds(6):
            return deep(max(rnd.choice([124, 125, 126, 127, 128, 129]) - depth, 1))
        kind = rnd.randrange(8)
        if depth < 4 and kind == 0:
            return [self.any_value(depth + 1) for _ in range(rnd.randint(0, 3))]
        if depth < 4 and kind == 1:
            return Dup(
                tuple((self.string(), self.any_value(depth + 1)) for _ in range(rnd.randint(0, 3)))
            )
        return rnd.choice(
            [
                None,
                True,
                False,
                rnd.choice(INT_EDGES),
                self.floating(""),
                self.string(),
                Lit(rnd.choice(FLOAT_SPELLINGS)),
            ]
        )

    # ----------------------------------------------------------------- schema types

    def value(self, t: Any, depth: int) -> Any:
        if self.bad() and self.odds(4):
            return self.rnd.choice(WRONG_TYPES)
        if isinstance(t, tuple):
            kind = t[0]
            if kind == "opt":
                return None if self.odds(4) else self.value(t[1], depth)
            if kind == "seq":
                size = self.rnd.choice([0, 0, 1, 1, 2, 3])
                return [self.value(t[1], depth + 1) for _ in range(size)]
            if kind == "map":
                size = self.rnd.randint(0, 3)
                return Dup(tuple((self.string(), self.value(t[1], depth + 1)) for _ in range(size)))
            if kind == "enum":
                return self.enum(t[1])
            if kind == "tagged":
                return self.tagged(t[1], depth)
            if kind == "struct":
                return self.struct(t[1], depth + 1)
            raise AssertionError(t)
        return self.scalar(t, depth)

    def enum(self, names: tuple[str, ...]) -> Any:
        name = self.rnd.choice(names)
        if self.bad():
            return self.rnd.choice(
                [
                    self.rnd.choice(misspellings(name)),
                    {name: None},
                    {name: 1},
                    Dup(((name, None), (name, None))),
                ]
            )
        return {name: None} if self.odds(40) else name

    def tagged(self, variants: dict[str, Any], depth: int) -> Any:
        name = self.rnd.choice(sorted(variants))
        content = self.value(variants[name], depth + 1)
        if self.bad():
            return self.rnd.choice(
                [
                    name,
                    {},
                    Dup(((name, content), (name, content))),
                    {name: content, "x": 1},
                    {self.rnd.choice(misspellings(name)): content},
                ]
            )
        return {name: content}

    def struct(self, s: Struct, depth: int) -> Any:
        rnd = self.rnd
        pairs: list[tuple[Any, Any]] = []
        for f in s.fields:
            present = f.required or self.odds(3)
            if f.required and self.bad() and self.odds(2):
                present = False
            if present:
                pairs.append((f.name, self.value(f.type, depth)))
        if s is KV_ROUTER and not self.bad():
            pairs = self.coherent_tracking(pairs)
        if self.bad() and self.odds(3):
            names = [f.name for f in s.fields]
            name = rnd.choice(["zz", "unknown_field", "", "Name", *misspellings(rnd.choice(names))])
            pairs.insert(rnd.randint(0, len(pairs)), (name, self.ignored_value()))
        if pairs and self.bad() and self.odds(3):
            # A repeated key: refused in a struct read from text, last one wins in a map.
            pairs.insert(rnd.randint(0, len(pairs)), rnd.choice(pairs))
        if pairs and self.odds(8):
            # An escaped spelling of a field name: the same field once decoded.
            i = rnd.randrange(len(pairs))
            pairs[i] = (Esc(pairs[i][0], every=True), pairs[i][1])
        if self.odds(40):
            # The array form: fields by position (a prefix of them when going invalid).
            values = {_plain(k): v for k, v in pairs}
            items = [values.get(f.name) for f in s.fields]
            cut = rnd.randint(max(len(items) - 2, 0), len(items)) if self.bad() else len(items)
            return Arr(tuple(items[:cut]))
        if self.odds(4):
            rnd.shuffle(pairs)
        return Dup(tuple(pairs))

    def ignored_value(self) -> Any:
        """A value for an unknown field: serde skips it, but still parses its numbers and
        strings (not its depth)."""
        return self.rnd.choice(
            [
                self.rnd.choice(WRONG_TYPES),
                deep(self.rnd.choice([126, 127, 128, 200])),
                Lit("1e400"),
                Lit("-1e400"),
                Lit('"\\ud800"'),
                Lit('"\\udc00\\ud800"'),
                Lit("18446744073709551616"),
            ]
        )

    def coherent_tracking(self, pairs: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        """Key options only with the keyed hash, so the rest of the router config is reached."""
        names = ("router_tracking_hash", "router_tracking_key_file", "router_tracking_key_id")
        rest = [p for p in pairs if p[0] not in names]
        if not self.odds(3):
            return rest
        key_file = self.rnd.choice(self.files.keys) if self.files.keys else "/nope"
        key_id = self.string("k1" if self.odds(2) else None)
        return [*rest, (names[0], "keyed-xxh3-v1"), (names[1], key_file), (names[2], key_id)]

    def scalar(self, t: str, depth: int) -> Any:
        rnd = self.rnd
        if t == "str":
            return self.string()
        if t == "name":
            return self.string(rnd.choice(["Qwen/Qwen3-0.6B", "m"]) if self.odds(2) else None)
        if t == "bool":
            return rnd.random() < 0.5
        if t in UNSIGNED_BITS:
            return self.integer(UNSIGNED_BITS[t])
        if t == "i64":
            return self.integer(None)
        if t in ("f64", "f32"):
            return self.floating("")
        if t in ("f64+", "f64%"):
            return self.floating(t[-1])
        if t == "any":
            return self.any_value(depth)
        if t == "runtime_data":
            size = rnd.randint(0, 3)
            return Dup(
                tuple(
                    (
                        rnd.choice(RUNTIME_DATA_KEYS),
                        rnd.choice(TRUTHY) if self.odds(2) else self.any_value(depth + 1),
                    )
                    for _ in range(size)
                )
            )
        if t == "slug":
            return rnd.choice(BAD_SLUGS if self.bad() else SLUGS)
        if t == "checksum":
            return rnd.choice(BAD_CHECKSUMS) if self.bad() else f"blake3:{rnd.choice(HASHES)}"
        if t == "model_type":
            if self.bad():
                return rnd.choice(BAD_MODEL_TYPES)
            flags = rnd.sample(MODEL_TYPE_NAMES, rnd.randint(1, 3))
            return rnd.choice(["|", " | ", " |", "|\t"]).join(flags)
        if t == "identity_map":
            size = rnd.choice([0, 31, 32, 33] if self.bad() else [1, 1, 2, 3])
            return Dup(tuple((self.string(), self.string()) for _ in range(size)))
        if t == "policy_file":
            pool = self.files.policies if self.bad() else self.files.policies[:1]
            return rnd.choice(pool) if pool else "/nope"
        if t == "key_file":
            return rnd.choice(self.files.keys) if self.files.keys else "/nope"
        raise AssertionError(t)


def _plain(key: Any) -> str:
    return key.text if isinstance(key, Esc) else str(key)


def render_fuzz(node: Any) -> str:
    """Render a node tree to JSON text; ``Esc`` strings keep their escaped spelling."""
    if isinstance(node, Esc):
        return render_text(node)
    if isinstance(node, Dup):
        return "{" + ",".join(f"{_key(k)}:{render_fuzz(v)}" for k, v in node.pairs) + "}"
    if isinstance(node, Arr):
        return "[" + ",".join(render_fuzz(v) for v in node.items) + "]"
    if isinstance(node, dict):
        return "{" + ",".join(f"{_key(k)}:{render_fuzz(v)}" for k, v in node.items()) + "}"
    if isinstance(node, list):
        return "[" + ",".join(render_fuzz(v) for v in node) + "]"
    return render(node)


def _key(key: Any) -> str:
    return render_text(key) if isinstance(key, Esc) else json.dumps(key, ensure_ascii=False)


def generate(
    seed: int, files: Files, dirty: bool, focus: str | None, invalid_one_in: int = 12
) -> str:
    """One card as JSON text, from ``seed``: the same arguments always give the same text."""
    gen = Gen(random.Random(seed), files, invalid_one_in if dirty else 0)
    node = gen.struct(CARD, 0)
    if focus is not None and isinstance(node, Dup):
        # The focus section is always present, so deep sections are not rare.
        field = next(f for f in CARD.fields if f.name == focus)
        inner = (
            field.type[1]
            if isinstance(field.type, tuple) and field.type[0] == "opt"
            else field.type
        )
        pairs = [p for p in node.pairs if _plain(p[0]) != focus]
        pairs.insert(gen.rnd.randint(0, len(pairs)), (focus, gen.value(inner, 1)))
        node = Dup(tuple(pairs))
    return render_fuzz(node)


def fuzz_cards(files: Files = Files()) -> st.SearchStrategy[str]:
    """Cards as JSON text. Hypothesis chooses the seed, whether the card is clean or may go
    invalid, and which section to focus on; a seeded ``random.Random`` then fills the leaves,
    because one Hypothesis draw per leaf made a card cost tens of milliseconds."""
    return st.builds(
        lambda seed, dirty, focus: generate(seed, files, dirty, focus),
        st.integers(0, 2**64 - 1),
        st.booleans(),
        st.one_of(st.none(), st.sampled_from(SECTIONS)),
    )
