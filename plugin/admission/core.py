"""The admission core: decides, per group, which cohort is served, and nothing else.

Theory of operation
-------------------

The core is a deterministic function of its inputs. ``apply(input)`` changes state and returns
the effects a service must carry out (and may trace); it performs no I/O, reads no clock and
raises only when called with something that is not an input.

*Groups and cohorts.* Every base (non-LoRA) registration belongs to one group (model plus
WorkerSet key) and, inside it, to the cohort of registrations sharing its ``mdc_checksum``.
Cohorts live in a dict, whose insertion order is their first-observation order: duplicates
and listings never move a cohort, and a cohort that empties is deleted, so if it comes back
it is re-inserted at the end.

*Tenure.* The front cohort is the incumbent. The moment a group's first valid card arrives,
that cohort is reserved: the group gets a receiver id, a build generation and the ``queued``
status, whatever happens to builds afterwards. A tenure ends only when the incumbent cohort
has no member left (its last worker was removed). Then the core cancels the build in flight,
withdraws the committed build, retires the receiver, and at once starts a new tenure for the
oldest remaining cohort, with a fresh receiver id and a fresh generation. A larger or newer
cohort never displaces the incumbent: size plays no part anywhere.

*Generations and fencing.* One counter per core hands out build generations; it only goes up
and a value is never handed out twice. Each build attempt has its own generation, and a
result is applied only when its ``AttemptId`` (group, checksum and generation) is the attempt
in flight (a commit failure: the committed attempt); anything else is reported as
``BuildDiscarded`` and changes nothing. A retired receiver id is
never reused either, so a holder of an old receiver can never see a successor's ids.

*Builds.* Queued groups start building in the order they were queued (FIFO, so no group
starves behind lower-sorted keys), at most ``max_concurrent_builds`` at a time. A failed
attempt schedules a retry after ``retry_delays[attempt - 1]`` (the last delay repeats) on the
injected clock; ``Tick`` makes due retries queue again. A worker joining or leaving the
incumbent cohort while a retry is pending (``retrying`` or ``blocked``) queues the rebuild at
once with the attempt count reset, as 1.6.1 does; rejected workers and adapters never do.
Dynamo 1.6.1 starts queued builds in sorted key order; the contract does not fix an order and
FIFO is what an operator expects.

*The hold and outage window* (``hold.py``). A removal an outage may have caused (a listing that
follows a lost connection or a start during an outage, and expiries soon after it) never ends a
tenure at once: when it empties the incumbent cohort the tenure is held, serving its members
on their last known records for a while, until a member it had rejoins or the hold's deadline
passes. A group this frontend holds nothing of whose peers serve a checksum the first listing
after an outage lacks is reserved for it, held, and a recorded tenure starts held or lends its
numbers. ``hold.py`` keeps the theory, the hold's phases and their table, and the rules that
judge a removal or a listing the outage's; the steps that change a group are here (``_hold``,
``_place_held``, ``_add_during_hold``, ``_expire_holds``).

*Drains and the handover* (``drain.py``). A drain sets a worker's registrations aside as if they
had left; lifting it places them again. When a drain takes the last member of a committed
incumbent and a cohort waits, the old tenure keeps serving its drained members (a handover)
until the successor is committed. ``drain.py`` keeps the theory, the drains in force with what
they set aside, and the handover's phases and table; the steps are here (``_on_drain``,
``_set_aside``, ``_end_handover``, ...).

*Rejections.* Each non-incumbent cohort is reported once per tenure: when it first appears,
or, after a succession, against the new incumbent. A cohort that empties and returns is a
new cohort and is reported again.

*In-place changes.* A key is an immutable incarnation. A re-sent key with another group or
checksum is refused (``MutationRefused``) and the first incarnation stays; a change of taints
or of the LoRA projection fingerprint alone is taken in place. ``TaintsUpdated`` names the
group whose tenure serves the worker at that moment (``serving``), so the hops carry it there
without asking the core again.

*LoRA adapters* (``projection.py``) never create or keep a group: an adapter is projected into
the group whose incumbent cohort holds its worker's base card, and every projection is judged
by the one-name-one-fingerprint rule as it is computed; a refused one is never announced
(``LoraProjectionRefused``) and on a committed group is a failed replacement
(``blocked_ready``), all in the step that made it. ``projection.py`` keeps the adapters and the
rule; the core names the host group and carries out the verdict.

*Batches.* Admissions and LoRA projections are published once per ``apply`` or
``apply_many`` call, for the groups that changed, after any builds that became possible have
started. A batch therefore gives the same state as applying its inputs one by one, with fewer
publications.

*Publication without copies.* A ``PublishAdmissions`` carries an ``AdmittedIds`` (``admitted.py``),
not a copy of the cohort's ids: the incumbent cohort keeps a frozen base set and an append-only
change log (``iid`` for a join, ``~iid`` for a departure), and an ``AdmittedIds`` is the base, the
log and the log's length at that moment, worked out into a frozenset only when someone reads it,
once. When the log grows longer than the base (and than 32 entries), the publication rebases the
cohort: a new base from its members and a new, empty log, while older ``AdmittedIds`` keep the old
list, which is never appended to again. A change therefore costs O(1) amortised instead of a copy of
the whole group, and a burst of changes between two reads of a receiver costs one materialisation.
Changes to a cohort are logged only while it is the incumbent; a new tenure rebases its cohort
first. Within a group an instance id names exactly one registration key (a group has one endpoint),
so a cohort's members are keyed by instance id and its ids need no set of their own.

*Where this differs from Dynamo 1.6.1* (the contract wins): 1.6.1 keeps a group's status
under a fingerprint that appends the worker's Qwen video prompt-expansion contract to the
checksum, and may retain a pipeline across a fingerprint change. The contract says the
``mdc_checksum`` is used throughout admission, construction and status, so cohorts, build
fences and status here are keyed by the checksum alone. 1.6.1's generation counter wraps at
2^64; this one never wraps, so no generation is ever handed out twice.

*Liveness* (endpoint instance records) is not an input here. Admission depends only on model
registrations; a hop intersects admitted ids with live instances at routing time
(``bindings.py``), exactly as Dynamo's admitted client does; only the members a hold serves
on last known good (``PublishAdmissions.last_known``) are routed to without that check. Keeping
liveness out of the core means instance churn never touches the core's state or its generation
counter.

*Reading this module.* The dispatch and the steps that change a group, in the order the
contract reads: the settings; then ``AdmissionCore``: its entry points, the discovery inputs,
drains, tenures and succession, the hold, builds and their fencing, LoRA adapters and in-place
changes, and the publication at the end of each call. Effects are made by their own
constructors, one readable way. The records are in ``group.py`` (cohorts, tenure, group),
``hold.py`` (the hold) and ``drain.py`` (drains, the handover); the group status table is
``status.py``. Read-only beside it: ``readout.py`` (the views of groups and placements),
``admitted.py`` (admitted ids and the cohort's change log), ``effects.py`` and ``inputs.py``.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Literal

from workerset_admission.admission import effects as fx
from workerset_admission.admission import readout
from workerset_admission.admission.drain import Drains, Handover, HandoverEvent
from workerset_admission.admission.group import Cohort, Group, Tenure, representative_of
from workerset_admission.admission.hold import (
    Hold,
    HoldEvent,
    expiry_outage,
    listing_outage,
    start_outage,
)
from workerset_admission.admission.inputs import (
    BuildFinished,
    CommitFailed,
    Drain,
    DrainLifted,
    DrainSet,
    Input,
    Listing,
    TenureRecorded,
    Tick,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.admission.projection import LoraProjection, base_key, same_projection
from workerset_admission.admission.snapshots import GroupView, PlacementView
from workerset_admission.admission.status import GroupStatus, StatusEvent
from workerset_admission.errors import ConfigError, UsageError
from workerset_admission.identity import AttemptId, GroupKey, Registration, instance_key

__all__ = ["AdmissionCore", "CoreSettings"]

_QUEUED = GroupStatus.QUEUED
_RETRYING = GroupStatus.RETRYING
_BLOCKED = GroupStatus.BLOCKED
_BLOCKED_READY = GroupStatus.BLOCKED_READY
_READY = GroupStatus.READY
_by_key = attrgetter("key")
_by_seq = attrgetter("seq")
_NO_IDS: frozenset[int] = frozenset()


# ---------------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """Tunables of the core; the defaults are Dynamo 1.6.1's."""

    max_concurrent_builds: int = 8
    retry_delays: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
    # Seconds a tenure is held when a post-outage resync lists none of its members (0: never);
    # three of Dynamo's default 10 s registration TTLs.
    tenure_hold: float = 30.0
    # The TTL workers register with: a live worker (or the bridge mirroring it) re-writes its
    # record within it, so during a hold the members the incumbent had stay admitted on their
    # last known records this long, and no longer (Dynamo's default 10 s).
    registration_ttl: float = 10.0

    def __post_init__(self) -> None:
        if self.max_concurrent_builds < 1:
            raise ConfigError("max_concurrent_builds must be at least 1")
        if not self.retry_delays or any(d < 0 for d in self.retry_delays):
            raise ConfigError("retry_delays must be a non-empty list of non-negative seconds")
        if not self.tenure_hold >= 0:
            raise ConfigError("tenure_hold must be zero or more seconds")
        if not self.registration_ttl > 0:
            raise ConfigError("registration_ttl must be more than zero seconds")

    def retry_delay(self, attempt: int) -> float:
        """Delay after the ``attempt``-th consecutive failure (1-based); the last one repeats."""
        delays = self.retry_delays
        return delays[min(max(attempt, 1), len(delays)) - 1]


