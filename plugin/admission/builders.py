"""Slot setters for the effects emitted on nearly every input, which the core builds directly."""

from __future__ import annotations

from typing import Any

from workerset_admission.admission import effects as fx

# The core builds these three effects by writing their slots directly: a frozen dataclass's
# generated __init__ goes through object.__setattr__ per field, which was a fifth of apply()'s
# time. The objects made this way are the same class with the same fields.
_new = object.__new__


def _slot_setters(cls: type, *names: str) -> tuple[Any, ...]:
    """Return the slot descriptors' setters of ``cls`` for ``names``, in that order."""
    return tuple(vars(cls)[name].__set__ for name in names)


_PLACED_SLOTS = _slot_setters(fx.WorkerPlaced, "key", "group", "mdc_checksum", "admitted")
_DEPARTED_SLOTS = _slot_setters(fx.WorkerDeparted, "key", "group", "mdc_checksum", "was_admitted")
_PUBLISH_SLOTS = _slot_setters(
    fx.PublishAdmissions, "group", "receiver", "mdc_checksum", "generation", "ids", "card"
)
