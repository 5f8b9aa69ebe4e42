"""The card's ``router_config`` section: KV router settings, their ranges and cross-field rules.

The N-1/N-2 spellings kept here: ``overlap_score_weight`` (the old name of
``prefill_load_scale``), ``router_prefill_load_model: "ais"`` and ``enforce_disagg``.
"""

from __future__ import annotations

import math
from typing import Any

from workerset_admission.card.router_policy import policy_file
from workerset_admission.card.schema import (
    BOOL,
    F64,
    STR,
    U32,
    U64,
    USIZE,
    Ctx,
    EnumT,
    Field,
    Opt,
    Refused,
    Struct,
    Validated,
    const,
    none,
    rust_trim,
)

__all__ = ["KV_ROUTER_CONFIG", "LOAD_THRESHOLD_CONFIG", "ROUTER_CONFIG", "ROUTER_MODES"]


def _range(name: str, low: float, high: float) -> Any:
    def check(value: Any, ctx: Ctx) -> Any:
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            raise Refused("invalid_router_config", f"{name} must be between {low} and {high}")
        return value

    return check


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
            default=const(1.0),
        ),
        Field(
            "overlap_score_credit_decay",
            Validated(F64, _non_negative("overlap_score_credit_decay")),
            default=const(0.0),
        ),
        Field(
            "prefill_load_scale",
            Validated(F64, _non_negative("prefill_load_scale")),
            default=const(1.0),
        ),
        Field(
            "decode_active_request_weight",
            Validated(F64, _non_negative("decode_active_request_weight")),
            default=const(0.0),
        ),
        Field("overlap_score_weight", Opt(F64), default=none),
        Field(
            "host_cache_hit_weight",
            Validated(F64, _range("host_cache_hit_weight", 0, 1)),
            default=const(0.75),
        ),
        Field(
            "disk_cache_hit_weight",
            Validated(F64, _range("disk_cache_hit_weight", 0, 1)),
            default=const(0.25),
        ),
        Field(
            "router_temperature",
            Validated(F64, _non_negative("router_temperature")),
            default=const(0.0),
        ),
        Field("use_kv_events", BOOL, default=const(True)),
        Field("durable_kv_events", Validated(BOOL, _durable_events), default=const(False)),
        Field("router_replica_sync", BOOL, default=const(False)),
        Field("router_track_active_blocks", BOOL, default=const(True)),
        Field("router_track_output_blocks", BOOL, default=const(False)),
        Field("router_assume_kv_reuse", BOOL, default=const(True)),
        Field("router_track_prefill_tokens", BOOL, default=const(True)),
        Field(
            "router_tracking_hash",
            EnumT(("public-xxh3-v1", "keyed-xxh3-v1")),
            default=const("public-xxh3-v1"),
        ),
        Field("router_tracking_key_file", Opt(STR), default=none),
        Field("router_tracking_key_id", Opt(STR), default=none),
        Field("router_prefill_load_model", EnumT(("none", "aic", "ais")), default=const("none")),
        Field("router_snapshot_threshold", Opt(U32), default=none),
        Field("router_reset_states", BOOL, default=const(False)),
        Field(
            "router_ttl_secs",
            Validated(F64, _non_negative("router_ttl_secs")),
            default=const(120.0),
        ),
        Field(
            "router_queue_threshold",
            Validated(Opt(F64), _non_negative("router_queue_threshold")),
            default=none,
        ),
        Field("router_policy_config", Validated(Opt(STR), policy_file), default=none),
        Field("router_event_threads", Validated(U32, _at_least_one), default=const(4)),
        Field("skip_initial_worker_wait", BOOL, default=const(False)),
        Field("router_queue_policy", EnumT(("fcfs", "lcfs", "wspt")), default=const("fcfs")),
        Field("use_remote_indexer", BOOL, default=const(False)),
        Field("serve_indexer", BOOL, default=const(False)),
        Field("enable_session_prefix_index", BOOL, default=const(False)),
        Field(
            "shared_cache_multiplier",
            Validated(Opt(F64), _range("shared_cache_multiplier", 0, 1)),
            default=none,
        ),
        Field("shared_cache_type", EnumT(("none", "hicache")), default=const("none")),
        Field(
            "router_predicted_ttl_secs",
            Validated(Opt(F64), _non_negative("router_predicted_ttl_secs")),
            default=none,
        ),
        Field("conditional_disagg_enabled", BOOL, default=const(False)),
        Field(
            "conditional_disagg_policy",
            EnumT(("isl_bounding", "prefill_load", "isl_or_load")),
            default=const("isl_bounding"),
        ),
        Field("conditional_disagg_eff_isl_threshold", USIZE, default=const(2048)),
        Field(
            "conditional_disagg_eff_isl_ratio_threshold",
            Validated(F64, _range("conditional_disagg_eff_isl_ratio_threshold", 0, 1)),
            default=const(0.7),
        ),
        Field(
            "conditional_disagg_prefill_busy_threshold",
            Validated(Opt(F64), _non_negative("conditional_disagg_prefill_busy_threshold")),
            default=none,
        ),
        Field(
            "conditional_disagg_decode_busy_threshold",
            Validated(Opt(F64), _non_negative("conditional_disagg_decode_busy_threshold")),
            default=none,
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
        Field("enforce_disagg", BOOL, default=const(False)),
        Field("session_affinity_ttl_secs", Opt(U64), default=none),
        Field("session_affinity_mode", EnumT(("hard", "soft")), default=const("hard")),
    ),
)
