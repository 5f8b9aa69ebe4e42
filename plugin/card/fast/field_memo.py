"""Card decoding memoized by the exact text of each top-level card field.

Cards of one fleet that are not byte-identical usually differ in one or two fields (a KV block
count, a port). :func:`decode_card_fields` walks the top level of compact card text with the C
JSON scanner, decodes each field's value once per distinct text and reuses the decoded value
for every later card that spells the field the same way.

It only ever succeeds with the result the whole-text path would give: it answers ``None``
(decide the slow way) for anything it does not handle exactly: any refusal, any repeated
top-level key, whitespace between top-level tokens, surrogate escapes, out-of-range numbers,
nesting near the depth limit, a router naming a policy file. The slow path then gives the
verdict and its error.
"""

from __future__ import annotations

from typing import Any

from workerset_admission.card import jsonio
from workerset_admission.card.fast.neighbour import clear_reference
from workerset_admission.card.model import CARD, DecodedCard
from workerset_admission.card.schema import _CONSTANT, _FACTORY, _OPTIONAL, Ctx, Refused

__all__ = ["clear_memo", "decode_card_fields"]

# The card sits at level 1 inside a discovery record, its fields at level 2.
_FIELD_LEVEL = 2
# Per field: a field that differs on every card only thrashes its own table.
_MAX_ENTRIES = 256
_MAX_TEXT = 4096

_scanstring = jsonio.scanstring
_scan_once = jsonio.scan_once
_PLAN = CARD._plan
_KNOWN = frozenset(name for name, *_ in _PLAN)
_MISSING = object()

_memo: dict[str, dict[str, Any]] = {name: {} for name in _KNOWN}
# The spelling each field had on the last card that reached the scanner for it.
_recent: dict[str, str] = {}


def clear_memo() -> None:
    """Forget every memoized field value (and the neighbour path's reference card)."""
    for table in _memo.values():
        table.clear()
    _recent.clear()
    clear_reference()


def _checked(value: Any) -> bool:
    """Whether a freshly parsed field value passes the record's number and depth rules."""
    # Dropped values of a repeated key count: serde_json parses them before overwriting.
    return jsonio.within_limits(value, _FIELD_LEVEL)


def _reads_files(router: Any) -> bool:
    if isinstance(router, dict):
        kv = router.get("kv_router_config")
        return isinstance(kv, list) or (
            isinstance(kv, dict) and kv.get("router_policy_config") is not None
        )
    return isinstance(router, list)


def decode_card_fields(text: str, ctx: Ctx) -> DecodedCard | None:
    """Decode compact card text as the record path does, or ``None`` to decide the slow way.

    ``ctx`` must be the context the slow path would use (no string checks, no strict
    duplicates). The caller has already refused text holding a surrogate escape.
    """
    if ctx.strict_dups or ctx.check_strings or CARD.validate is not None or CARD.deny_unknown:
        return None
    end = len(text)
    if end < 2 or text[0] != "{":
        return None
    found: dict[str, Any] = {}
    memo = _memo
    pos = 1
    if text[1] == "}":
        if end != 2:
            return None
    else:
        try:
            while True:
                if text[pos] != '"':
                    return None
                name, pos = _scanstring(text, pos + 1)
                if text[pos] != ":" or name in found:
                    return None
                start = pos + 1
                table = memo.get(name)
                if table is not None:
                    # The field spelled as on the last card: a complete JSON value followed
                    # by a separator parses as exactly itself, so it needs no scanning.
                    recent = _recent.get(name)
                    if recent is not None and text.startswith(recent, start):
                        after = start + len(recent)
                        if text[after] in ",}":
                            decoded = table.get(recent, _MISSING)
                            if decoded is not _MISSING:
                                found[name] = decoded
                                pos = after
                                if text[pos] == ",":
                                    pos += 1
                                    continue
                                if pos + 1 == end:
                                    break
                                return None
                value, pos = _scan_once(text, start)
                if table is not None:
                    slot = text[start:pos]
                    _recent[name] = slot
                    decoded = table.get(slot, _MISSING)
                    if decoded is _MISSING:
                        if not _checked(value) or (name == "router_config" and _reads_files(value)):
                            # A router naming a policy file reads it on every decode.
                            return None
                        decoded = _decode_field(name, value, ctx)
                        if decoded is _MISSING:
                            return None
                        if pos - start <= _MAX_TEXT:
                            if len(table) >= _MAX_ENTRIES:
                                table.clear()
                            table[slot] = decoded
                    found[name] = decoded
                elif not _checked(value):
                    return None
                else:
                    # Unknown keys are skipped, but a repeat must still be noticed.
                    found[name] = _MISSING
                if text[pos] == ",":
                    pos += 1
                    continue
                if text[pos] == "}" and pos + 1 == end:
                    break
                return None
        except (IndexError, ValueError, StopIteration, RecursionError):
            return None
    out: dict[str, Any] = {}
    for name, _decode, kind, const, factory in _PLAN:
        item = found.get(name, _MISSING)
        if item is not _MISSING:
            out[name] = item
        elif kind == _CONSTANT:
            out[name] = const
        elif kind == _OPTIONAL:
            out[name] = None
        elif kind == _FACTORY:
            out[name] = factory()
        else:
            return None
    return DecodedCard(out)


def _decode_field(name: str, value: Any, ctx: Ctx) -> Any:
    decode = CARD._lookup[name].type.decode
    try:
        # Struct fields are decoded one level below the card object itself.
        return decode(value, 1, ctx)
    except (Refused, RecursionError):
        return _MISSING
