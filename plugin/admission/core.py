"""The admission core: decides, per group, which cohort is served, and nothing else.

Theory of operation
-------------------

The core is a deterministic function of its inputs. ``apply(input)`` changes state and returns
the effects a service must carry out (and may trace); it performs no I/O, reads no clock and
raises only when called with something that is not an input.

*Groups and cohorts.* Every base (non-LoRA) registration belongs to one group (model plus
WorkerSet key) and, inside it, to the cohort of registrations sharing its ``mdc_checksum``.
Cohorts live in a dict, whose insertion order is their first-observation order: duplicates
and snapshots never move a cohort, and a cohort that empties is deleted, so if it comes back
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
result is applied only when group, checksum and generation all match the attempt in flight;
anything else is reported as ``BuildDiscarded`` and changes nothing. A retired receiver id is
never reused either, so a holder of an old receiver can never see a successor's ids.

*Builds.* Queued groups start building in the order they were queued (FIFO, so no group
starves behind lower-sorted keys), at most ``max_concurrent_builds`` at a time. A failed
attempt schedules a retry after ``retry_delays[attempt - 1]`` (the last delay repeats) on the
injected clock; ``Tick`` makes due retries queue again. A worker joining or leaving the
incumbent cohort while a retry is pending (``retrying`` or ``blocked``) queues the rebuild at
once with the attempt count reset, as 1.6.1 does; rejected workers and adapters never do.
Dynamo 1.6.1 starts queued builds in sorted key order; the contract does not fix an order and
FIFO is what an operator expects.

*Holding a tenure across an outage.* A listing that follows a lost connection
(``Snapshot(reconnect=True)``) may miss the incumbent's workers only because their heartbeats
could not reach the store while it was away. When such a listing empties the incumbent cohort,
the tenure is not ended: the empty cohort stays in front, receiver, generation and committed
build stay, nothing is admitted (no vanished worker is served), and the hold runs for
``tenure_hold`` seconds of the injected clock. A member of the incumbent checksum that
registers meanwhile rejoins and the hold ends (``TenureHoldEnded("rejoined")``); competitors
that register meanwhile are rejected as usual. When a ``Tick`` reaches the deadline with the
cohort still empty, the hold ends (``"expired"``) and the ordinary succession follows. Live
removals and other listings never hold: only an outage can make a present worker look gone.

*Rejections.* Each non-incumbent cohort is reported once per tenure: when it first appears,
or, after a succession, against the new incumbent. A cohort that empties and returns is a
new cohort and is reported again.

*In-place changes.* A key is an immutable incarnation. A re-sent key with another group or
checksum is refused (``MutationRefused``) and the first incarnation stays; a change of taints
or of the LoRA projection fingerprint alone is taken in place.

*LoRA adapters* never create or keep a group. An adapter is projected into the group whose
incumbent cohort holds the base registration of the same (endpoint, instance id); adapters of
rejected or unknown workers are kept aside and change nothing until their base is admitted.
A projection change is announced as ``LoraProjectionChanged`` (no rebuild).

*Batches.* Admissions and LoRA projections are published once per ``apply`` or
``apply_many`` call, for the groups that changed, after any builds that became possible have
started. A batch therefore gives the same state as applying its inputs one by one, with fewer
publications.

*Where this differs from Dynamo 1.6.1* (the contract wins): 1.6.1 keeps a group's status
under a fingerprint that appends the worker's Qwen video prompt-expansion contract to the
checksum, and may retain a pipeline across a fingerprint change. The contract says the
``mdc_checksum`` is used throughout admission, construction and status, so cohorts, build
fences and status here are keyed by the checksum alone. 1.6.1's generation counter wraps at
2^64; this one never wraps, so no generation is ever handed out twice.

*Liveness* (endpoint instance records) is not an input here. Admission depends only on model
registrations; a hop intersects admitted ids with live instances at routing time
(``bindings.py``), exactly as Dynamo's admitted client does. Keeping liveness out of the core
means instance churn never touches the core's state or its generation counter.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from workerset_admission.admission import effects as fx
from workerset_admission.admission.inputs import (
    BuildFinished,
    CommitFailed,
    Input,
    Snapshot,
    Tick,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.admission.status import GroupStatus, StatusEvent, StatusMachine
from workerset_admission.admission.views import CohortView, GroupView, MemberView, PlacementView
from workerset_admission.errors import ConfigError, UsageError
from workerset_admission.identity import GroupKey, Registration, instance_key

__all__ = ["AdmissionCore", "CoreSettings"]

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


_QUEUED = GroupStatus.QUEUED
_RETRYING = GroupStatus.RETRYING
_BLOCKED = GroupStatus.BLOCKED
_BLOCKED_READY = GroupStatus.BLOCKED_READY
_READY = GroupStatus.READY


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """Tunables of the core; the defaults are Dynamo 1.6.1's."""

    max_concurrent_builds: int = 8
    retry_delays: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
    # Seconds a tenure is held when a post-outage resync lists none of its members (0: never);
    # three of Dynamo's default 10 s registration TTLs.
    tenure_hold: float = 30.0

    def __post_init__(self) -> None:
        if self.max_concurrent_builds < 1:
            raise ConfigError("max_concurrent_builds must be at least 1")
        if not self.retry_delays or any(d < 0 for d in self.retry_delays):
            raise ConfigError("retry_delays must be a non-empty list of non-negative seconds")
        if not self.tenure_hold >= 0:
            raise ConfigError("tenure_hold must be zero or more seconds")

    def retry_delay(self, attempt: int) -> float:
        """Delay after the ``attempt``-th consecutive failure (1-based); the last one repeats."""
        delays = self.retry_delays
        return delays[min(max(attempt, 1), len(delays)) - 1]


