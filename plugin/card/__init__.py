"""Dynamo 1.6.1 model deployment cards: decoding, ``mdcsum()``, and the discovery boundary."""

from __future__ import annotations

from .boundary import (
    DEFAULT_MAX_VALUE_SIZE,
    BoundarySettings,
    EndpointRecord,
    NamespaceFilter,
    ParsedKey,
    decode_endpoint_record,
    decode_model_record,
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    escape_token,
    lora_projection_fingerprint,
    model_kv_key,
    normalize_card,
    parse_key,
    unescape_token,
)
from .checksum import card_checksum, mdc_local_path, mdcsum, router_config_json, slug
from .model import DecodedCard, decode_card, model_type_names

__all__ = [
    "DEFAULT_MAX_VALUE_SIZE",
    "BoundarySettings",
    "DecodedCard",
    "EndpointRecord",
    "NamespaceFilter",
    "ParsedKey",
    "card_checksum",
    "decode_card",
    "decode_endpoint_record",
    "decode_model_record",
    "encode_endpoint_record",
    "encode_model_record",
    "endpoint_kv_key",
    "escape_token",
    "lora_projection_fingerprint",
    "mdc_local_path",
    "mdcsum",
    "model_kv_key",
    "model_type_names",
    "normalize_card",
    "parse_key",
    "router_config_json",
    "slug",
    "unescape_token",
]
