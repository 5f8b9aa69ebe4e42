"""Blank classes for building the effects emitted on nearly every input, and publish()."""

from __future__ import annotations

from typing import Any

from workerset_admission.admission import effects as fx
from workerset_admission.admission.admitted import AdmittedIds, HoldsAdmittedIds
from workerset_admission.identity import GroupKey

# A frozen dataclass's generated __init__ writes each field through object.__setattr__, and
# writing the slots through their descriptors' __set__ is hardly cheaper: both are a generic
# call with a tuple of arguments per field, and building these three effects that way was half
# of apply()'s time. Each blank class below has exactly the slots of its effect and nothing
# else, so it is made by a C-level call and filled with plain attribute stores; the last store
# turns the object into the effect class itself (a __class__ assignment, which Python allows
# between classes with the same slots). What comes out is an ordinary frozen instance of the
# effect: same type, fields, equality, hash and repr as one made by the effect's own __init__.
# The core's hot paths (_add, _remove, apply) write these steps out inline, a Python call less
# per input; publish() below is the same steps for the other publications.


class _BlankWorkerPlaced:
    __slots__ = fx.WorkerPlaced.__slots__
    key: str
    group: GroupKey
    mdc_checksum: str
    admitted: bool


class _BlankWorkerDeparted:
    __slots__ = fx.WorkerDeparted.__slots__
    key: str
    group: GroupKey
    mdc_checksum: str
    was_admitted: bool


class _BlankPublishAdmissions(HoldsAdmittedIds):
    # The same bases as the effect too: a __class__ assignment needs the same layout.
    __slots__ = fx.PublishAdmissions.__slots__
    group: GroupKey
    receiver: int
    mdc_checksum: str
    generation: int
    ids: AdmittedIds
    card: Any
    last_known: frozenset[int]


NO_IDS: frozenset[int] = frozenset()


def publish(
    group: GroupKey,
    receiver: int,
    mdc_checksum: str,
    generation: int,
    ids: AdmittedIds,
    card: Any,
    last_known: frozenset[int] = NO_IDS,
) -> fx.PublishAdmissions:
    effect = _BlankPublishAdmissions()
    effect.group = group
    effect.receiver = receiver
    effect.mdc_checksum = mdc_checksum
    effect.generation = generation
    effect.ids = ids
    effect.card = card
    effect.last_known = last_known
    effect.__class__ = fx.PublishAdmissions  # type: ignore[assignment]
    return effect  # type: ignore[return-value]