class _Cohort:
    __slots__ = ("checksum", "ids", "members")

    def __init__(self, checksum: str) -> None:
        self.checksum = checksum
        # Insertion-ordered; membership, not order, matters inside a cohort.
        self.members: dict[str, Registration] = {}
        # The members' instance ids, kept alongside so that publishing admissions is one C-level
        # set copy instead of a Python loop. A group has one endpoint and a base card per
        # instance, so ids are unique within a cohort.
        self.ids: set[int] = set()


class _Group:
    __slots__ = (
        "attempt",
        "card",
        "checksum",
        "cohorts",
        "committed_generation",
        "deadline",
        "dirty",
        "generation",
        "held_since",
        "held_until",
        "in_flight",
        "key",
        "lora",
        "lora_dirty",
        "receiver",
        "reported",
        "representative",
        "status",
    )

    def __init__(self, key: GroupKey) -> None:
        self.key = key
        self.cohorts: dict[str, _Cohort] = {}
        self.status = StatusMachine()
        # Tenure fields: all None/empty while idle.
        self.checksum: str | None = None
        self.receiver: int | None = None
        self.generation: int | None = None
        self.committed_generation: int | None = None
        self.in_flight: int | None = None
        self.attempt = 0
        self.deadline: float | None = None
        self.representative: str | None = None
        self.card: Any = None
        self.reported: set[str] = set()
        # None forces the next flush to announce the projection even if unchanged.
        self.lora: tuple[fx.LoraWorker, ...] | None = ()
        self.dirty = False
        self.lora_dirty = False
        # Set while the tenure is held after an outage (see the theory of operation).
        self.held_since: float | None = None
        self.held_until: float | None = None


def _base_key(reg: Registration) -> str:
    """Return the instance key of the base card an adapter rides on (a base card's own key)."""
    return instance_key(reg.endpoint, reg.instance_id)


def _representative(cohort: _Cohort) -> Registration:
    # Dynamo keeps members in a BTreeSet and takes the first: the smallest key.
    return cohort.members[min(cohort.members)]


