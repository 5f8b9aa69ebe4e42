"""The status read-model as a fold: a change rebuilds the groups it names, never the fleet.

Theory of operation
-------------------

What the service shows (its status, its serving records, the gauges read from them) is per
group: a group's picture, its standing rejections, its readiness unit and its entry in its
namespace's serving record depend on that group's state in the core and on the liveness of its
endpoint's instances, and on nothing else. So the fold keeps those four parts per group and
rebuilds a group's parts only when something named it since they were built:

* every step's delta (:class:`~workerset_admission.ports.StepDelta`): the groups it names
  (an effect named them) may have changed;
* the delta's endpoints whose liveness moved: an endpoint record that came or went changes
  which admitted ids are routable at that endpoint, for every group there.

A step only notes those groups (:meth:`StatusFold.step`), in time proportional to the delta.
Rebuilding a group is linear in its members (its view sorts them, its serving entry names each
one), so it is done in *rounds*, apart from the steps, in two halves:

* on the loop, a copy of each dirty group (:meth:`~workerset_admission.admission.AdmissionCore.
  group_copy`: one C-level copy of each member table, no sorting, no view made) and of its
  endpoint's live ids (a frozen set the liveness index keeps anyway), in slices of at most
  :data:`SLICE_SECONDS` of the loop each;
* from the copies alone, the group's parts and then the status's tuples (:class:`FoldSnapshot`):
  in a thread (:meth:`StatusFold.refresh_off_loop`, the service's status round), or inline
  (:meth:`StatusFold.refresh`: a reader on the loop, the serving publication, a service that is
  not running).

Each round ends by publishing one immutable :class:`FoldSnapshot`; a reader in any thread takes
:attr:`StatusFold.snapshot` and renders it in its own thread, reading only frozen objects and
never calling into the core. A part built from a copy older than the group's current part (an
inline refresh overtook the round) is dropped, and a group a step named after its copy was
taken stays dirty for the next round. The service starts a round :data:`STATUS_INTERVAL`
seconds after a change (the steps of a burst coalesce), or :data:`ROUND_SHARE` times the CPU
time the last round's read-out took if that is longer, but never more than
:data:`ROUND_WAIT_MAX` (which it waits when no other thread has read the status for a while):
so the round's thread holds the interpreter's lock (which the loop's thread needs too) at most
about a fifth of the time, whatever the fleet's size, and what a snapshot shows is at most that
wait plus one round behind the last step. Its ``as_of`` says
when its round began, and every step that ended before then is in it.

The first refresh builds everything, as the full path does; :func:`~.status_model.serving_records`,
:func:`~.status_model.readiness` and :func:`~.status_model.standing_rejections` are that full
path, and a differential test (``tests/test_status_fold.py``) holds the fold to them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workerset_admission.admission import AdmissionCore
from workerset_admission.admission.admitted import routable_ids
from workerset_admission.admission.readiness import ReadinessUnit
from workerset_admission.admission.readout import GroupCopy
from workerset_admission.aio import collector_paused
from workerset_admission.identity import EndpointId, GroupKey
from workerset_admission.ports import StepDelta
from workerset_admission.service.liveness import LivenessIndex
from workerset_admission.service.status_model import (
    GroupStatusReport,
    ModelReadiness,
    ServingRecord,
    StandingRejection,
    group_status_report,
    judge_readiness,
    readiness_unit,
    serving_group,
    serving_record,
    standing_rejections,
)

__all__ = [
    "EMPTY_FOLD",
    "ROUND_SHARE",
    "ROUND_WAIT_MAX",
    "SLICE_SECONDS",
    "STATUS_INTERVAL",
    "FoldSnapshot",
    "StatusFold",
]

STATUS_INTERVAL = 0.1
"""Seconds the service waits after a change before a status round: a burst's steps coalesce."""

ROUND_SHARE = 4
"""A round waits at least this many times the CPU time the last one's read-out took."""

ROUND_WAIT_MAX = 1.0
"""The longest a round waits after a change, however long the last one took."""

SLICE_SECONDS = 0.002
"""The most time one slice of a round's copies takes on the loop before it lets others run."""


@dataclass(frozen=True, slots=True)
class FoldSnapshot:
    """The status's per-group tuples as one round left them; immutable, safe in any thread.

    ``as_of`` (Unix time, ``None`` before the first round) is when the round began: every step
    that ended before then is shown. The service starts a round at most
    :data:`ROUND_WAIT_MAX` seconds after a change (:data:`STATUS_INTERVAL` when rounds are
    cheap), so a snapshot is replaced within that wait plus one round of the last change it
    does not show.
    """

    groups: tuple[GroupStatusReport, ...]
    rejections: tuple[StandingRejection, ...]
    readiness: tuple[ModelReadiness, ...]
    as_of: float | None


