"""Typed decoding of parsed JSON with serde's rules: the building blocks of the card model.

Each type object turns a parsed JSON value (from :mod:`.jsonio`) into a plain Python value or
raises :class:`Refused`. The rules are serde's, as Dynamo 1.6.1 applies them:

* structs accept an object (unknown keys ignored unless ``deny_unknown``) or an array holding
  the fields in declaration order; a repeated known key is refused when the text was parsed
  with duplicate detection (card text), and last-wins otherwise (a card carried inside a
  discovery record is a ``serde_json::Value`` first, which keeps the last key);
* integers are range-checked (``-0`` and any float are refused), floats accept integers;
* free-form values (``Value``) must nest less than 128 levels counting their ancestors.

The card's section modules also share two field defaults (:func:`none`, :func:`const`) and
Rust's ``str::trim`` (:func:`rust_trim`) from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from workerset_admission.card.jsonio import (
    MAX_DEPTH,
    DupDict,
    Overflow,
    depth_of,
    has_lone_surrogate,
    has_overflow,
)

__all__ = [
    "ANY",
    "BOOL",
    "F32",
    "F64",
    "I64",
    "STR",
    "U8",
    "U16",
    "U32",
    "U64",
    "USIZE",
    "Ctx",
    "EnumT",
    "ExtTagged",
    "Field",
    "MapT",
    "Opt",
    "Refused",
    "Seq",
    "Struct",
    "Type",
    "Validated",
    "const",
    "none",
    "rust_trim",
]


class Refused(Exception):
    """A value the modelled serde type would not accept."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(detail)


@dataclass(slots=True)
class Ctx:
    """Decoding context.

    ``strict_dups``: the text was parsed directly into the typed card (refuse repeated known
    keys). ``check_strings``: the raw text held a surrogate escape, so every typed string must
    be checked. ``read_file``: reads a file named inside the card (router policy, tracking
    key); ``None`` means files are read from the local filesystem.
    """

    strict_dups: bool = True
    check_strings: bool = False
    read_file: Callable[[str], bytes] | None = None


def _kind(value: Any) -> str:
    if isinstance(value, Overflow):
        raise Refused("number_out_of_range", "number out of range")
    if value is None:
        return "null"
    if value is True or value is False:
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return "floating point"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "sequence"
    return "map"


def _invalid_type(value: Any, expected: str) -> Refused:
    return Refused("invalid_type", f"invalid type: {_kind(value)}, expected {expected}")


class Type:
    """A serde type: ``decode(value, level, ctx)``; ``level`` counts enclosing containers."""

    expected = "value"

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        raise NotImplementedError


class _Str(Type):
    expected = "a string"

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if not isinstance(value, str):
            raise _invalid_type(value, self.expected)
        if ctx.check_strings and has_lone_surrogate(value):
            raise Refused("invalid_string", "lone surrogate in hex escape")
        return value


class _Bool(Type):
    expected = "a boolean"

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if value is True or value is False:
            return value
        raise _invalid_type(value, self.expected)


class _UInt(Type):
    def __init__(self, name: str, bits: int) -> None:
        self.expected = name
        self.limit = (1 << bits) - 1

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid_type(value, self.expected)
        if value < 0 or value > self.limit:
            raise Refused(
                "out_of_range", f"invalid value: integer `{value}`, expected {self.expected}"
            )
        return value


class _SInt(Type):
    def __init__(self, name: str, bits: int) -> None:
        self.expected = name
        self.low = -(1 << (bits - 1))
        self.high = (1 << (bits - 1)) - 1

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid_type(value, self.expected)
        if not self.low <= value <= self.high:
            raise Refused(
                "out_of_range", f"invalid value: integer `{value}`, expected {self.expected}"
            )
        return value


class _Float(Type):
    def __init__(self, name: str) -> None:
        self.expected = name

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _invalid_type(value, self.expected)
        return float(value)


class _Any(Type):
    """``serde_json::Value``: anything, within the nesting limit."""

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if isinstance(value, Overflow):
            raise Refused("number_out_of_range", "number out of range")
        if isinstance(value, (dict, list)):
            if level + depth_of(value) > MAX_DEPTH:
                raise Refused("depth_limit", "recursion limit exceeded")
            if has_overflow(value):
                raise Refused("number_out_of_range", "number out of range")
            if ctx.check_strings and has_lone_surrogate(value):
                raise Refused("invalid_string", "lone surrogate in hex escape")
        elif isinstance(value, str) and ctx.check_strings and has_lone_surrogate(value):
            raise Refused("invalid_string", "lone surrogate in hex escape")
        return value


