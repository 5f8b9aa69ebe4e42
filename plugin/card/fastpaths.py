"""The fast card paths: records spelled as 1.6.1 writes them, shared card text, fleet neighbours.

The decoded card, its checksum and fingerprint are cached by the exact card text (and the
tokenizer overrides) in a bounded, content-addressed cache. A card that differs from the last
field-by-field decoded card inside one value (:mod:`.neighbour`) reuses that card's facts when
computing them never read the value; other cards are decoded field by field (:mod:`.fieldmemo`)
and anything else by the whole-text decoder. Every path answers as the whole-record decode does.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from typing import Any

from ..errors import CardDecodeError, InvalidRecordError, RemoteDataError
from ..identity import EndpointId, Registration
from ..keys import ParsedKey, plain_model_key
from . import jsonio
from .boundarysettings import BoundarySettings
from .cardfacts import CACHE_LIMIT, CardFacts, card_facts, facts_for
from .envelope import (
    CARD_MARK,
    MODEL_FIELDS,
    build_registration,
    check_envelope,
    parse,
    registration,
)
from .fieldmemo import decode_card_fields
from .model import DecodedCard
from .neighbour import Near, decode_near, learn
from .schema import Ctx

__all__ = ["decode_plain_model", "try_canonical", "try_shared_card"]


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
    """Which fields and struct members :func:`card_facts` reads for this card and settings.

    The facts are computed once more over fields that log every read. ``card_facts`` is a
    deterministic function of what it reads (and the settings), so a card that differs from
    this one only in a value it never read has the same facts, the card itself aside.
    """
    log: set[str] = set()
    fields = {
        name: _logged(value, f"{name}.", log) if isinstance(value, dict) else value
        for name, value in card.fields.items()
    }
    with contextlib.suppress(CardDecodeError):
        card_facts(DecodedCard(_logged(fields, "", log)), settings)
    return frozenset(log)


@dataclass(frozen=True, slots=True)
class _NearFacts:
    """The facts of a neighbour path's reference card, and what computing them read."""

    facts: CardFacts
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


def _near_facts(near: Near, settings: BoundarySettings) -> CardFacts | CardDecodeError:
    ref = near.note
    if isinstance(ref, _NearFacts) and ref.reusable(near.path, settings.overrides):
        # Only a value the facts never read changed: they are the reference's, bar the card.
        return CardFacts(near.card, *ref.facts[1:])
    try:
        return card_facts(near.card, settings)
    except CardDecodeError as exc:
        return exc


_CacheKey = tuple[bytes | str, tuple[str | None, bool | None]]


class _FactsCache:
    """Decoded cards by exact card text and override settings (content addressed).

    Bounded by entry count and by the total size of the card texts it keeps, oldest first,
    so a writer sending many large distinct cards cannot grow it without limit.
    """

    def __init__(self, max_entries: int = CACHE_LIMIT, max_bytes: int = 64 << 20) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.size = 0
        self.entries: dict[_CacheKey, CardFacts | CardDecodeError] = {}

    def get(self, key: _CacheKey) -> CardFacts | CardDecodeError | None:
        return self.entries.get(key)

    def put(self, key: _CacheKey, value: CardFacts | CardDecodeError) -> None:
        if key in self.entries:
            return
        self.size += len(key[0])
        self.entries[key] = value
        while self.entries and (len(self.entries) > self.max_entries or self.size > self.max_bytes):
            oldest = next(iter(self.entries))
            del self.entries[oldest]
            self.size -= len(oldest[0])


_CACHE = _FactsCache()


def clear_caches() -> None:
    """Forget every decoded card: the facts cache and the last canonical card."""
    _CACHE.entries.clear()
    _CACHE.size = 0
    _LAST_CARD[0] = None


def _decode_card_text(card_text: str, key: str, level: int) -> Any:
    value = parse(card_text, key)
    if level + jsonio.depth_of(value) > jsonio.MAX_DEPTH:
        raise InvalidRecordError("depth_limit", "recursion limit exceeded", key=key)
    return value


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
) -> CardFacts:
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
                cached = card_facts(fast, settings)
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
                cached = facts_for(card_value, False, settings, ctx)
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


_CARD_MARK_BYTES = CARD_MARK.encode()
_SUFFIX_MARK = ',"model_suffix":"'
_SUFFIX_MARK_BYTES = _SUFFIX_MARK.encode()


