"""Memos of pure functions the fast paths call for every record or every distinct card.

Each memo answers exactly what the function it stands for answers for the same arguments; it
only saves computing it again. Every memo holds at most :data:`CACHE_LIMIT` entries and is
emptied when full, so a writer with many distinct values cannot grow it without limit.
"""

from __future__ import annotations

from typing import Any

from workerset_admission.card import jsonio
from workerset_admission.card.boundary_settings import BoundarySettings
from workerset_admission.card.card_facts import CardFacts, card_facts, lora_projection_fingerprint
from workerset_admission.card.model import DecodedCard, model_type_names
from workerset_admission.identity import EndpointId, GroupKey

__all__ = [
    "CACHE_LIMIT",
    "canonical_head",
    "clear",
    "facts_of",
    "fingerprint",
    "group_key",
    "model_types",
]

CACHE_LIMIT = 1024

_FINGERPRINTS: dict[tuple[Any, ...], str] = {}
_MODEL_TYPES: dict[int, str] = {}
_GROUPS: dict[tuple[str, tuple[str, str, str], str, str], GroupKey] = {}
_HEADS: dict[EndpointId, bytes] = {}
# The last group looked up, by the identity of its facts and endpoint: a fleet sharing one card
# under one endpoint asks for the same group record after record.
_LAST_GROUP: list[tuple[CardFacts, EndpointId, GroupKey] | None] = [None]


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    if len(memo) >= CACHE_LIMIT:
        memo.clear()
    memo[key] = value


def clear() -> None:
    """Forget every memoized value."""
    for memo in (_FINGERPRINTS, _MODEL_TYPES, _GROUPS, _HEADS):
        memo.clear()
    _LAST_GROUP[0] = None


def fingerprint(card: DecodedCard) -> str:
    """:func:`~..card_facts.lora_projection_fingerprint`, by the four values it reads."""
    fields = card.fields
    lora = fields["lora"]
    # The projection reads these typed fields (strings, u32 or None): an exact memo key.
    key = (
        fields["display_name"],
        tuple(fields["aliases"]),
        fields["runtime_config"]["max_gpu_lora_count"],
        None if lora is None else (lora["name"], lora["max_gpu_lora_count"]),
    )
    known = _FINGERPRINTS.get(key)
    if known is None:
        known = lora_projection_fingerprint(card)
        _remember(_FINGERPRINTS, key, known)
    return known


def model_types(bits: int) -> str:
    """:func:`~..model.model_type_names`: a fleet uses one or two model-type sets."""
    names = _MODEL_TYPES.get(bits)
    if names is None:
        names = model_type_names(bits)
        _remember(_MODEL_TYPES, bits, names)
    return names


def facts_of(card: DecodedCard, settings: BoundarySettings) -> CardFacts:
    """:func:`~..card_facts.card_facts` with its fingerprint and model-type names memoized."""
    return card_facts(card, settings, fingerprint=fingerprint, model_types=model_types)


def group_key(facts: CardFacts, endpoint: EndpointId) -> GroupKey:
    """:meth:`CardFacts.group_key`: one GroupKey object for every record of a group."""
    last = _LAST_GROUP[0]
    if last is not None and last[0] is facts and last[1] is endpoint:
        return last[2]
    where = (endpoint.namespace, endpoint.component, endpoint.endpoint)
    key = (facts.card.display_name, where, facts.model_types, facts.effective.value)
    group = _GROUPS.get(key)
    if group is None:
        group = facts.group_key(endpoint)
        _remember(_GROUPS, key, group)
    _LAST_GROUP[0] = (facts, endpoint, group)
    return group


def canonical_head(endpoint: EndpointId) -> bytes:
    """Return the bytes 1.6.1 writes before a model record's instance id, for this endpoint."""
    head = _HEADS.get(endpoint)
    if head is None:
        head = (
            f'{{"type":"Model","namespace":{jsonio.quote(endpoint.namespace)}'
            f',"component":{jsonio.quote(endpoint.component)}'
            f',"endpoint":{jsonio.quote(endpoint.endpoint)},"instance_id":'
        ).encode("utf-8", "surrogatepass")
        _remember(_HEADS, endpoint, head)
    return head
