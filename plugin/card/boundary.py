"""The discovery boundary: KV keys and values in, normalized registrations out.

This is where a discovery record becomes a :class:`~workerset_admission.identity.Registration`
the admission core can use, with the same normalization 1.6.1's frontend applies before it
computes ``mdcsum()``: namespace filter, card decoding, legacy prefill topology, tokenizer
overrides, card shape validation, the LoRA suffix/card agreement, the group key, the checksum,
the LoRA projection fingerprint, taints.

KV keys mirror Dynamo's discovery paths with ``.`` as the separator so NATS subject filters
work::

    v1.mdc.<ns>.<component>.<endpoint>.<id hex>[.<lora suffix>]
    v1.instances.<ns>.<component>.<endpoint>.<id hex>

Each token is escaped reversibly: a byte outside ``[A-Za-z0-9_-]`` becomes ``=XX`` (uppercase
hex of each UTF-8 byte). Only the canonical spelling is accepted, so a key has one meaning.

Wire shapes read here (the card's own generations and shims are listed in ``model``):

* 1.6.1 writes ``{"type":"Model","namespace","component","endpoint","instance_id":<u64>,
  "card_json":{...},"model_suffix"?}`` and ``{"type":"Endpoint",...,"transport",
  "device_type","request_plane_codec"}``.
* For the earlier generations in the N-2 window, the envelope fields they did not write are
  optional: ``model_suffix`` (base cards, and workers from before LoRA adapter records),
  ``device_type`` and ``request_plane_codec`` on endpoint records; transports of any
  spelling are carried through untouched. Their cards are handled by the shims in ``model``.

A record is parsed whole into serde_json values before its card is read, as 1.6.1 does, so
inside ``card_json`` a repeated key keeps its last value, every number is evaluated and the
128-level nesting limit counts the envelope; a repeated envelope field is refused.

The serde-faithful decode is :func:`decode_whole_record`, readable on its own: it parses the
whole record, checks the envelope, decodes the card and computes its facts. The speed code lives
in the :mod:`.fast` package; :func:`decode_model_record` is the one place that tries it first
(each fast path answers as :func:`decode_whole_record` does, or declines), and ``.fast`` says
what each shortcut assumes and which differential test holds it to the whole-record decode.

This module holds the model-record entry points and re-exports the boundary's public names from
the modules that hold them: ``boundary_settings`` (the frontend's settings), ``card_facts``
(normalization, shape rules, checksum and fingerprint of a card), ``envelope`` (size, text and
envelope checks, key/value agreement, the registration), ``endpoint_record`` (endpoint liveness
records) and ``encoders`` (the record encoders publishers and tests use).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workerset_admission.card import jsonio
from workerset_admission.card.boundary_settings import (
    DEFAULT_MAX_VALUE_SIZE,
    BoundarySettings,
    NamespaceFilter,
)
from workerset_admission.card.card_facts import (
    facts_for,
    lora_projection_fingerprint,
    normalize_card,
)
from workerset_admission.card.encoders import encode_endpoint_record, encode_model_record
from workerset_admission.card.endpoint_record import EndpointRecord, decode_endpoint_record
from workerset_admission.card.envelope import (
    MODEL_FIELDS,
    as_text,
    check_envelope,
    check_size,
    mapping_value,
    parse,
    registration,
)
from workerset_admission.card.fast import decode_plain_model, try_canonical, try_shared_card
from workerset_admission.card.schema import Ctx
from workerset_admission.errors import InvalidRecordError, UsageError
from workerset_admission.identity import Registration

# The key codec lives beside the identities it names, so the NATS adapters and the service
# share it without reaching into the card package; it stays importable from here too.
from workerset_admission.keys import (
    ParsedKey,
    endpoint_kv_key,
    escape_token,
    model_kv_key,
    parse_key,
    unescape_token,
)

__all__ = [
    "DEFAULT_MAX_VALUE_SIZE",
    "BoundarySettings",
    "EndpointRecord",
    "NamespaceFilter",
    "ParsedKey",
    "decode_endpoint_record",
    "decode_model_entry",
    "decode_model_record",
    "decode_plain_model",
    "decode_whole_record",
    "encode_endpoint_record",
    "encode_model_record",
    "endpoint_kv_key",
    "escape_token",
    "lora_projection_fingerprint",
    "model_kv_key",
    "normalize_card",
    "parse_key",
    "unescape_token",
]


def decode_model_entry(
    key: str, raw: bytes, settings: BoundarySettings | None = None
) -> Registration | None:
    """Decode the model record under bucket key ``key``: what ingestion asks of a model entry.

    The commonest record (a base card spelled as 1.6.1 writes it, under a plain key) is decoded
    in one step; anything else goes through :func:`decode_model_record`, which gives the verdict.
    """
    settings = settings or BoundarySettings()
    fast = decode_plain_model(key, raw, settings)
    if fast is not None:
        return fast
    return decode_model_record(parse_key(key), raw, settings)


def decode_model_record(
    parsed_key: ParsedKey,
    raw: bytes | bytearray | memoryview | str | Mapping[str, Any],
    settings: BoundarySettings | None = None,
    *,
    ctx: Ctx | None = None,
) -> Registration | None:
    """Decode and normalize one model card record; ``None`` when the namespace filter drops it.

    Raises :class:`InvalidRecordError` (bad envelope, key/value disagreement, LoRA
    disagreement) or :class:`CardDecodeError` (a card 1.6.1 refuses), never anything else.
    ``ctx`` may supply a file reader for the router files a card names (tests). The answer is
    :func:`decode_whole_record`'s; the fast paths reach it sooner for the records they know.
    """
    settings = settings or BoundarySettings()
    key = _model_key(parsed_key)
    if not settings.namespace_matches(parsed_key.endpoint.namespace):
        return None
    if isinstance(raw, (bytearray, memoryview)):
        raw = bytes(raw)
    if isinstance(raw, (bytes, str)):
        check_size(raw, settings, key)
        fast = None
        if type(raw) is bytes:
            fast = try_canonical(raw, parsed_key, settings, ctx, key)
        if fast is None:
            fast = try_shared_card(raw, parsed_key, settings, ctx, key)
        if fast is not None:
            return fast
    return decode_whole_record(parsed_key, raw, settings, ctx=ctx)


def decode_whole_record(
    parsed_key: ParsedKey,
    raw: bytes | bytearray | memoryview | str | Mapping[str, Any],
    settings: BoundarySettings | None = None,
    *,
    ctx: Ctx | None = None,
) -> Registration | None:
    """Decode one model record as 1.6.1 does, parsing it whole: the serde-faithful path.

    Same contract as :func:`decode_model_record`, without any cache or shortcut.
    """
    settings = settings or BoundarySettings()
    key = _model_key(parsed_key)
    if not settings.namespace_matches(parsed_key.endpoint.namespace):
        return None
    if not isinstance(raw, (bytes, bytearray, memoryview, str)) and isinstance(raw, Mapping):
        envelope = mapping_value(raw, key)
        obj = check_envelope(envelope, parsed_key, "Model", MODEL_FIELDS)
        card_value = obj.get("card_json")
        if jsonio.depth_of(obj) > jsonio.MAX_DEPTH:
            raise InvalidRecordError("depth_limit", "recursion limit exceeded", key=key)
        check = True
    else:
        if isinstance(raw, (bytearray, memoryview)):
            raw = bytes(raw)
        check_size(raw, settings, key)
        text = as_text(raw, settings, key)
        check = jsonio.has_lone_surrogate_escape(text)
        whole = parse(text, key)
        if jsonio.depth_of(whole) > jsonio.MAX_DEPTH:
            raise InvalidRecordError("depth_limit", "recursion limit exceeded", key=key)
        if check and jsonio.has_lone_surrogate(whole):
            raise InvalidRecordError("invalid_string", "lone surrogate in hex escape", key=key)
        obj = check_envelope(whole, parsed_key, "Model", MODEL_FIELDS)
        card_value = obj.get("card_json")
        check = False
    if "card_json" not in obj:
        raise InvalidRecordError("invalid_record", "missing field `card_json`", key=key)
    return registration(obj, parsed_key, facts_for(card_value, check, settings, ctx), key)


def _model_key(parsed_key: ParsedKey) -> str:
    if parsed_key.kind != "model":
        raise UsageError("decode_model_record needs a model key")
    return parsed_key.key or model_kv_key(
        parsed_key.endpoint, parsed_key.instance_id, parsed_key.model_suffix
    )
