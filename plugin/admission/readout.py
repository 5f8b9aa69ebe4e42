"""Read-only snapshots of the core's groups and placements, worked out from its records.

Nothing here changes state: these functions read a group as ``core.py`` left it and build the
frozen snapshots of ``snapshots.py`` for status pages, ``replay`` and ``explain``. They read the
core's records through the read-only shapes below (``GroupRecord`` and its parts), so this
module does not import the core that imports it: the arrow runs one way.

:func:`group_copy` takes what :func:`group_view` reads of a group into a :class:`GroupCopy`
that no later change of the core touches: plain copies of the member tables (one C-level copy
each) and the tenure's fields, no sorting and no view made. Its :meth:`GroupCopy.view` is
:func:`group_view` over the copy, the same function, so it can run later, anywhere (the
status reads a large group out in a thread while the core goes on).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from workerset_admission.admission.effects import LoraWorker
from workerset_admission.admission.snapshots import (
    CohortView,
    DrainedView,
    GroupView,
    HandoverView,
    MemberView,
    PlacementView,
)
from workerset_admission.admission.status import GroupStatus
from workerset_admission.identity import AttemptId, Drain, GroupKey, Registration

__all__ = [
    "GroupCopy",
    "GroupRecord",
    "adapter_placement",
    "base_placement",
    "drained_placement",
    "group_copy",
    "group_view",
]


class _Status(Protocol):
    @property
    def state(self) -> GroupStatus: ...


class _Cohort(Protocol):
    @property
    def checksum(self) -> str: ...

    @property
    def members(self) -> Mapping[int, Registration]: ...


class _Hold(Protocol):
    @property
    def held(self) -> bool: ...

    @property
    def until(self) -> float: ...

    @property
    def members(self) -> Mapping[int, str]: ...

    @property
    def last_known(self) -> Mapping[int, str]: ...

    @property
    def last_known_until(self) -> float: ...

    @property
    def arrivals(self) -> Mapping[int, Registration]: ...


class _Handover(Protocol):
    @property
    def checksum(self) -> str: ...

    @property
    def generation(self) -> int: ...

    @property
    def receiver(self) -> int: ...

    @property
    def members(self) -> Mapping[int, str]: ...


class _Tenure(Protocol):
    @property
    def checksum(self) -> str | None: ...

    @property
    def committed_generation(self) -> int | None: ...

    @property
    def receiver(self) -> int | None: ...

    @property
    def attempt(self) -> int: ...

    @property
    def deadline(self) -> float | None: ...

    @property
    def lora(self) -> tuple[LoraWorker, ...] | None: ...

    @property
    def hold(self) -> _Hold | None: ...


class GroupRecord(Protocol):
    """One group's record as the core keeps it (``group.Group``), read-only."""

    @property
    def key(self) -> GroupKey: ...

    @property
    def cohorts(self) -> Mapping[str, _Cohort]: ...

    @property
    def status(self) -> _Status: ...

    @property
    def tenure(self) -> _Tenure: ...

    @property
    def generation(self) -> int | None: ...

    @property
    def handover(self) -> _Handover | None: ...

    def served_ids(self, cohort: Any) -> Iterable[int]: ...

    def served_attempt(self) -> AttemptId | None: ...


def group_view(group: GroupRecord, drained: Iterable[tuple[Registration, Drain]] = ()) -> GroupView:
    """Picture one group: incumbent, status, generations, cohorts in order, any hold.

    ``drained`` are the group's registrations a drain set aside, with their drains.
    """
    cohorts = tuple(
        CohortView(
            mdc_checksum=c.checksum,
            members=tuple(
                sorted(
                    (MemberView(r.key, r.instance_id) for r in c.members.values()),
                    key=lambda m: (m.instance_id, m.key),
                )
            ),
        )
        for c in group.cohorts.values()
    )
    tenure = group.tenure
    admitted: tuple[int, ...] = ()
    if tenure.checksum is not None:
        # The ids themselves, not ``AdmittedIds``: handing them out may rebase the cohort's log.
        admitted = tuple(sorted(group.served_ids(group.cohorts[tenure.checksum])))
    hold = tenure.hold
    handover = group.handover
    return GroupView(
        key=group.key,
        incumbent=tenure.checksum,
        status=group.status.state,
        generation=group.generation,
        committed_generation=tenure.committed_generation,
        receiver=tenure.receiver,
        admitted=admitted,
        cohorts=cohorts,
        attempt=tenure.attempt,
        deadline=tenure.deadline,
        lora=tenure.lora or (),
        held_until=hold.until if hold is not None and hold.held else None,
        hold_members=tuple(sorted(hold.members)) if hold is not None and hold.held else (),
        last_known=() if hold is None else tuple(sorted(hold.last_known)),
        last_known_until=hold.last_known_until if hold is not None and hold.last_known else None,
        arrivals=() if hold is None else tuple(sorted(hold.arrivals)),
        drained=tuple(
            sorted(
                (DrainedView(r.key, r.instance_id, r.mdc_checksum, d) for r, d in drained),
                key=lambda v: (v.instance_id, v.key),
            )
        ),
        handover=None
        if handover is None
        else HandoverView(
            handover.checksum,
            handover.generation,
            handover.receiver,
            tuple(sorted(handover.members)),
        ),
    )


