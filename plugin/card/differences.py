"""Which inputs of ``mdcsum()`` two normalized cards differ in, and how each side reads.

Two cards land in different cohorts when their checksums differ, and the checksum reads only
some of a card's fields (``checksum.CHECKSUM_INPUTS``). :func:`card_differences` compares two
cards input by input over that table, so it names exactly what the checksum saw differ, in the
checksum's own order, and never a field the checksum does not read. A router config present on
both sides is broken down into the members of its canonical serialization that differ, with
every default filled in, since its digest alone says nothing an operator can act on.

Values are rendered as text: compact JSON, shortened past :data:`MAX_VALUE_CHARS` with the full
length stated; ``absent`` for an input the card leaves out (it adds nothing to the checksum,
which is not the same as an explicit default); the effective context length names the field it
came from.

The cards are the ones admission compares: decoded, then normalized at the discovery boundary
(legacy prefill topology, tokenizer overrides).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workerset_admission.card import jsonio
from workerset_admission.card.checksum import (
    _VIDEO_CONTRACT,
    CHECKSUM_INPUTS,
    _kv_router_json,
    _scalar,
    _slot_checksum,
    card_checksum,
    router_config_json,
)
from workerset_admission.card.model import DecodedCard
from workerset_admission.card.paths import file_basename
from workerset_admission.card.router_config import KV_ROUTER_CONFIG, LOAD_THRESHOLD_CONFIG

__all__ = [
    "ABSENT",
    "MAX_VALUE_CHARS",
    "Difference",
    "card_differences",
    "describe",
    "differences_json",
    "differences_of",
    "summarize",
]

ABSENT = "absent"
"""How an input the card leaves out is shown."""

MAX_VALUE_CHARS = 80
"""A rendered value longer than this is cut to its first characters and its length."""

_KEEP_CHARS = 60
_RUNTIME_DATA = "runtime_config.runtime_data."
_CONTEXT_SOURCES = (
    ("runtime_config", "context_length"),
    (None, "architectural_max_context_length"),
    (None, "context_length"),
)


@dataclass(frozen=True, slots=True)
class Difference:
    """One input of the checksum that differs: its dotted card path and each side's value."""

    field: str
    incumbent: str
    rejected: str

    def to_json(self) -> dict[str, str]:
        return {"field": self.field, "incumbent": self.incumbent, "rejected": self.rejected}

    def __str__(self) -> str:
        return f"{self.field} {self.incumbent} -> {self.rejected}"


def card_differences(incumbent: DecodedCard, rejected: DecodedCard) -> tuple[Difference, ...]:
    """Return the inputs of ``mdcsum()`` in which ``rejected`` differs from ``incumbent``, in order.

    Empty exactly when the two checksums are equal. Setting every listed input of ``rejected``
    to the incumbent's value gives it the incumbent's checksum, and each listed input is needed
    for that.
    """
    if card_checksum(incumbent) == card_checksum(rejected):
        # The layout joins some inputs without a separator, so two cards can split the same
        # bytes differently and still hash alike: for the checksum nothing differs then.
        return ()
    ours, theirs = incumbent.fields, rejected.fields
    out: list[Difference] = []
    for name, part in CHECKSUM_INPUTS:
        if part(ours) == part(theirs):
            continue
        if name == "router_config" and ours[name] is not None and theirs[name] is not None:
            out.extend(_router_differences(ours[name], theirs[name]))
        else:
            out.append(Difference(name, _render(name, ours), _render(name, theirs)))
    return tuple(out)


_MEMO: dict[tuple[str, str], tuple[Difference, ...]] = {}
_MEMO_LIMIT = 1024


def differences_of(
    incumbent: object, rejected: object, checksums: tuple[str, str] | None = None
) -> tuple[Difference, ...] | None:
    """:func:`card_differences` of two registrations' cards; ``None`` unless both are cards.

    With ``checksums`` (the incumbent's, the rejected card's) the answer is remembered under
    them: status pages ask again for every standing rejection each time they are rebuilt.
    Cards with one checksum hash the same inputs, though they may spell one differently (a
    runtime flag ``"yes"`` or ``true``); the answer remembered shows the first spelling seen.
    """
    if not (isinstance(incumbent, DecodedCard) and isinstance(rejected, DecodedCard)):
        return None
    if checksums is None:
        return card_differences(incumbent, rejected)
    known = _MEMO.get(checksums)
    if known is None:
        if len(_MEMO) >= _MEMO_LIMIT:
            _MEMO.clear()
        known = _MEMO[checksums] = card_differences(incumbent, rejected)
    return known