STR: Type = _Str()
BOOL: Type = _Bool()
U8: Type = _UInt("u8", 8)
U16: Type = _UInt("u16", 16)
U32: Type = _UInt("u32", 32)
I64: Type = _SInt("i64", 64)
U64: Type = _UInt("u64", 64)
USIZE: Type = _UInt("usize", 64)
F64: Type = _Float("f64")
F32: Type = _Float("f32")
ANY: Type = _Any()


class Opt(Type):
    """``Option<T>``: ``null`` is ``None``."""

    def __init__(self, inner: Type) -> None:
        self.inner = inner
        self.expected = inner.expected

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if value is None:
            return None
        return self.inner.decode(value, level, ctx)


class Seq(Type):
    expected = "a sequence"

    def __init__(self, inner: Type) -> None:
        self.inner = inner

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if not isinstance(value, list):
            raise _invalid_type(value, self.expected)
        inner = self.inner
        return [inner.decode(item, level + 1, ctx) for item in value]


class MapT(Type):
    """A free-form string-keyed map (``HashMap<String, T>``): repeated keys keep the last."""

    expected = "a map"

    def __init__(self, inner: Type) -> None:
        self.inner = inner

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if not isinstance(value, dict):
            raise _invalid_type(value, self.expected)
        if ctx.check_strings and any(has_lone_surrogate(k) for k in value):
            raise Refused("invalid_string", "lone surrogate in hex escape")
        inner = self.inner
        if ctx.strict_dups and type(value) is DupDict:
            # Read from text, every earlier value of a repeated key is decoded before the
            # last one replaces it, so it must be valid too.
            for _key, item in value.dropped:
                inner.decode(item, level + 1, ctx)
        return {key: inner.decode(item, level + 1, ctx) for key, item in value.items()}


class EnumT(Type):
    """A unit-only enum written as its variant name."""

    def __init__(self, names: tuple[str, ...], expected: str = "variant identifier") -> None:
        self.names = frozenset(names)
        self.expected = expected

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if isinstance(value, dict) and len(value) == 1:
            # serde_json also accepts ``{"variant": null}`` for a unit variant.
            ((name, content),) = value.items()
            repeated = ctx.strict_dups and isinstance(value, DupDict)
            if content is None and name in self.names and not repeated:
                return name
            raise Refused("unknown_variant", f"unknown variant `{name}`")
        if not isinstance(value, str):
            raise _invalid_type(value, "enum")
        if value not in self.names:
            raise Refused("unknown_variant", f"unknown variant `{value}`")
        return value


class ExtTagged(Type):
    """An externally tagged enum of newtype variants: ``{"variant": content}``."""

    def __init__(self, variants: Mapping[str, Type], aliases: Mapping[str, str] | None = None):
        self.variants = dict(variants)
        self.aliases = dict(aliases or {})

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if isinstance(value, str):
            name: str = self.aliases.get(value, value)
            if name in self.variants:
                raise Refused(
                    "invalid_type", "invalid type: unit variant, expected newtype variant"
                )
            raise Refused("unknown_variant", f"unknown variant `{value}`")
        if not isinstance(value, dict):
            raise _invalid_type(value, "enum")
        if len(value) != 1 or (ctx.strict_dups and isinstance(value, DupDict)):
            # Read from text, serde takes the first key as the variant and then expects the
            # object to end, so a repeated variant key is refused like a second variant.
            raise Refused("invalid_enum", "expected an object with exactly one variant key")
        ((name, content),) = value.items()
        canonical: str = self.aliases.get(name, name)
        inner = self.variants.get(canonical)
        if inner is None:
            raise Refused("unknown_variant", f"unknown variant `{name}`")
        return (canonical, inner.decode(content, level + 1, ctx))


class Validated(Type):
    """A type followed by a check on the decoded value (``check`` raises :class:`Refused`)."""

    def __init__(self, inner: Type, check: Callable[[Any, Ctx], Any]) -> None:
        self.inner = inner
        self.check = check
        self.expected = inner.expected

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        return self.check(self.inner.decode(value, level, ctx), ctx)


_ABSENT = object()
# How a struct field is filled when its key is absent.
_REQUIRED, _OPTIONAL, _CONSTANT, _FACTORY = range(4)


@dataclass(frozen=True, slots=True)
class Field:
    """One struct field.

    ``default``: a zero-argument factory used when the key is absent (serde ``default``);
    ``None`` means the key is required, except that an ``Opt`` field may be absent in object
    form (serde treats a missing ``Option`` as ``None``) but not in array form.
    """

    name: str
    type: Type
    default: Callable[[], Any] | None = None
    aliases: tuple[str, ...] = ()


