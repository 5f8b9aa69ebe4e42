"""The status rounds: a change reads out again the groups it names, never the fleet, into the store.

Theory of operation
-------------------

What the service shows (its status, its serving records, its worker listing, the gauges read
from them) is per group: a group's entry in the read store (:mod:`~.read_store`: its picture,
standing rejections, readiness unit, serving entry and worker records) depends on that group's
state in the core and on the liveness of its endpoint's instances, and on nothing else. So a
group's entry is read out again only when something named it since it was made:

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
* from the copies alone, the groups' entries, applied to the store
  (:meth:`~.read_store.ReadStore.applied`, which puts the status's tuples together):
  in a thread (:meth:`StatusFold.refresh_off_loop`, the service's status round), or inline
  (:meth:`StatusFold.refresh`: a reader on the loop, the serving publication, a service that is
  not running).

Each round ends by publishing one immutable :class:`~.read_store.ReadStore`; a reader in any
thread takes :attr:`StatusFold.snapshot` and renders it in its own thread, reading only frozen
objects and never calling into the core. An entry built from a copy older than the group's
current one (an inline refresh overtook the round) is dropped, the round's newer entries wait
for the next application, and a group a step named after its copy was taken stays dirty for
the next round. The service starts a round :data:`STATUS_INTERVAL`
seconds after a change (the steps of a burst coalesce), or :data:`ROUND_SHARE` times the CPU
time the last round's read-out took if that is longer, but never more than
:data:`ROUND_WAIT_MAX` (which it waits when no other thread has read the status for a while):
so the round's thread holds the interpreter's lock (which the loop's thread needs too) at most
about a fifth of the time, whatever the fleet's size, and what a snapshot shows is at most that
wait plus one round behind the last step. Its ``as_of`` says
when its round began, and every step that ended before then is in it.

The first refresh builds everything, as the full path does; :func:`~.status_model.serving_records`,
:func:`~.status_model.readiness` and :func:`~.status_model.standing_rejections` are that full
path, and a differential test (``tests/test_read_store.py``) holds the store to them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from workerset_admission.admission import AdmissionCore
from workerset_admission.admission.admitted import routable_ids
from workerset_admission.admission.readout import GroupCopy
from workerset_admission.aio import collector_paused
from workerset_admission.identity import EndpointId, GroupKey
from workerset_admission.ports import StepDelta
from workerset_admission.service.liveness import LivenessIndex
from workerset_admission.service.read_store import (
    EMPTY_STORE,
    GroupEntry,
    ReadStore,
    group_entry,
)
from workerset_admission.service.status_model import ServingRecord

__all__ = [
    "ROUND_SHARE",
    "ROUND_WAIT_MAX",
    "SLICE_SECONDS",
    "STATUS_INTERVAL",
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


def _entry_of(copy: _Copy, clock: Callable[[], float]) -> GroupEntry | None:
    """Read one group's entry out of its copy (pure: runs in any thread)."""
    group = copy.group
    return None if group is None else group_entry(group, copy.live, clock)


def _round(
    copies: Sequence[_Copy],
    store: ReadStore,
    pending: Mapping[GroupKey, tuple[int, GroupEntry | None]],
    clock: Callable[[], float],
    as_of: float,
) -> tuple[list[GroupEntry | None], ReadStore, float]:
    """Build the copied groups' entries and apply them (after ``pending``'s) to ``store``.

    Also return the thread's CPU seconds for it (what the round cost the interpreter).

    The cyclic collector is held off meanwhile: a large group's read-out makes a view per
    member, alive for the round, which collections would promote to the oldest generation
    until they set off a full collection; and a full collection stops every thread, the
    loop's too, for a time that grows with the heap (the fleet).
    """
    began = time.thread_time()
    with collector_paused():
        built = [_entry_of(copy, clock) for copy in copies]
    changes = {key: entry for key, (_, entry) in pending.items()}
    for copy, made in zip(copies, built, strict=True):
        changes[copy.key] = made
    applied = store.applied(changes, as_of)
    return built, applied, time.thread_time() - began


