"""Card decoding by difference from the last card decoded field by field (a fleet's neighbour).

Cards of one fleet that are not byte-identical usually differ from each other in one value (a
KV block count, a port). :func:`decode_near` compares compact card text with a reference card
(the last one :mod:`.field_memo` decoded) by its common prefix and suffix. When everything that
differs lies inside the value of one top-level field, or of one member of a top-level struct
field, the new text is the reference with that one value respelled, so it decodes as the
reference's decoded card with only that value decoded afresh.

Why that is exact: the reference text was walked and decoded by the field-by-field path, which
only succeeds where the whole-text path gives the same result. The new text keeps every byte
outside the changed value, so it has the same keys, no new repeated key and the same nesting
around the value; the value itself is parsed by the same C scanner and must end exactly where
the reference's value ended (shifted by the length change), and then goes through the same
number, depth and type rules. A struct's validation runs again on the struct holding the new
member. Anything else (non-ASCII text, a change spanning two values, the router config, a
rule that refuses) answers ``None`` and the caller decides the slower way.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, NamedTuple

from workerset_admission.card import jsonio
from workerset_admission.card.model import CARD, DecodedCard
from workerset_admission.card.schema import Ctx, Refused, Struct

__all__ = ["Near", "clear_reference", "decode_near", "learn"]

_scanstring = jsonio.scanstring
_scan_once = jsonio.scan_once
# A card sits at level 1 inside its record: its fields' values at 2, their members at 3.
_FIELD_LEVEL = 2
# The ``level`` argument the schema passes to a card field's decoder, and to a member's.
_FIELD_DECODE_LEVEL = 1
_MEMBER_DECODE_LEVEL = 2
_MAX_TEXT = 16 << 10
# A router config may name policy files that 1.6.1 reads on every decode: never reused.
_NEVER_RESPELLED = frozenset({"router_config"})


@dataclass(frozen=True, slots=True)
class _Member:
    """One member of an object in the reference text: its name and value span."""

    name: str
    start: int
    end: int
    inner: _Object | None = None
    # The value's name as :class:`Near` reports it: ``"field"`` or ``"field.member"``.
    path: str = ""


@dataclass(frozen=True, slots=True)
class _Object:
    """An object in the reference text: its members' spans, sorted by position."""

    members: tuple[_Member, ...]
    starts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Reference:
    text: bytes
    shape: _Object
    fields: dict[str, Any]
    note: object


class Near(NamedTuple):
    """A card decoded as the reference with one value respelled.

    ``path`` names that value: ``"field"`` or ``"field.member"``. ``note`` is what the caller
    attached to the reference when it was learned.
    """

    card: DecodedCard
    path: str
    note: object


_reference: list[_Reference] = []
# The value found changed last time, with the reference's bytes before and after it.
_hint: list[tuple[_Member, _Member | None, bytes, bytes]] = []


def clear_reference() -> None:
    """Forget the reference card."""
    _reference.clear()
    _hint.clear()


def _members(text: str, pos: int) -> tuple[list[_Member], int] | None:
    """Walk a compact object starting at ``pos``: members and the index after its ``}``."""
    if text[pos] != "{":
        return None
    pos += 1
    members: list[_Member] = []
    names: set[str] = set()
    if text[pos] == "}":
        return members, pos + 1
    while True:
        if text[pos] != '"':
            return None
        name, pos = _scanstring(text, pos + 1)
        if text[pos] != ":" or name in names:
            return None
        names.add(name)
        start = pos + 1
        _value, pos = _scan_once(text, start)
        members.append(_Member(name, start, pos))
        if text[pos] == ",":
            pos += 1
            continue
        if text[pos] == "}":
            return members, pos + 1
        return None


def _object(members: list[_Member]) -> _Object:
    return _Object(tuple(members), tuple(m.start for m in members))


def learn(text: bytes, card: DecodedCard, note: object = None) -> None:
    """Keep ``text`` (compact ASCII card text the field-by-field path decoded) as the reference.

    Struct-valued fields in object form are walked one level further, so a change inside one
    of their members is found too. ``note`` is handed back with every card decoded from it.
    """
    if len(text) > _MAX_TEXT or not text.isascii():
        return
    try:
        source = text.decode("ascii")
        walked = _members(source, 0)
        if walked is None or walked[1] != len(source):
            return
        top: list[_Member] = []
        for member in walked[0]:
            inner = None
            fld = CARD._lookup.get(member.name)
            if fld is not None and _plain_struct(fld.type) and source[member.start] == "{":
                nested = _members(source, member.start)
                if nested is not None and nested[1] == member.end:
                    inner = _object(
                        [
                            _Member(m.name, m.start, m.end, None, f"{member.name}.{m.name}")
                            for m in nested[0]
                        ]
                    )
            top.append(_Member(member.name, member.start, member.end, inner, member.name))
    except (IndexError, ValueError, StopIteration, RecursionError):
        return
    _reference[:] = [_Reference(text, _object(top), card.fields, note)]
    _hint.clear()