@dataclass(slots=True)
class Struct(Type):
    """A serde struct with object and array forms."""

    name: str
    fields: tuple[Field, ...]
    deny_unknown: bool = False
    validate: Callable[[dict[str, Any], Ctx], None] | None = None
    _lookup: dict[str, Field] = field(init=False, repr=False)
    _has_aliases: bool = field(init=False, repr=False, default=False)
    _plan: tuple[tuple[str, Any, int, Any, Any], ...] = field(init=False, repr=False, default=())

    def __post_init__(self) -> None:
        self.expected = f"struct {self.name}"
        self._lookup = {}
        for fld in self.fields:
            self._lookup[fld.name] = fld
            for alias in fld.aliases:
                self._lookup[alias] = fld
        self._has_aliases = any(fld.aliases for fld in self.fields)
        plan = []
        for fld in self.fields:
            if fld.default is None:
                kind, const = (_OPTIONAL if isinstance(fld.type, Opt) else _REQUIRED), None
            else:
                sample = fld.default()
                immutable = sample is None or isinstance(sample, (bool, int, float, str))
                kind, const = (_CONSTANT, sample) if immutable else (_FACTORY, None)
            plan.append((fld.name, fld.type.decode, kind, const, fld.default))
        self._plan = tuple(plan)

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if isinstance(value, dict):
            out = self._from_map(value, level + 1, ctx)
        elif isinstance(value, list):
            out = self._from_seq(value, level + 1, ctx)
        else:
            raise _invalid_type(value, self.expected)
        if self.validate is not None:
            self.validate(out, ctx)
        return out

    def _from_map(self, value: dict[str, Any], level: int, ctx: Ctx) -> dict[str, Any]:
        lookup = self._lookup
        if ctx.strict_dups and isinstance(value, DupDict):
            for key in value.dups:
                if key in lookup:
                    raise Refused("duplicate_field", f"duplicate field `{lookup[key].name}`")
        if not self._has_aliases:
            return self._from_plain_map(value, level, ctx)
        seen: dict[str, str] = {}
        raw: dict[str, Any] = {}
        for key, item in value.items():
            fld = lookup.get(key)
            if fld is None:
                if self.deny_unknown:
                    raise Refused("unknown_field", f"unknown field `{key}` in {self.name}")
                if ctx.check_strings and has_lone_surrogate(key):
                    raise Refused("invalid_string", "lone surrogate in hex escape")
                continue
            if fld.name in seen:
                # A field and its alias both given: serde sees the same field twice.
                raise Refused("duplicate_field", f"duplicate field `{fld.name}`")
            seen[fld.name] = key
            raw[fld.name] = item
        out: dict[str, Any] = {}
        for fld in self.fields:
            if fld.name in raw:
                out[fld.name] = fld.type.decode(raw[fld.name], level, ctx)
            elif fld.default is not None:
                out[fld.name] = fld.default()
            elif isinstance(fld.type, Opt):
                out[fld.name] = None
            else:
                raise Refused("missing_field", f"missing field `{fld.name}` in {self.name}")
        return out

    def _from_plain_map(self, value: dict[str, Any], level: int, ctx: Ctx) -> dict[str, Any]:
        # Without aliases every known key is a field name: look fields up directly.
        lookup = self._lookup
        if self.deny_unknown or ctx.check_strings:
            for key in value:
                if key not in lookup:
                    if self.deny_unknown:
                        raise Refused("unknown_field", f"unknown field `{key}` in {self.name}")
                    if has_lone_surrogate(key):
                        raise Refused("invalid_string", "lone surrogate in hex escape")
        out: dict[str, Any] = {}
        for name, decode, kind, const, factory in self._plan:
            item = value.get(name, _ABSENT)
            if item is not _ABSENT:
                out[name] = decode(item, level, ctx)
            elif kind == _CONSTANT:
                out[name] = const
            elif kind == _OPTIONAL:
                out[name] = None
            elif kind == _FACTORY:
                out[name] = factory()
            else:
                raise Refused("missing_field", f"missing field `{name}` in {self.name}")
        return out

    def _from_seq(self, value: list[Any], level: int, ctx: Ctx) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for index, fld in enumerate(self.fields):
            if index < len(value):
                out[fld.name] = fld.type.decode(value[index], level, ctx)
            elif fld.default is not None:
                out[fld.name] = fld.default()
            else:
                raise Refused(
                    "invalid_length",
                    f"invalid length {len(value)}, expected struct {self.name} "
                    f"with {len(self.fields)} elements",
                )
        if len(value) > len(self.fields):
            raise Refused("invalid_length", f"too many elements for struct {self.name}")
        return out


# Rust's char::is_whitespace (Unicode White_Space), used by str::trim.
_RUST_WS = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def rust_trim(text: str) -> str:
    return text.strip(_RUST_WS)


# Field defaults shared by the card's sections.
def none() -> None:
    return None


def const(value: Any) -> Any:
    return lambda: value