@dataclass(frozen=True, slots=True)
class _CohortCopy:
    checksum: str
    members: Mapping[int, Registration]


@dataclass(frozen=True, slots=True)
class _StatusCopy:
    state: GroupStatus


@dataclass(frozen=True, slots=True)
class _HoldCopy:
    held: bool
    until: float
    members: Mapping[int, str]
    last_known: Mapping[int, str]
    last_known_until: float
    arrivals: Mapping[int, Registration]


@dataclass(frozen=True, slots=True)
class _TenureCopy:
    checksum: str | None
    committed_generation: int | None
    receiver: int | None
    attempt: int
    deadline: float | None
    lora: tuple[LoraWorker, ...] | None
    hold: _HoldCopy | None


@dataclass(frozen=True, slots=True)
class _HandoverCopy:
    checksum: str
    generation: int
    receiver: int
    members: Mapping[int, str]


@dataclass(frozen=True, slots=True)
class GroupCopy:
    """What :func:`group_view` reads of one group, copied: later steps change none of it.

    ``served`` are the incumbent's admitted ids (``served_ids`` of its cohort), ``drained`` the
    group's registrations a drain set aside, with their drains, and ``serving`` the attempt
    whose hop binding served (``served_attempt``), all as they were.
    """

    key: GroupKey
    cohorts: Mapping[str, _CohortCopy]
    status: _StatusCopy
    tenure: _TenureCopy
    generation: int | None
    handover: _HandoverCopy | None
    served: tuple[int, ...]
    drained: tuple[tuple[Registration, Drain], ...]
    serving: AttemptId | None

    def served_ids(self, cohort: Any) -> Iterable[int]:
        return self.served

    def served_attempt(self) -> AttemptId | None:
        return self.serving

    def view(self) -> GroupView:
        """Picture the group as it was copied (:func:`group_view`)."""
        return group_view(self, self.drained)

    def registration(self, key: str) -> Registration | None:
        """Return the member registration held for ``key`` in one of the copied cohorts."""
        for cohort in self.cohorts.values():
            for reg in cohort.members.values():
                if reg.key == key:
                    return reg
        return None


def group_copy(group: GroupRecord, drained: Iterable[tuple[Registration, Drain]] = ()) -> GroupCopy:
    """Copy what :func:`group_view` reads of ``group``; see the module docstring."""
    tenure = group.tenure
    hold = tenure.hold
    handover = group.handover
    served: tuple[int, ...] = ()
    if tenure.checksum is not None:
        served = tuple(group.served_ids(group.cohorts[tenure.checksum]))
    return GroupCopy(
        key=group.key,
        cohorts={
            c.checksum: _CohortCopy(c.checksum, dict(c.members)) for c in group.cohorts.values()
        },
        status=_StatusCopy(group.status.state),
        tenure=_TenureCopy(
            checksum=tenure.checksum,
            committed_generation=tenure.committed_generation,
            receiver=tenure.receiver,
            attempt=tenure.attempt,
            deadline=tenure.deadline,
            lora=tenure.lora,
            hold=None
            if hold is None
            else _HoldCopy(
                held=hold.held,
                until=hold.until,
                members=dict(hold.members),
                last_known=dict(hold.last_known),
                last_known_until=hold.last_known_until,
                arrivals=dict(hold.arrivals),
            ),
        ),
        generation=group.generation,
        handover=None
        if handover is None
        else _HandoverCopy(
            handover.checksum, handover.generation, handover.receiver, dict(handover.members)
        ),
        served=served,
        drained=tuple(drained),
        serving=group.served_attempt(),
    )


def base_placement(group: GroupRecord, reg: Registration) -> PlacementView:
    """Where a base registration stands in its group."""
    hold = group.tenure.hold
    if hold is not None and hold.arrivals.get(reg.instance_id) is reg:
        # A new instance of a held incumbent's checksum: tracked, in no cohort yet.
        return PlacementView(reg.key, reg.group, reg.mdc_checksum, False, None, False, None)
    position = list(group.cohorts).index(reg.mdc_checksum)
    return PlacementView(
        key=reg.key,
        group=reg.group,
        mdc_checksum=reg.mdc_checksum,
        is_lora=False,
        position=position,
        admitted=position == 0,
        attached_to=None,
    )


def drained_placement(reg: Registration, drain: Drain) -> PlacementView:
    """Where a drained registration stands: in no cohort, not admitted, drained by ``drain``."""
    return PlacementView(
        key=reg.key,
        group=reg.group,
        mdc_checksum=reg.mdc_checksum,
        is_lora=False,
        position=None,
        admitted=False,
        attached_to=None,
        drained_by=drain,
    )


def adapter_placement(lora: Registration, host: GroupRecord | None) -> PlacementView:
    """Where an adapter stands: attached to the group admitting its base card, or not."""
    return PlacementView(
        key=lora.key,
        group=lora.group,
        mdc_checksum=lora.mdc_checksum,
        is_lora=True,
        position=None,
        admitted=host is not None,
        attached_to=None if host is None else host.key,
    )
