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

Speed: registrations that share a card (a fleet) usually carry byte-identical ``card_json``
text. The decoded card, its checksum and fingerprint are cached by those exact bytes (and by
the tokenizer overrides), so each further record costs a small parse of the envelope only.
A record spelled exactly as 1.6.1 writes it for its key (``_try_canonical``) is not parsed at
all outside its card. A card that differs from the last field-by-field decoded card inside one
value only (a fleet's neighbour, ``neighbour``) is decoded as that card with the one value
decoded afresh, and keeps its checksum and other facts when computing them never read that
value. Other cards are decoded field by field, each field's value once per distinct spelling
(``fieldmemo``), and anything else by the whole-text decoder.
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import blake3

from ..errors import CardDecodeError, InvalidRecordError, RemoteDataError, UsageError
from ..identity import EndpointId, GroupKey, Registration, WorkerType, instance_key

# The key codec lives beside the identities it names, so the NATS adapters and the service
# share it without reaching into the card package; it stays importable from here too.
from ..keys import (
    ParsedKey,
    check_instance_id,
    endpoint_kv_key,
    escape_token,
    model_kv_key,
    parse_key,
    unescape_token,
)
from . import jsonio
from .checksum import card_checksum
from .fieldmemo import decode_card_fields
from .model import PREFILL_BIT, DecodedCard, decode_card_value, model_type_names
from .neighbour import Near, decode_near, learn
from .schema import Ctx

__all__ = [
    "DEFAULT_MAX_VALUE_SIZE",
    "BoundarySettings",
    "EndpointRecord",
    "NamespaceFilter",
    "ParsedKey",
    "decode_endpoint_record",
    "decode_model_record",
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

DEFAULT_MAX_VALUE_SIZE = 1 << 20


# --------------------------------------------------------------------------- settings


class NamespaceFilter(str, enum.Enum):
    """How the frontend's namespace setting selects worker namespaces (1.6.1 rules)."""

    GLOBAL = "global"
    EXACT = "exact"
    PREFIX = "prefix"


@dataclass(frozen=True, slots=True)
class BoundarySettings:
    """Frontend-side settings that shape normalization.

    ``namespace``: absent, empty or ``"dynamo"`` means every namespace (Dynamo's global
    filter). ``namespace_prefix``: a literal prefix match instead; with ``prefix_strict`` only
    the prefix itself or ``<prefix>-*`` match (worker generations). The tokenizer overrides
    are written into ``runtime_config`` as 1.6.1's ``--tokenizer-backend`` /
    ``--tokenizer-fallback`` do; they are not part of the checksum.
    """

    namespace: str | None = None
    namespace_prefix: str | None = None
    prefix_strict: bool = False
    tokenizer_backend: str | None = None
    tokenizer_fallback_enabled: bool | None = None
    max_value_size: int = DEFAULT_MAX_VALUE_SIZE

    def __post_init__(self) -> None:
        if self.tokenizer_backend not in (None, "default", "fastokens", "basetenkenizer"):
            raise UsageError(f"unknown tokenizer backend {self.tokenizer_backend!r}")
        if self.max_value_size <= 0:
            raise UsageError("max_value_size must be positive")

    @property
    def filter_kind(self) -> NamespaceFilter:
        if self.namespace_prefix is not None:
            return NamespaceFilter.PREFIX
        if self.namespace in (None, "", "dynamo"):
            return NamespaceFilter.GLOBAL
        return NamespaceFilter.EXACT

    def namespace_matches(self, namespace: str) -> bool:
        if self.namespace_prefix is None and self.namespace in (None, "", "dynamo"):
            return True  # the global filter, the common case: checked without the property
        kind = self.filter_kind
        if kind is NamespaceFilter.GLOBAL:
            return True
        if kind is NamespaceFilter.EXACT:
            return namespace == self.namespace
        prefix = self.namespace_prefix or ""
        if self.prefix_strict:
            return namespace == prefix or namespace.startswith(prefix + "-")
        return namespace.startswith(prefix)

    @property
    def overrides(self) -> tuple[str | None, bool | None]:
        return (self.tokenizer_backend, self.tokenizer_fallback_enabled)


# --------------------------------------------------------------------------- normalization


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(item) for item in value]
    return value


_FINGERPRINTS: dict[tuple[Any, ...], str] = {}


def lora_projection_fingerprint(card: DecodedCard) -> str:
    """1.6.1's LoRA projection fingerprint: blake3 of the key-sorted projection JSON."""
    fields = card.fields
    lora = fields["lora"]
    # The projection reads four typed fields (strings, u32 or None): a cheap exact memo key.
    memo_key = (
        fields["display_name"],
        tuple(fields["aliases"]),
        fields["runtime_config"]["max_gpu_lora_count"],
        None if lora is None else (lora["name"], lora["max_gpu_lora_count"]),
    )
    known = _FINGERPRINTS.get(memo_key)
    if known is not None:
        return known
    fingerprint = _projection_fingerprint(fields, lora)
    if len(_FINGERPRINTS) >= _CACHE_LIMIT:
        _FINGERPRINTS.clear()
    _FINGERPRINTS[memo_key] = fingerprint
    return fingerprint


def _projection_fingerprint(fields: dict[str, Any], lora: Any) -> str:
    if lora is not None:
        # LoraInfo leaves out an unset capacity when it is serialized.
        lora = {
            k: v
            for k, v in (("name", lora["name"]), ("max_gpu_lora_count", lora["max_gpu_lora_count"]))
            if v is not None
        }
    projection = {
        "aliases": list(fields["aliases"]),
        "base_capacity": fields["runtime_config"]["max_gpu_lora_count"],
        "display_name": fields["display_name"],
        "lora": lora,
    }
    text = jsonio.dumps_compact(_sorted_keys(projection))
    return blake3.blake3(text.encode()).hexdigest()


_TOKENS_SURFACES = PREFILL_BIT | 0b111  # chat, completions, embedding, legacy prefill bit
_TENSOR_BIT = 1 << 3


def _validate_shape(card: DecodedCard, effective: str) -> None:
    bits = card.model_type_bits
    model_input = card.model_input
    if not card.display_name:
        raise CardDecodeError("invalid_card_shape", "model name must not be empty")
    if effective == "prefill" and model_input != "Tokens":
        raise CardDecodeError("invalid_card_shape", "a prefill worker requires Tokens input")
    if card.worker_type == "encode" and bits == 0 and model_input != "Tokens":
        raise CardDecodeError("invalid_card_shape", "an encode worker requires Tokens input")
    if bits == 0 or model_input == "Text":
        return
    if model_input == "Tokens" and not bits & ~_TOKENS_SURFACES:
        return
    if model_input == "Tensor" and bits == _TENSOR_BIT:
        return
    raise CardDecodeError(
        "invalid_card_shape",
        f"unsupported model input {model_input} for model type {model_type_names(bits)!r}",
    )


def normalize_card(card: DecodedCard, settings: BoundarySettings) -> DecodedCard:
    """Legacy prefill topology and tokenizer overrides, as 1.6.1 applies them before mdcsum."""
    fields = card.fields
    changed = False
    if fields["worker_type"] is None and fields["model_type"] & PREFILL_BIT:
        # N-2 prefill workers announced themselves only through the Prefill model-type bit.
        fields = dict(fields)
        fields["worker_type"] = "prefill"
        if not fields["needs"]:
            fields["needs"] = [["decode"]]
        changed = True
    backend, fallback = settings.overrides
    if backend is not None or fallback is not None:
        fields = dict(fields) if not changed else fields
        runtime = dict(fields["runtime_config"])
        if backend is not None:
            runtime["tokenizer_backend"] = backend
        if fallback is not None:
            runtime["tokenizer_fallback_enabled"] = fallback
        fields["runtime_config"] = runtime
        changed = True
    return DecodedCard(fields) if changed else card


def _effective_worker_type(card: DecodedCard) -> str:
    if card.worker_type is not None:
        return card.worker_type
    return "prefill" if card.model_type_bits & PREFILL_BIT else "aggregated"


class _CardFacts(NamedTuple):
    """Everything about a card that does not depend on the record carrying it.

    A named tuple rather than a frozen dataclass: one is built for every distinct card, and a
    tuple is built in one step instead of one attribute at a time.
    """

    card: DecodedCard
    checksum: str
    fingerprint: str
    model_types: str
    effective: WorkerType
    worker_type: WorkerType | None
    needs: tuple[tuple[WorkerType, ...], ...]
    taints: tuple[str, ...]
    has_lora: bool
    # Group keys by endpoint: a fleet shares one card across a few endpoints.
    groups: dict[tuple[str, str, str], GroupKey]


_WORKER_TYPES = {kind.value: kind for kind in WorkerType}
_MODEL_TYPES: dict[int, str] = {}


def _model_types(bits: int) -> str:
    # A fleet uses one or two model-type sets: spell each once.
    names = _MODEL_TYPES.get(bits)
    if names is None:
        names = model_type_names(bits)
        if len(_MODEL_TYPES) < _CACHE_LIMIT:
            _MODEL_TYPES[bits] = names
    return names


def _card_facts(card: DecodedCard, settings: BoundarySettings) -> _CardFacts:
    card = normalize_card(card, settings)
    effective = _effective_worker_type(card)
    _validate_shape(card, effective)
    worker_type = card.worker_type
    fields = card.fields
    needs = fields["needs"]
    return _CardFacts(
        card=card,
        checksum=card_checksum(card),
        fingerprint=lora_projection_fingerprint(card),
        model_types=_model_types(card.model_type_bits),
        effective=_WORKER_TYPES[effective],
        worker_type=None if worker_type is None else _WORKER_TYPES[worker_type],
        needs=tuple(tuple(_WORKER_TYPES[w] for w in alt) for alt in needs) if needs else (),
        taints=tuple(sorted(fields["runtime_config"]["taints"])),
        has_lora=fields["lora"] is not None,
        groups={},
    )


class _Reads(dict):  # type: ignore[type-arg]
    """A card's fields (or a struct field's members) that log which keys are read.

    Reading one key logs ``prefix + key``; anything that looks at the mapping as a whole
    (iteration, copying, comparison) logs ``prefix + "*"``.
    """

    __slots__ = ("log", "prefix")

    log: set[str]
    prefix: str

    def __getitem__(self, key: str) -> Any:
        self.log.add(self.prefix + key)
        return dict.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        self.log.add(self.prefix + key)
        return dict.get(self, key, default)

    def __contains__(self, key: object) -> bool:
        self.log.add(self.prefix + str(key))
        return dict.__contains__(self, key)

    def _whole(self) -> None:
        self.log.add(self.prefix + "*")

    def __iter__(self) -> Any:
        self._whole()
        return dict.__iter__(self)

    def keys(self) -> Any:
        self._whole()
        return dict.keys(self)

    def values(self) -> Any:
        self._whole()
        return dict.values(self)

    def items(self) -> Any:
        self._whole()
        return dict.items(self)

    def copy(self) -> dict[str, Any]:
        self._whole()
        return dict(dict.items(self))

    def __len__(self) -> int:
        self._whole()
        return dict.__len__(self)

    def __eq__(self, other: object) -> bool:
        self._whole()
        return dict.__eq__(self, other)

    __hash__ = None


def _logged(values: dict[str, Any], prefix: str, log: set[str]) -> _Reads:
    logged = _Reads(values)
    logged.log = log
    logged.prefix = prefix
    return logged


def _facts_reads(card: DecodedCard, settings: BoundarySettings) -> frozenset[str]:
    """Which fields and struct members :func:`_card_facts` reads for this card and settings.

    The facts are computed once more over fields that log every read. ``_card_facts`` is a
    deterministic function of what it reads (and the settings), so a card that differs from
    this one only in a value it never read has the same facts, the card itself aside.
    """
    log: set[str] = set()
    fields = {
        name: _logged(value, f"{name}.", log) if isinstance(value, dict) else value
        for name, value in card.fields.items()
    }
    with contextlib.suppress(CardDecodeError):
        _card_facts(DecodedCard(_logged(fields, "", log)), settings)
    return frozenset(log)


@dataclass(frozen=True, slots=True)
class _NearFacts:
    """The facts of a neighbour path's reference card, and what computing them read."""

    facts: _CardFacts
    overrides: tuple[str | None, bool | None]
    reads: frozenset[str]

    def reusable(self, path: str, overrides: tuple[str | None, bool | None]) -> bool:
        if overrides != self.overrides:
            return False
        reads = self.reads
        if path in reads or "*" in reads:
            return False
        top, dot, _member = path.partition(".")
        return not dot or f"{top}.*" not in reads


def _near_facts(near: Near, settings: BoundarySettings) -> _CardFacts | CardDecodeError:
    ref = near.note
    if isinstance(ref, _NearFacts) and ref.reusable(near.path, settings.overrides):
        # Only a value the facts never read changed: they are the reference's, bar the card.
        return _CardFacts(near.card, *ref.facts[1:])
    try:
        return _card_facts(near.card, settings)
    except CardDecodeError as exc:
        return exc


# --------------------------------------------------------------------------- records


_CACHE_LIMIT = 1024
_CacheKey = tuple[bytes | str, tuple[str | None, bool | None]]


class _FactsCache:
    """Decoded cards by exact card text and override settings (content addressed).

    Bounded by entry count and by the total size of the card texts it keeps, oldest first,
    so a writer sending many large distinct cards cannot grow it without limit.
    """

    def __init__(self, max_entries: int = _CACHE_LIMIT, max_bytes: int = 64 << 20) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.size = 0
        self.entries: dict[_CacheKey, _CardFacts | CardDecodeError] = {}

    def get(self, key: _CacheKey) -> _CardFacts | CardDecodeError | None:
        return self.entries.get(key)

    def put(self, key: _CacheKey, value: _CardFacts | CardDecodeError) -> None:
        if key in self.entries:
            return
        self.size += len(key[0])
        self.entries[key] = value
        while self.entries and (len(self.entries) > self.max_entries or self.size > self.max_bytes):
            oldest = next(iter(self.entries))
            del self.entries[oldest]
            self.size -= len(oldest[0])


_CACHE = _FactsCache()
_GROUPS: dict[tuple[str, tuple[str, str, str], str, WorkerType], GroupKey] = {}


def _check_size(raw: bytes | str, settings: BoundarySettings, key: str) -> None:
    limit = settings.max_value_size
    size = len(raw)
    if isinstance(raw, str) and size <= limit < size * 4:
        size = len(raw.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise InvalidRecordError(
            "value_too_large", f"value of {size} bytes exceeds {limit}", key=key
        )


def _as_text(raw: bytes | str, settings: BoundarySettings, key: str) -> str:
    _check_size(raw, settings, key)
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRecordError("invalid_utf8", str(exc), key=key) from None


def _parse(text: str, key: str) -> Any:
    # A record is parsed whole into serde_json values: every number is evaluated.
    try:
        value = jsonio.loads(text)
    except jsonio.JsonError as exc:
        raise InvalidRecordError(exc.reason, exc.detail, key=key) from None
    if isinstance(value, dict) and all(not isinstance(v, (dict, list)) for v in value.values()):
        overflow = any(isinstance(v, jsonio.Overflow) for v in value.values())
    else:
        overflow = jsonio.has_overflow(value)
    if overflow:
        raise InvalidRecordError("number_out_of_range", "number out of range", key=key)
    return value


def _check_envelope(
    obj: Any, parsed: ParsedKey, expected_type: str, fields: tuple[str, ...]
) -> dict[str, Any]:
    key = parsed.key
    if not isinstance(obj, dict):
        raise InvalidRecordError(
            "invalid_record", "a discovery value must be a JSON object", key=key
        )
    if isinstance(obj, jsonio.DupDict):
        for name in obj.dups:
            if name == "type" or name in fields:
                raise InvalidRecordError("duplicate_field", f"duplicate field `{name}`", key=key)
    kind = obj.get("type")
    if kind != expected_type:
        raise InvalidRecordError(
            "wrong_record_type", f"expected a {expected_type} record, got type {kind!r}", key=key
        )
    for name in ("namespace", "component", "endpoint"):
        if not isinstance(obj.get(name), str):
            raise InvalidRecordError("invalid_record", f"field `{name}` must be a string", key=key)
    instance_id = obj.get("instance_id")
    if (
        isinstance(instance_id, bool)
        or not isinstance(instance_id, int)
        or not 0 <= instance_id < 1 << 64
    ):
        raise InvalidRecordError("invalid_record", "field `instance_id` must be a u64", key=key)
    endpoint = parsed.endpoint
    if (obj["namespace"], obj["component"], obj["endpoint"]) != (
        endpoint.namespace,
        endpoint.component,
        endpoint.endpoint,
    ) or instance_id != parsed.instance_id:
        raise InvalidRecordError("identity_mismatch", _disagreement(obj, parsed), key=key)
    return obj


def _disagreement(obj: dict[str, Any], parsed: ParsedKey) -> str:
    # Name each field that disagrees, so "namespace prod vs the key's dev" reads as it is.
    endpoint = parsed.endpoint
    pairs = (
        ("namespace", obj["namespace"], endpoint.namespace),
        ("component", obj["component"], endpoint.component),
        ("endpoint", obj["endpoint"], endpoint.endpoint),
        ("instance_id", obj["instance_id"], parsed.instance_id),
    )
    return "; ".join(
        f"the value's {name} {mine!r} disagrees with the key's {theirs!r}"
        for name, mine, theirs in pairs
        if mine != theirs
    )


_MODEL_FIELDS = ("namespace", "component", "endpoint", "instance_id", "card_json", "model_suffix")
_CARD_MARK = '"card_json":'


_CARD_MARK_BYTES = _CARD_MARK.encode()
_SUFFIX_MARK = ',"model_suffix":"'
_SUFFIX_MARK_BYTES = _SUFFIX_MARK.encode()


def _try_shared_card(
    raw: bytes | str,
    parsed_key: ParsedKey,
    settings: BoundarySettings,
    ctx: Ctx | None,
    key: str,
) -> Registration | None:
    """Decode a record whose card text was seen before, parsing only its small envelope.

    The record is cut into the envelope (``card_json`` replaced by ``null``) and the card text.
    When the envelope parses with ``card_json: null`` at the one place the key occurs, the
    original text is exactly that envelope with the card text in the value position, so
    decoding the two parts separately equals decoding the whole. Anything unusual (spacing,
    repeated markers, escapes) returns None and the caller decodes the whole record.
    """
    if isinstance(raw, str):
        mark, suffix_mark, null, close = _CARD_MARK, _SUFFIX_MARK, "null", "}"
    else:
        mark, suffix_mark, null, close = _CARD_MARK_BYTES, _SUFFIX_MARK_BYTES, b"null", b"}"  # type: ignore[assignment]
    start = raw.find(mark)  # type: ignore[arg-type]
    if start < 0 or not raw.endswith(close):  # type: ignore[arg-type]
        return None
    card_start = start + len(mark)
    end = raw.rfind(suffix_mark, card_start)  # type: ignore[arg-type]
    if end < 0:
        end = len(raw) - 1
    envelope = raw[:card_start] + null + raw[end:]  # type: ignore[operator]
    if isinstance(envelope, bytes):
        if envelope.count(b"card_json") != 1:
            return None
        try:
            envelope_text = envelope.decode("utf-8")
        except UnicodeDecodeError:
            return None
    else:
        if envelope.count("card_json") != 1:
            return None
        envelope_text = envelope
    if jsonio.has_lone_surrogate_escape(envelope_text):
        return None
    # The plain parser is enough for a flat envelope without repeated keys, "-0", NaN or
    # infinities; anything else goes to the whole-record path, which applies serde's rules.
    try:
        value = json.loads(envelope_text)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("card_json", 0) is not None:
        return None
    if len(value) != envelope_text.count('":') or '":-0' in envelope_text:
        return None
    for member in value.values():
        if isinstance(member, (dict, list)) or (
            isinstance(member, float) and not math.isfinite(member)
        ):
            return None
    obj = _check_envelope(value, parsed_key, "Model", _MODEL_FIELDS)
    try:
        facts = _cached_facts(raw[card_start:end], settings, ctx, key)
    except RemoteDataError:
        # The cut is exact only when the card text is one JSON value. Spelled otherwise (a
        # space after a comma, a member between the card and the suffix), the slice carries
        # more than the card and is refused; the whole-record path gives the true verdict.
        return None
    return _registration(obj, parsed_key, facts, key)


_HEADS: dict[EndpointId, bytes] = {}


def _canonical_head(endpoint: EndpointId) -> bytes:
    head = _HEADS.get(endpoint)
    if head is None:
        head = (
            f'{{"type":"Model","namespace":{jsonio.quote(endpoint.namespace)}'
            f',"component":{jsonio.quote(endpoint.component)}'
            f',"endpoint":{jsonio.quote(endpoint.endpoint)},"instance_id":'
        ).encode("utf-8", "surrogatepass")
        if len(_HEADS) >= _CACHE_LIMIT:
            _HEADS.clear()
        _HEADS[endpoint] = head
    return head


def _try_canonical(
    raw: bytes,
    parsed_key: ParsedKey,
    settings: BoundarySettings,
    ctx: Ctx | None,
    key: str,
) -> Registration | None:
    """Decode a record spelled exactly as 1.6.1 writes it for its key, parsing only its card.

    1.6.1 writes ``{"type":"Model","namespace":..,"component":..,"endpoint":..,
    "instance_id":..,"card_json":<card>}`` with ``,"model_suffix":".."`` before the brace for
    an adapter. When the bytes around the card are exactly that text for this record's key,
    the envelope's parse is known without parsing it: the right type, the key's identity, no
    repeated field. That holds only if the card text is one complete JSON value, which every
    card path below confirms before it answers (it refuses trailing text). Any refusal of
    the card text falls back to the general paths, which give the verdict for the whole
    record.
    """
    suffix = parsed_key.model_suffix
    if suffix is None:
        tail = b"}"
        envelope: dict[str, Any] = _NO_SUFFIX
    else:
        tail = f',"model_suffix":{jsonio.quote(suffix)}}}'.encode("utf-8", "surrogatepass")
        envelope = {"model_suffix": suffix}
    head = _HEADS.get(parsed_key.endpoint) or _canonical_head(parsed_key.endpoint)
    if not raw.startswith(head) or not raw.endswith(tail):
        return None
    # The instance id's digits and the card mark follow the head.
    rest = b"%d,%s" % (parsed_key.instance_id, _CARD_MARK_BYTES)
    start = len(head) + len(rest)
    if raw[len(head) : start] != rest:
        return None
    card_raw = raw[start : len(raw) - len(tail)]
    try:
        facts = _cached_facts(card_raw, settings, ctx, key)
    except InvalidRecordError:
        return None
    return _registration(envelope, parsed_key, facts, key)


_NO_SUFFIX: dict[str, Any] = {}


def _decode_card_text(card_text: str, key: str, level: int) -> Any:
    value = _parse(card_text, key)
    if level + jsonio.depth_of(value) > jsonio.MAX_DEPTH:
        raise InvalidRecordError("depth_limit", "recursion limit exceeded", key=key)
    return value


def _facts_for(
    card_value: Any, check_strings: bool, settings: BoundarySettings, ctx: Ctx | None
) -> _CardFacts:
    card = decode_card_value(card_value, strict_dups=False, check_strings=check_strings, ctx=ctx)
    return _card_facts(card, settings)


def _reads_files(value: Any) -> bool:
    """Whether decoding this card reads a router policy file (an array-form router may)."""
    router = value.get("router_config") if isinstance(value, dict) else None
    if isinstance(router, dict):
        kv = router.get("kv_router_config")
        return isinstance(kv, list) or (
            isinstance(kv, dict) and kv.get("router_policy_config") is not None
        )
    return isinstance(router, list)


_FAST_CTX = Ctx(strict_dups=False, check_strings=False)


def _fast_ctx(ctx: Ctx) -> Ctx:
    return Ctx(strict_dups=False, check_strings=False, read_file=ctx.read_file)


def _cached_facts(
    card_raw: bytes | str, settings: BoundarySettings, ctx: Ctx | None, key: str
) -> _CardFacts:
    cache_key = (card_raw, settings.overrides)
    cached = _CACHE.get(cache_key)
    if cached is None and ctx is None and type(card_raw) is bytes:
        # A fleet neighbour: the reference card with one value respelled.
        near = decode_near(card_raw, _FAST_CTX)
        if near is not None:
            cached = _near_facts(near, settings)
            _CACHE.put(cache_key, cached)
    if cached is None:
        if isinstance(card_raw, bytes):
            try:
                card_text = card_raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidRecordError("invalid_utf8", str(exc), key=key) from None
        else:
            card_text = card_raw
        check = jsonio.has_lone_surrogate_escape(card_text)
        fast = None
        learning = not check and ctx is None and isinstance(card_raw, bytes)
        if not check:
            # Fields spelled like an earlier card's are not decoded again.
            fast = decode_card_fields(card_text, _FAST_CTX if ctx is None else _fast_ctx(ctx))
        if fast is not None:
            try:
                cached = _card_facts(fast, settings)
            except CardDecodeError as exc:
                cached = exc
            reads_files = False
            if learning and not isinstance(cached, CardDecodeError) and cached.card is fast:
                note = _NearFacts(cached, settings.overrides, _facts_reads(fast, settings))
                learn(card_raw, fast, note)  # type: ignore[arg-type]
        else:
            card_value = _decode_card_text(card_text, key, 1)
            if check and jsonio.has_lone_surrogate(card_value):
                raise InvalidRecordError("invalid_string", "lone surrogate in hex escape", key=key)
            try:
                cached = _facts_for(card_value, False, settings, ctx)
            except CardDecodeError as exc:
                cached = exc
            reads_files = _reads_files(card_value)
        assert cached is not None
        # A card naming a router policy file is decoded afresh each time: 1.6.1 reads the
        # file on every decode, so its verdict can change.
        if ctx is None and not reads_files:
            _CACHE.put(cache_key, cached)
    if isinstance(cached, CardDecodeError):
        raise CardDecodeError(cached.reason, cached.detail)
    return cached


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
    ``ctx`` may supply a file reader for the router files a card names (tests).
    """
    settings = settings or BoundarySettings()
    if parsed_key.kind != "model":
        raise UsageError("decode_model_record needs a model key")
    key = parsed_key.key or model_kv_key(
        parsed_key.endpoint, parsed_key.instance_id, parsed_key.model_suffix
    )
    if not settings.namespace_matches(parsed_key.endpoint.namespace):
        return None
    if type(raw) is bytes:
        # The wire's own type, checked before the costlier abstract Mapping check below.
        _check_size(raw, settings, key)
        fast = _try_canonical(raw, parsed_key, settings, ctx, key)
        if fast is not None:
            return fast
    if not isinstance(raw, (bytes, bytearray, memoryview, str)) and isinstance(raw, Mapping):
        try:
            envelope = jsonio.loads(jsonio.dumps_compact(dict(raw)))
        except (TypeError, jsonio.JsonError) as exc:
            raise InvalidRecordError("invalid_record", str(exc), key=key) from None
        obj = _check_envelope(envelope, parsed_key, "Model", _MODEL_FIELDS)
        card_value = obj.get("card_json")
        if jsonio.depth_of(obj) > jsonio.MAX_DEPTH:
            raise InvalidRecordError("depth_limit", "recursion limit exceeded", key=key)
        check = True
    else:
        if isinstance(raw, (bytearray, memoryview)):
            raw = bytes(raw)
        _check_size(raw, settings, key)
        fast = _try_shared_card(raw, parsed_key, settings, ctx, key)
        if fast is not None:
            return fast
        text = _as_text(raw, settings, key)
        check = jsonio.has_lone_surrogate_escape(text)
        whole = _parse(text, key)
        if jsonio.depth_of(whole) > jsonio.MAX_DEPTH:
            raise InvalidRecordError("depth_limit", "recursion limit exceeded", key=key)
        if check and jsonio.has_lone_surrogate(whole):
            raise InvalidRecordError("invalid_string", "lone surrogate in hex escape", key=key)
        obj = _check_envelope(whole, parsed_key, "Model", _MODEL_FIELDS)
        card_value = obj.get("card_json")
        check = False
    if "card_json" not in obj:
        raise InvalidRecordError("invalid_record", "missing field `card_json`", key=key)
    return _registration(obj, parsed_key, _facts_for(card_value, check, settings, ctx), key)


def _registration(
    obj: dict[str, Any], parsed_key: ParsedKey, facts: _CardFacts, key: str
) -> Registration:
    suffix = obj.get("model_suffix")
    if suffix != parsed_key.model_suffix:
        if suffix is not None and not isinstance(suffix, str):
            raise InvalidRecordError(
                "invalid_record", "field `model_suffix` must be a string", key=key
            )
        raise InvalidRecordError(
            "identity_mismatch", "the value's model_suffix disagrees with its key", key=key
        )
    if (suffix is not None) is not facts.has_lora:
        raise InvalidRecordError(
            "lora_mismatch", "LoRA discovery identity and card metadata disagree", key=key
        )
    endpoint = parsed_key.endpoint
    where = (endpoint.namespace, endpoint.component, endpoint.endpoint)
    group = facts.groups.get(where)
    if group is None:
        # Distinct cards of one fleet still share their group: one GroupKey object for all.
        shared = (facts.card.display_name, where, facts.model_types, facts.effective)
        group = _GROUPS.get(shared)
        if group is None:
            group = GroupKey.build(
                facts.card.display_name, endpoint, facts.model_types, facts.effective
            )
            if len(_GROUPS) >= _CACHE_LIMIT:
                _GROUPS.clear()
            _GROUPS[shared] = group
        if len(facts.groups) < _CACHE_LIMIT:
            facts.groups[where] = group
    instance_id = parsed_key.instance_id
    path = f"{where[0]}/{where[1]}/{where[2]}/{instance_id:x}"
    # One registration per record: its slots are written directly, as the core writes its
    # effects, instead of through the frozen dataclass __init__ (object.__setattr__ per field).
    reg = _new(Registration)
    (
        set_key,
        set_endpoint,
        set_instance_id,
        set_suffix,
        set_group,
        set_checksum,
        set_fingerprint,
        set_worker_type,
        set_needs,
        set_taints,
        set_card,
    ) = _REGISTRATION_SLOTS
    set_key(reg, f"{path}/{suffix}" if suffix else path)
    set_endpoint(reg, endpoint)
    set_instance_id(reg, instance_id)
    set_suffix(reg, suffix)
    set_group(reg, group)
    set_checksum(reg, facts.checksum)
    set_fingerprint(reg, facts.fingerprint)
    set_worker_type(reg, facts.worker_type)
    set_needs(reg, facts.needs)
    set_taints(reg, facts.taints)
    set_card(reg, facts.card)
    return reg


_new = object.__new__
_REGISTRATION_SLOTS = tuple(
    vars(Registration)[name].__set__
    for name in (
        "key",
        "endpoint",
        "instance_id",
        "model_suffix",
        "group",
        "mdc_checksum",
        "lora_fingerprint",
        "worker_type",
        "needs",
        "taints",
        "card",
    )
)


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    """An endpoint liveness record: which instance serves an endpoint, and how to reach it."""

    endpoint: EndpointId
    instance_id: int
    transport: Any = None
    device_type: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def instance_key(self) -> str:
        return instance_key(self.endpoint, self.instance_id)


_ENDPOINT_FIELDS = ("namespace", "component", "endpoint", "instance_id", "transport", "device_type")


def decode_endpoint_record(
    parsed_key: ParsedKey,
    raw: bytes | bytearray | memoryview | str | Mapping[str, Any],
    settings: BoundarySettings | None = None,
) -> EndpointRecord:
    """Decode an endpoint liveness record; its identity must agree with its key."""
    settings = settings or BoundarySettings()
    if parsed_key.kind != "endpoint":
        raise UsageError("decode_endpoint_record needs an endpoint key")
    key = parsed_key.key or endpoint_kv_key(parsed_key.endpoint, parsed_key.instance_id)
    if isinstance(raw, Mapping):
        try:
            value = jsonio.loads(jsonio.dumps_compact(dict(raw)))
        except (TypeError, jsonio.JsonError) as exc:
            raise InvalidRecordError("invalid_record", str(exc), key=key) from None
    else:
        data = raw if isinstance(raw, (bytes, str)) else bytes(raw)
        value = _parse(_as_text(data, settings, key), key)
    if jsonio.depth_of(value) > jsonio.MAX_DEPTH:
        raise InvalidRecordError("depth_limit", "recursion limit exceeded", key=key)
    obj = _check_envelope(value, parsed_key, "Endpoint", _ENDPOINT_FIELDS)
    device = obj.get("device_type")
    if device is not None and not isinstance(device, str):
        raise InvalidRecordError("invalid_record", "field `device_type` must be a string", key=key)
    extra = {k: v for k, v in obj.items() if k not in _ENDPOINT_FIELDS and k != "type"}
    return EndpointRecord(
        parsed_key.endpoint, parsed_key.instance_id, obj.get("transport"), device, extra
    )


# --------------------------------------------------------------------------- encoders


def _card_text(card: Mapping[str, Any] | str | bytes) -> str:
    if isinstance(card, Mapping):
        return jsonio.dumps_compact(dict(card))
    text = card.decode("utf-8") if isinstance(card, bytes) else card
    try:
        value = jsonio.loads(text)
    except jsonio.JsonError as exc:
        raise UsageError(f"card text is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError("card text must be a JSON object")
    return text.strip()


def encode_model_record(
    endpoint: EndpointId,
    instance_id: int,
    card_mapping: Mapping[str, Any] | str | bytes,
    suffix: str | None = None,
) -> bytes:
    """Encode a 1.6.1 ``DiscoveryInstance::Model`` value (compact JSON, 1.6.1 field order)."""
    check_instance_id(instance_id)
    head = jsonio.dumps_compact(
        {
            "type": "Model",
            "namespace": endpoint.namespace,
            "component": endpoint.component,
            "endpoint": endpoint.endpoint,
            "instance_id": instance_id,
        }
    )
    text = f"{head[:-1]},{_CARD_MARK}{_card_text(card_mapping)}"
    if suffix:
        text += f',"model_suffix":{json.dumps(suffix, ensure_ascii=False)}'
    return (text + "}").encode("utf-8")


def encode_endpoint_record(
    endpoint: EndpointId,
    instance_id: int,
    transport: Any = None,
    device_type: str | None = "cpu",
    extra: Mapping[str, Any] | None = None,
) -> bytes:
    """Encode a 1.6.1 ``DiscoveryInstance::Endpoint`` value."""
    check_instance_id(instance_id)
    value: dict[str, Any] = {
        "type": "Endpoint",
        "component": endpoint.component,
        "endpoint": endpoint.endpoint,
        "namespace": endpoint.namespace,
        "instance_id": instance_id,
        "transport": transport
        if transport is not None
        else {"tcp": f"127.0.0.1:0/{instance_id:x}"},
        "device_type": device_type,
    }
    value.update(extra or {})
    return jsonio.dumps_compact(value).encode("utf-8")
