"""The Dynamo 1.6.1 ModelDeploymentCard as a serde-faithful schema, and its decoder.

The schema mirrors what the 1.6.1 frontend accepts (field order, required keys, defaults,
aliases, value ranges, cross-field rules, the array form of structs). The shims for the
earlier wire generations in the N-2 window, and the generation each one serves:

* N (1.6.1) writes ``architectural_max_context_length``, ``indexer_identity``, the runtime
  contract keys in ``runtime_data`` and a ``size`` in every CheckedFile.
* N-1 carried the context length only in the top-level ``context_length`` field: 1.6.1 reads
  it as the last fallback of the effective context length (and still writes it).
* N-1 and N-2 (the window the old spellings are kept for):

  - ``overlap_score_weight``, the old name of ``prefill_load_scale``: when present it
    replaces ``prefill_load_scale``, and a zero weight also zeroes ``overlap_score_credit``;
    ``router_prefill_load_model: "ais"`` is read as ``"aic"``;
  - CheckedFile without ``size``;
  - ``hf_chat_template_jinja``, an alias of the ``hf_chat_template`` slot;
  - prefill workers without ``worker_type``, marked only by the ``Prefill`` model-type bit
    (the discovery boundary normalizes them before hashing, see ``boundary.normalize_card``);
  - ``enforce_disagg``: accepted; it no longer changes routing but is still part of the router
    config digest.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..errors import CardDecodeError
from . import jsonio
from .schema import (
    ANY,
    BOOL,
    F32,
    F64,
    I64,
    STR,
    U8,
    U16,
    U32,
    U64,
    USIZE,
    Ctx,
    EnumT,
    ExtTagged,
    Field,
    MapT,
    Opt,
    Refused,
    Seq,
    Struct,
    Type,
    Validated,
)

__all__ = [
    "MODEL_TYPE_NAMES",
    "WORKER_TYPES",
    "DecodedCard",
    "decode_card",
    "decode_card_value",
    "model_type_names",
]

# ModelType bit order; the first name is the Display spelling, the second the as_vec spelling.
MODEL_TYPE_NAMES: tuple[tuple[str, str], ...] = (
    ("Chat", "chat"),
    ("Completions", "completions"),
    ("Embedding", "embedding"),
    ("TensorBased", "tensor"),
    ("Prefill", "prefill"),
    ("Images", "images"),
    ("Audios", "audios"),
    ("Videos", "videos"),
    ("Realtime", "realtime"),
    ("Classify", "classify"),
    ("Pooling", "pooling"),
    ("Rerank", "rerank"),
)
_FLAG_BY_NAME = {name: 1 << bit for bit, (name, _) in enumerate(MODEL_TYPE_NAMES)}
PREFILL_BIT = _FLAG_BY_NAME["Prefill"]
WORKER_TYPES = ("prefill", "decode", "encode", "aggregated")

# Rust's char::is_whitespace (Unicode White_Space), used by str::trim.
_RUST_WS = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def rust_trim(text: str) -> str:
    return text.strip(_RUST_WS)


class _ModelTypeT(Type):
    """bitflags text: names or ``0x`` hex joined by ``|``; unknown bits are kept."""

    expected = "a string value of `|` separated flags"

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if not isinstance(value, str):
            raise Refused("invalid_type", f"invalid type, expected {self.expected}")
        text = rust_trim(value)
        bits = 0
        if not text:
            return 0
        for part in text.split("|"):
            flag = rust_trim(part)
            if not flag:
                raise Refused("invalid_model_type", "encountered empty flag")
            if flag.startswith("0x"):
                digits = flag[2:]
                # u16::from_str_radix: optional '+', then hex digits.
                body = digits[1:] if digits.startswith("+") else digits
                if not body or not all(c in "0123456789abcdefABCDEF" for c in body):
                    raise Refused("invalid_model_type", f"invalid hex flag `{digits}`")
                number = int(body, 16)
                if number > 0xFFFF:
                    raise Refused("invalid_model_type", f"invalid hex flag `{digits}`")
                bits |= number
            else:
                bit = _FLAG_BY_NAME.get(flag)
                if bit is None:
                    raise Refused("invalid_model_type", f"unrecognized named flag `{flag}`")
                bits |= bit
        return bits


def model_type_names(bits: int) -> str:
    """``ModelType::as_vec().join("|")``: the known flags, lowercase, in bit order."""
    return "|".join(short for bit, (_, short) in enumerate(MODEL_TYPE_NAMES) if bits >> bit & 1)


_SLUG_RE = re.compile(r"[a-z0-9_-]*")


def _check_slug(value: str, ctx: Ctx) -> str:
    if not _SLUG_RE.fullmatch(value):
        bad = next(c for c in value if not re.fullmatch(r"[a-z0-9_-]", c))
        raise Refused(
            "invalid_slug", f"Invalid char {bad!r}. String can only contain a-z, 0-9, - and _."
        )
    return value


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _check_checksum(value: str, ctx: Ctx) -> tuple[str, str]:
    algo, sep, digest = value.partition(":")
    if not sep or algo != "blake3":
        raise Refused("invalid_checksum", f"invalid checksum algorithm {algo!r}")
    if not _HEX64.fullmatch(digest):
        raise Refused("invalid_checksum", "invalid checksum hash")
    return (algo, digest)


CHECKED_FILE = Struct(
    "WireCheckedFile",
    (
        Field("path", STR),
        Field("checksum", Validated(STR, _check_checksum)),
        Field("size", Opt(U64), default=lambda: None),
    ),
)

_CHAT_TEMPLATE = Struct("ChatTemplateFile", (Field("is_custom", BOOL), Field("file", CHECKED_FILE)))

PROMPT_FORMATTER = ExtTagged(
    {
        "hf_tokenizer_config_json": CHECKED_FILE,
        "hf_chat_template": _CHAT_TEMPLATE,
        "hf_chat_template_json": _CHAT_TEMPLATE,
    },
    # N-1 spelling of the Jinja chat template slot.
    aliases={"hf_chat_template_jinja": "hf_chat_template"},
)


def _none() -> None:
    return None


_WORKER_TYPE = EnumT(WORKER_TYPES)

LORA = Struct(
    "LoraInfo", (Field("name", STR), Field("max_gpu_lora_count", Opt(U32), default=_none))
)

_ENDPOINT_ID = Struct(
    "EndpointId", (Field("namespace", STR), Field("component", STR), Field("name", STR))
)


def _const(value: Any) -> Any:
    return lambda: value


DISAGGREGATED_ENDPOINT = Struct(
    "DisaggregatedEndpoint",
    (
        Field("bootstrap_host", Opt(STR), default=_none),
        Field("bootstrap_port", Opt(U16), default=_none),
    ),
)

STRUCTURAL_TAG = Struct(
    "StructuralTagConfig",
    (
        Field("scope", EnumT(("auto", "always")), default=_const("auto")),
        Field("schema", EnumT(("auto", "strict")), default=_const("auto")),
        Field("allow_tool_calls_with_structured_output", BOOL, default=_const(False)),
        Field("exclude_special_tokens", Opt(BOOL), default=_none),
        Field(
            "reasoning_boundary",
            EnumT(("auto", "structural_tag", "backend")),
            default=_const("auto"),
        ),
        Field("tool_arguments_any_order", BOOL, default=_const(False)),
    ),
)

RUNTIME_CONFIG = Struct(
    "ModelRuntimeConfig",
    (
        Field("context_length", Opt(U32)),
        Field("total_kv_blocks", Opt(U64)),
        Field("max_num_seqs", Opt(U64)),
        Field("max_num_batched_tokens", Opt(U64)),
        Field("tool_call_parser", Opt(STR)),
        Field("reasoning_parser", Opt(STR)),
        Field(
            "tool_call_arguments_format",
            EnumT(("json_string", "json_object")),
            default=_const("json_string"),
        ),
        Field(
            "tokenizer_backend",
            Opt(EnumT(("default", "fastokens", "basetenkenizer"))),
            default=_none,
        ),
        Field("tokenizer_fallback_enabled", Opt(BOOL), default=_none),
        Field("structural_tag", Opt(STRUCTURAL_TAG), default=_none),
        Field("structural_tag_mode", EnumT(("off", "on")), default=_const("off")),
        Field("structural_tag_scope", EnumT(("auto", "always")), default=_const("auto")),
        Field("structural_tag_schema", EnumT(("auto", "strict")), default=_const("auto")),
        Field("exclude_tools_when_tool_choice_none", BOOL, default=_const(True)),
        Field("data_parallel_start_rank", U32, default=_const(0)),
        Field("data_parallel_size", U32, default=_const(1)),
        Field("enable_local_indexer", BOOL, default=_const(True)),
        Field("kv_event_publishing_enabled", Opt(BOOL), default=_none),
        Field("kv_event_source_mode", Opt(STR), default=_none),
        Field("kv_state_endpoint", Opt(_ENDPOINT_ID), default=_none),
        Field("runtime_data", MapT(ANY), default=dict),
        Field("disaggregated_endpoint", Opt(DISAGGREGATED_ENDPOINT), default=_none),
        Field("enable_eagle", BOOL, default=_const(False)),
        Field("taints", Seq(STR), default=list),
        Field("stable_routing_id", Opt(STR), default=_none),
        Field("topology_domains", MapT(STR), default=dict),
        Field("kv_transfer_domain", Opt(STR), default=_none),
        Field("kv_transfer_enforcement", Opt(EnumT(("required", "preferred"))), default=_none),
        Field("kv_transfer_preferred_weight", Opt(F32), default=_none),
        Field("max_gpu_lora_count", Opt(U32), default=_none),
    ),
)


def _range(name: str, low: float, high: float) -> Any:
    def check(value: Any, ctx: Ctx) -> Any:
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            raise Refused("invalid_router_config", f"{name} must be between {low} and {high}")
        return value

    return check


def _read(ctx: Ctx, path: str) -> bytes:
    if ctx.read_file is not None:
        return ctx.read_file(path)
    with open(path, "rb") as handle:
        return handle.read()


def _policy_file(value: Any, ctx: Ctx) -> Any:
    # 1.6.1 loads the named policy file while decoding; an unreadable file refuses the card.
    if value is None:
        return None
    try:
        data = _read(ctx, value)
    except OSError as exc:
        raise Refused(
            "router_policy_config", f"failed to read router policy config {value}: {exc}"
        ) from None
    _check_policy_yaml(data, value)
    return value


_POLICY_KEYS = frozenset(
    {
        "router",
        "default_policy_family",
        "policy_classes",
        "uncached_isl_buckets",
        "models",
        "worker_selection",
        "request_classifier",
    }
)
_ROOT_PROFILE = ("default_policy_family", "uncached_isl_buckets", "policy_classes")
_SELECTION_ROLES = frozenset({"aggregated", "prefill", "decode", "encode", "instances"})


def _check_policy_yaml(data: bytes, path: str) -> None:
    """Check a router policy file the way 1.6.1 does, as far as its top level goes.

    The file is YAML; its top level is a struct with a fixed key set (repeats refused), and it
    must define router settings, a root profile, a model profile, ``worker_selection`` or a
    ``request_classifier``. Router settings must be a mapping; 1.6.1 knows no setting we have
    seen a card use, so a non-empty one is refused. Profiles, worker selection and the request
    classifier are checked at their top level only (their inner schema is 1.6.1's own).
    """
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML ships with the Dynamo runtime
        return
    problem = "invalid_router_policy"

    class _Loader(yaml.SafeLoader):
        pass

    def mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
        hashable = [k for k in keys if isinstance(k, (str, int, float, bool)) or k is None]
        if len(set(hashable)) != len(hashable):
            raise yaml.constructor.ConstructorError(None, None, "duplicate field", node.start_mark)
        return yaml.SafeLoader.construct_mapping(loader, node, deep)

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        parsed = yaml.load(data.decode("utf-8"), Loader=_Loader)
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise Refused(problem, f"failed to parse router policy config {path}: {exc}") from None
    if parsed is None:
        parsed = {}
    if not isinstance(parsed, dict):
        raise Refused(problem, f"router policy config {path} is not a mapping")
    unknown = [k for k in parsed if k not in _POLICY_KEYS]
    if unknown:
        raise Refused(problem, f"unknown field {unknown[0]!r} in router policy config {path}")
    router = parsed.get("router")
    if router is not None:
        if not isinstance(router, dict):
            raise Refused(problem, "router: expected a map")
        if router:
            raise Refused(problem, f"unknown router setting: {next(iter(router))}")
    root = [k for k in _ROOT_PROFILE if parsed.get(k) is not None]
    if root and len(root) != len(_ROOT_PROFILE):
        raise Refused(problem, "root profile must specify all of " + ", ".join(_ROOT_PROFILE))
    if root:
        _check_profile(parsed, "root profile", problem)
    models = parsed.get("models", {})
    if not isinstance(models, dict):
        raise Refused(problem, "models: expected a map")
    for name, profile in models.items():
        if not name:
            raise Refused(problem, "model profile name must not be empty")
        if not isinstance(profile, dict) or "default_policy_family" not in profile:
            raise Refused(problem, f"models.{name}: missing field `default_policy_family`")
        _check_profile(profile, f"models.{name}", problem)
    selection = parsed.get("worker_selection")
    if selection is not None:
        if not isinstance(selection, dict):
            raise Refused(problem, "worker_selection: expected a map")
        for role, value in selection.items():
            if role not in _SELECTION_ROLES:
                raise Refused(problem, f"worker_selection: unknown field `{role}`")
            if role != "instances" and value is not None and not isinstance(value, str):
                raise Refused(problem, f"worker_selection.{role}: expected a string")
        if all(value is None for value in selection.values()):
            raise Refused(problem, "worker_selection must define a selection")
    classifier = parsed.get("request_classifier")
    if classifier is not None and (not isinstance(classifier, dict) or "type" not in classifier):
        raise Refused(problem, "request_classifier: missing field `type`")
    defined = router is not None or bool(root) or bool(models) or selection is not None
    if not defined and classifier is None:
        raise Refused(problem, "router policy config must define something")


def _check_profile(profile: dict[str, Any], where: str, problem: str) -> None:
    classes = profile.get("policy_classes")
    if classes is not None and not isinstance(classes, list):
        raise Refused(problem, f"{where}: policy_classes must be a sequence")


def _non_negative(name: str) -> Any:
    def check(value: Any, ctx: Ctx) -> Any:
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise Refused("invalid_router_config", f"{name} must be greater than or equal to 0")
        return value

    return check


def _at_least_one(value: Any, ctx: Ctx) -> Any:
    if value < 1:
        raise Refused("invalid_router_config", "router_event_threads must be at least 1")
    return value


def _durable_events(value: Any, ctx: Ctx) -> Any:
    if value:
        raise Refused("invalid_router_config", "durable_kv_events=true is not supported")
    return value


KV_ROUTER_CONFIG = Struct(
    "KvRouterConfigSerde",
    (
        Field(
            "overlap_score_credit",
            Validated(F64, _non_negative("overlap_score_credit")),
            default=_const(1.0),
        ),
        Field(
            "overlap_score_credit_decay",
            Validated(F64, _non_negative("overlap_score_credit_decay")),
            default=_const(0.0),
        ),
        Field(
            "prefill_load_scale",
            Validated(F64, _non_negative("prefill_load_scale")),
            default=_const(1.0),
        ),
        Field(
            "decode_active_request_weight",
            Validated(F64, _non_negative("decode_active_request_weight")),
            default=_const(0.0),
        ),
        Field("overlap_score_weight", Opt(F64), default=_none),
        Field(
            "host_cache_hit_weight",
            Validated(F64, _range("host_cache_hit_weight", 0, 1)),
            default=_const(0.75),
        ),
        Field(
            "disk_cache_hit_weight",
            Validated(F64, _range("disk_cache_hit_weight", 0, 1)),
            default=_const(0.25),
        ),
        Field(
            "router_temperature",
            Validated(F64, _non_negative("router_temperature")),
            default=_const(0.0),
        ),
        Field("use_kv_events", BOOL, default=_const(True)),
        Field("durable_kv_events", Validated(BOOL, _durable_events), default=_const(False)),
        Field("router_replica_sync", BOOL, default=_const(False)),
        Field("router_track_active_blocks", BOOL, default=_const(True)),
        Field("router_track_output_blocks", BOOL, default=_const(False)),
        Field("router_assume_kv_reuse", BOOL, default=_const(True)),
        Field("router_track_prefill_tokens", BOOL, default=_const(True)),
        Field(
            "router_tracking_hash",
            EnumT(("public-xxh3-v1", "keyed-xxh3-v1")),
            default=_const("public-xxh3-v1"),
        ),
        Field("router_tracking_key_file", Opt(STR), default=_none),
        Field("router_tracking_key_id", Opt(STR), default=_none),
        Field("router_prefill_load_model", EnumT(("none", "aic", "ais")), default=_const("none")),
        Field("router_snapshot_threshold", Opt(U32), default=_none),
        Field("router_reset_states", BOOL, default=_const(False)),
        Field(
            "router_ttl_secs",
            Validated(F64, _non_negative("router_ttl_secs")),
            default=_const(120.0),
        ),
        Field(
            "router_queue_threshold",
            Validated(Opt(F64), _non_negative("router_queue_threshold")),
            default=_none,
        ),
        Field("router_policy_config", Validated(Opt(STR), _policy_file), default=_none),
        Field("router_event_threads", Validated(U32, _at_least_one), default=_const(4)),
        Field("skip_initial_worker_wait", BOOL, default=_const(False)),
        Field("router_queue_policy", EnumT(("fcfs", "lcfs", "wspt")), default=_const("fcfs")),
        Field("use_remote_indexer", BOOL, default=_const(False)),
        Field("serve_indexer", BOOL, default=_const(False)),
        Field("enable_session_prefix_index", BOOL, default=_const(False)),
        Field(
            "shared_cache_multiplier",
            Validated(Opt(F64), _range("shared_cache_multiplier", 0, 1)),
            default=_none,
        ),
        Field("shared_cache_type", EnumT(("none", "hicache")), default=_const("none")),
        Field(
            "router_predicted_ttl_secs",
            Validated(Opt(F64), _non_negative("router_predicted_ttl_secs")),
            default=_none,
        ),
        Field("conditional_disagg_enabled", BOOL, default=_const(False)),
        Field(
            "conditional_disagg_policy",
            EnumT(("isl_bounding", "prefill_load", "isl_or_load")),
            default=_const("isl_bounding"),
        ),
        Field("conditional_disagg_eff_isl_threshold", USIZE, default=_const(2048)),
        Field(
            "conditional_disagg_eff_isl_ratio_threshold",
            Validated(F64, _range("conditional_disagg_eff_isl_ratio_threshold", 0, 1)),
            default=_const(0.7),
        ),
        Field(
            "conditional_disagg_prefill_busy_threshold",
            Validated(Opt(F64), _non_negative("conditional_disagg_prefill_busy_threshold")),
            default=_none,
        ),
        Field(
            "conditional_disagg_decode_busy_threshold",
            Validated(Opt(F64), _non_negative("conditional_disagg_decode_busy_threshold")),
            default=_none,
        ),
    ),
    deny_unknown=True,
    validate=lambda kv, ctx: _check_kv_router(kv),
)


def _refuse(detail: str) -> Refused:
    return Refused("invalid_router_config", detail)


def _check_kv_router(kv: dict[str, Any]) -> None:
    """Cross-field rules and legacy spellings 1.6.1 applies after reading the fields."""
    # N-1 spelling: overlap_score_weight sets prefill_load_scale; a zero weight also turned
    # the overlap credit off in that generation.
    weight = kv.pop("overlap_score_weight")
    if weight is not None:
        if not (math.isfinite(weight) and weight >= 0):
            raise _refuse("prefill_load_scale must be finite and non-negative")
        kv["prefill_load_scale"] = weight
        if weight == 0.0:
            kv["overlap_score_credit"] = 0.0
    if kv["router_prefill_load_model"] == "ais":
        kv["router_prefill_load_model"] = "aic"  # "ais" is an accepted alias
    keyed = kv["router_tracking_hash"] == "keyed-xxh3-v1"
    if keyed:
        if kv["router_tracking_key_file"] is None:
            raise _refuse("keyed-xxh3-v1 requires router_tracking_key_file")
        key_id = kv["router_tracking_key_id"]
        # 1.6.1 trims the id (Rust whitespace, not Python's) and refuses it unless the
        # trimmed id is non-empty and unchanged, so surrounding whitespace is refused too.
        if not key_id or rust_trim(key_id) != key_id:
            raise _refuse("keyed-xxh3-v1 requires a nonempty router_tracking_key_id")
    elif kv["router_tracking_key_file"] is not None or kv["router_tracking_key_id"] is not None:
        raise _refuse("router tracking key options require router_tracking_hash=keyed-xxh3-v1")
    if kv["router_predicted_ttl_secs"] is not None and not kv["use_kv_events"]:
        raise _refuse("router_predicted_ttl_secs requires use_kv_events=true")
    if kv["router_prefill_load_model"] != "none" and not kv["router_track_prefill_tokens"]:
        raise _refuse("router_prefill_load_model requires router_track_prefill_tokens=true")
    if kv["router_track_output_blocks"] and not kv["router_track_active_blocks"]:
        raise _refuse("router_track_output_blocks requires router_track_active_blocks=true")
    if kv["use_remote_indexer"] and kv["serve_indexer"]:
        raise _refuse("use_remote_indexer and serve_indexer are mutually exclusive")
    if kv["enable_session_prefix_index"]:
        if not kv["use_kv_events"]:
            raise _refuse("enable_session_prefix_index requires use_kv_events=true")
        if kv["use_remote_indexer"]:
            raise _refuse(
                "enable_session_prefix_index is not supported with use_remote_indexer=true"
            )
    # A load-based policy without its own busy threshold inherits router_queue_threshold
    # (the digest still shows the threshold as unset); with neither it is refused.
    if (
        kv["conditional_disagg_enabled"]
        and kv["conditional_disagg_policy"] in ("prefill_load", "isl_or_load")
        and kv["conditional_disagg_prefill_busy_threshold"] is None
        and kv["router_queue_threshold"] is None
    ):
        raise _refuse("conditional_disagg policy needs prefill_busy_threshold")


LOAD_THRESHOLD_CONFIG = Struct(
    "LoadThresholdConfig",
    (
        Field("active_decode_blocks_threshold", Opt(F64)),
        Field("active_prefill_tokens_threshold", Opt(U64)),
        Field("active_prefill_tokens_threshold_frac", Opt(F64)),
    ),
)

ROUTER_MODES = (
    "round_robin",
    "random",
    "power_of_two_choices",
    "k_v",
    "direct",
    "least_loaded",
    "device_aware_weighted",
)

ROUTER_CONFIG = Struct(
    "RouterConfig",
    (
        Field("router_mode", EnumT(ROUTER_MODES)),
        Field("kv_router_config", KV_ROUTER_CONFIG),
        Field("load_threshold_config", LOAD_THRESHOLD_CONFIG),
        Field("enforce_disagg", BOOL, default=_const(False)),
        Field("session_affinity_ttl_secs", Opt(U64), default=_none),
        Field("session_affinity_mode", EnumT(("hard", "soft")), default=_const("hard")),
    ),
)


class _IdentityMap(Type):
    expected = "a non-empty map of unique identity keys to strings"

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if not isinstance(value, dict):
            raise Refused("invalid_type", f"invalid type, expected {self.expected}")
        if not value:
            raise Refused(
                "invalid_indexer_identity", "explicit identity map must contain at least one entry"
            )
        if any(not key for key in value):
            raise Refused("invalid_indexer_identity", "identity key must not be empty")
        if ctx.strict_dups and isinstance(value, jsonio.DupDict):
            raise Refused("invalid_indexer_identity", "identity keys must be unique")
        if len(value) > _IDENTITY_MAX_ENTRIES:
            raise Refused(
                "invalid_indexer_identity",
                f"explicit identity map contains more than {_IDENTITY_MAX_ENTRIES} entries",
            )
        out = {key: STR.decode(item, level + 1, ctx) for key, item in value.items()}
        for key, item in out.items():
            if not item:
                raise Refused("invalid_indexer_identity", "identity value must not be empty")
            if _utf8_len(key) > _IDENTITY_MAX_KEY_BYTES:
                raise Refused(
                    "invalid_indexer_identity",
                    f"identity key exceeds {_IDENTITY_MAX_KEY_BYTES} UTF-8 bytes",
                )
            if _utf8_len(item) > _IDENTITY_MAX_VALUE_BYTES:
                raise Refused(
                    "invalid_indexer_identity",
                    f"identity value exceeds {_IDENTITY_MAX_VALUE_BYTES} UTF-8 bytes",
                )
        return out


# 1.6.1's bounds on an explicit identity map; lengths count UTF-8 bytes, not characters.
_IDENTITY_MAX_ENTRIES = 32
_IDENTITY_MAX_KEY_BYTES = 128
_IDENTITY_MAX_VALUE_BYTES = 1024


def _utf8_len(text: str) -> int:
    # Lone surrogates (accepted only where 1.6.1 accepts them) count as the 3 bytes of WTF-8.
    return len(text.encode("utf-8", "surrogatepass"))


INDEXER_IDENTITY = Struct(
    "IndexerIdentitySpec",
    (
        Field("semantics", Opt(_IdentityMap()), default=_none),
        Field("routing_scope", Opt(_IdentityMap()), default=_none),
    ),
)

IMAGE_LIMITS = Struct(
    "ImageDecoderLimits",
    (
        Field("max_image_width", Opt(U32), default=_none),
        Field("max_image_height", Opt(U32), default=_none),
        Field("max_alloc", Opt(U64), default=_const(134217728)),
    ),
    deny_unknown=True,
)
IMAGE_DECODER = Struct(
    "ImageDecoder",
    (Field("limits", IMAGE_LIMITS, default=lambda: IMAGE_LIMITS.decode({}, 0, Ctx())),),
    deny_unknown=True,
)
MEDIA_DECODER = Struct("MediaDecoder", (Field("image", Opt(IMAGE_DECODER), default=_none),))


def _check_duration(value: dict[str, Any], ctx: Ctx) -> None:
    # serde carries whole seconds out of ``nanos`` into ``secs`` and refuses a u64 overflow.
    if value["secs"] + value["nanos"] // 1_000_000_000 > (1 << 64) - 1:
        raise Refused("out_of_range", "overflow deserializing Duration")


DURATION = Struct(
    "Duration",
    (Field("secs", U64), Field("nanos", U32)),
    deny_unknown=True,
    validate=_check_duration,
)
MEDIA_FETCHER = Struct(
    "MediaFetcher",
    (
        Field("user_agent", STR),
        Field("allow_direct_ip", BOOL),
        Field("allow_direct_port", BOOL),
        Field("allow_private_ips", BOOL),
        Field("allowed_media_domains", Opt(Seq(STR))),
        Field("timeout", Opt(DURATION)),
    ),
)


TENSOR_PARAMETER = ExtTagged(
    {"bool": BOOL, "int64": I64, "string": STR, "double": F64, "uint64": U64}
)


TENSOR_DATA_TYPES = (
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
)
TENSOR_METADATA = Struct(
    "TensorMetadata",
    (
        Field("name", STR),
        Field("data_type", EnumT(TENSOR_DATA_TYPES)),
        Field("shape", Seq(I64)),
        Field("parameters", MapT(TENSOR_PARAMETER), default=dict),
    ),
    deny_unknown=True,
)
TENSOR_MODEL_CONFIG = Struct(
    "TensorModelConfig",
    (
        Field("name", STR),
        Field("inputs", Seq(TENSOR_METADATA)),
        Field("outputs", Seq(TENSOR_METADATA)),
        Field("triton_model_config", Opt(Seq(U8)), default=_none),
    ),
    deny_unknown=True,
)

MODEL_INFO = ExtTagged({"hf_config_json": CHECKED_FILE})
TOKENIZER = ExtTagged({"hf_tokenizer_json": CHECKED_FILE, "tik_token_model": CHECKED_FILE})
GEN_CONFIG = ExtTagged({"hf_generation_config_json": CHECKED_FILE})

CARD = Struct(
    "ModelDeploymentCard",
    (
        Field("display_name", STR),
        Field("slug", Validated(STR, _check_slug)),
        Field("source_path", Opt(STR), default=_none),
        Field("model_info", Opt(MODEL_INFO)),
        Field("tokenizer", Opt(TOKENIZER)),
        Field("prompt_formatter", Opt(PROMPT_FORMATTER), default=_none),
        Field("chat_template_file", Opt(PROMPT_FORMATTER), default=_none),
        Field("gen_config", Opt(GEN_CONFIG), default=_none),
        Field("prompt_context", Opt(Seq(EnumT(("oai_chat", "llama3_date_time")))), default=_none),
        Field("architectural_max_context_length", Opt(U32), default=_none),
        Field("context_length", Opt(U32), default=_none),
        Field("kv_cache_block_size", U32),
        Field("migration_limit", U32),
        Field("model_type", _ModelTypeT()),
        Field("model_input", EnumT(("Text", "Tokens", "Tensor"))),
        Field("worker_type", Opt(_WORKER_TYPE), default=_none),
        Field("needs", Seq(Seq(_WORKER_TYPE)), default=list),
        Field("lora", Opt(LORA), default=_none),
        Field("aliases", Seq(STR), default=list),
        Field("user_data", Opt(ANY), default=_none),
        Field(
            "runtime_config", RUNTIME_CONFIG, default=lambda: RUNTIME_CONFIG.decode({}, 0, Ctx())
        ),
        Field("tensor_model_config", Opt(TENSOR_MODEL_CONFIG), default=_none),
        Field("media_decoder", Opt(MEDIA_DECODER), default=_none),
        Field("media_fetcher", Opt(MEDIA_FETCHER), default=_none),
        Field("router_config", Opt(ROUTER_CONFIG), default=_none),
        Field("indexer_identity", Opt(INDEXER_IDENTITY), default=_none),
        Field("extra_files", Seq(CHECKED_FILE), default=list),
    ),
)


@dataclass(frozen=True, slots=True)
class DecodedCard:
    """A card as 1.6.1 decoded it: ``fields`` maps each card field to its decoded value.

    Struct values are dicts in declaration order, enum variants ``(name, content)`` pairs,
    ``model_type`` an int bit set, CheckedFile checksums ``(algo, hex)`` pairs.
    """

    fields: dict[str, Any]

    @property
    def display_name(self) -> str:
        return str(self.fields["display_name"])

    @property
    def slug(self) -> str:
        return str(self.fields["slug"])

    @property
    def model_type_bits(self) -> int:
        return int(self.fields["model_type"])

    @property
    def model_input(self) -> str:
        return str(self.fields["model_input"])

    @property
    def worker_type(self) -> str | None:
        value = self.fields["worker_type"]
        return None if value is None else str(value)

    @property
    def needs(self) -> list[list[str]]:
        return [list(alt) for alt in self.fields["needs"]]

    @property
    def runtime_config(self) -> dict[str, Any]:
        return dict(self.fields["runtime_config"])

    @property
    def lora(self) -> dict[str, Any] | None:
        value = self.fields["lora"]
        return None if value is None else dict(value)


def decode_card_value(
    value: Any, *, strict_dups: bool, check_strings: bool, ctx: Ctx | None = None
) -> DecodedCard:
    """Decode an already parsed card (see :func:`decode_card` for text)."""
    context = Ctx(strict_dups, check_strings, ctx.read_file if ctx is not None else None)
    try:
        fields = CARD.decode(value, 0, context)
    except Refused as exc:
        raise CardDecodeError(exc.reason, exc.detail) from None
    return DecodedCard(fields)


def decode_card(text: str | bytes, ctx: Ctx | None = None) -> DecodedCard:
    """Decode card JSON text exactly as ``ModelDeploymentCard.from_json_str`` would."""
    try:
        value = jsonio.loads(text)
    except jsonio.JsonError as exc:
        raise CardDecodeError(exc.reason, exc.detail) from None
    raw = text.decode("utf-8", "replace") if isinstance(text, (bytes, bytearray)) else text
    return decode_card_value(
        value,
        strict_dups=True,
        check_strings=jsonio.has_lone_surrogate_escape(raw),
        ctx=ctx,
    )