def _plain_struct(kind: Any) -> bool:
    return isinstance(kind, Struct) and not kind._has_aliases


def _common_prefix(a: bytes, b: bytes, n: int) -> int:
    diff = int.from_bytes(a[:n], "big") ^ int.from_bytes(b[:n], "big")
    return n if not diff else n - 1 - (diff.bit_length() - 1) // 8


def _common_suffix(a: bytes, b: bytes, n: int) -> int:
    diff = int.from_bytes(a[len(a) - n :], "little") ^ int.from_bytes(b[len(b) - n :], "little")
    return n if not diff else n - 1 - (diff.bit_length() - 1) // 8


def _enclosing(shape: _Object, low: int, high: int) -> _Member | None:
    """Find the member whose value span holds ``[low, high)`` of the reference text, if any."""
    index = bisect.bisect_right(shape.starts, low) - 1
    if index < 0:
        return None
    member = shape.members[index]
    return member if high <= member.end else None


_MISSING: Any = object()


def _located(ref: _Reference, text: bytes) -> tuple[_Member, _Member | None] | None:
    """Find the top-level member, and the member inside it, holding every changed byte."""
    hint = _hint[0] if _hint else None
    if hint is not None:
        member, nested, head, tail = hint
        # The same value as last time changed, and nothing else: no comparison needed.
        if len(text) >= len(head) + len(tail) and text.startswith(head) and text.endswith(tail):
            return member, nested
    old = ref.text
    n = min(len(old), len(text))
    if n == 0:
        return None
    prefix = _common_prefix(old, text, n)
    suffix = min(_common_suffix(old, text, n), n - prefix)
    low, high = prefix, len(old) - suffix
    found = _enclosing(ref.shape, low, high)
    if found is None:
        return None
    inner = found.inner
    nested = None if inner is None else _enclosing(inner, low, high)
    span = found if nested is None else nested
    _hint[:] = [(found, nested, old[: span.start], old[span.end :])]
    return found, nested


def _respelled(text: bytes, span: _Member, shift: int, level: int) -> Any:
    """Parse the new spelling of ``span``'s value; ``_MISSING`` unless it fits exactly."""
    piece = text[span.start : span.end + shift].decode("ascii")
    # Only this value can hold a surrogate escape: the reference's text held none.
    if jsonio.has_lone_surrogate_escape(piece):
        return _MISSING
    value, end = _scan_once(piece, 0)
    if end != len(piece) or not jsonio.within_limits(value, level):
        return _MISSING
    return value


def decode_near(text: bytes, ctx: Ctx) -> Near | None:
    """Decode compact card text as a respelling of the reference card, or ``None``.

    ``ctx`` must be the record path's context without string checks or strict duplicates.
    Only the respelled value is decoded from text: the rest of the card is byte for byte the
    reference's, which held no surrogate escape and was valid compact JSON.
    """
    if not _reference or ctx.strict_dups or ctx.check_strings or ctx.read_file is not None:
        return None
    ref = _reference[0]
    if len(text) > _MAX_TEXT or not text.isascii():
        return None
    located = _located(ref, text)
    if located is None:
        return None
    member, nested = located
    if member.name in _NEVER_RESPELLED:
        return None
    shift = len(text) - len(ref.text)
    fld = CARD._lookup.get(member.name)
    try:
        if nested is not None and fld is not None:
            value = _respelled(text, nested, shift, _FIELD_LEVEL + 1)
            if value is _MISSING:
                return None
            struct: Struct = fld.type  # type: ignore[assignment]
            path = nested.path
            inner_field = struct._lookup.get(nested.name)
            if inner_field is None:
                # An ignored member: nothing decoded changes.
                return Near(DecodedCard(ref.fields), path, ref.note)
            members = dict(ref.fields[member.name])
            members[nested.name] = inner_field.type.decode(value, _MEMBER_DECODE_LEVEL, ctx)
            if struct.validate is not None:
                struct.validate(members, ctx)
            decoded = members
        else:
            value = _respelled(text, member, shift, _FIELD_LEVEL)
            if value is _MISSING:
                return None
            path = member.path
            if fld is None:
                return Near(DecodedCard(ref.fields), path, ref.note)  # an ignored field
            decoded = fld.type.decode(value, _FIELD_DECODE_LEVEL, ctx)
    except (IndexError, ValueError, StopIteration, RecursionError, Refused):
        return None
    fields = dict(ref.fields)
    fields[member.name] = decoded
    return Near(DecodedCard(fields), path, ref.note)