EMPTY_FOLD = FoldSnapshot((), (), (), None)


@dataclass(frozen=True, slots=True)
class _GroupParts:
    """What one group contributes to the status and the serving records."""

    status: GroupStatusReport
    rejections: tuple[StandingRejection, ...]
    unit: ReadinessUnit | None
    serving: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class _LiveAt:
    """An endpoint's live instance ids as they were when a group was copied."""

    live: frozenset[int]

    def routable(
        self, endpoint: EndpointId, admitted: Iterable[int], last_known: Iterable[int] = ()
    ) -> frozenset[int]:
        return routable_ids(admitted, self.live, last_known)


@dataclass(frozen=True, slots=True)
class _Copy:
    """One dirty group as a round copied it (``group`` ``None``: the group is gone)."""

    key: GroupKey
    group: GroupCopy | None
    live: _LiveAt
    # The fold's step count when the copy was taken: every step up to it is in the copy.
    seq: int


def _parts_of(copy: _Copy, clock: Callable[[], float]) -> _GroupParts | None:
    """Read one group's parts out of its copy (pure: runs in any thread)."""
    group = copy.group
    if group is None:
        return None
    view = group.view()
    served = group.serving
    # Only a committed group (one that serves) has a readiness unit and a serving entry.
    return _GroupParts(
        status=group_status_report(view, copy.live, clock),
        rejections=standing_rejections(group, [view]),
        unit=None if served is None else readiness_unit(group, view, copy.live),
        serving=None if served is None else serving_group(view, served),
    )


def _assembled(parts: Mapping[GroupKey, _GroupParts], as_of: float) -> FoldSnapshot:
    """Put the status's tuples together from the kept parts (linear in the groups)."""
    keys = sorted(parts)
    ordered = [parts[key] for key in keys]
    units = [(key, unit) for key in keys if (unit := parts[key].unit) is not None]
    return FoldSnapshot(
        groups=tuple(p.status for p in ordered),
        rejections=tuple(r for p in ordered for r in p.rejections),
        readiness=judge_readiness(units),
        as_of=as_of,
    )


def _round(
    copies: Sequence[_Copy],
    parts: dict[GroupKey, _GroupParts],
    clock: Callable[[], float],
    as_of: float,
) -> tuple[list[_GroupParts | None], FoldSnapshot, float]:
    """Build the copied groups' parts and the snapshot they make with ``parts`` (its own).

    Also return the thread's CPU seconds for it (what the round cost the interpreter).

    The cyclic collector is held off meanwhile: a large group's read-out makes a view per
    member, alive for the round, which collections would promote to the oldest generation
    until they set off a full collection; and a full collection stops every thread, the
    loop's too, for a time that grows with the heap (the fleet).
    """
    began = time.thread_time()
    with collector_paused():
        built = [_parts_of(copy, clock) for copy in copies]
    for copy, made in zip(copies, built, strict=True):
        if made is None:
            parts.pop(copy.key, None)
        else:
            parts[copy.key] = made
    snapshot = _assembled(parts, as_of)
    return built, snapshot, time.thread_time() - began


