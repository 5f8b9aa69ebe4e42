"""Card facts by card text: the content-addressed cache and the decoders tried on a miss.

The decoded card, its checksum and fingerprint are kept by the exact card text (and the
tokenizer overrides and Dynamo line) in a bounded cache. On a miss the card is tried as a
neighbour of the last card decoded field by field (:mod:`.neighbour`, reusing that card's
facts when computing them never read the value that changed), then field by field
(:mod:`.field_memo`), then as whole text by the general decoder. Each answers as the general
path does, or declines.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from workerset_admission.card import jsonio
from workerset_admission.card.boundary_settings import BoundarySettings, FactsKey
from workerset_admission.card.card_facts import CardFacts, card_facts, facts_for
from workerset_admission.card.envelope import parse
from workerset_admission.card.fast import memo
from workerset_admission.card.fast.field_memo import decode_card_fields
from workerset_admission.card.fast.neighbour import Near, decode_near, learn
from workerset_admission.card.model import DecodedCard
from workerset_admission.card.schema import Ctx
from workerset_admission.errors import CardDecodeError, InvalidRecordError

__all__ = ["cached_facts", "clear"]


class _Reads(dict[str, Any]):
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
    """Which fields and struct members the general :func:`card_facts` reads for this card.

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
    settings: FactsKey
    reads: frozenset[str]

    def reusable(self, path: str, settings: FactsKey) -> bool:
        if settings != self.settings:
            return False
        reads = self.reads
        if path in reads or "*" in reads:
            return False
        top, dot, _member = path.partition(".")
        return not dot or f"{top}.*" not in reads


def _near_facts(near: Near, settings: BoundarySettings) -> CardFacts | CardDecodeError:
    ref = near.note
    if isinstance(ref, _NearFacts) and ref.reusable(near.path, settings.facts_key):
        # Only a value the facts never read changed: they are the reference's, bar the card.
        return CardFacts(near.card, *ref.facts[1:])
    try:
        return memo.facts_of(near.card, settings)
    except CardDecodeError as exc:
        return exc


_CacheKey = tuple[bytes | str, FactsKey]


class _FactsCache:
    """Decoded cards by exact card text and the settings facts depend on (content addressed).

    Bounded by entry count and by the total size of the card texts it keeps, oldest first,
    so a writer sending many large distinct cards cannot grow it without limit.
    """

    def __init__(self, max_entries: int = memo.CACHE_LIMIT, max_bytes: int = 64 << 20) -> None:
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


def clear() -> None:
    """Forget every decoded card."""
    _CACHE.entries.clear()
    _CACHE.size = 0


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


def cached_facts(
    card_raw: bytes | str, settings: BoundarySettings, ctx: Ctx | None, key: str
) -> CardFacts:
    """Return the facts of a card's text as the general path gives them, or raise its refusal.

    Looked up by the exact text and the settings the facts depend on; a miss is decoded as a
    neighbour of the last field-by-field decoded card, field by field, or as whole text, in
    that order.
    """
    cache_key = (card_raw, settings.facts_key)
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
        if not check:
            # Fields spelled like an earlier card's are not decoded again.
            fast = decode_card_fields(card_text, _FAST_CTX if ctx is None else _fast_ctx(ctx))
        if fast is not None:
            try:
                cached = memo.facts_of(fast, settings)
            except CardDecodeError as exc:
                cached = exc
            reads_files = False
            if (
                ctx is None
                and isinstance(card_raw, bytes)
                and not isinstance(cached, CardDecodeError)
                and cached.card is fast
            ):
                # The reference for the next card's neighbour path (compact wire bytes only).
                note = _NearFacts(cached, settings.facts_key, _facts_reads(fast, settings))
                learn(card_raw, fast, note)
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
