"""Frozen snapshots of the core's state, for status pages, ``replay`` and ``explain``."""

from __future__ import annotations

from dataclasses import dataclass

from workerset_admission.admission.effects import LoraWorker
from workerset_admission.admission.status import GroupStatus
from workerset_admission.identity import Drain, GroupKey

__all__ = ["CohortView", "DrainedView", "GroupView", "HandoverView", "MemberView", "PlacementView"]


@dataclass(frozen=True, slots=True)
class MemberView:
    """One registration in a cohort."""

    key: str
    instance_id: int


@dataclass(frozen=True, slots=True)
class CohortView:
    """Workers sharing one ``mdc_checksum``, members sorted by instance id."""

    mdc_checksum: str
    members: tuple[MemberView, ...]

    @property
    def instance_ids(self) -> tuple[int, ...]:
        return tuple(m.instance_id for m in self.members)


@dataclass(frozen=True, slots=True)
class DrainedView:
    """A registration a drain set aside: tracked, in no cohort, never admitted."""

    key: str
    instance_id: int
    mdc_checksum: str
    drain: Drain


@dataclass(frozen=True, slots=True)
class HandoverView:
    """A drained tenure still serving its drained members until its successor is committed."""

    mdc_checksum: str
    generation: int
    receiver: int
    members: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GroupView:
    """One group: its incumbent, status, generations, receiver and cohorts in order.

    ``cohorts[0]`` is the incumbent cohort when there is one; the rest are rejected, in
    first-observation order. ``committed_generation`` identifies the served binding.
    """

    key: GroupKey
    incumbent: str | None
    status: GroupStatus
    generation: int | None
    committed_generation: int | None
    receiver: int | None
    admitted: tuple[int, ...]
    cohorts: tuple[CohortView, ...]
    attempt: int
    deadline: float | None
    lora: tuple[LoraWorker, ...]
    # Set while the tenure is held after an outage: the clock value at which it ends, and the
    # instance ids the incumbent had when the hold began (only one of these ends it).
    held_until: float | None = None
    hold_members: tuple[int, ...] = ()
    # Members the incumbent had when a hold began, not back yet and admitted on their last
    # known records until the clock reaches ``last_known_until`` (one registration TTL).
    last_known: tuple[int, ...] = ()
    last_known_until: float | None = None
    # New instances of a held incumbent's checksum: tracked, admitted only if a pre-hold
    # member comes back, otherwise a cohort at the end of the order when the hold expires.
    arrivals: tuple[int, ...] = ()
    # Registrations drained out of the group, sorted by instance id, and a drained tenure
    # handing over to the incumbent, if one is.
    drained: tuple[DrainedView, ...] = ()
    handover: HandoverView | None = None

    @property
    def rejected(self) -> tuple[CohortView, ...]:
        return self.cohorts[1:]


@dataclass(frozen=True, slots=True)
class PlacementView:
    """Where one registration key stands: its group, cohort position and whether it is served.

    ``position`` is the cohort's index in the group's order (0 is the incumbent). For a LoRA
    adapter, ``attached_to`` names the group it is projected into, if any.
    """

    key: str
    group: GroupKey
    mdc_checksum: str
    is_lora: bool
    position: int | None
    admitted: bool
    attached_to: GroupKey | None
    # The drain that set this registration aside, if one did.
    drained_by: Drain | None = None