def try_shared_card(
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
        mark, suffix_mark, null, close = CARD_MARK, _SUFFIX_MARK, "null", "}"
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
    obj = check_envelope(value, parsed_key, "Model", MODEL_FIELDS)
    try:
        facts = _cached_facts(raw[card_start:end], settings, ctx, key)
    except RemoteDataError:
        # The cut is exact only when the card text is one JSON value. Spelled otherwise (a
        # space after a comma, a member between the card and the suffix), the slice carries
        # more than the card and is refused; the whole-record path gives the true verdict.
        return None
    return registration(obj, parsed_key, facts, key)


_HEADS: dict[EndpointId, bytes] = {}


def _canonical_head(endpoint: EndpointId) -> bytes:
    head = _HEADS.get(endpoint)
    if head is None:
        head = (
            f'{{"type":"Model","namespace":{jsonio.quote(endpoint.namespace)}'
            f',"component":{jsonio.quote(endpoint.component)}'
            f',"endpoint":{jsonio.quote(endpoint.endpoint)},"instance_id":'
        ).encode("utf-8", "surrogatepass")
        if len(_HEADS) >= CACHE_LIMIT:
            _HEADS.clear()
        _HEADS[endpoint] = head
    return head


def try_canonical(
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
    facts = _canonical_facts(raw, head, tail, parsed_key.instance_id, settings, ctx, key)
    if facts is None:
        return None
    return registration(envelope, parsed_key, facts, key)


def decode_plain_model(key: str, raw: bytes, settings: BoundarySettings) -> Registration | None:
    """Decode the commonest record in one step, or return ``None`` for the general path.

    It answers for a base model card (no adapter) whose key needs no unescaping, whose
    namespace passes the filter, whose value is within the size limit and spelled exactly as
    1.6.1 writes it (see :func:`try_canonical`), and whose card is accepted and carries no
    LoRA metadata. For those the answer is the one ``decode_model_record`` gives, reached
    without the parsed key and the call chain. Anything else, a refusal included, is left to
    the general path, which gives the verdict.
    """
    if type(raw) is not bytes or len(raw) > settings.max_value_size:
        return None
    plain = plain_model_key(key)
    if plain is None:
        return None
    endpoint, instance_id = plain
    if not settings.namespace_matches(endpoint.namespace):
        return None
    head = _HEADS.get(endpoint) or _canonical_head(endpoint)
    try:
        facts = _canonical_facts(raw, head, b"}", instance_id, settings, None, key)
    except RemoteDataError:
        return None
    if facts is None or facts.has_lora:
        return None
    return build_registration(endpoint, instance_id, None, facts)


def _canonical_facts(
    raw: bytes,
    head: bytes,
    tail: bytes,
    instance_id: int,
    settings: BoundarySettings,
    ctx: Ctx | None,
    key: str,
) -> CardFacts | None:
    """Return the card's facts if ``raw`` is head, instance id, card mark, card, tail; else None."""
    if not raw.startswith(head) or not raw.endswith(tail):
        return None
    # The instance id's digits and the card mark follow the head.
    rest = b"%d,%s" % (instance_id, _CARD_MARK_BYTES)
    start = len(head) + len(rest)
    if raw[len(head) : start] != rest:
        return None
    end = len(raw) - len(tail)
    overrides = settings.overrides
    last = _LAST_CARD[0]
    if (
        last is not None
        and ctx is None
        and last[1] == overrides
        and end - start == len(last[0])
        and raw.startswith(last[0], start)
    ):
        # The card text of the record before (a fleet sharing one card): compared in place,
        # with neither a copy of the card nor a hash of it.
        return last[2]
    card_raw = raw[start:end]
    try:
        facts = _cached_facts(card_raw, settings, ctx, key)
    except InvalidRecordError:
        return None
    if ctx is None:
        _LAST_CARD[0] = (card_raw, overrides, facts)
    return facts


# The last card text a canonical record carried, with the overrides it was decoded under and
# its facts: what the cache would answer for the same text, found without looking it up.
_LAST_CARD: list[tuple[bytes, tuple[str | None, bool | None], CardFacts] | None] = [None]


_NO_SUFFIX: dict[str, Any] = {}
