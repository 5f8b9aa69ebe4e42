"""The digest of one step's effects: each effect spelled one canonical way, and hashed.

A frontend's trace carries, on every line that stepped the core, the digest of the effects that
step returned; ``replay`` computes the same digest from the effects of its own step and stops at
the first line where the two differ. The spelling is the effect's kind and its compared fields
only (cards are opaque and take no part, as they take no part in an effect's equality), with
sets sorted, groups by their id and floats by their exact spelling, so the same effects give
the same digest in any process, whatever the order a set was built in.

*Times.* A frontend decides on its own monotonic clock, and its trace counts time from the
moment it began (``t``); replay's clock is that ``t``. So a clock value an effect carries (a
deadline) is spelled counted from ``origin`` (the frontend's clock when its trace began; 0 in
replay), and every time is spelled to the microsecond: ``(now + delay) - origin`` and
``(now - origin) + delay`` may differ in their last bits, never in a microsecond but by the
rarest rounding.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from workerset_admission.admission import Effect
from workerset_admission.identity import GroupKey

__all__ = ["effect_form", "effects_digest"]

# The effect fields that hold a reading of the core's clock (not a duration).
_CLOCK_FIELDS: dict[str, tuple[str, ...]] = {
    "RetryScheduled": ("deadline",),
    "TenureHeld": ("deadline", "last_known_until"),
}


def effects_digest(effects: Iterable[Effect], origin: float = 0.0) -> str:
    """Return the hex digest of a list of effects, in their order (an empty list has one too).

    ``origin`` is the clock reading time is counted from (see the module doc).
    """
    digest = hashlib.blake2b(digest_size=12)
    for effect in effects:
        text = json.dumps(effect_form(effect, origin), separators=(",", ":"), ensure_ascii=False)
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\n")
    return digest.hexdigest()


def effect_form(effect: Effect, origin: float = 0.0) -> list[Any]:
    """Return an effect's canonical form: its kind, then its compared fields by name."""
    kind = type(effect).__name__
    form = _fields(effect)
    for name in _CLOCK_FIELDS.get(kind, ()):
        value = getattr(effect, name)
        if value is not None:
            form[name] = _canon(value - origin)
    return [kind, form]


def _fields(value: Any) -> dict[str, Any]:
    compared = getattr(type(value), "_compared", None)
    if compared is not None:  # the slotted effects made on nearly every input
        return {name: _canon(getattr(value, name)) for name in compared}
    return {f.name: _canon(getattr(value, f.name)) for f in dataclasses.fields(value) if f.compare}


def _canon(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        text = f"{value:.6f}"
        return "0.000000" if text == "-0.000000" else text
    if isinstance(value, enum.Enum):
        return _canon(value.value)
    if isinstance(value, GroupKey):
        return value.id
    if isinstance(value, AbstractSet):
        return sorted(_canon(v) for v in value)
    if isinstance(value, Mapping):
        return {str(k): _canon(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if dataclasses.is_dataclass(value) or hasattr(type(value), "_compared"):
        return _fields(value)
    if isinstance(value, Iterable):
        return [_canon(v) for v in value]
    raise TypeError(f"an effect field the digest cannot spell: {value!r}")
