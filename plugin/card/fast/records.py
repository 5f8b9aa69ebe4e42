"""The fast record paths: records spelled as 1.6.1 writes them, and records carrying a known card.

Each path answers a record exactly as the general path (:func:`..boundary.decode_model_record`
without this package) would, or returns ``None`` and leaves the record to the general path,
which then gives the verdict. Card texts go to :mod:`.card_cache`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from workerset_admission.card import jsonio
from workerset_admission.card.boundary_settings import BoundarySettings, FactsKey
from workerset_admission.card.card_facts import CardFacts
from workerset_admission.card.envelope import (
    CARD_MARK,
    MODEL_FIELDS,
    build_registration,
    check_envelope,
    registration,
)
from workerset_admission.card.fast import card_cache, field_memo, memo
from workerset_admission.card.fast.card_cache import cached_facts
from workerset_admission.card.schema import Ctx
from workerset_admission.errors import InvalidRecordError, RemoteDataError
from workerset_admission.identity import Registration
from workerset_admission.keys import ParsedKey, plain_model_key

__all__ = ["clear_caches", "decode_plain_model", "try_canonical", "try_shared_card"]


def clear_caches() -> None:
    """Forget every decoded card, memo, memoized field and the last canonical card."""
    card_cache.clear()
    memo.clear()
    field_memo.clear_memo()
    _LAST_CARD[0] = None


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
    cut = _cut_bytes(raw) if isinstance(raw, bytes) else _cut_text(raw)
    if cut is None:
        return None
    envelope_text, card_raw = cut
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
        facts = cached_facts(card_raw, settings, ctx, key)
    except RemoteDataError:
        # The cut is exact only when the card text is one JSON value. Spelled otherwise (a
        # space after a comma, a member between the card and the suffix), the slice carries
        # more than the card and is refused; the whole-record path gives the true verdict.
        return None
    return registration(obj, parsed_key, facts, key, memo.group_key(facts, parsed_key.endpoint))


def _cut_bytes(raw: bytes) -> tuple[str, bytes] | None:
    """Cut a record into its envelope text (card as ``null``) and its card's bytes."""
    start = raw.find(_CARD_MARK_BYTES)
    if start < 0 or not raw.endswith(b"}"):
        return None
    card_start = start + len(_CARD_MARK_BYTES)
    end = raw.rfind(_SUFFIX_MARK_BYTES, card_start)
    if end < 0:
        end = len(raw) - 1
    envelope = raw[:card_start] + b"null" + raw[end:]
    if envelope.count(b"card_json") != 1:
        return None
    try:
        return envelope.decode("utf-8"), raw[card_start:end]
    except UnicodeDecodeError:
        return None


def _cut_text(raw: str) -> tuple[str, str] | None:
    """:func:`_cut_bytes` for a record handed over as text."""
    start = raw.find(CARD_MARK)
    if start < 0 or not raw.endswith("}"):
        return None
    card_start = start + len(CARD_MARK)
    end = raw.rfind(_SUFFIX_MARK, card_start)
    if end < 0:
        end = len(raw) - 1
    envelope = raw[:card_start] + "null" + raw[end:]
    if envelope.count("card_json") != 1:
        return None
    return envelope, raw[card_start:end]


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
    head = memo.canonical_head(parsed_key.endpoint)
    facts = _canonical_facts(raw, head, tail, parsed_key.instance_id, settings, ctx, key)
    if facts is None:
        return None
    return registration(
        envelope, parsed_key, facts, key, memo.group_key(facts, parsed_key.endpoint)
    )


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
    head = memo.canonical_head(endpoint)
    try:
        facts = _canonical_facts(raw, head, b"}", instance_id, settings, None, key)
    except RemoteDataError:
        return None
    if facts is None or facts.has_lora:
        return None
    return build_registration(endpoint, instance_id, None, facts, memo.group_key(facts, endpoint))


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
    facts_key = settings.facts_key
    last = _LAST_CARD[0]
    if (
        last is not None
        and ctx is None
        and last[1] == facts_key
        and end - start == len(last[0])
        and raw.startswith(last[0], start)
    ):
        # The card text of the record before (a fleet sharing one card): compared in place,
        # with neither a copy of the card nor a hash of it.
        return last[2]
    card_raw = raw[start:end]
    try:
        facts = cached_facts(card_raw, settings, ctx, key)
    except InvalidRecordError:
        return None
    if ctx is None:
        _LAST_CARD[0] = (card_raw, facts_key, facts)
    return facts


# The last card text a canonical record carried, with the settings it was decoded under and
# its facts: what the cache would answer for the same text, found without looking it up.
_LAST_CARD: list[tuple[bytes, FactsKey, CardFacts] | None] = [None]


_NO_SUFFIX: dict[str, Any] = {}