# ---------------------------------------------------------------------------------- the core


class AdmissionCore:
    """Pure, synchronous admission decisions for every group one frontend observes."""

    def __init__(self, settings: CoreSettings | None = None) -> None:
        self._settings = settings or CoreSettings()
        # Keyed by (model, worker_set): hashing a plain tuple of strings is C-level, hashing
        # the GroupKey dataclass is a Python call, and this lookup is on every input.
        self._groups: dict[tuple[str, str], Group] = {}
        self._regs: dict[str, Registration] = {}
        # Every adapter, by key and by the base card it rides on (``projection.py``).
        self._lora = LoraProjection()
        self._last_generation = 0
        self._last_receiver = 0
        self._now = 0.0
        self._queue: deque[tuple[Group, int]] = deque()
        # How many builds are started and not yet answered (read it; only the core changes it).
        self.builds_in_flight = 0
        self._timers: list[tuple[float, int, Group, int]] = []
        self._timer_seq = 0
        self._holds: list[tuple[float, int, Group]] = []
        # When the last-known-good windows of holds end: (time, seq, group).
        self._last_known_ends: list[tuple[float, int, Group]] = []
        self._dirty: list[Group] = []
        self._lora_dirty: list[Group] = []
        self._out: list[fx.Effect] = []
        # The effects of the batch ``apply_many`` is applying (None outside one).
        self._batch: list[fx.Effect] | None = None
        # Recorded tenures not held, taken up when their group's tenure starts.
        self._recorded: dict[tuple[str, str], TenureRecorded] = {}
        # Drains in force, by worker (namespace, instance id), and the base registrations they
        # set aside, by key: tracked, in no cohort (``drain.py``).
        self._drains = Drains()
        # The clock value of the last listing that followed a lost connection (none yet).
        self._last_reconnect: float | None = None
        # The first listing's clock value and what the live peers served then, per group, while
        # an outage the peers have not resynced from yet may still reach this frontend; None
        # after the first listing was judged or once its window is over (``hold.py``).
        self._listed = False
        self._start_peers: tuple[float, dict[tuple[str, str], str]] | None = None

    # ------------------------------------------------------------------ entry points

    def apply(self, event: Input) -> list[fx.Effect]:
        """Apply one input and return the effects, in the order to carry them out.

        This is the one input dispatch: ``apply_many`` calls it for every input of a batch,
        and the batch publishes once, at its end.
        """
        out = self._batch
        batched = out is not None
        if out is None:
            out = self._out = []
        # The two discovery inputs are nearly all the traffic: they are tested first.
        if type(event) is WorkerAdded:
            self._add(event.registration)
        elif type(event) is WorkerRemoved:
            if event.expired_at is None:
                self._remove(event.key)
            else:
                self._expire(event.key, event.expired_at)
        elif type(event) is Listing:
            self._on_listing(event)
        elif type(event) is BuildFinished:
            self._on_build_finished(event)
        elif type(event) is CommitFailed:
            self._on_commit_failed(event)
        elif type(event) is Tick:
            self._on_tick(event)
        elif type(event) is TenureRecorded:
            self._on_tenure_recorded(event)
        elif type(event) is DrainSet:
            self._on_drain(event.drain)
        elif type(event) is DrainLifted:
            self._on_drain_lifted((event.namespace, event.instance_id))
        else:
            raise UsageError(f"not an admission input: {type(event).__name__}")
        if batched:
            return out
        # Most calls leave nothing queued and at most the one group they touched dirty:
        # publish that group here and skip the general flush.
        dirty = self._dirty
        if self._queue or self._lora_dirty or len(dirty) > 1:
            self._flush()
        elif dirty:
            group = dirty.pop()
            if group.dirty:
                group.dirty = False
                out.append(self._publication(group))
        return out

    def apply_many(self, events: Iterable[Input]) -> list[fx.Effect]:
        """Apply inputs in order, publishing admissions once per changed group at the end."""
        out: list[fx.Effect] = []
        self._out = self._batch = out
        try:
            for event in events:
                self.apply(event)
        finally:
            self._batch = None
        self._flush()
        return out

    # ------------------------------------------------------------------ discovery inputs

    def _add(self, reg: Registration) -> None:
        if reg.model_suffix is not None:
            self._add_lora(reg)
            return
        drains = self._drains.in_force
        if drains and (reg.endpoint.namespace, reg.instance_id) in drains:
            self._add_drained(reg)
            return
        key = reg.key
        regs = self._regs
        old = regs.get(key)
        if old is not None:
            self._update_in_place(old, reg)
            return
        gk = reg.group
        group = self._groups.get((gk.model, gk.worker_set))
        if group is None:
            group = self._groups[(gk.model, gk.worker_set)] = Group(gk)
        checksum = reg.mdc_checksum
        tenure = group.tenure
        incumbent = tenure.checksum
        if tenure.hold is not None and checksum == incumbent:
            self._add_during_hold(group, tenure.hold, reg)
            return
        cohort = group.cohorts.get(checksum)
        if cohort is None:
            # A new cohort joins the end of the order.
            group.seq += 1
            cohort = group.cohorts[checksum] = Cohort(checksum, group.seq)
        iid = reg.instance_id
        cohort.members[iid] = reg
        regs[key] = reg
        admitted = incumbent is None or incumbent == checksum
        self._out.append(fx.WorkerPlaced(key, gk, checksum, admitted))
        if incumbent is None:
            self._start_tenure(group)
        elif admitted:
            cohort.log.append(iid)
            if not group.dirty:
                group.dirty = True
                self._dirty.append(group)
            if key in self._lora.by_base:
                self._mark_lora(group)
            state = group.status.state
            if state is _RETRYING or state is _BLOCKED:
                # A membership change ends a retry backoff.
                self._rebuild_now(group)
        elif checksum not in tenure.reported:
            self._report(group, cohort)

    def _expire(self, key: str, at: float) -> None:
        """Remove a registration whose TTL ran out at ``at``; judge whether an outage did it.

        An expiry is a clock reading: the clock moves to it as a ``Tick`` would.
        """
        if at > self._now:
            self._advance(at)
        hold_for = self._settings.tenure_hold
        outage = expiry_outage(at, self._last_reconnect, hold_for)
        start = self._start_peers
        if outage is None and start is not None:
            if not at - start[0] < hold_for:
                self._start_peers = None  # the first listing's window is over
            else:
                base = self._base_of(key)
                if base is not None:
                    group = base.group
                    served = start[1].get((group.model, group.worker_set))
                    outage = start_outage(at, start[0], hold_for, served, base.mdc_checksum)
        self._remove(key, outage)

    def _base_of(self, key: str) -> Registration | None:
        """Return the base registration ``key`` is (a base card) or rides on (an adapter)."""
        reg = self._regs.get(key)
        if reg is not None:
            return reg
        adapter = self._lora.registered.get(key)
        return None if adapter is None else self._regs.get(base_key(adapter))

    def _remove(self, key: str, outage: float | None = None) -> None:
        """Remove a registration; ``outage``: the reconnect an outage's removal follows."""
        reg = self._regs.pop(key, None)
        if reg is None:
            if key in self._drains.drained:
                self._remove_drained(key)
            else:
                self._remove_lora(key, outage)
            return
        gk = reg.group
        group = self._groups[(gk.model, gk.worker_set)]
        checksum = reg.mdc_checksum
        iid = reg.instance_id
        tenure = group.tenure
        was_admitted = tenure.checksum == checksum
        hold = tenure.hold
        if hold is not None and was_admitted and hold.held:
            # While held the incumbent cohort is empty: this is an instance that arrived.
            hold.drop_arrival(reg)
            self._out.append(fx.WorkerDeparted(reg.key, gk, checksum, False))
            return
        cohort = group.cohorts[checksum]
        del cohort.members[iid]
        self._out.append(fx.WorkerDeparted(key, gk, checksum, was_admitted))
        if was_admitted:
            cohort.log.append(~iid)
            if outage is not None:
                self._note_outage_removal(group, reg, outage)
        if cohort.members:
            if was_admitted:
                if not group.dirty:
                    group.dirty = True
                    self._dirty.append(group)
                if key in self._lora.by_base:
                    self._mark_lora(group)
                state = group.status.state
                if state is _RETRYING or state is _BLOCKED:
                    self._rebuild_now(group)
        elif (
            was_admitted and outage is not None and outage + self._settings.tenure_hold > self._now
        ):
            # A pending retry waits: a hold builds nothing until a member is back.
            self._hold(group, outage)
        else:
            del group.cohorts[checksum]
            tenure.reported.discard(checksum)
            if was_admitted:
                self._succeed(group)

    def _on_listing(self, event: Listing) -> None:
        # Drains first, so no registration of a drained worker is admitted even for a moment;
        # lifted ones last, so what they give back is what the listing holds.
        drains = {d.worker: d for d in event.drains}
        for drain in drains.values():
            self._on_drain(drain)
        # A listing after an outage (a lost connection, or a start while the store was away)
        # removes what it omits as the outage's doing, and expiries soon after it are judged
        # against it (``_expire``).
        outage = listing_outage(
            self._now,
            self._settings.tenure_hold,
            reconnect=event.reconnect,
            outage_start=event.outage_start,
            peer_outage_at=event.peer_outage_at,
        )
        if outage is not None:
            self._last_reconnect = outage
            if event.peer_tenures:
                self._hold_for_peers(event, outage)
        elif not self._listed and event.peer_tenures and self._settings.tenure_hold > 0:
            # A first listing the peers may not have resynced from yet (see ``hold.py``).
            served = {key: tenure.mdc_checksum for key, tenure in event.peer_tenures.items()}
            self._start_peers = (self._now, served)
        self._listed = True
        listed: set[str] = set(event.retain)
        for reg in event.registrations:
            listed.add(reg.key)
            self._add(reg)
        for key in [k for k in self._regs if k not in listed]:
            self._remove(key, outage)
        for key in [k for k in self._drains.drained if k not in listed]:
            self._remove(key)
        for key in [k for k in self._lora.registered if k not in listed]:
            self._remove(key, outage)
        kept = set(event.retain_drains)
        for worker in [w for w in self._drains.in_force if w not in drains and w not in kept]:
            self._on_drain_lifted(worker)

    # ------------------------------------------------------------------ drains

    def _on_drain(self, drain: Drain) -> None:
        news = self._drains.put(drain)
        if news == "same":
            return  # a re-listing or a duplicate changes nothing
        self._out.append(fx.DrainChanged(drain.namespace, drain.instance_id, drain))
        if news == "changed":
            return  # who or when changed; the worker was set aside already
        namespace, iid = drain.worker
        for reg in [r for r in self._regs.values() if r.instance_id == iid]:
            if reg.endpoint.namespace == namespace:
                self._set_aside(reg, drain)
        # Members a held tenure serves on last known records are not registered now.
        for group in self._groups.values():
            hold = group.tenure.hold
            if group.key.endpoint.namespace != namespace or hold is None:
                continue
            carried = iid in hold.last_known_lora
            if hold.forget(iid):
                assert group.tenure.checksum is not None
                group.cohorts[group.tenure.checksum].log.append(~iid)
                if hold.over:
                    group.tenure.hold = None
                self._mark_dirty(group)
                if carried:
                    self._mark_lora(group)

    def _on_drain_lifted(self, worker: tuple[str, int]) -> None:
        returning = self._drains.lift(worker)
        if returning is None:
            return
        namespace, iid = worker
        self._out.append(fx.DrainChanged(namespace, iid, None))
        for reg in returning:
            del self._drains.drained[reg.key]
            group = self._group_of(reg)
            handover = group.handover
            if handover is not None and iid in handover.members:
                # It rejoins behind the successor: the old tenure stops serving it now.
                self._end_handover(group, HandoverEvent.UNDRAINED)
            self._add(reg)

    def _set_aside(self, reg: Registration, drain: Drain) -> None:
        """Take a drained worker's registration out of its cohort, as if it had left."""
        key = reg.key
        del self._regs[key]
        self._drains.drained[key] = reg
        gk = reg.group
        group = self._groups[(gk.model, gk.worker_set)]
        checksum = reg.mdc_checksum
        iid = reg.instance_id
        hold = group.tenure.hold
        was_admitted = group.tenure.checksum == checksum
        if hold is not None and was_admitted and hold.held:
            # While held the incumbent cohort is empty: this is an instance that arrived.
            hold.drop_arrival(reg)
            self._out.append(fx.WorkerDrained(key, gk, checksum, False, drain))
            return
        cohort = group.cohorts[checksum]
        del cohort.members[iid]
        self._out.append(fx.WorkerDrained(key, gk, checksum, was_admitted, drain))
        if was_admitted:
            cohort.log.append(~iid)
            group.tenure.parked[iid] = key
            self._mark_dirty(group)
            if key in self._lora.by_base:
                self._mark_lora(group)
        if cohort.members:
            if was_admitted:
                state = group.status.state
                if state is _RETRYING or state is _BLOCKED:
                    self._rebuild_now(group)
            return
        del group.cohorts[checksum]
        group.tenure.reported.discard(checksum)
        if was_admitted:
            self._succeed(group, drained=True)

    def _add_drained(self, reg: Registration) -> None:
        """Set aside a registration of a drained worker; it is never placed."""
        key = reg.key
        drained = self._drains.drained
        old = drained.get(key)
        if old is not None:
            if old.group != reg.group or old.mdc_checksum != reg.mdc_checksum:
                self._update_in_place(old, reg)  # refused: the first incarnation stays
            return
        gk = reg.group
        if (gk.model, gk.worker_set) not in self._groups:
            self._groups[(gk.model, gk.worker_set)] = Group(gk)
        drained[key] = reg
        drain = self._drains.drain_of(reg)
        self._out.append(fx.WorkerDrained(key, gk, reg.mdc_checksum, False, drain))

    def _remove_drained(self, key: str) -> None:
        """Forget a drained worker's registration: it is really gone."""
        reg = self._drains.drained.pop(key)
        group = self._group_of(reg)
        if group.tenure.parked.get(reg.instance_id) == key:
            del group.tenure.parked[reg.instance_id]  # gone before a handover could serve it
        self._out.append(fx.WorkerDeparted(key, reg.group, reg.mdc_checksum, False))
        handover = group.handover
        if handover is not None and handover.serves(reg.instance_id, key):
            if not handover.member_left(reg.instance_id):
                self._end_handover(group, HandoverEvent.DEPARTED)
            else:
                self._out.append(
                    fx.PublishAdmissions(
                        group.key,
                        handover.receiver,
                        handover.checksum,
                        handover.generation,
                        frozenset(handover.members),
                        handover.card,
                    )
                )

    # ------------------------------------------------------------------ tenures and succession

    def _start_tenure(self, group: Group) -> None:
        cohort = next(iter(group.cohorts.values()))
        # Changes were not logged while the cohort was not the incumbent.
        cohort.rebase(cohort.members)
        representative = representative_of(cohort)
        recorded = self._recorded.pop((group.key.model, group.key.worker_set), None)
        if recorded is not None and recorded.mdc_checksum == cohort.checksum:
            receiver, generation = self._take_recorded_numbers(recorded)
        else:
            self._last_receiver += 1
            receiver, generation = self._last_receiver, self._next_generation()
        group.tenure.checksum = cohort.checksum
        group.tenure.receiver = receiver
        group.generation = generation
        group.tenure.representative = representative.key
        group.tenure.card = representative.card
        group.tenure.lora = ()
        self._out.append(fx.OpenReceiver(group.key, receiver, cohort.checksum, generation))
        self._transition(group, StatusEvent.RESERVE)
        self._queue.append((group, generation))
        self._mark_dirty(group)
        self._mark_lora(group)

    def _on_tenure_recorded(self, event: TenureRecorded) -> None:
        """Take up a tenure a recording began with (see ``TenureRecorded``)."""
        gk = event.group
        key = (gk.model, gk.worker_set)
        if key in self._groups:
            raise UsageError(f"a recorded tenure of {gk.id} comes after that group's inputs")
        if event.held_until is None:
            self._recorded[key] = event
            return
        # Held when the recording began: the incumbent cohort is empty and in front.
        group = self._groups[key] = Group(gk)
        receiver, generation = self._take_recorded_numbers(event)
        self._place_held(
            group,
            event.mdc_checksum,
            receiver,
            generation,
            event.held_until,
            event.hold_members,
            event.last_known,
            event.last_known_until,
            committed=event.committed_generation == generation,
        )

    def _hold_for_peers(self, event: Listing, outage: float) -> None:
        """Reserve, held, what the peers serve of groups this frontend holds nothing of.

        See ``hold.py`` ("Starting during an outage"). The group is held exactly as a live
        frontend's hold (the empty cohort in front, until the outage's reconnect plus
        ``tenure_hold``); only the members the peers serve end the hold. Nothing is served
        meanwhile: this frontend never saw their records.
        """
        hold_for = self._settings.tenure_hold
        if not hold_for > 0:
            return
        listed = {
            (reg.group.model, reg.group.worker_set, reg.mdc_checksum)
            for reg in event.registrations
            if reg.model_suffix is None
        }
        for key, tenure in sorted(event.peer_tenures.items()):
            group = self._groups.get(key)
            if group is not None and (group.tenure.checksum is not None or group.cohorts):
                continue  # it holds a tenure: first-observation order stands
            if (*key, tenure.mdc_checksum) in listed or not tenure.members:
                continue  # listed: observed first (ordering.py); an expiry then holds it
            if group is None:
                group = self._groups[key] = Group(GroupKey(*key))
            self._last_receiver += 1
            self._place_held(
                group,
                tenure.mdc_checksum,
                self._last_receiver,
                self._next_generation(),
                outage + hold_for,
                tenure.members,
                since=outage,
            )

    def _place_held(
        self,
        group: Group,
        checksum: str,
        receiver: int,
        generation: int,
        until: float,
        members: Iterable[int],
        last_known: Iterable[int] = (),
        last_known_until: float | None = None,
        *,
        committed: bool = False,
        since: float | None = None,
    ) -> None:
        """Start a tenure already held: its empty cohort in front, as ``_hold`` leaves one.

        ``members`` are the instance ids whose return ends the hold; ``last_known`` those
        served on their last known records until ``last_known_until``; ``since`` the reconnect
        it counts from (now when not given).
        """
        gk = group.key
        group.seq += 1
        group.cohorts[checksum] = cohort = Cohort(checksum, group.seq)
        group.tenure.checksum = checksum
        group.tenure.receiver = receiver
        group.generation = generation
        self._out.append(fx.OpenReceiver(gk, receiver, checksum, generation))
        self._transition(group, StatusEvent.RESERVE)
        if committed:
            # Its build was committed: the tenure goes on from there, as live.
            self._transition(group, StatusEvent.START_BUILD)
            self._transition(group, StatusEvent.BUILD_OK)
            group.tenure.committed_generation = generation
        else:
            # A hold builds nothing; the rejoin that brings a member back queues the build.
            self._queue.append((group, generation))
        endpoint = gk.endpoint
        pre_hold = {iid: instance_key(endpoint, iid) for iid in members}
        served = {iid: instance_key(endpoint, iid) for iid in last_known}
        if last_known_until is None or not served:
            served, last_known_until = {}, until
        # A recorded hold's reconnect is before the recording: its length counts from here.
        start = self._now if since is None else since
        group.tenure.hold = Hold(start, until, pre_hold, served, last_known_until)
        self._timer_seq += 1
        heapq.heappush(self._holds, (until, self._timer_seq, group))
        if served:
            for iid in served:
                cohort.log.append(iid)
            heapq.heappush(self._last_known_ends, (last_known_until, self._timer_seq, group))
        self._out.append(
            fx.TenureHeld(
                gk,
                checksum,
                receiver,
                generation,
                until,
                tuple(sorted(served.values())),
                last_known_until if served else None,
            )
        )
        self._mark_dirty(group)
        self._mark_lora(group)

    def _take_recorded_numbers(self, recorded: TenureRecorded) -> tuple[int, int]:
        """Use a recorded receiver and generation; later ones are numbered after them."""
        self._last_receiver = max(self._last_receiver, recorded.receiver)
        self._last_generation = max(self._last_generation, recorded.generation)
        return recorded.receiver, recorded.generation

    def _end_tenure(self, group: Group, *, hand_over: bool = False) -> None:
        """End the tenure; with ``hand_over`` its committed build and receiver stay serving."""
        tenure = group.tenure
        checksum = tenure.checksum
        receiver = tenure.receiver
        assert checksum is not None
        assert receiver is not None
        if group.handover is not None:
            self._end_handover(group, HandoverEvent.SUPERSEDED)
        if tenure.in_flight is not None:
            self._out.append(fx.CancelBuild(group.key, checksum, tenure.in_flight))
            self.builds_in_flight -= 1
        if hand_over:
            assert tenure.committed_generation is not None
            assert group.generation is not None
            members = dict(tenure.parked)
            group.handover = Handover(
                checksum, receiver, tenure.committed_generation, members, tenure.card
            )
            # The receiver lists exactly the drained members it goes on serving.
            self._out.append(
                fx.PublishAdmissions(
                    group.key, receiver, checksum, group.generation, frozenset(members), tenure.card
                )
            )
        else:
            if group.status.state.committed:
                assert tenure.committed_generation is not None
                self._out.append(fx.WithdrawGroup(group.key, checksum, tenure.committed_generation))
            self._out.append(fx.RetireReceiver(group.key, receiver, checksum))
        self._transition(group, StatusEvent.END_TENURE)
        # Everything the tenure held goes with it; nothing of it is left to publish.
        group.tenure = Tenure()
        group.dirty = group.lora_dirty = False

    def _end_handover(self, group: Group, event: HandoverEvent) -> None:
        """Withdraw a drained tenure that handed over, and retire its receiver."""
        handover = group.handover
        assert handover is not None
        reason = handover.end(event)
        group.handover = None
        key = group.key
        self._out.append(fx.WithdrawGroup(key, handover.checksum, handover.generation))
        self._out.append(fx.RetireReceiver(key, handover.receiver, handover.checksum))
        self._out.append(
            fx.HandoverEnded(key, handover.checksum, handover.generation, handover.receiver, reason)
        )

    def _succeed(self, group: Group, *, drained: bool = False) -> None:
        """End the tenure of a cohort that is gone; the oldest remaining cohort takes over.

        ``drained``: its last members were drained and still serve; a committed tenure then
        hands over to the successor instead of being withdrawn at once.
        """
        old_checksum = group.tenure.checksum
        old_generation = group.generation
        old_receiver = group.tenure.receiver
        assert old_checksum is not None
        assert old_receiver is not None
        hand_over = (
            drained
            and bool(group.cohorts)
            and bool(group.tenure.parked)
            and group.status.state.committed
        )
        self._end_tenure(group, hand_over=hand_over)
        if not group.cohorts:
            self._out.append(
                fx.Succession(
                    group.key, old_checksum, None, old_generation, None, old_receiver, None
                )
            )
            return
        self._start_tenure(group)
        self._out.append(
            fx.Succession(
                group.key,
                old_checksum,
                group.tenure.checksum,
                old_generation,
                group.generation,
                old_receiver,
                group.tenure.receiver,
                hand_over,
            )
        )
        # Every disagreement still standing is reported again against the new incumbent.
        for cohort in list(group.cohorts.values())[1:]:
            self._report(group, cohort)

    def _report(self, group: Group, cohort: Cohort) -> None:
        assert group.tenure.checksum is not None
        group.tenure.reported.add(cohort.checksum)
        representative = representative_of(cohort)
        self._out.append(
            fx.RejectionReported(
                group=group.key,
                model=group.key.model,
                worker_set=group.key.worker_set,
                incumbent_checksum=group.tenure.checksum,
                rejected_checksum=cohort.checksum,
                instance=representative.key,
                # The tenure's card (kept through a hold), so the report can say what differs.
                incumbent_card=group.tenure.card,
                rejected_card=representative.card,
            )
        )

    # ------------------------------------------------------------------ the hold

    def _note_outage_removal(self, group: Group, reg: Registration, outage: float) -> None:
        """Remember an incumbent member an outage's removal took: a hold may serve it."""
        if not self._settings.tenure_hold > 0:
            return
        gone = group.tenure.outage_gone
        if gone is None or gone[0] != outage:
            gone = group.tenure.outage_gone = (outage, {})
        gone[1][reg.instance_id] = reg.key
        self._note_outage_adapters(group, reg, outage)

    def _note_outage_adapters(self, group: Group, base: Registration, outage: float) -> None:
        """Remember a member's adapters as they were before an outage's removals took any."""
        worker = self._lora.project((base,))
        if not worker:
            return
        kept = group.tenure.outage_lora
        if kept is None or kept[0] != outage:
            kept = group.tenure.outage_lora = (outage, {})
        kept[1].setdefault(base.instance_id, worker[0])

    def _hold(self, group: Group, outage: float) -> None:
        """Keep an emptied incumbent reserved, serving its last known members for a while.

        The hold counts from the reconnect (``outage``), so an expiry that empties the cohort
        later in the same outage never holds it past ``outage + tenure_hold``.
        """
        checksum = group.tenure.checksum
        assert checksum is not None
        assert group.tenure.receiver is not None
        settings = self._settings
        gone = group.tenure.outage_gone
        members = gone[1] if gone is not None and gone[0] == outage else {}
        group.tenure.outage_gone = None
        kept = group.tenure.outage_lora
        adapters = kept[1] if kept is not None and kept[0] == outage else {}
        group.tenure.outage_lora = None
        old = group.tenure.hold
        if old is not None:
            # A second emptying within an earlier hold's window: those not back stay served.
            members = {**old.last_known, **members}
            adapters = {**old.last_known_lora, **adapters}
        until = outage + settings.tenure_hold
        last_known_until = min(outage + settings.registration_ttl, until)
        serving = last_known_until > self._now and bool(members)
        served = dict(members) if serving else {}
        hold = group.tenure.hold = Hold(outage, until, members, served, last_known_until, adapters)
        self._timer_seq += 1
        heapq.heappush(self._holds, (until, self._timer_seq, group))
        if serving:
            log = group.cohorts[checksum].log
            for iid in members:
                log.append(iid)  # served again (or still) on its last known record
            heapq.heappush(self._last_known_ends, (last_known_until, self._timer_seq, group))
        self._out.append(
            fx.TenureHeld(
                group.key,
                checksum,
                group.tenure.receiver,
                group.generation,
                until,
                tuple(sorted(hold.last_known.values())),
                last_known_until if hold.last_known else None,
            )
        )
        self._mark_dirty(group)
        self._mark_lora(group)

    def _add_during_hold(self, group: Group, hold: Hold, reg: Registration) -> None:
        """Place an instance of the checksum a hold (or its last-known-good window) is about."""
        key = reg.key
        iid = reg.instance_id
        self._regs[key] = reg
        prior = hold.members.get(iid)
        returning = prior == key
        if hold.held and not returning:
            # A new instance does not end the hold: tracked, not admitted (see _expire_holds).
            if not hold.arrivals:
                group.seq += 1  # the place the cohort it would make takes
            hold.arrive(reg, group.seq)
            self._out.append(fx.WorkerPlaced(key, group.key, reg.mdc_checksum, False))
            return
        checksum = reg.mdc_checksum
        cohort = group.cohorts[checksum]
        cohort.members[iid] = reg
        cohort.log.append(iid)
        # A member back on its own records is projected from its own adapters from now on.
        carried = iid in hold.last_known_lora
        hold.back(iid)
        self._out.append(fx.WorkerPlaced(key, group.key, checksum, True))
        rejoined = hold.held
        if rejoined:
            # A pre-hold member is back: the emptying was the outage's; the new instances
            # join the incumbent with it.
            for arrival in hold.take_arrivals().values():
                cohort.members[arrival.instance_id] = arrival
                cohort.log.append(arrival.instance_id)
            self._end_hold(group, hold, HoldEvent.REJOIN)
        if hold.over:
            group.tenure.hold = None
        self._mark_dirty(group)
        if key in self._lora.by_base or rejoined or carried:
            self._mark_lora(group)
        state = group.status.state
        if state is _RETRYING or state is _BLOCKED:
            self._rebuild_now(group)
        elif state is _QUEUED and rejoined:
            # Its queue entry may have been passed over while held: queue it again, under a
            # fresh generation so that no build starts after a newer one.
            group.generation = generation = self._next_generation()
            self._queue.append((group, generation))

    def _end_hold(self, group: Group, hold: Hold, event: HoldEvent) -> None:
        assert group.tenure.checksum is not None
        hold.process(event)
        outcome: Literal["rejoined", "expired"] = (
            "rejoined" if event is HoldEvent.REJOIN else "expired"
        )
        self._out.append(
            fx.TenureHoldEnded(group.key, group.tenure.checksum, outcome, self._now - hold.since)
        )

    def _expire_holds(self) -> None:
        now = self._now
        ends = self._last_known_ends
        while ends and ends[0][0] <= now:
            until, _seq, group = heapq.heappop(ends)
            hold = group.tenure.hold
            if hold is None or hold.last_known_until != until or not hold.last_known:
                continue  # the tenure ended, or every member is back
            self._stop_serving_last_known(group, hold)
        holds = self._holds
        while holds and holds[0][0] <= now:
            deadline, _seq, group = heapq.heappop(holds)
            hold = group.tenure.hold
            if hold is None or not hold.held or hold.until != deadline:
                continue  # a member rejoined before the deadline
            checksum = group.tenure.checksum
            assert checksum is not None
            self._end_hold(group, hold, HoldEvent.EXPIRE)
            del group.cohorts[checksum]
            group.tenure.reported.discard(checksum)
            if hold.arrivals:
                # The new instances make the cohort they would have made with no hold, in the
                # place their first registration would have put it.
                assert hold.arrival_seq is not None
                cohort = Cohort(checksum, hold.arrival_seq)
                cohort.members = hold.take_arrivals()
                ordered = sorted([*group.cohorts.values(), cohort], key=_by_seq)
                group.cohorts = {c.checksum: c for c in ordered}
            self._succeed(group)

    def _stop_serving_last_known(self, group: Group, hold: Hold) -> None:
        """One registration TTL is over: members not back by now were not alive."""
        assert group.tenure.checksum is not None
        log = group.cohorts[group.tenure.checksum].log
        carried = bool(hold.last_known_lora)
        for iid in hold.last_known_over():
            log.append(~iid)
        if hold.over:
            group.tenure.hold = None
        self._mark_dirty(group)
        if carried:
            self._mark_lora(group)

    # ------------------------------------------------------------------ builds and fencing

    def _on_build_finished(self, event: BuildFinished) -> None:
        attempt = event.attempt_id
        group = self._groups.get((event.group.model, event.group.worker_set))
        if group is None or group.tenure.in_flight is None:
            self._discard(attempt, "no build in flight")
            return
        if attempt != group.attempt_in_flight():
            self._discard(attempt, "stale checksum or generation")
            return
        group.tenure.in_flight = None
        self.builds_in_flight -= 1
        checksum = group.tenure.checksum
        receiver = group.tenure.receiver
        assert checksum is not None
        assert receiver is not None
        if event.ok:
            self._transition(group, StatusEvent.BUILD_OK)
            group.tenure.committed_generation = event.generation
            group.tenure.attempt = 0
            cohort = group.cohorts[checksum]
            assert group.tenure.representative is not None
            hold = group.tenure.hold
            members = {r.key for r in cohort.members.values()}
            if hold is not None:
                members.update(hold.last_known.values())
            handover = group.handover
            self._out.append(
                fx.CommitGroup(
                    group=group.key,
                    mdc_checksum=checksum,
                    generation=event.generation,
                    receiver=receiver,
                    members=tuple(sorted(members)),
                    admitted=cohort.admitted_ids(group.served_ids(cohort)).as_frozenset(),
                    representative=group.tenure.representative,
                    card=group.tenure.card,
                    handover_from=None if handover is None else handover.generation,
                )
            )
            if handover is not None:
                # The successor serves now: the drained tenure goes, after it.
                self._end_handover(group, HandoverEvent.COMMITTED)
        else:
            self._transition(group, StatusEvent.BUILD_FAILED)
            self._schedule_retry(group, event.generation, event.error or "build failed")

    def _on_commit_failed(self, event: CommitFailed) -> None:
        attempt = event.attempt_id
        group = self._groups.get((event.group.model, event.group.worker_set))
        if (
            group is None
            or attempt != group.committed_attempt()
            or not group.status.state.committed
        ):
            self._discard(attempt, "no such commit")
            return
        if event.phase == "commit":
            # Blocked-ready: the core refused this commit's projection in the commit's step.
            if group.status.state is not _READY and group.status.state is not _BLOCKED_READY:
                self._discard(attempt, "commit already judged")
                return
            self._transition(group, StatusEvent.COMMIT_FAILED)
            group.tenure.committed_generation = None
        else:
            self._transition(group, StatusEvent.REPLACE_FAILED)
        group.tenure.attempt += 1
        self._schedule_retry(group, event.generation, event.error or f"{event.phase} failed")

    def _schedule_retry(self, group: Group, generation: int, error: str) -> None:
        assert group.tenure.checksum is not None
        delay = self._settings.retry_delay(group.tenure.attempt)
        deadline = self._now + delay
        group.tenure.deadline = deadline
        self._timer_seq += 1
        heapq.heappush(self._timers, (deadline, self._timer_seq, group, generation))
        self._out.append(
            fx.RetryScheduled(
                group.key,
                group.tenure.checksum,
                generation,
                group.tenure.attempt,
                delay,
                deadline,
                error,
            )
        )

    def _on_tick(self, event: Tick) -> None:
        self._advance(event.now)

    def _advance(self, now: float) -> None:
        """Move the clock to ``now`` and act on every deadline due by then."""
        # The clock never runs backwards: an older reading only means a late delivery.
        if now > self._now:
            self._now = now
        if self._holds or self._last_known_ends:
            self._expire_holds()
        timers = self._timers
        while timers and timers[0][0] <= self._now:
            deadline, _seq, group, generation = heapq.heappop(timers)
            if group.tenure.deadline != deadline or generation != group.generation:
                continue  # the timer outlived its tenure or attempt
            group.tenure.deadline = None
            state = group.status.state
            hold = group.tenure.hold
            if hold is not None and hold.held and (state is _RETRYING or state is _BLOCKED):
                # A hold pauses the retry: nothing to build for until a member is back, and
                # the rejoin that brings one rebuilds at once.
                continue
            if state is _RETRYING or state is _BLOCKED:
                group.generation = self._next_generation()
                self._transition(group, StatusEvent.RETRY_DUE)
                self._queue.append((group, group.generation))
                self._mark_dirty(group)
            elif state is _BLOCKED_READY:
                self._transition(group, StatusEvent.REPLACE_DUE)
                self._mark_dirty(group)
                group.tenure.lora = None
                self._mark_lora(group)

    def _rebuild_now(self, group: Group) -> None:
        """Queue a rebuild at once: the incumbent's membership changed during a backoff."""
        # The failure being waited out was about other members, so the backoff restarts from
        # its first step (1.6.1 resets its attempt count too); the pending timer goes stale.
        group.tenure.deadline = None
        group.tenure.attempt = 0
        group.generation = self._next_generation()
        self._transition(group, StatusEvent.MEMBERS_CHANGED)
        self._queue.append((group, group.generation))
        self._mark_dirty(group)

    def _start_build(self, group: Group) -> None:
        checksum = group.tenure.checksum
        generation = group.generation
        receiver = group.tenure.receiver
        assert checksum is not None
        assert generation is not None
        assert receiver is not None
        self._transition(group, StatusEvent.START_BUILD)
        cohort = group.cohorts[checksum]
        # Builds wait out a hold, but after a rejoin members may still be on last known good.
        if cohort.members:
            representative = representative_of(cohort)
            if representative.key != group.tenure.representative:
                # The card travels with the admissions: a new representative is news.
                group.tenure.representative = representative.key
                group.tenure.card = representative.card
                self._mark_dirty(group)
        assert group.tenure.representative is not None
        group.tenure.attempt += 1
        group.tenure.in_flight = generation
        self.builds_in_flight += 1
        self._out.append(
            fx.StartBuild(
                group=group.key,
                mdc_checksum=checksum,
                generation=generation,
                attempt=group.tenure.attempt,
                receiver=receiver,
                admitted=cohort.admitted_ids(group.served_ids(cohort)).as_frozenset(),
                representative=group.tenure.representative,
                card=group.tenure.card,
            )
        )

    # ------------------------------------------------------------------ LoRA and in-place changes

    def _update_in_place(self, old: Registration, reg: Registration) -> None:
        if old.group != reg.group or old.mdc_checksum != reg.mdc_checksum:
            self._out.append(
                fx.MutationRefused(
                    key=reg.key,
                    reason="in-place materialization change; the first incarnation is kept",
                    kept_group=old.group,
                    kept_checksum=old.mdc_checksum,
                    offered_group=reg.group,
                    offered_checksum=reg.mdc_checksum,
                )
            )
            return
        taints_changed = old.taints != reg.taints
        fingerprint_changed = old.lora_fingerprint != reg.lora_fingerprint
        if not (taints_changed or fingerprint_changed):
            return  # a duplicate: the first incarnation's card stays
        if reg.model_suffix is None:
            self._regs[reg.key] = reg
            group = self._group_of(reg)
            hold = group.tenure.hold
            if hold is not None and hold.arrivals.get(reg.instance_id) is old:
                hold.arrivals[reg.instance_id] = reg
            else:
                group.cohorts[reg.mdc_checksum].members[reg.instance_id] = reg
        else:
            self._lora.replace(reg)
        if taints_changed:
            self._out.append(fx.TaintsUpdated(reg.key, reg.taints, self._serving(reg)))
        if fingerprint_changed:
            base = base_key(reg)
            host = self._admitted_host(base)
            if host is not None and base in self._lora.by_base:
                self._mark_lora(host)

    def _add_lora(self, reg: Registration) -> None:
        if self._settings.tenure_hold > 0 and self._regs.get(base_key(reg)) is None:
            # A live record of an adapter whose base a hold may serve on last known records:
            # the held copy is what the worker had before the outage, so another fingerprint
            # ends it (the new one is served once the base card is back); the same one keeps it.
            self._drop_last_known_adapter(reg, keep_fingerprint=reg.lora_fingerprint)
        old = self._lora.registered.get(reg.key)
        if old is not None:
            self._update_in_place(old, reg)
            return
        host = self._admitted_host(self._lora.add(reg))
        if host is not None:
            self._mark_lora(host)

    def _remove_lora(self, key: str, outage: float | None = None) -> None:
        """Forget an adapter; ``outage``: the reconnect an outage's removal follows."""
        reg = self._lora.registered.get(key)
        if reg is not None and self._settings.tenure_hold > 0:
            base_reg = self._regs.get(base_key(reg))
            if base_reg is None:
                if outage is None:
                    self._drop_last_known_adapter(reg)
            elif outage is not None:
                # Its base card may go next in the same outage: a hold then serves it with this.
                host = self._admitted_host(base_key(reg))
                if host is not None:
                    self._note_outage_adapters(host, base_reg, outage)
        base = self._lora.remove(key)
        if base is None:
            return  # an unknown key: removing it again is harmless
        host = self._admitted_host(base)
        if host is not None:
            self._mark_lora(host)

    def _drop_last_known_adapter(
        self, reg: Registration, keep_fingerprint: str | None = None
    ) -> None:
        """Stop serving an adapter removed live whose base a hold serves on last known records.

        ``keep_fingerprint``: an adapter put live again; a held copy with this fingerprint stays.
        """
        for group in self._groups.values():
            hold = group.tenure.hold
            if hold is None or group.key.endpoint != reg.endpoint:
                continue
            worker = hold.last_known_lora.get(reg.instance_id)
            if worker is None:
                continue
            rest = tuple(
                a
                for a in worker.adapters
                if a.key != reg.key or a.lora_fingerprint == keep_fingerprint
            )
            if len(rest) == len(worker.adapters):
                continue
            if rest:
                hold.last_known_lora[reg.instance_id] = fx.LoraWorker(
                    worker.endpoint, worker.instance_id, worker.base_fingerprint, rest
                )
            else:
                del hold.last_known_lora[reg.instance_id]
            self._mark_lora(group)

    def _serving(self, reg: Registration) -> GroupKey | None:
        """Name the group whose tenure serves ``reg`` (a base card or an adapter), if any."""
        if reg.model_suffix is not None:
            host = self._admitted_host(base_key(reg))
            return None if host is None else host.key
        group = self._group_of(reg)
        if group.tenure.checksum != reg.mdc_checksum:
            return None
        hold = group.tenure.hold
        if hold is not None and hold.arrivals.get(reg.instance_id) is reg:
            return None  # a new instance of a held incumbent's checksum: in no cohort yet
        return group.key

    def _admitted_host(self, key: str) -> Group | None:
        """Find the group whose incumbent cohort holds the base card ``key``, if any."""
        base = self._regs.get(key)
        if base is None:
            return None
        group = self._group_of(base)
        return group if group.tenure.checksum == base.mdc_checksum else None

    # ------------------------------------------------------------------ end of a call

    def _publication(self, group: Group) -> fx.PublishAdmissions:
        """Publish the incumbent's admitted ids: read from its log, not a copy of its set."""
        tenure = group.tenure
        checksum = tenure.checksum
        receiver = tenure.receiver
        generation = group.generation
        assert checksum is not None
        assert receiver is not None
        assert generation is not None
        cohort = group.cohorts[checksum]
        tenure.parked = {}
        hold = tenure.hold
        if hold is None:
            ids = cohort.admitted_ids(cohort.members)
            last_known = _NO_IDS
        else:
            ids = cohort.admitted_ids(group.served_ids(cohort))
            last_known = frozenset(hold.last_known)
        return fx.PublishAdmissions(
            group.key, receiver, checksum, generation, ids, tenure.card, last_known
        )

    def _flush(self) -> None:
        queue = self._queue
        if not (queue or self._dirty or self._lora_dirty):
            return
        out = self._out
        limit = self._settings.max_concurrent_builds
        while queue and self.builds_in_flight < limit:
            group, generation = queue.popleft()
            if group.status.state is _QUEUED and group.generation == generation:
                hold = group.tenure.hold
                if hold is not None and hold.held:
                    continue  # nothing to build for until a member is back; a rejoin queues it
                self._start_build(group)
        if self._dirty:
            for group in self._dirty:
                if group.dirty:
                    group.dirty = False
                    out.append(self._publication(group))
            self._dirty.clear()
        if self._lora_dirty:
            for group in self._lora_dirty:
                if not group.lora_dirty:
                    continue
                group.lora_dirty = False
                tenure = group.tenure
                assert tenure.checksum is not None
                cohort = group.cohorts[tenure.checksum]
                projection = self._lora.project(cohort.members.values())
                hold = tenure.hold
                if hold is not None and hold.last_known_lora:
                    projection = _with_last_known(projection, hold, cohort.members)
                if not same_projection(projection, tenure.lora):
                    tenure.lora = projection
                    assert tenure.receiver is not None
                    assert group.generation is not None
                    conflict = self._lora.judge(group.key, tenure.receiver, projection)
                    if conflict is None:
                        out.append(
                            fx.LoraProjectionChanged(
                                group.key, tenure.receiver, group.generation, projection
                            )
                        )
                    else:
                        self._refuse_projection(group, conflict)
            self._lora_dirty.clear()

    def _refuse_projection(self, group: Group, reason: str) -> None:
        """Keep a conflicting projection off the hops; on a committed group, retry it later.

        The hops keep serving the last projection. A committed group's replacement failed: it
        goes on serving its last safe commit (``blocked_ready``) and the projection is judged
        again at the retry's deadline (``REPLACE_DUE``). Before a commit nothing is served, so
        there is nothing to keep and nothing to retry: the next change is judged afresh.
        """
        receiver = group.tenure.receiver
        generation = group.generation
        assert receiver is not None
        assert generation is not None
        self._out.append(fx.LoraProjectionRefused(group.key, receiver, generation, reason))
        if group.status.state.committed and group.tenure.committed_generation == generation:
            self._transition(group, StatusEvent.REPLACE_FAILED)
            group.tenure.attempt += 1
            self._schedule_retry(group, generation, reason)

    # ------------------------------------------------------------------ small shared steps

    def _group_of(self, reg: Registration) -> Group:
        gk = reg.group
        return self._groups[(gk.model, gk.worker_set)]

    def _discard(self, attempt: AttemptId, reason: str) -> None:
        self._out.append(
            fx.BuildDiscarded(attempt.group, attempt.mdc_checksum, attempt.generation, reason)
        )

    def _next_generation(self) -> int:
        self._last_generation += 1
        return self._last_generation

    def _transition(self, group: Group, event: StatusEvent) -> None:
        old = group.status.state
        new = group.status.process(event)
        self._out.append(fx.StatusChanged(group.key, old, new, group.generation))

    def _mark_dirty(self, group: Group) -> None:
        if not group.dirty:
            group.dirty = True
            self._dirty.append(group)

    def _mark_lora(self, group: Group) -> None:
        if not group.lora_dirty:
            group.lora_dirty = True
            self._lora_dirty.append(group)

    # ------------------------------------------------------------------ read-only views

    @property
    def settings(self) -> CoreSettings:
        return self._settings

    @property
    def now(self) -> float:
        """The latest clock value a ``Tick`` brought."""
        return self._now

    def group(self, key: GroupKey) -> GroupView | None:
        group = self._groups.get((key.model, key.worker_set))
        return None if group is None else readout.group_view(group, self._drained_in(group))

    def group_copy(self, key: GroupKey) -> readout.GroupCopy | None:
        """Copy what :meth:`group` reads of the group: a later step changes none of it.

        The copy's ``view()`` is :meth:`group`'s answer as of now, worked out whenever (and in
        whichever thread) the reader wants it.
        """
        group = self._groups.get((key.model, key.worker_set))
        return None if group is None else readout.group_copy(group, self._drained_in(group))

    def group_keys(self) -> list[GroupKey]:
        """Return the key of every group ever seen (idle ones included), in no given order."""
        return [group.key for group in self._groups.values()]

    def groups(self) -> list[GroupView]:
        """Every group ever seen (idle ones included), sorted by model then WorkerSet key."""
        ordered = sorted(self._groups.values(), key=_by_key)
        return [readout.group_view(g, self._drained_in(g)) for g in ordered]

    def serving(self) -> dict[GroupKey, AttemptId]:
        """Return the attempt whose hop binding serves now, for each group that has one.

        A committed incumbent serves its committed build; a drained tenure handing over serves
        its own until the successor commits. This is the one account of what is committed:
        the service reads it here and keeps no copy of its own.
        """
        out: dict[GroupKey, AttemptId] = {}
        for group in self._groups.values():
            served = group.served_attempt()
            if served is not None:
                out[group.key] = served
        return out

    def serves(self, key: GroupKey) -> bool:
        """Return whether a hop binding of the group serves now (see :meth:`serving`)."""
        group = self._groups.get((key.model, key.worker_set))
        return group is not None and group.serves()

    def drains(self) -> list[Drain]:
        """Every drain in force, by namespace then instance id."""
        return list(self._drains.workers())

    def _drained_in(self, group: Group) -> list[tuple[Registration, Drain]]:
        return self._drains.in_group(group.key)

    def registration(self, key: str) -> Registration | None:
        """Return the registration held for ``key`` (base or LoRA): its first incarnation."""
        return (
            self._regs.get(key) or self._drains.drained.get(key) or self._lora.registered.get(key)
        )

    def registrations(self) -> Iterator[Registration]:
        yield from self._regs.values()
        yield from self._drains.drained.values()
        yield from self._lora

    def placement(self, key: str) -> PlacementView | None:
        """Where ``key`` stands: cohort position, whether admitted, adapter attachment."""
        reg = self._regs.get(key)
        if reg is not None:
            return readout.base_placement(self._group_of(reg), reg)
        drained = self._drains.drained.get(key)
        if drained is not None:
            return readout.drained_placement(drained, self._drains.drain_of(drained))
        lora = self._lora.registered.get(key)
        if lora is None:
            return None
        return readout.adapter_placement(lora, self._admitted_host(base_key(lora)))


_by_instance = attrgetter("instance_id")


def _with_last_known(
    projection: tuple[fx.LoraWorker, ...], hold: Hold, live: Mapping[int, Registration]
) -> tuple[fx.LoraWorker, ...]:
    """Add the adapters a hold serves on last known records to its live members' projection."""
    carried = [w for iid, w in hold.last_known_lora.items() if iid not in live]
    if not carried:
        return projection
    return tuple(sorted((*projection, *carried), key=_by_instance))
