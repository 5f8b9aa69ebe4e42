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
(``Snapshot(reconnect=True)``), and an expiry reported soon after it (``WorkerRemoved`` with
the listing's time as ``outage``), may miss the incumbent's workers only because their
heartbeats could not reach the store while it was away. When such a removal empties the
incumbent cohort, the tenure is held, never changed: the empty cohort stays in front with its
receiver, generation and committed build until the reconnect plus ``tenure_hold``. The hold
delays the decision and nothing else. Only a member the cohort had when the hold began (the
same instance key) ends it (``TenureHoldEnded("rejoined")``), and the tenure goes on; a new
instance of the incumbent's checksum is tracked aside, not admitted, and joins the cohort with
a returning member. When a ``Tick`` reaches the deadline with no pre-hold member back, the hold
ends (``"expired"``) and the core does what it would have done with no hold: the cohort is
gone, the new instances make a cohort in the place the first of them would have taken (cohorts
carry their creation number, ``seq``), and the oldest remaining cohort succeeds. Meanwhile the
hold serves: the members the outage's removals took stay admitted on their last known records
for one ``registration_ttl`` (``PublishAdmissions.last_known`` names them, so a hop routes to
them without their instance records), then those not back are withdrawn while the reservation
lasts. A hold builds nothing: a queued build or a due retry waits, and the rejoin rebuilds at
once. Live removals and other listings never hold: only an outage can make a present worker
look gone.

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

*Publication without copies.* A ``PublishAdmissions`` carries an ``AdmittedIds`` snapshot
(``admitted.py``), not a copy of the cohort's ids: the incumbent cohort keeps a frozen base set
and an append-only change log (``iid`` for a join, ``~iid`` for a departure), and a snapshot is
the base, the log and the log's length at that moment, worked out into a frozenset only when
someone reads it, once. When the log grows longer than the base (and than 32 entries), the
publication rebases the cohort: a new base from its members and a new, empty log, while older
snapshots keep the old list, which is never appended to again. A change therefore costs O(1)
amortised instead of a copy of the whole group, and a burst of changes between two reads of a
receiver costs one materialisation. Changes to a cohort are logged only while it is the
incumbent; a new tenure rebases its cohort first. Within a group an instance id names exactly
one registration key (a group has one endpoint), so a cohort's members are keyed by instance
id and its ids need no set of their own.

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

*Where the steps live.* This module holds the entry points and the path nearly every input
takes (``_add``, ``_remove`` and the publication at the end of a call). ``AdmissionCore``
inherits the rest from its parts, so a call between them is an ordinary method call:
``state.py`` (settings, per-group records, the shared small steps), ``tenure.py`` (tenures,
succession, rejection reports, the post-outage hold, snapshots), ``builds.py`` (build results,
commit failures, retry timers, starting builds), ``lora.py`` (adapters and in-place changes),
``readout.py`` (read-only views), ``builders.py`` (the blank classes from which the effects
of nearly every input are built inline, see there why) and ``admitted.py`` (admitted-id
snapshots and the cohort's change log).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from workerset_admission.admission import effects as fx
from workerset_admission.admission.builders import (
    NO_IDS,
    _BlankPublishAdmissions,
    _BlankWorkerDeparted,
    _BlankWorkerPlaced,
    publish,
)
from workerset_admission.admission.builds import _BuildsMixin
from workerset_admission.admission.effects import PublishAdmissions, WorkerDeparted, WorkerPlaced
from workerset_admission.admission.inputs import (
    BuildFinished,
    CommitFailed,
    Input,
    Snapshot,
    Tick,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.admission.lora import _LoraMixin
from workerset_admission.admission.readout import _ReadoutMixin
from workerset_admission.admission.state import (
    _BLOCKED,
    _QUEUED,
    _RETRYING,
    CoreSettings,
    _Group,
)
from workerset_admission.admission.tenure import _TenureMixin
from workerset_admission.errors import UsageError
from workerset_admission.identity import Registration

__all__ = ["AdmissionCore", "CoreSettings"]


def _admissions(group: _Group) -> fx.PublishAdmissions:
    """Publish the incumbent's admitted ids: a snapshot of its log, not a copy of its set."""
    cohort = group.cohorts[group.checksum]  # type: ignore[index]
    return publish(
        group.key,
        group.receiver,  # type: ignore[arg-type]
        group.checksum,  # type: ignore[arg-type]
        group.generation,  # type: ignore[arg-type]
        cohort.snapshot(group.served_ids(cohort)),
        group.card,
        NO_IDS if group.hold is None else frozenset(group.hold.last_known),
    )


class AdmissionCore(_ReadoutMixin, _LoraMixin, _TenureMixin, _BuildsMixin):
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
        self.builds_in_flight = 0
        self._timers: list[tuple[float, int, _Group, int]] = []
        self._timer_seq = 0
        self._holds: list[tuple[float, int, _Group]] = []
        # When the last-known-good windows of holds end: (time, seq, group).
        self._last_known_ends: list[tuple[float, int, _Group]] = []
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
            self._remove(event.key, event.outage)  # type: ignore[union-attr]
        else:
            handler = self._handlers.get(kind)
            if handler is None:
                raise UsageError(f"not an admission input: {kind.__name__}")
            handler(event)
        # Most calls leave nothing queued and at most the one group they touched dirty:
        # publish that group here and skip the general flush.
        dirty = self._dirty
        if self._queue or self._lora_dirty:
            self._flush()
        elif dirty:
            group = dirty.pop()
            if dirty:
                # More than one group changed: put it back, in its place, for the flush.
                dirty.append(group)
                self._flush()
            elif group.dirty:
                group.dirty = False
                # _admissions and builders.publish, inlined: two Python calls less per input.
                cohort = group.cohorts[group.checksum]  # type: ignore[index]
                effect = _BlankPublishAdmissions()
                effect.group = group.key
                effect.receiver = group.receiver  # type: ignore[assignment]
                effect.mdc_checksum = group.checksum  # type: ignore[assignment]
                effect.generation = group.generation  # type: ignore[assignment]
                hold = group.hold
                if hold is None:
                    effect.ids = cohort.snapshot(cohort.members)
                    effect.last_known = NO_IDS
                else:
                    effect.ids = cohort.snapshot(group.served_ids(cohort))
                    effect.last_known = frozenset(hold.last_known)
                effect.card = group.card
                effect.__class__ = PublishAdmissions  # type: ignore[assignment]
                out.append(effect)  # type: ignore[arg-type]
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
                remove(event.key, event.outage)  # type: ignore[union-attr]
            else:
                handler = handlers.get(kind)
                if handler is None:
                    raise UsageError(f"not an admission input: {kind.__name__}")
                handler(event)
        self._flush()
        return out

    # ------------------------------------------------------------------ discovery inputs

    def _add(self, reg: Registration) -> None:
        if reg.model_suffix is not None:
            self._add_lora(reg)
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
            group = self._groups[(gk.model, gk.worker_set)] = _Group(gk)
        checksum = reg.mdc_checksum
        if group.hold is not None and checksum == group.checksum:
            self._add_during_hold(group, group.hold, reg)
            return
        cohort = group.cohorts.get(checksum)
        if cohort is None:
            cohort = group.new_cohort(checksum)
        iid = reg.instance_id
        cohort.members[iid] = reg
        regs[key] = reg
        incumbent = group.checksum
        admitted = incumbent is None or incumbent == checksum
        # builders.placed, inlined: a Python call less per input.
        effect = _BlankWorkerPlaced()
        effect.key = key
        effect.group = group.key
        effect.mdc_checksum = checksum
        effect.admitted = admitted
        effect.__class__ = WorkerPlaced  # type: ignore[assignment]
        self._out.append(effect)  # type: ignore[arg-type]
        if incumbent is None:
            self._start_tenure(group)
        elif admitted:
            cohort.log.append(iid)
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

    def _remove(self, key: str, outage: float | None = None) -> None:
        """Remove a registration; ``outage``: the reconnect an outage's removal follows."""
        reg = self._regs.pop(key, None)
        if reg is None:
            self._remove_lora(key)
            return
        gk = reg.group
        group = self._groups[(gk.model, gk.worker_set)]
        checksum = reg.mdc_checksum
        iid = reg.instance_id
        was_admitted = group.checksum == checksum
        if group.hold is not None and was_admitted and group.hold.held:
            # While held the incumbent cohort is empty: this is an instance that arrived.
            self._remove_arrival(group, group.hold, reg)
            return
        cohort = group.cohorts[checksum]
        del cohort.members[iid]
        if was_admitted:
            cohort.log.append(~iid)
            if outage is not None:
                self._note_outage_removal(group, reg, outage)
        # builders.departed, inlined: a Python call less per input.
        gone = _BlankWorkerDeparted()
        gone.key = key
        gone.group = group.key
        gone.mdc_checksum = checksum
        gone.was_admitted = was_admitted
        gone.__class__ = WorkerDeparted  # type: ignore[assignment]
        self._out.append(gone)  # type: ignore[arg-type]
        if not cohort.members:
            if (
                was_admitted
                and outage is not None
                and outage + self._settings.tenure_hold > self._now
            ):
                # A pending retry waits: a hold builds nothing until a member is back.
                self._hold(group, outage)
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

    # ------------------------------------------------------------------ end of a call

    def _flush(self) -> None:
        queue = self._queue
        if not (queue or self._dirty or self._lora_dirty):
            return
        out = self._out
        limit = self._settings.max_concurrent_builds
        while queue and self.builds_in_flight < limit:
            group, generation = queue.popleft()
            if group.status.state is _QUEUED and group.generation == generation:
                hold = group.hold
                if hold is not None and hold.held:
                    continue  # nothing to build for until a member is back; a rejoin queues it
                self._start_build(group)
        if self._dirty:
            for group in self._dirty:
                if not group.dirty:
                    continue
                group.dirty = False
                out.append(_admissions(group))
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
