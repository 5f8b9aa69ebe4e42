"""JSON reading and writing with serde_json's number, duplicate-key and depth semantics.

Dynamo 1.6.1 reads cards with ``serde_json`` (without its ``float_roundtrip`` feature) and writes
them back with it. Python's ``json`` module differs in a few ways that change what is accepted
and what a checksum covers, so this module wraps it:

* numbers: an integer literal stays an ``int`` while it fits ``u64``/``i64``; ``-0`` and
  integers outside that range become floats; floats are computed the way serde_json computes
  them (a ``u64`` significand times or divided by one power of ten), which is not always the
  nearest double for long decimals; values that overflow to infinity are refused.
* objects: parsed into ``dict``; an object that repeated a key is a :class:`DupDict` that
  remembers which keys repeated, so typed decoding can refuse duplicates of known fields while
  free-form maps keep the last value.
* floats are written like serde_json (shortest round-trip digits, ``1e-7``, ``1e+16``,
  ``100.0``), not like Python's ``repr``.
"""

from __future__ import annotations

import json
import json.decoder
import json.encoder
import math
import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "DupDict",
    "JsonError",
    "Overflow",
    "depth_of",
    "dumps_compact",
    "format_f64",
    "has_lone_surrogate",
    "has_overflow",
    "loads",
    "quote",
    "scan_once",
    "scanstring",
    "serde_f64",
    "sorted_keys",
    "within_limits",
]

# serde_json refuses a value whose container nesting reaches 128 levels.
MAX_DEPTH = 127

_U64_MAX = (1 << 64) - 1
_I32_MAX = (1 << 31) - 1
_POW10 = [float(f"1e{i}") for i in range(309)]
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class JsonError(ValueError):
    """Text that serde_json would not parse; ``reason`` is a short stable token."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class Overflow:
    """A number literal serde_json refuses as out of range (kept so ignored keys can hold it)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Overflow({self.text!r})"


class DupDict(dict[str, Any]):
    """An object whose text repeated at least one key; the last value of each key is kept.

    ``dropped`` holds the earlier values of repeated keys, in text order: serde_json still
    parses each of them (depth, numbers, strings) before the map overwrites it.
    """

    __slots__ = ("dropped", "dups")

    dups: frozenset[str]
    dropped: tuple[tuple[str, Any], ...]


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    repeated = set()
    for key, _ in pairs:
        if key in seen:
            repeated.add(key)
        seen.add(key)
    dup = DupDict(obj)
    dup.dups = frozenset(repeated)
    last = {key: i for i, (key, _) in enumerate(pairs)}
    dup.dropped = tuple(pair for i, pair in enumerate(pairs) if last[pair[0]] != i)
    return dup


def _overflows(significand: int, digit: int) -> bool:
    return significand * 10 + digit > _U64_MAX


def _from_parts(negative: bool, significand: int, exponent: int) -> float:
    # serde_json (no float_roundtrip): one rounding to f64, then one multiply or divide by an
    # exactly representable-or-rounded power of ten, stepping by 1e308 for tiny exponents.
    value = float(significand)
    while True:
        if abs(exponent) <= 308:
            if exponent >= 0:
                value *= _POW10[exponent]
                if math.isinf(value):
                    raise JsonError("number_out_of_range", "number out of range")
            else:
                value /= _POW10[-exponent]
            break
        if value == 0.0:
            break
        if exponent >= 0:
            raise JsonError("number_out_of_range", "number out of range")
        value /= 1e308
        exponent += 308
    return -value if negative else value


def serde_f64(text: str) -> float:
    """Compute the f64 serde_json produces for a JSON number literal (valid JSON syntax)."""
    pos = 0
    negative = text.startswith("-")
    if negative:
        pos = 1
    end = len(text)
    significand = 0
    exponent = 0
    long_mode = False
    while pos < end and "0" <= text[pos] <= "9":
        digit = ord(text[pos]) - 48
        if long_mode:
            exponent += 1
        elif _overflows(significand, digit):
            long_mode = True
            exponent += 1
        else:
            significand = significand * 10 + digit
        pos += 1
    if pos < end and text[pos] == ".":
        pos += 1
        dropping = False
        while pos < end and "0" <= text[pos] <= "9":
            digit = ord(text[pos]) - 48
            if not dropping:
                if _overflows(significand, digit):
                    dropping = True
                else:
                    significand = significand * 10 + digit
                    exponent -= 1
            pos += 1
    if pos < end and text[pos] in "eE":
        pos += 1
        positive_exp = True
        if text[pos] in "+-":
            positive_exp = text[pos] == "+"
            pos += 1
        exp = 0
        while pos < end:
            digit = ord(text[pos]) - 48
            if exp * 10 + digit > _I32_MAX:
                if significand != 0 and positive_exp:
                    raise JsonError("number_out_of_range", "number out of range")
                return -0.0 if negative else 0.0
            exp = exp * 10 + digit
            pos += 1
        exponent = exponent + exp if positive_exp else exponent - exp
        exponent = max(-(1 << 31), min(_I32_MAX, exponent))
    return _from_parts(negative, significand, exponent)


def _parse_int(text: str) -> int | float | Overflow:
    if len(text) < 19:
        if text == "-0":
            return -0.0
        return int(text)
    value = int(text)
    if value > _U64_MAX or value < -(1 << 63):
        if value < 0 and -value <= _U64_MAX:
            return -float(-value)
        return _parse_float(text)
    return value