class AdmissionCore:
    """Pure, synchronous admission decisions for every group one frontend observes."""

    def __init__(self, settings: CoreSettings | None = None) -> None:
        self._settings = settings or CoreSettings()
        # Keyed by (model, worker_set): hashing a plain tuple of strings is C-level, hashing
        # the GroupKey dataclass is a Python call, and this lookup is on every input.
        self._groups: dict[tuple[str, str], _Group] = {}
        self._regs: dict[str, Registration] = {}
        self._loras: dict[str, Registration] = {}
        # Adapters by the instance key of the base card they ride on.
        self._adapters_at: dict[str, dict[str, Registration]] = {}
        self._last_generation = 0
        self._last_receiver = 0
        self._now = 0.0
        self._queue: deque[tuple[_Group, int]] = deque()
        self._in_flight = 0
        self._timers: list[tuple[float, int, _Group, int]] = []
        self._timer_seq = 0
        self._holds: list[tuple[float, int, _Group]] = []
        # True while a post-outage listing removes the keys it omits.
        self._holding = False
        self._dirty: list[_Group] = []
        self._lora_dirty: list[_Group] = []
        self._out: list[fx.Effect] = []
        # WorkerAdded and WorkerRemoved are dispatched inline by apply/apply_many.
        self._handlers: dict[type, Callable[[Any], None]] = {
            Snapshot: self._on_snapshot,
            BuildFinished: self._on_build_finished,
            CommitFailed: self._on_commit_failed,
            Tick: self._on_tick,
        }

    # ------------------------------------------------------------------ entry points

    def apply(self, event: Input) -> list[fx.Effect]:
        """Apply one input and return the effects, in the order to carry them out."""
        out: list[fx.Effect] = []
        self._out = out
        kind = type(event)
        # The two discovery inputs are nearly all the traffic: skip the table for them.
        if kind is WorkerAdded:
            self._add(event.registration)  # type: ignore[union-attr]
        elif kind is WorkerRemoved:
            if event.hold:  # type: ignore[union-attr]
                self._remove_holding(event.key)  # type: ignore[union-attr]
            else:
                self._remove(event.key)  # type: ignore[union-attr]
        else:
            handler = self._handlers.get(kind)
            if handler is None:
                raise UsageError(f"not an admission input: {kind.__name__}")
            handler(event)
        # Most calls leave nothing queued and at most the one group they touched dirty:
        # publish that group here and skip the general flush.
        dirty = self._dirty
        if self._queue or self._lora_dirty or len(dirty) > 1:
            self._flush()
        elif dirty:
            group = dirty.pop()
            if group.dirty:
                group.dirty = False
                out.append(self._admissions(group))
        return out

    def apply_many(self, events: Iterable[Input]) -> list[fx.Effect]:
        """Apply inputs in order, publishing admissions once per changed group at the end."""
        out: list[fx.Effect] = []
        self._out = out
        handlers = self._handlers
        add, remove = self._add, self._remove
        for event in events:
            kind = type(event)
            if kind is WorkerAdded:
                add(event.registration)  # type: ignore[union-attr]
            elif kind is WorkerRemoved:
                if event.hold:  # type: ignore[union-attr]
                    self._remove_holding(event.key)  # type: ignore[union-attr]
                else:
                    remove(event.key)  # type: ignore[union-attr]
            else:
                handler = handlers.get(kind)
                if handler is None:
                    raise UsageError(f"not an admission input: {kind.__name__}")
                handler(event)
        self._flush()
        return out

    # ------------------------------------------------------------------ read-only views

    @property
    def settings(self) -> CoreSettings:
        return self._settings

    @property
    def now(self) -> float:
        """The latest clock value a ``Tick`` brought."""
        return self._now

    @property
    def builds_in_flight(self) -> int:
        return self._in_flight

    def group(self, key: GroupKey) -> GroupView | None:
        group = self._groups.get((key.model, key.worker_set))
        return None if group is None else self._view(group)

    def groups(self) -> list[GroupView]:
        """Every group ever seen (idle ones included), sorted by model then WorkerSet key."""
        return [self._view(g) for g in sorted(self._groups.values(), key=lambda g: g.key)]

    def registration(self, key: str) -> Registration | None:
        """Return the registration held for ``key`` (base or LoRA): its first incarnation."""
        return self._regs.get(key) or self._loras.get(key)

    def registrations(self) -> Iterator[Registration]:
        yield from self._regs.values()
        yield from self._loras.values()

    def placement(self, key: str) -> PlacementView | None:
        """Where ``key`` stands: cohort position, whether admitted, adapter attachment."""
        reg = self._regs.get(key)
        if reg is not None:
            group = self._group_of(reg)
            position = list(group.cohorts).index(reg.mdc_checksum)
            return PlacementView(
                key=key,
                group=reg.group,
                mdc_checksum=reg.mdc_checksum,
                is_lora=False,
                position=position,
                admitted=position == 0,
                attached_to=None,
            )
        lora = self._loras.get(key)
        if lora is None:
            return None
        host = self._admitted_host(_base_key(lora))
        return PlacementView(
            key=key,
            group=lora.group,
            mdc_checksum=lora.mdc_checksum,
            is_lora=True,
            position=None,
            admitted=host is not None,
            attached_to=None if host is None else host.key,
        )

    def _view(self, group: _Group) -> GroupView:
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
        admitted = tuple(sorted(self._admitted(group))) if group.checksum is not None else ()
        return GroupView(
            key=group.key,
            incumbent=group.checksum,
            status=group.status.state,
            generation=group.generation,
            committed_generation=group.committed_generation,
            receiver=group.receiver,
            admitted=admitted,
            cohorts=cohorts,
            attempt=group.attempt,
            deadline=group.deadline,
            lora=group.lora or (),
            held_until=group.held_until,
        )

    # ------------------------------------------------------------------ discovery inputs

    def _on_snapshot(self, event: Snapshot) -> None:
        listed: set[str] = set(event.retain)
        for reg in event.registrations:
            listed.add(reg.key)
            self._add(reg)
        self._holding = event.reconnect and self._settings.tenure_hold > 0
        try:
            for key in [k for k in self._regs if k not in listed]:
                self._remove(key)
        finally:
            self._holding = False
        for key in [k for k in self._loras if k not in listed]:
            self._remove(key)

    def _add(self, reg: Registration) -> None:
        if reg.model_suffix is not None:
            self._add_lora(reg)
            return
        key = reg.key
        old = self._regs.get(key)
        if old is not None:
            self._update_in_place(old, reg)
            return
        gk = reg.group
        group = self._groups.get((gk.model, gk.worker_set))
        if group is None:
            group = self._groups[(gk.model, gk.worker_set)] = _Group(gk)
        checksum = reg.mdc_checksum
        cohort = group.cohorts.get(checksum)
        if cohort is None:
            cohort = group.cohorts[checksum] = _Cohort(checksum)
        cohort.members[key] = reg
        cohort.ids.add(reg.instance_id)
        self._regs[key] = reg
        incumbent = group.checksum
        admitted = incumbent is None or incumbent == checksum
        self._out.append(_placed(key, group.key, checksum, admitted))
        if incumbent is None:
            self._start_tenure(group)
        elif admitted:
            if group.held_until is not None:
                self._end_hold(group, "rejoined")
            if not group.dirty:
                group.dirty = True
                self._dirty.append(group)
            if key in self._adapters_at:
                self._mark_lora(group)
            state = group.status.state
            if state is _RETRYING or state is _BLOCKED:
                self._rebuild_now(group)
        elif checksum not in group.reported:
            self._report(group, cohort)

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
            self._group_of(reg).cohorts[reg.mdc_checksum].members[reg.key] = reg
        else:
            self._loras[reg.key] = reg
            self._adapters_at[_base_key(reg)][reg.key] = reg
        if taints_changed:
            self._out.append(fx.TaintsUpdated(reg.key, reg.taints))
        if fingerprint_changed:
            base_key = _base_key(reg)
            host = self._admitted_host(base_key)
            if host is not None and base_key in self._adapters_at:
                self._mark_lora(host)

    def _remove(self, key: str) -> None:
        reg = self._regs.pop(key, None)
        if reg is None:
            self._remove_lora(key)
            return
        group = self._group_of(reg)
        checksum = reg.mdc_checksum
        cohort = group.cohorts[checksum]
        del cohort.members[key]
        cohort.ids.discard(reg.instance_id)
        was_admitted = group.checksum == checksum
        self._out.append(_departed(key, group.key, checksum, was_admitted))
        if not cohort.members:
            if was_admitted and self._holding:
                self._hold(group)
                # Emptied is a membership change like any other: a pending retry runs now.
                state = group.status.state
                if state is _RETRYING or state is _BLOCKED:
                    self._rebuild_now(group)
                return
            del group.cohorts[checksum]
            group.reported.discard(checksum)
            if was_admitted:
                self._succeed(group)
        elif was_admitted:
            if not group.dirty:
                group.dirty = True
                self._dirty.append(group)
            if key in self._adapters_at:
                self._mark_lora(group)
            state = group.status.state
            if state is _RETRYING or state is _BLOCKED:
                self._rebuild_now(group)

    # ------------------------------------------------------------------ LoRA adapters

    def _add_lora(self, reg: Registration) -> None:
        old = self._loras.get(reg.key)
        if old is not None:
            self._update_in_place(old, reg)
            return
        base_key = _base_key(reg)
        self._loras[reg.key] = reg
        self._adapters_at.setdefault(base_key, {})[reg.key] = reg
        host = self._admitted_host(base_key)
        if host is not None:
            self._mark_lora(host)

    def _remove_lora(self, key: str) -> None:
        reg = self._loras.pop(key, None)
        if reg is None:
            return  # an unknown key: removing it again is harmless
        base_key = _base_key(reg)
        adapters = self._adapters_at[base_key]
        del adapters[key]
        if not adapters:
            del self._adapters_at[base_key]
        host = self._admitted_host(base_key)
        if host is not None:
            self._mark_lora(host)

    def _admitted_host(self, base_key: str) -> _Group | None:
        """Find the group whose incumbent cohort holds this base card, if any."""
        base = self._regs.get(base_key)
        if base is None:
            return None
        group = self._group_of(base)
        return group if group.checksum == base.mdc_checksum else None

    def _group_of(self, reg: Registration) -> _Group:
        gk = reg.group
        return self._groups[(gk.model, gk.worker_set)]

    def _projection(self, group: _Group) -> tuple[fx.LoraWorker, ...]:
        assert group.checksum is not None
        workers = []
        adapters_at = self._adapters_at
        for reg in group.cohorts[group.checksum].members.values():
            adapters = adapters_at.get(reg.key)
            if adapters:
                workers.append(
                    fx.LoraWorker(
                        endpoint=reg.endpoint,
                        instance_id=reg.instance_id,
                        base_fingerprint=reg.lora_fingerprint,
                        adapters=tuple(
                            fx.LoraAdapter(a.key, a.model_suffix or "", a.lora_fingerprint, a.card)
                            for a in sorted(adapters.values(), key=lambda a: a.key)
                        ),
                    )
                )
        workers.sort(key=lambda w: w.instance_id)
        return tuple(workers)

    # ------------------------------------------------------------------ tenure

    def _start_tenure(self, group: _Group) -> None:
        cohort = next(iter(group.cohorts.values()))
        representative = _representative(cohort)
        self._last_receiver += 1
        group.checksum = cohort.checksum
        group.receiver = self._last_receiver
        group.generation = self._next_generation()
        group.representative = representative.key
        group.card = representative.card
        group.lora = ()
        self._out.append(
            fx.OpenReceiver(group.key, group.receiver, cohort.checksum, group.generation)
        )
        self._transition(group, StatusEvent.RESERVE)
        self._queue.append((group, group.generation))
        self._mark_dirty(group)
        self._mark_lora(group)

    def _end_tenure(self, group: _Group) -> None:
        checksum = group.checksum
        receiver = group.receiver
        assert checksum is not None
        assert receiver is not None
        if group.in_flight is not None:
            self._out.append(fx.CancelBuild(group.key, checksum, group.in_flight))
            self._in_flight -= 1
            group.in_flight = None
        if group.status.state.committed:
            assert group.committed_generation is not None
            self._out.append(fx.WithdrawGroup(group.key, checksum, group.committed_generation))
        self._out.append(fx.RetireReceiver(group.key, receiver, checksum))
        self._transition(group, StatusEvent.DRAIN)
        group.checksum = None
        group.receiver = None
        group.committed_generation = None
        group.attempt = 0
        group.deadline = None
        group.representative = None
        group.card = None
        group.reported.clear()
        group.lora = ()
        group.dirty = False
        group.lora_dirty = False
        group.held_since = None
        group.held_until = None

    def _remove_holding(self, key: str) -> None:
        self._holding = self._settings.tenure_hold > 0
        try:
            self._remove(key)
        finally:
            self._holding = False

    def _hold(self, group: _Group) -> None:
        """Keep an emptied incumbent reserved, admitting nobody, until it returns or time is up."""
        assert group.checksum is not None
        assert group.receiver is not None
        if group.held_until is None:
            group.held_since = self._now
            group.held_until = self._now + self._settings.tenure_hold
            self._timer_seq += 1
            heapq.heappush(self._holds, (group.held_until, self._timer_seq, group))
            self._out.append(
                fx.TenureHeld(
                    group.key, group.checksum, group.receiver, group.generation, group.held_until
                )
            )
        self._mark_dirty(group)
        self._mark_lora(group)

    def _end_hold(self, group: _Group, outcome: Literal["rejoined", "expired"]) -> None:
        assert group.checksum is not None
        assert group.held_since is not None
        self._out.append(
            fx.TenureHoldEnded(group.key, group.checksum, outcome, self._now - group.held_since)
        )
        group.held_since = None
        group.held_until = None

    def _expire_holds(self) -> None:
        holds = self._holds
        while holds and holds[0][0] <= self._now:
            deadline, _seq, group = heapq.heappop(holds)
            if group.held_until != deadline:
                continue  # a member rejoined before the deadline
            checksum = group.checksum
            assert checksum is not None
            self._end_hold(group, "expired")
            del group.cohorts[checksum]
            group.reported.discard(checksum)
            self._succeed(group)

    def _succeed(self, group: _Group) -> None:
        old_checksum = group.checksum
        old_generation = group.generation
        old_receiver = group.receiver
        assert old_checksum is not None
        assert old_receiver is not None
        self._end_tenure(group)
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
                group.checksum,
                old_generation,
                group.generation,
                old_receiver,
                group.receiver,
            )
        )
        # Every disagreement still standing is reported again against the new incumbent.
        for cohort in list(group.cohorts.values())[1:]:
            self._report(group, cohort)

    def _report(self, group: _Group, cohort: _Cohort) -> None:
        assert group.checksum is not None
        group.reported.add(cohort.checksum)
        self._out.append(
            fx.RejectionReported(
                group=group.key,
                model=group.key.model,
                worker_set=group.key.worker_set,
                incumbent_checksum=group.checksum,
                rejected_checksum=cohort.checksum,
                instance=min(cohort.members),
            )
        )

    # ------------------------------------------------------------------ builds and clock

    def _on_build_finished(self, event: BuildFinished) -> None:
        group = self._groups.get((event.group.model, event.group.worker_set))
        if group is None or group.in_flight is None:
            self._discard(event.group, event.mdc_checksum, event.generation, "no build in flight")
            return
        if group.in_flight != event.generation or group.checksum != event.mdc_checksum:
            self._discard(
                event.group, event.mdc_checksum, event.generation, "stale checksum or generation"
            )
            return
        group.in_flight = None
        self._in_flight -= 1
        checksum = group.checksum
        receiver = group.receiver
        assert checksum is not None
        assert receiver is not None
        if event.ok:
            self._transition(group, StatusEvent.BUILD_OK)
            group.committed_generation = event.generation
            group.attempt = 0
            members = group.cohorts[checksum].members
            assert group.representative is not None
            self._out.append(
                fx.CommitGroup(
                    group=group.key,
                    mdc_checksum=checksum,
                    generation=event.generation,
                    receiver=receiver,
                    members=tuple(sorted(members)),
                    admitted=frozenset(group.cohorts[checksum].ids),
                    representative=group.representative,
                    card=group.card,
                )
            )
        else:
            self._transition(group, StatusEvent.BUILD_FAILED)
            self._schedule_retry(group, event.generation, event.error or "build failed")

    def _on_commit_failed(self, event: CommitFailed) -> None:
        group = self._groups.get((event.group.model, event.group.worker_set))
        if (
            group is None
            or group.committed_generation != event.generation
            or group.checksum != event.mdc_checksum
            or not group.status.state.committed
        ):
            self._discard(event.group, event.mdc_checksum, event.generation, "no such commit")
            return
        if event.phase == "commit":
            if group.status.state is not _READY:
                self._discard(
                    event.group, event.mdc_checksum, event.generation, "commit already judged"
                )
                return
            self._transition(group, StatusEvent.COMMIT_FAILED)
            group.committed_generation = None
        else:
            self._transition(group, StatusEvent.REPLACE_FAILED)
        group.attempt += 1
        self._schedule_retry(group, event.generation, event.error or f"{event.phase} failed")

    def _schedule_retry(self, group: _Group, generation: int, error: str) -> None:
        assert group.checksum is not None
        delay = self._settings.retry_delay(group.attempt)
        deadline = self._now + delay
        group.deadline = deadline
        self._timer_seq += 1
        heapq.heappush(self._timers, (deadline, self._timer_seq, group, generation))
        self._out.append(
            fx.RetryScheduled(
                group.key, group.checksum, generation, group.attempt, delay, deadline, error
            )
        )

    def _on_tick(self, event: Tick) -> None:
        # The clock never runs backwards: an older tick only means a late delivery.
        if event.now > self._now:
            self._now = event.now
        if self._holds:
            self._expire_holds()
        timers = self._timers
        while timers and timers[0][0] <= self._now:
            deadline, _seq, group, generation = heapq.heappop(timers)
            if group.deadline != deadline or generation != group.generation:
                continue  # the timer outlived its tenure or attempt
            group.deadline = None
            state = group.status.state
            if state is _RETRYING or state is _BLOCKED:
                group.generation = self._next_generation()
                self._transition(group, StatusEvent.RETRY_DUE)
                self._queue.append((group, group.generation))
                self._mark_dirty(group)
            elif state is _BLOCKED_READY:
                self._transition(group, StatusEvent.REPLACE_DUE)
                self._mark_dirty(group)
                group.lora = None
                self._mark_lora(group)

    def _rebuild_now(self, group: _Group) -> None:
        """Queue a rebuild at once: the incumbent's membership changed during a backoff."""
        # The failure being waited out was about other members, so the backoff restarts from
        # its first step (1.6.1 resets its attempt count too); the pending timer goes stale.
        group.deadline = None
        group.attempt = 0
        group.generation = self._next_generation()
        self._transition(group, StatusEvent.MEMBERS_CHANGED)
        self._queue.append((group, group.generation))
        self._mark_dirty(group)

    def _discard(self, key: GroupKey, checksum: str, generation: int, reason: str) -> None:
        self._out.append(fx.BuildDiscarded(key, checksum, generation, reason))

    def _next_generation(self) -> int:
        self._last_generation += 1
        return self._last_generation

    def _transition(self, group: _Group, event: StatusEvent) -> None:
        old = group.status.state
        new = group.status.process(event)
        self._out.append(fx.StatusChanged(group.key, old, new, group.generation))

    def _mark_dirty(self, group: _Group) -> None:
        if not group.dirty:
            group.dirty = True
            self._dirty.append(group)

    def _mark_lora(self, group: _Group) -> None:
        if not group.lora_dirty:
            group.lora_dirty = True
            self._lora_dirty.append(group)

    def _admitted(self, group: _Group) -> frozenset[int]:
        assert group.checksum is not None
        return frozenset(group.cohorts[group.checksum].ids)

    # ------------------------------------------------------------------ end of a call

    @staticmethod
    def _admissions(group: _Group) -> fx.PublishAdmissions:
        checksum = group.checksum
        assert checksum is not None
        # One C-level copy per changed group per call: the admitted set handed out must never
        # change under its holder.
        return _publish(
            group.key,
            group.receiver,  # type: ignore[arg-type]
            checksum,
            group.generation,  # type: ignore[arg-type]
            frozenset(group.cohorts[checksum].ids),
            group.card,
        )

    def _flush(self) -> None:
        queue = self._queue
        if not (queue or self._dirty or self._lora_dirty):
            return
        out = self._out
        limit = self._settings.max_concurrent_builds
        while queue and self._in_flight < limit:
            group, generation = queue.popleft()
            if group.status.state is _QUEUED and group.generation == generation:
                self._start_build(group)
        if self._dirty:
            for group in self._dirty:
                if not group.dirty:
                    continue
                group.dirty = False
                out.append(self._admissions(group))
            self._dirty.clear()
        if self._lora_dirty:
            for group in self._lora_dirty:
                if not group.lora_dirty:
                    continue
                group.lora_dirty = False
                projection = self._projection(group)
                if projection != group.lora:
                    group.lora = projection
                    assert group.receiver is not None
                    assert group.generation is not None
                    out.append(
                        fx.LoraProjectionChanged(
                            group.key, group.receiver, group.generation, projection
                        )
                    )
            self._lora_dirty.clear()

    def _start_build(self, group: _Group) -> None:
        checksum = group.checksum
        generation = group.generation
        receiver = group.receiver
        assert checksum is not None
        assert generation is not None
        assert receiver is not None
        self._transition(group, StatusEvent.START_BUILD)
        cohort = group.cohorts[checksum]
        # A held tenure has no member: it builds from the card its tenure already holds.
        if cohort.members:
            representative = _representative(cohort)
            if representative.key != group.representative:
                # The card travels with the admissions: a new representative is news.
                group.representative = representative.key
                group.card = representative.card
                self._mark_dirty(group)
        assert group.representative is not None
        group.attempt += 1
        group.in_flight = generation
        self._in_flight += 1
        self._out.append(
            fx.StartBuild(
                group=group.key,
                mdc_checksum=checksum,
                generation=generation,
                attempt=group.attempt,
                receiver=receiver,
                admitted=frozenset(cohort.ids),
                representative=group.representative,
                card=group.card,
            )
        )
