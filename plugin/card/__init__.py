"""Dynamo 1.6.1 model deployment cards: decoding, ``mdcsum()``, and the discovery boundary.

Every refusal is a :class:`~workerset_admission.errors.CardDecodeError` (the card) or an
:class:`~workerset_admission.errors.InvalidRecordError` (the key or the record around it) with
a short, stable ``reason``, one of :data:`~workerset_admission.errors.REFUSAL_REASONS`:

* record and key: ``bad_key``, ``value_too_large``, ``invalid_utf8``, ``invalid_json``,
  ``depth_limit``, ``number_out_of_range``, ``invalid_string``, ``invalid_record``,
  ``duplicate_field``, ``wrong_record_type``, ``identity_mismatch``, ``lora_mismatch``;
* card: ``invalid_type``, ``out_of_range``, ``missing_field``, ``unknown_field``,
  ``duplicate_field``, ``unknown_variant``, ``invalid_enum``, ``invalid_length``,
  ``invalid_slug``, ``invalid_checksum``, ``invalid_model_type``, ``depth_limit``,
  ``number_out_of_range``, ``invalid_string``, ``invalid_router_config``,
  ``router_policy_config`` (the policy file cannot be read), ``invalid_router_policy``,
  ``invalid_indexer_identity``, ``invalid_card_shape``, ``name_too_long`` (a model name,
  LoRA name or alias longer than ``MAX_NAME_CHARS``, 1,024 characters: not a 1.6.1 rule, a
  bound on the free text every frontend carries on), ``invalid_json``, ``invalid_utf8``.

Event-plane records (``events``) and drain records (``drain_record``) are refused with the
record reasons above; serving records (``serving_record``, the ``frontend-model-admission``
bucket) with reasons of their own, listed there.
"""

from __future__ import annotations

from workerset_admission.card.boundary import (
    DEFAULT_MAX_VALUE_SIZE,
    BoundarySettings,
    EndpointRecord,
    NamespaceFilter,
    ParsedKey,
    decode_endpoint_record,
    decode_model_record,
    decode_plain_model,
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
from workerset_admission.card.checksum import (
    card_checksum,
    mdc_local_path,
    mdcsum,
    router_config_json,
    slug,
)
from workerset_admission.card.differences import Difference, card_differences
from workerset_admission.card.drain_record import (
    decode_drain_record,
    encode_drain_record,
    is_drain_key,
)
from workerset_admission.card.entry import EntryDecoder, EntryKind, entry_kind
from workerset_admission.card.events import (
    EventKey,
    EventRecord,
    decode_event_record,
    event_kv_key,
    is_event_key,
    parse_event_key,
)
from workerset_admission.card.model import DecodedCard, decode_card, model_type_names

__all__ = [
    "DEFAULT_MAX_VALUE_SIZE",
    "BoundarySettings",
    "DecodedCard",
    "Difference",
    "EndpointRecord",
    "EntryDecoder",
    "EntryKind",
    "EventKey",
    "EventRecord",
    "NamespaceFilter",
    "ParsedKey",
    "card_checksum",
    "card_differences",
    "decode_card",
    "decode_drain_record",
    "decode_endpoint_record",
    "decode_event_record",
    "decode_model_record",
    "decode_plain_model",
    "encode_drain_record",
    "encode_endpoint_record",
    "encode_model_record",
    "endpoint_kv_key",
    "entry_kind",
    "escape_token",
    "event_kv_key",
    "is_drain_key",
    "is_event_key",
    "lora_projection_fingerprint",
    "mdc_local_path",
    "mdcsum",
    "model_kv_key",
    "model_type_names",
    "normalize_card",
    "parse_event_key",
    "parse_key",
    "router_config_json",
    "slug",
    "unescape_token",
]