def differences_json(differences: Iterable[Difference] | None) -> list[dict[str, str]] | None:
    """Render ``differences`` as JSON; ``None`` (the cards were not at hand) stays ``None``."""
    return None if differences is None else [d.to_json() for d in differences]


def summarize(differences: Sequence[Difference], limit: int = 5) -> str:
    """One line for a log: the first ``limit`` differences, then how many more there are."""
    shown = "; ".join(str(d) for d in differences[:limit])
    rest = len(differences) - limit
    return f"{shown}; and {rest} more" if rest > 0 else shown


def describe(difference: Difference) -> str:
    """One sentence about a difference, for ``explain``."""
    field, ours, theirs = difference.field, difference.incumbent, difference.rejected
    if ABSENT in (ours, theirs):
        if ours == ABSENT:
            missing, present, value = "incumbent", "rejected", theirs
        else:
            missing, present, value = "rejected", "incumbent", ours
        text = f"{field} is absent from the {missing} card and set to {value} on the {present} one"
        if field == "router_config":
            text += (
                " (a router config is hashed whenever it is present, even one of defaults, so "
                "an absent router config and an explicit default one give different checksums)"
            )
        return text + "."
    return f"{field} is {ours} on the incumbent card and {theirs} on the rejected one."


# --------------------------------------------------------------------------- rendering


def _shorten(text: str) -> str:
    if len(text) <= MAX_VALUE_CHARS:
        return text
    return f"{text[:_KEEP_CHARS]}… ({len(text)} chars)"


def _json(value: Any) -> str:
    return _shorten(jsonio.dumps_compact(value))


def _render(name: str, fields: Mapping[str, Any]) -> str:
    if name.startswith(_RUNTIME_DATA):
        key = name[len(_RUNTIME_DATA) :]
        runtime_data = fields["runtime_config"]["runtime_data"]
        if key not in runtime_data:
            return ABSENT
        value = runtime_data[key]
        return _json(jsonio.sorted_keys(value) if key == _VIDEO_CONTRACT else value)
    if name == "context_length":
        return _context_length(fields)
    if name == "extra_files":
        files = sorted((file_basename(f["path"]), ":".join(f["checksum"])) for f in fields[name])
        return _json([list(pair) for pair in files])
    value = fields[name]
    if value is None:
        return ABSENT
    if name in ("model_info", "tokenizer", "prompt_formatter", "chat_template_file", "gen_config"):
        return _json(_slot_checksum(value))
    if name == "router_config":
        return _shorten(router_config_json(value))
    if name == "indexer_identity":
        return _json(jsonio.sorted_keys(value))
    return _json(value)


def _context_length(fields: Mapping[str, Any]) -> str:
    # The effective context length, as the checksum takes it: the first source that is set.
    for section, name in _CONTEXT_SOURCES:
        holder = fields if section is None else fields[section]
        value = holder[name]
        if value is not None:
            where = name if section is None else f"{section}.{name}"
            return f"{int(value)} ({where})"
    return "0 (none set)"


# --------------------------------------------------------------------------- router config


# Every member 1.6.1 can write for ``kv_router_config``, in the order it writes them: the
# serialization run on values that are all "not the default" writes each conditional member.
_KV_MEMBERS = tuple(_kv_router_json({f.name: object() for f in KV_ROUTER_CONFIG.fields}))
_LOAD_MEMBERS = tuple(f.name for f in LOAD_THRESHOLD_CONFIG.fields)


def _router_members(router: Mapping[str, Any]) -> dict[str, tuple[str | None, str]]:
    """Each member of the router config's serialization: what it adds, and how it reads.

    What a member adds is its value's text, or ``None`` when the serialization leaves it out
    (1.6.1 skips some members at their defaults); how it reads is the value with the default
    filled in, either way.
    """
    kv = router["kv_router_config"]
    written = _kv_router_json(kv)
    members = {"router_mode": _member(router["router_mode"], True)}
    for name in _KV_MEMBERS:
        members[f"kv_router_config.{name}"] = _member(kv[name], name in written)
    load = router["load_threshold_config"]
    for name in _LOAD_MEMBERS:
        members[f"load_threshold_config.{name}"] = _member(load[name], load[name] is not None)
    for name in ("enforce_disagg", "session_affinity_ttl_secs", "session_affinity_mode"):
        members[name] = _member(router[name], True)
    return members


def _member(value: Any, written: bool) -> tuple[str | None, str]:
    text = _scalar(value)
    return (text if written else None, _shorten(text))


def _router_differences(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[Difference]:
    mine, other = _router_members(ours), _router_members(theirs)
    return [
        Difference(f"router_config.{member}", mine[member][1], other[member][1])
        for member in mine
        if mine[member][0] != other[member][0]
    ]