def _refuse_constant(name: str) -> Any:
    raise JsonError("invalid_json", f"{name} is not a JSON value")


def _parse_float(text: str) -> float | Overflow:
    try:
        return serde_f64(text)
    except JsonError:
        # serde_json skips an unknown key's value without evaluating it, so the refusal
        # happens only where a typed field or a free-form value reads the number.
        return Overflow(text)


_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs,
    parse_float=_parse_float,
    parse_int=_parse_int,
    parse_constant=_refuse_constant,
)

# The C scanner behind _DECODER: parses one value at an index and returns it with its end.
scan_once: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
# The C scanner of one JSON string after its opening quote: the string and its end.
scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


def loads(text: str | bytes) -> Any:
    """Parse JSON text like serde_json would, or raise :class:`JsonError`."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonError("invalid_utf8", str(exc)) from None
    try:
        return _DECODER.decode(text)
    except JsonError:
        raise
    except RecursionError:
        raise JsonError("depth_limit", "recursion limit exceeded") from None
    except ValueError as exc:
        raise JsonError("invalid_json", str(exc)) from None


def has_lone_surrogate_escape(text: str) -> bool:
    """Whether the raw text could hold a surrogate escape (a cheap pre-check)."""
    return _SURROGATE_ESCAPE.search(text) is not None


def has_lone_surrogate(value: Any) -> bool:
    """Whether any string or key in a parsed value holds a surrogate code point."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            for key, sub in item.items():
                if _SURROGATE.search(key):
                    return True
                stack.append(sub)
            if type(item) is DupDict:
                stack.extend(sub for _, sub in item.dropped)
        elif isinstance(item, list):
            stack.extend(item)
    return False


def has_overflow(value: Any) -> bool:
    """Whether a parsed value holds an out-of-range number anywhere."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Overflow):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
            if type(item) is DupDict:
                stack.extend(sub for _, sub in item.dropped)
        elif isinstance(item, list):
            stack.extend(item)
    return False


def within_limits(value: Any, level: int) -> bool:
    """Whether a parsed value at nesting ``level`` passes the number and depth rules.

    It holds no out-of-range number and, counted from ``level``, nests within
    :data:`MAX_DEPTH`; the dropped values of repeated keys count too.
    """
    if isinstance(value, Overflow):
        return False
    if not isinstance(value, (dict, list)):
        return True
    limit = MAX_DEPTH - level
    stack: list[tuple[Any, int]] = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        if depth > limit:
            return False
        if isinstance(item, dict):
            subs: Any = item.values()
            if type(item) is DupDict:
                subs = [*subs, *(sub for _, sub in item.dropped)]
        else:
            subs = item
        for sub in subs:
            if isinstance(sub, (dict, list)):
                push((sub, depth + 1))
            elif isinstance(sub, Overflow):
                return False
    return True


def depth_of(value: Any) -> int:
    """Container nesting depth of a parsed value (a scalar is 0, ``[]`` is 1)."""
    best = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            level += 1
            stack.extend((sub, level) for sub in item.values())
            if type(item) is DupDict:
                stack.extend((sub, level) for _, sub in item.dropped)
        elif isinstance(item, list):
            level += 1
            stack.extend((sub, level) for sub in item)
        else:
            continue
        best = max(best, level)
    return best


def format_f64(value: float) -> str:
    """Write a finite float the way serde_json does."""
    if value == 0.0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    return _format_nonzero(value)


def _format_nonzero(value: float) -> str:
    sign = "-" if value < 0 else ""
    text = repr(abs(value))
    mantissa, _, exp_text = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    if exp_text:
        digits = whole + frac
        point = len(whole) + int(exp_text)
    elif whole != "0":
        digits = whole + frac
        point = len(whole)
    else:
        significant = frac.lstrip("0")
        point = -(len(frac) - len(significant))
        digits = significant
    digits = digits.rstrip("0") or "0"
    if 0 < point <= 16:
        if len(digits) <= point:
            return f"{sign}{digits}{'0' * (point - len(digits))}.0"
        return f"{sign}{digits[:point]}.{digits[point:]}"
    if -5 < point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    exp = point - 1
    exp_str = f"e+{exp}" if exp >= 0 else f"e{exp}"
    if len(digits) == 1:
        return f"{sign}{digits}{exp_str}"
    return f"{sign}{digits[0]}.{digits[1:]}{exp_str}"


# The C string quoter behind json.dumps(ensure_ascii=False); it escapes exactly what
# serde_json escapes (quote, backslash, control characters as \n-style or \u00xx).
quote: Callable[[str], str] = json.encoder.encode_basestring


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("JSON has no NaN or infinity")
        out.append(format_f64(value))
    elif isinstance(value, str):
        out.append(quote(value))
    elif isinstance(value, dict):
        out.append("{")
        first = True
        for key, sub in value.items():
            if not isinstance(key, str):
                raise TypeError("JSON object keys must be strings")
            if not first:
                out.append(",")
            first = False
            out.append(quote(key))
            out.append(":")
            _encode(sub, out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for index, sub in enumerate(value):
            if index:
                out.append(",")
            _encode(sub, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def dumps_compact(value: Any) -> str:
    """Compact JSON in serde_json's style (floats included), keys in the given order."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out)


def sorted_keys(value: Any) -> Any:
    """Return the value with every object's keys sorted, as a ``BTreeMap`` holds them."""
    if isinstance(value, dict):
        return {key: sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sorted_keys(item) for item in value]
    return value
