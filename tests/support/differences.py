"""Undoing reported checksum differences on card JSON, and card pairs that differ in known ways.

:func:`revert` sets one reported field of a card to another card's value (or removes it where
the other card leaves it out), on the JSON text's own structure, so any checksum, ours or the
runtime's, can judge the result.
"""

from __future__ import annotations

import copy
from typing import Any

from workerset_admission.card import BoundarySettings, decode_card, normalize_card
from workerset_admission.card.model import DecodedCard
from workerset_admission.identity import compact_json

__all__ = ["CONTEXT_SOURCES", "normalized", "revert", "reverted"]

# The effective context length is one input of the checksum read from three fields.
CONTEXT_SOURCES = (
    ("runtime_config", "context_length"),
    ("architectural_max_context_length",),
    ("context_length",),
)
_MISSING = object()


def normalized(card: dict[str, Any], settings: BoundarySettings | None = None) -> DecodedCard:
    """Decode and normalize a card as the discovery boundary does."""
    return normalize_card(decode_card(compact_json(card)), settings or BoundarySettings())


def _get(card: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        if not isinstance(card, dict) or name not in card:
            return _MISSING
        card = card[name]
    return card


def _copy(target: dict[str, Any], source: dict[str, Any], path: tuple[str, ...]) -> None:
    value = _get(source, path)
    parent: Any = target
    for name in path[:-1]:
        if value is _MISSING and not isinstance(parent.get(name), dict):
            return
        parent = parent.setdefault(name, {})
    if value is _MISSING:
        parent.pop(path[-1], None)
    else:
        parent[path[-1]] = copy.deepcopy(value)


def revert(rejected: dict[str, Any], incumbent: dict[str, Any], field: str) -> None:
    """Give ``rejected`` the incumbent's value of one reported field, in place."""
    paths = CONTEXT_SOURCES if field == "context_length" else (tuple(field.split(".")),)
    for path in paths:
        _copy(rejected, incumbent, path)


def reverted(
    rejected: dict[str, Any], incumbent: dict[str, Any], fields: list[str]
) -> dict[str, Any]:
    """A copy of ``rejected`` with every one of ``fields`` reverted to the incumbent's."""
    out = copy.deepcopy(rejected)
    for field in fields:
        revert(out, incumbent, field)
    return out