class StatusFold:
    """The read store, its groups read out again as a change names them; see the module doc.

    Only the loop's thread calls its methods; :attr:`snapshot` is read from any thread.
    """

    def __init__(
        self, core: AdmissionCore, liveness: LivenessIndex, clock: Callable[[], float]
    ) -> None:
        self._core = core
        self._liveness = liveness
        self._clock = clock
        self._dirty: set[GroupKey] = set()
        self._everything = True
        # One round at a time: a round asked for while another runs starts when it ends, so
        # its copies are taken after every step before it was asked for.
        self._rounds = asyncio.Lock()
        # Steps heard, the last step that named each group, the copy each group's entry is from.
        self._seq = 0
        self._named: dict[GroupKey, int] = {}
        self._built: dict[GroupKey, int] = {}
        # Entries newer than the published store's, not applied yet (a round was overtaken),
        # with the step count of the copy each is from.
        self._pending: dict[GroupKey, tuple[int, GroupEntry | None]] = {}
        self._published = 0
        self._snapshot = EMPTY_STORE
        self.rebuilt = 0
        # The CPU seconds the last round's read-out took in its thread.
        self.round_seconds = 0.0

    def step(self, delta: StepDelta) -> None:
        """Note the groups one step named, and those at endpoints whose liveness moved."""
        self._seq += 1
        by_endpoint = self._snapshot.indexes["endpoint"]
        for key in delta.groups:
            self._named_now(key)
        for endpoint in delta.endpoints:
            for key in by_endpoint.get(endpoint, ()):
                self._named_now(key)
            # A group a round built but has not published yet is at that endpoint too.
            for key in self._pending:
                if key.endpoint == endpoint:
                    self._named_now(key)

    def _named_now(self, key: GroupKey) -> None:
        self._dirty.add(key)
        self._named[key] = self._seq

    @property
    def snapshot(self) -> ReadStore:
        """The latest published store (from any thread; see :class:`~.read_store.ReadStore`)."""
        return self._snapshot

    @property
    def dirty(self) -> bool:
        """Whether a step changed something the published store does not show yet."""
        return self._everything or bool(self._dirty) or bool(self._pending)

    def refresh(self) -> ReadStore:
        """Rebuild the dirty groups now, inline, and publish the store they make."""
        if not self.dirty:
            return self._snapshot
        as_of = time.time()
        copies = [self._copy(key) for key in self._dirty_keys()]
        clock = self._clock
        self._merge(copies, [_entry_of(copy, clock) for copy in copies])
        pending, self._pending = self._pending, {}
        changes = {key: entry for key, (_, entry) in pending.items()}
        self._publish(self._snapshot.applied(changes, as_of))
        return self._snapshot

    async def refresh_off_loop(self) -> ReadStore:
        """Run one round: copies on the loop in slices, the read-out in a thread; publish it.

        Rounds run one at a time: the store returned shows every step heard before the call.
        """
        async with self._rounds:
            return await self._round_now()

    async def _round_now(self) -> ReadStore:
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
        # The pending entries go to the round as its own table (their values are frozen).
        pending, self._pending = self._pending, {}
        built, applied, self.round_seconds = await asyncio.to_thread(
            _round, copies, self._snapshot, pending, self._clock, as_of
        )
        if self._published == published:
            # Nothing built a copy meanwhile: every one of the round's is the newest.
            self._merge(copies, built)
            self._pending.clear()
            self._publish(applied)
            return self._snapshot
        # An inline refresh published meanwhile, from copies as new or newer: what the round
        # had or built that is newer still waits for the next application.
        for key, (seq, entry) in pending.items():
            if self._built.get(key) == seq:
                self._pending.setdefault(key, (seq, entry))
        self._merge(copies, built)
        return self._snapshot

    def serving_records(self) -> dict[str, ServingRecord]:
        """Return what this frontend serves, per worker namespace (a copy of the store's)."""
        return dict(self.refresh().records)

    # -- the fold ----------------------------------------------------------------------------

    def _dirty_keys(self) -> list[GroupKey]:
        if self._everything:
            self._everything = False
            for key in (*self._core.group_keys(), *self._snapshot.entries):
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

    def _merge(self, copies: Sequence[_Copy], built: Sequence[GroupEntry | None]) -> None:
        """Take each copied group's new entry for the next application (unless newer was)."""
        for copy, entry in zip(copies, built, strict=True):
            key = copy.key
            if self._named.get(key, 0) <= copy.seq:
                self._dirty.discard(key)
            if self._built.get(key, -1) >= copy.seq:
                continue
            self._built[key] = copy.seq
            self._pending[key] = (copy.seq, entry)

    def _publish(self, store: ReadStore) -> None:
        self._snapshot = store
        self._published += 1