class StatusFold:
    """Per-group status parts, rebuilt for the groups a change named; see the module doc.

    Only the loop's thread calls its methods; :attr:`snapshot` is read from any thread.
    """

    def __init__(
        self, core: AdmissionCore, liveness: LivenessIndex, clock: Callable[[], float]
    ) -> None:
        self._core = core
        self._liveness = liveness
        self._clock = clock
        self._parts: dict[GroupKey, _GroupParts] = {}
        self._by_endpoint: dict[EndpointId, set[GroupKey]] = {}
        self._by_namespace: dict[str, set[GroupKey]] = {}
        self._records: dict[str, ServingRecord] = {}
        # Namespaces whose serving record must be put together again before it is read.
        self._stale_records: set[str] = set()
        self._dirty: set[GroupKey] = set()
        self._everything = True
        # Steps heard, the last step that named each group, the copy each group's parts are from.
        self._seq = 0
        self._named: dict[GroupKey, int] = {}
        self._built: dict[GroupKey, int] = {}
        # Whether the published snapshot shows every kept part, and how many were published.
        self._assembled = True
        self._published = 0
        self._snapshot = EMPTY_FOLD
        self.rebuilt = 0
        # The CPU seconds the last round's read-out took in its thread.
        self.round_seconds = 0.0

    def step(self, delta: StepDelta) -> None:
        """Note the groups one step named, and those at endpoints whose liveness moved."""
        self._seq += 1
        for key in delta.groups:
            self._named_now(key)
        for endpoint in delta.endpoints:
            for key in self._by_endpoint.get(endpoint, ()):
                self._named_now(key)

    def _named_now(self, key: GroupKey) -> None:
        self._dirty.add(key)
        self._named[key] = self._seq

    @property
    def snapshot(self) -> FoldSnapshot:
        """The latest published snapshot (from any thread; see :class:`FoldSnapshot`)."""
        return self._snapshot

    @property
    def dirty(self) -> bool:
        """Whether a step changed something the published snapshot does not show yet."""
        return self._everything or bool(self._dirty) or not self._assembled

    def refresh(self) -> FoldSnapshot:
        """Rebuild the dirty groups now, inline, and publish the snapshot they make."""
        if not self.dirty:
            return self._snapshot
        as_of = time.time()
        copies = [self._copy(key) for key in self._dirty_keys()]
        clock = self._clock
        self._merge(copies, [_parts_of(copy, clock) for copy in copies])
        self._publish(_assembled(self._parts, as_of))
        return self._snapshot

    async def refresh_off_loop(self) -> FoldSnapshot:
        """Run one round: copies on the loop in slices, the read-out in a thread; publish it."""
        if not self.dirty:
            return self._snapshot
        published = self._published
        as_of = time.time()
        copies: list[_Copy] = []
        began = time.perf_counter()
        for key in self._dirty_keys():
            if time.perf_counter() - began > SLICE_SECONDS:
                await asyncio.sleep(0)
                began = time.perf_counter()
            copies.append(self._copy(key))
        # The kept parts' table is the round's own copy (its values are frozen).
        built, snapshot, self.round_seconds = await asyncio.to_thread(
            _round, copies, dict(self._parts), self._clock, as_of
        )
        self._merge(copies, built)
        # Unless an inline refresh published meanwhile, from copies as new or newer (a part of
        # this round it did not have leaves the fold unassembled: the next refresh assembles).
        if self._published == published:
            self._publish(snapshot)
        return self._snapshot

    def serving_records(self) -> dict[str, ServingRecord]:
        """Return what this frontend serves, per worker namespace (a copy of the kept records)."""
        self.refresh()
        stale, self._stale_records = self._stale_records, set()
        for namespace in stale:
            self._record(namespace)
        return dict(self._records)

    # -- the fold ----------------------------------------------------------------------------

    def _dirty_keys(self) -> list[GroupKey]:
        if self._everything:
            self._everything = False
            for key in (*self._core.group_keys(), *self._parts):
                self._named_now(key)
        return list(self._dirty)

    def _copy(self, key: GroupKey) -> _Copy:
        self.rebuilt += 1
        return _Copy(
            key,
            self._core.group_copy(key),
            _LiveAt(self._liveness.live_ids(key.endpoint)),
            self._seq,
        )

    def _merge(self, copies: Sequence[_Copy], built: Sequence[_GroupParts | None]) -> None:
        """Keep each copied group's new parts, unless newer ones were kept meanwhile."""
        for copy, parts in zip(copies, built, strict=True):
            key = copy.key
            if self._named.get(key, 0) <= copy.seq:
                self._dirty.discard(key)
            if self._built.get(key, -1) >= copy.seq:
                continue
            self._built[key] = copy.seq
            self._assembled = False
            self._stale_records.add(key.endpoint.namespace)
            if parts is None:
                if self._parts.pop(key, None) is not None:
                    _unindex(self._by_endpoint, key.endpoint, key)
                    _unindex(self._by_namespace, key.endpoint.namespace, key)
                continue
            self._parts[key] = parts
            self._by_endpoint.setdefault(key.endpoint, set()).add(key)
            self._by_namespace.setdefault(key.endpoint.namespace, set()).add(key)

    def _publish(self, snapshot: FoldSnapshot) -> None:
        self._snapshot = snapshot
        self._assembled = True
        self._published += 1

    def _record(self, namespace: str) -> None:
        parts = self._parts
        entries = [
            entry
            for key in sorted(self._by_namespace.get(namespace, ()))
            if (entry := parts[key].serving) is not None
        ]
        if entries:
            self._records[namespace] = serving_record(entries)
        else:
            self._records.pop(namespace, None)


def _unindex(index: dict[Any, set[GroupKey]], at: Any, key: GroupKey) -> None:
    keys = index[at]
    keys.discard(key)
    if not keys:
        del index[at]
