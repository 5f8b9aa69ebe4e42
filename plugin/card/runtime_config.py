"""The card's ``runtime_config`` section (ModelRuntimeConfig) and the structs nested in it."""

from __future__ import annotations

from workerset_admission.card.schema import (
    ANY,
    BOOL,
    F32,
    STR,
    U16,
    U32,
    U64,
    EnumT,
    Field,
    MapT,
    Opt,
    Seq,
    Struct,
    const,
    none,
)

__all__ = ["DISAGGREGATED_ENDPOINT", "RUNTIME_CONFIG", "STRUCTURAL_TAG"]

_ENDPOINT_ID = Struct(
    "EndpointId", (Field("namespace", STR), Field("component", STR), Field("name", STR))
)


DISAGGREGATED_ENDPOINT = Struct(
    "DisaggregatedEndpoint",
    (
        Field("bootstrap_host", Opt(STR), default=none),
        Field("bootstrap_port", Opt(U16), default=none),
    ),
)

STRUCTURAL_TAG = Struct(
    "StructuralTagConfig",
    (
        Field("scope", EnumT(("auto", "always")), default=const("auto")),
        Field("schema", EnumT(("auto", "strict")), default=const("auto")),
        Field("allow_tool_calls_with_structured_output", BOOL, default=const(False)),
        Field("exclude_special_tokens", Opt(BOOL), default=none),
        Field(
            "reasoning_boundary",
            EnumT(("auto", "structural_tag", "backend")),
            default=const("auto"),
        ),
        Field("tool_arguments_any_order", BOOL, default=const(False)),
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
            default=const("json_string"),
        ),
        Field(
            "tokenizer_backend",
            Opt(EnumT(("default", "fastokens", "basetenkenizer"))),
            default=none,
        ),
        Field("tokenizer_fallback_enabled", Opt(BOOL), default=none),
        Field("structural_tag", Opt(STRUCTURAL_TAG), default=none),
        Field("structural_tag_mode", EnumT(("off", "on")), default=const("off")),
        Field("structural_tag_scope", EnumT(("auto", "always")), default=const("auto")),
        Field("structural_tag_schema", EnumT(("auto", "strict")), default=const("auto")),
        Field("exclude_tools_when_tool_choice_none", BOOL, default=const(True)),
        Field("data_parallel_start_rank", U32, default=const(0)),
        Field("data_parallel_size", U32, default=const(1)),
        Field("enable_local_indexer", BOOL, default=const(True)),
        Field("kv_event_publishing_enabled", Opt(BOOL), default=none),
        Field("kv_event_source_mode", Opt(STR), default=none),
        Field("kv_state_endpoint", Opt(_ENDPOINT_ID), default=none),
        Field("runtime_data", MapT(ANY), default=dict),
        Field("disaggregated_endpoint", Opt(DISAGGREGATED_ENDPOINT), default=none),
        Field("enable_eagle", BOOL, default=const(False)),
        Field("taints", Seq(STR), default=list),
        Field("stable_routing_id", Opt(STR), default=none),
        Field("topology_domains", MapT(STR), default=dict),
        Field("kv_transfer_domain", Opt(STR), default=none),
        Field("kv_transfer_enforcement", Opt(EnumT(("required", "preferred"))), default=none),
        Field("kv_transfer_preferred_weight", Opt(F32), default=none),
        Field("max_gpu_lora_count", Opt(U32), default=none),
    ),
)
