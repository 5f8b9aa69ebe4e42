"""Builders for the effects emitted on nearly every input, writing their slots directly."""

from __future__ import annotations

from typing import Any

from workerset_admission.admission import effects as fx
from workerset_admission.identity import GroupKey

# The three effects emitted on nearly every input are built by writing their slots directly.
# A frozen dataclass's generated __init__ goes through object.__setattr__ per field, which was
# a fifth of apply()'s time; the objects made here are the same class with the same fields.
_new = object.__new__


def _slot_setters(cls: type, *names: str) -> tuple[Any, ...]:
    """Return the slot descriptors' setters of ``cls`` for ``names``, in that order."""
    return tuple(vars(cls)[name].__set__ for name in names)


_PLACED_SLOTS = _slot_setters(fx.WorkerPlaced, "key", "group", "mdc_checksum", "admitted")
_DEPARTED_SLOTS = _slot_setters(fx.WorkerDeparted, "key", "group", "mdc_checksum", "was_admitted")
_PUBLISH_SLOTS = _slot_setters(
    fx.PublishAdmissions, "group", "receiver", "mdc_checksum", "generation", "admitted", "card"
)


def _placed(key: str, group: GroupKey, checksum: str, admitted: bool) -> fx.WorkerPlaced:
    effect = _new(fx.WorkerPlaced)
    set_key, set_group, set_checksum, set_admitted = _PLACED_SLOTS
    set_key(effect, key)
    set_group(effect, group)
    set_checksum(effect, checksum)
    set_admitted(effect, admitted)
    return effect


def _departed(key: str, group: GroupKey, checksum: str, was_admitted: bool) -> fx.WorkerDeparted:
    effect = _new(fx.WorkerDeparted)
    set_key, set_group, set_checksum, set_was_admitted = _DEPARTED_SLOTS
    set_key(effect, key)
    set_group(effect, group)
    set_checksum(effect, checksum)
    set_was_admitted(effect, was_admitted)
    return effect


def _publish(
    group: GroupKey,
    receiver: int,
    checksum: str,
    generation: int,
    admitted: frozenset[int],
    card: Any,
) -> fx.PublishAdmissions:
    effect = _new(fx.PublishAdmissions)
    set_group, set_receiver, set_checksum, set_generation, set_admitted, set_card = _PUBLISH_SLOTS
    set_group(effect, group)
    set_receiver(effect, receiver)
    set_checksum(effect, checksum)
    set_generation(effect, generation)
    set_admitted(effect, admitted)
    set_card(effect, card)
    return effect
