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

*Holding a tenure across an outage.* A listing that follows a lost connection
(``Listing(reconnect=True)``), and an expiry reported soon after it, may miss the incumbent's
workers only because their heartbeats could not reach the store while it was away. Ingestion
reports an expiry with its time (``WorkerRemoved.expired_at``) and nothing more; the core
alone judges it the outage's when it comes within ``tenure_hold`` of the last reconnect
listing, and then counts from that listing. When such a removal empties the
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

*Starting during an outage.* A frontend that starts (or restarts) while the store is away
has lived through the outage as much as its peers have, only without state. Ingestion reports
its first listing as such (``Listing(outage_start=True)``), and the core treats it as a
reconnect listing: expiries within ``tenure_hold`` of it are the outage's, so an incumbent the
listing still holds is held when they empty it, as its peers hold theirs. One that starts
just after the store came back saw no outage itself, but a peer that resynced after losing its
connection says when (``Listing.peer_outage_at``): a first listing within ``tenure_hold`` of
that resync is one of that outage, and its holds count from the peer's resync, so they end
with the peer's (``_outage_of``). A cohort the listing already lacks (its records ran out
while the store was away) cannot be observed at all; so after any outage, a group this
frontend holds nothing of, whose live peers serve a checksum the listing lacks
(``Listing.peer_tenures``), is reserved for that checksum at once, held until the outage's
reconnect plus ``tenure_hold``, and only the members the peers serve end the hold. These rules
only delay a succession the outage may have faked, as the hold always does; with them a
frontend restarted during an outage ends on the incumbent its peers keep.

*Recorded tenures.* A replay of a recording that began mid-rollout starts from what the
recorded frontend decided: ``TenureRecorded``, before anything else of its group. A tenure
that was not held lends its receiver and generation to the tenure the listing starts for that
checksum; a held one is put in place at once, exactly as ``_hold`` leaves a live group (the
empty cohort in front, its members served on last known good, the deadline scheduled), so
everything after it runs through the same code as live.

*Drains.* A drain (``DrainSet``) is an operator's word that a worker is about to stop: for
admission its registrations have left (an operator-declared departure). They are set aside,
not forgotten (``WorkerDrained``): the cohort loses them as it would lose departed workers,
a rejected cohort simply shrinks, and a registration of a drained worker that arrives later
is set aside at once, never admitted. The worker's real removal forgets them. Lifting the
drain (``DrainLifted``) places them again exactly as a returning member is placed: into the
cohort of their checksum if it still has members, else as a new cohort at the end of the order.
A drain never holds a tenure; only an outage does, and a drained member of a held tenure is
no longer served on its last known record.

*Handover.* A drained worker still serves; a departed one does not. So when a drain takes the
last member of a committed incumbent and another cohort waits, the successor's tenure starts
as for any succession (fresh receiver, fresh generation, its build queued), but the old
tenure's committed build and receiver stay in place, still serving the drained members, until
the successor is committed: its ``CommitGroup`` names the generation it takes over from
(``handover_from``), and the old tenure's ``WithdrawGroup``, ``RetireReceiver`` and
``HandoverEnded`` follow in the same step. The frontend therefore knows the successor before
the drained workers go, as it does on the workers' own store, and never routes to nothing in
between. The handover also ends when the drained workers really leave, when one of them is
given back (it rejoins behind the successor), or when the successor's own tenure ends. With
no cohort waiting, or with an incumbent not yet committed, a drain ends the tenure at once,
as a departure does.

*Rejections.* Each non-incumbent cohort is reported once per tenure: when it first appears,
or, after a succession, against the new incumbent. A cohort that empties and returns is a
new cohort and is reported again.

*In-place changes.* A key is an immutable incarnation. A re-sent key with another group or
checksum is refused (``MutationRefused``) and the first incarnation stays; a change of taints
or of the LoRA projection fingerprint alone is taken in place. ``TaintsUpdated`` names the
group whose tenure serves the worker at that moment (``serving``), so the hops carry it there
without asking the core again.

*LoRA adapters* never create or keep a group. An adapter is projected into the group whose
incumbent cohort holds the base registration of the same (endpoint, instance id); adapters of
rejected or unknown workers are kept aside and change nothing until their base is admitted.
A projection change is announced as ``LoraProjectionChanged`` (no rebuild). One adapter name
must mean one set of weights across a group, so every projection is judged as it is computed
(``projection.py``): one that serves a name with two fingerprints is never announced
(``LoraProjectionRefused``); on a committed group that is a failed replacement, so the group
goes ``blocked_ready``, serves its last safe commit and projection, and the projection is
judged again at the retry's deadline, all in the step that made it.

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

*Reading this module.* Everything that changes a group's state is here, in the order the
contract reads: the settings; the records (``_Cohort``, ``_Hold``, ``_Handover``, ``_Tenure``,
``_Group``: a group's tenure is one record, which a succession replaces whole); then
``AdmissionCore``: its entry points, the discovery inputs, tenures and succession, the hold,
builds and their fencing, LoRA adapters and in-place changes, and the publication at the end of
each call. Effects are made by their own constructors, one readable way. Beside it, read-only:
``readout.py`` (the views of groups and placements), ``admitted.py`` (admitted ids and
the cohort's change log), ``status.py`` (the status table), ``effects.py`` and ``inputs.py``.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Literal

from workerset_admission.admission import effects as fx
from workerset_admission.admission import readout
from workerset_admission.admission.admitted import AdmittedLog
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
from workerset_admission.admission.lora import AdapterLog
from workerset_admission.admission.projection import ProjectionConflicts
from workerset_admission.admission.snapshots import GroupView, PlacementView
from workerset_admission.admission.status import GroupStatus, StatusEvent, StatusMachine
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


# ---------------------------------------------------------------------------------- records


class _Cohort(AdmittedLog):
    """The registrations sharing one checksum in a group; as the incumbent, its admitted ids.

    While the cohort is the incumbent, every change of membership is appended to its log (see
    ``AdmittedLog``); changes before that are not, so a tenure start rebases it.
    """

    __slots__ = ("checksum", "members", "seq")

    def __init__(self, checksum: str, seq: int) -> None:
        super().__init__()
        self.checksum = checksum
        # The group's count of cohorts made when this one was: its place in the order.
        self.seq = seq
        # Keyed by instance id: a group has one endpoint and a base card per instance, so within
        # a group an instance id names exactly one registration key. Insertion-ordered;
        # membership, not order, matters inside a cohort. The keys are the cohort's ids, so a
        # rebase is one C-level copy of them.
        self.members: dict[int, Registration] = {}


class _Hold:
    """A tenure held after an outage, and the members it serves on last known good.

    ``held`` is true from the emptying removal until a pre-hold member comes back or ``until``
    is reached; the last-known-good window (``last_known``, until ``last_known_until``) may
    outlast a rejoin, so the object stays on the group until both are over.
    """

    __slots__ = (
        "arrival_seq",
        "arrivals",
        "held",
        "last_known",
        "last_known_until",
        "members",
        "since",
        "until",
    )

    def __init__(
        self, since: float, until: float, members: dict[int, str], last_known_until: float
    ) -> None:
        self.held = True
        # The clock value of the reconnect the hold counts from, and its deadline.
        self.since = since
        self.until = until
        # The members the incumbent had when the hold began (instance id to key): only one of
        # these ends it.
        self.members = members
        # Those of them not back yet, still admitted on their last known records.
        self.last_known = dict(members)
        self.last_known_until = last_known_until
        # New instances of the incumbent's checksum registered during the hold: tracked, not
        # admitted; they join the incumbent on a rejoin, or the end of the order on expiry.
        self.arrivals: dict[int, Registration] = {}
        self.arrival_seq: int | None = None


class _Handover:
    """A drained tenure still serving its drained members until its successor is committed."""

    __slots__ = ("card", "checksum", "generation", "members", "receiver")

    def __init__(
        self, checksum: str, receiver: int, generation: int, members: dict[int, str]
    ) -> None:
        self.checksum = checksum
        self.receiver = receiver
        # The committed build it keeps serving, and the drained members it serves (id to key).
        self.generation = generation
        self.members = members
        self.card: Any = None


class _Tenure:
    """One tenure's state: what a succession ends, all at once, by putting a fresh one in place.

    A group with no incumbent has an idle tenure (``checksum`` None, everything empty).
    """

    __slots__ = (
        "attempt",
        "card",
        "checksum",
        "committed_generation",
        "deadline",
        "hold",
        "in_flight",
        "lora",
        "outage_gone",
        "parked",
        "receiver",
        "reported",
        "representative",
    )

    def __init__(self) -> None:
        # The incumbent's checksum and receiver; the generation of its committed build and of
        # the build in flight; consecutive failed attempts and the retry's deadline.
        self.checksum: str | None = None
        self.receiver: int | None = None
        self.committed_generation: int | None = None
        self.in_flight: int | None = None
        self.attempt = 0
        self.deadline: float | None = None
        # The member whose card the tenure serves (the smallest key), and that card.
        self.representative: str | None = None
        self.card: Any = None
        # The checksums reported as rejected against this incumbent.
        self.reported: set[str] = set()
        # The last projection announced; None forces the next flush to announce it again.
        self.lora: tuple[fx.LoraWorker, ...] | None = ()
        # Set while the tenure is held after an outage, or its members are still served on
        # last known good (see the theory of operation).
        self.hold: _Hold | None = None
        # The clock value of the last reconnect whose removals took incumbent members away,
        # and those members: a hold that reconnect causes serves them on last known good.
        self.outage_gone: tuple[float, dict[int, str]] | None = None
        # Incumbent members drained since the last publication (id to key): the receiver
        # still lists them, so a handover that begins now keeps serving exactly these.
        self.parked: dict[int, str] = {}


class _Group:
    """One group's state; only ``AdmissionCore`` changes it, and only in this module."""

    __slots__ = (
        "cohorts",
        "dirty",
        "generation",
        "handover",
        "key",
        "lora_dirty",
        "seq",
        "status",
        "tenure",
    )

    def __init__(self, key: GroupKey) -> None:
        self.key = key
        self.cohorts: dict[str, _Cohort] = {}
        self.status = StatusMachine()
        self.tenure = _Tenure()
        # The latest build generation: it outlives its tenure (status shows it).
        self.generation: int | None = None
        # Admissions or the projection to publish at the end of the call.
        self.dirty = False
        self.lora_dirty = False
        # How many cohorts the group has made: each new one is numbered with it.
        self.seq = 0
        # Set while a drained tenure hands over to its successor (see the theory of operation);
        # it outlives the tenure that handed over.
        self.handover: _Handover | None = None

    def attempt_in_flight(self) -> AttemptId | None:
        """Return the build attempt in flight (whose result alone is applied), or None."""
        if self.tenure.checksum is None or self.tenure.in_flight is None:
            return None
        return AttemptId(self.key, self.tenure.checksum, self.tenure.in_flight)

    def committed_attempt(self) -> AttemptId | None:
        """Return the committed build's attempt (a commit failure must name it), or None."""
        if self.tenure.checksum is None or self.tenure.committed_generation is None:
            return None
        return AttemptId(self.key, self.tenure.checksum, self.tenure.committed_generation)

    def served_attempt(self) -> AttemptId | None:
        """Return the attempt whose hop binding serves now, or None.

        That is the committed incumbent's, or a drained tenure's that hands over to a
        successor not committed yet.
        """
        if self.status.state.committed:
            return self.committed_attempt()
        handover = self.handover
        if handover is not None:
            return AttemptId(self.key, handover.checksum, handover.generation)
        return None

    def serves(self) -> bool:
        """Return whether :meth:`served_attempt` names an attempt, without making one."""
        return self.status.state.committed or self.handover is not None

    def served_ids(self, cohort: _Cohort) -> Iterable[int]:
        """Return the incumbent's admitted ids: its members, and any on last known good."""
        hold = self.tenure.hold
        if hold is None or not hold.last_known:
            return cohort.members
        return cohort.members.keys() | hold.last_known.keys()


def _base_key(reg: Registration) -> str:
    """Return the instance key of the base card an adapter rides on (a base card's own key)."""
    return instance_key(reg.endpoint, reg.instance_id)


def _adapter(reg: Registration) -> fx.LoraAdapter:
    return fx.LoraAdapter(reg.key, reg.model_suffix or "", reg.lora_fingerprint, reg.card)


def _same_projection(new: tuple[fx.LoraWorker, ...], old: tuple[fx.LoraWorker, ...] | None) -> bool:
    # Entries are remade only on a change, so identity says "unchanged" without reading any
    # worker's adapters (an adapter added and removed again counts as a change: one more
    # publication, never a missed one).
    return (
        old is not None
        and len(new) == len(old)
        and all(a is b for a, b in zip(new, old, strict=True))
    )


def _representative(cohort: _Cohort) -> Registration:
    # Dynamo keeps members in a BTreeSet and takes the first: the smallest key.
    return min(cohort.members.values(), key=_by_key)


# ---------------------------------------------------------------------------------- the core


class AdmissionCore:
    """Pure, synchronous admission decisions for every group one frontend observes."""

    def __init__(self, settings: CoreSettings | None = None) -> None:
        self._settings = settings or CoreSettings()
        # Keyed by (model, worker_set): hashing a plain tuple of strings is C-level, hashing
        # the GroupKey dataclass is a Python call, and this lookup is on every input.
        self._groups: dict[tuple[str, str], _Group] = {}
        self._regs: dict[str, Registration] = {}
        self._loras: dict[str, Registration] = {}
        # Adapters by the instance key of the base card they ride on, as registrations and
        # as the projection's change log, and each worker's latest projection entry.
        self._adapters_at: dict[str, dict[str, Registration]] = {}
        self._adapter_logs: dict[str, AdapterLog] = {}
        self._lora_workers: dict[str, fx.LoraWorker] = {}
        self._last_generation = 0
        self._last_receiver = 0
        self._now = 0.0
        self._queue: deque[tuple[_Group, int]] = deque()
        # How many builds are started and not yet answered (read it; only the core changes it).
        self.builds_in_flight = 0
        self._timers: list[tuple[float, int, _Group, int]] = []
        self._timer_seq = 0
        self._holds: list[tuple[float, int, _Group]] = []
        # When the last-known-good windows of holds end: (time, seq, group).
        self._last_known_ends: list[tuple[float, int, _Group]] = []
        self._dirty: list[_Group] = []
        self._lora_dirty: list[_Group] = []
        self._out: list[fx.Effect] = []
        # The effects of the batch ``apply_many`` is applying (None outside one).
        self._batch: list[fx.Effect] | None = None
        # Recorded tenures not held, taken up when their group's tenure starts.
        self._recorded: dict[tuple[str, str], TenureRecorded] = {}
        # Drains in force, by worker (namespace, instance id), and the base registrations they
        # set aside, by key: tracked, in no cohort.
        self._drains: dict[tuple[str, int], Drain] = {}
        self._drained: dict[str, Registration] = {}
        # The clock value of the last listing that followed a lost connection (none yet).
        self._last_reconnect: float | None = None
        # Every projection's verdict under the one-name-one-fingerprint rule, kept per change.
        self._conflicts = ProjectionConflicts()

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
        if self._drains and (reg.endpoint.namespace, reg.instance_id) in self._drains:
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
            group = self._groups[(gk.model, gk.worker_set)] = _Group(gk)
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
            cohort = group.cohorts[checksum] = _Cohort(checksum, group.seq)
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
            if key in self._adapters_at:
                self._mark_lora(group)
            state = group.status.state
            if state is _RETRYING or state is _BLOCKED:
                # A membership change ends a retry backoff.
                self._rebuild_now(group)
        elif checksum not in tenure.reported:
            self._report(group, cohort)

    def _expire(self, key: str, at: float) -> None:
        """Remove a registration whose TTL ran out at ``at``; judge whether an outage did it.

        An expiry is a clock reading: the clock moves to it as a ``Tick`` would. One that comes
        within the tenure hold of the last listing that followed a lost connection is most
        likely the outage's doing (the worker could not refresh its record while the store was
        away), so it counts from that reconnect, as the listing's own removals do.
        """
        if at > self._now:
            self._advance(at)
        reconnect = self._last_reconnect
        if reconnect is not None and at - reconnect < self._settings.tenure_hold:
            self._remove(key, reconnect)
        else:
            self._remove(key)

    def _remove(self, key: str, outage: float | None = None) -> None:
        """Remove a registration; ``outage``: the reconnect an outage's removal follows."""
        reg = self._regs.pop(key, None)
        if reg is None:
            if key in self._drained:
                self._remove_drained(key)
            else:
                self._remove_lora(key)
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
            self._drop_arrival(hold, reg)
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
                if key in self._adapters_at:
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
        outage = self._outage_of(event)
        if outage is not None:
            self._last_reconnect = outage
            if event.peer_tenures:
                self._hold_for_peers(event, outage)
        listed: set[str] = set(event.retain)
        for reg in event.registrations:
            listed.add(reg.key)
            self._add(reg)
        for key in [k for k in self._regs if k not in listed]:
            self._remove(key, outage)
        for key in [k for k in self._drained if k not in listed]:
            self._remove(key)
        for key in [k for k in self._loras if k not in listed]:
            self._remove(key)
        kept = set(event.retain_drains)
        for worker in [w for w in self._drains if w not in drains and w not in kept]:
            self._on_drain_lifted(worker)

    # ------------------------------------------------------------------ drains

    def _on_drain(self, drain: Drain) -> None:
        worker = drain.worker
        old = self._drains.get(worker)
        if old == drain:
            return  # a re-listing or a duplicate changes nothing
        self._drains[worker] = drain
        self._out.append(fx.DrainChanged(drain.namespace, drain.instance_id, drain))
        if old is not None:
            return  # who or when changed; the worker was set aside already
        namespace, iid = worker
        for reg in [r for r in self._regs.values() if r.instance_id == iid]:
            if reg.endpoint.namespace == namespace:
                self._set_aside(reg, drain)
        # Members a held tenure serves on last known records are not registered now.
        for group in self._groups.values():
            hold = group.tenure.hold
            if group.key.endpoint.namespace == namespace and hold is not None:
                hold.members.pop(iid, None)
                if hold.last_known.pop(iid, None) is not None:
                    assert group.tenure.checksum is not None
                    group.cohorts[group.tenure.checksum].log.append(~iid)
                    if not hold.last_known and not hold.held:
                        group.tenure.hold = None
                    self._mark_dirty(group)

    def _on_drain_lifted(self, worker: tuple[str, int]) -> None:
        if self._drains.pop(worker, None) is None:
            return
        namespace, iid = worker
        self._out.append(fx.DrainChanged(namespace, iid, None))
        returning = [
            r
            for r in self._drained.values()
            if r.instance_id == iid and r.endpoint.namespace == namespace
        ]
        for reg in sorted(returning, key=_by_key):
            del self._drained[reg.key]
            group = self._group_of(reg)
            handover = group.handover
            if handover is not None and iid in handover.members:
                # It rejoins behind the successor: the old tenure stops serving it now.
                self._end_handover(group, "undrained")
            self._add(reg)

    def _set_aside(self, reg: Registration, drain: Drain) -> None:
        """Take a drained worker's registration out of its cohort, as if it had left."""
        key = reg.key
        del self._regs[key]
        self._drained[key] = reg
        gk = reg.group
        group = self._groups[(gk.model, gk.worker_set)]
        checksum = reg.mdc_checksum
        iid = reg.instance_id
        hold = group.tenure.hold
        was_admitted = group.tenure.checksum == checksum
        if hold is not None and was_admitted and hold.held:
            # While held the incumbent cohort is empty: this is an instance that arrived.
            self._drop_arrival(hold, reg)
            self._out.append(fx.WorkerDrained(key, gk, checksum, False, drain))
            return
        cohort = group.cohorts[checksum]
        del cohort.members[iid]
        self._out.append(fx.WorkerDrained(key, gk, checksum, was_admitted, drain))
        if was_admitted:
            cohort.log.append(~iid)
            group.tenure.parked[iid] = key
            self._mark_dirty(group)
            if key in self._adapters_at:
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
        old = self._drained.get(key)
        if old is not None:
            if old.group != reg.group or old.mdc_checksum != reg.mdc_checksum:
                self._update_in_place(old, reg)  # refused: the first incarnation stays
            return
        gk = reg.group
        if (gk.model, gk.worker_set) not in self._groups:
            self._groups[(gk.model, gk.worker_set)] = _Group(gk)
        self._drained[key] = reg
        drain = self._drains[(reg.endpoint.namespace, reg.instance_id)]
        self._out.append(fx.WorkerDrained(key, gk, reg.mdc_checksum, False, drain))

    def _remove_drained(self, key: str) -> None:
        """Forget a drained worker's registration: it is really gone."""
        reg = self._drained.pop(key)
        group = self._group_of(reg)
        if group.tenure.parked.get(reg.instance_id) == key:
            del group.tenure.parked[reg.instance_id]  # gone before a handover could serve it
        self._out.append(fx.WorkerDeparted(key, reg.group, reg.mdc_checksum, False))
        handover = group.handover
        if handover is not None and handover.members.get(reg.instance_id) == key:
            del handover.members[reg.instance_id]
            if not handover.members:
                self._end_handover(group, "departed")
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

    def _start_tenure(self, group: _Group) -> None:
        cohort = next(iter(group.cohorts.values()))
        # Changes were not logged while the cohort was not the incumbent.
        cohort.rebase(cohort.members)
        representative = _representative(cohort)
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
        group = self._groups[key] = _Group(gk)
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

    def _outage_of(self, event: Listing) -> float | None:
        """Return the reconnect a listing follows (the clock value holds count from), if any.

        A reconnect listing follows this frontend's own. A first listing follows a peer's
        resync after an outage when that came within ``tenure_hold`` (the workers' records
        could not be refreshed either), and counts from it, so its holds end with the peers';
        else its own start during an outage, now.
        """
        now = self._now
        if event.reconnect:
            return now
        peer = event.peer_outage_at
        if peer is not None and min(peer, now) > now - self._settings.tenure_hold:
            return min(peer, now)
        return now if event.outage_start else None

    def _hold_for_peers(self, event: Listing, outage: float) -> None:
        """Reserve, held, what the peers serve of groups this frontend holds nothing of.

        The first listing after an outage may lack a cohort only because its workers could not
        refresh their records while the store was away: a frontend that lived through the
        outage holds that tenure (``_hold``), and one that starts now must not hand the group
        to a cohort that merely refreshed first. So when the peers serve a checksum the listing
        lacks, the group is reserved for it at once, held exactly as a live frontend's hold
        (the empty cohort in front, until the outage's reconnect plus ``tenure_hold``); only
        the members the peers serve end the hold. Nothing is served meanwhile: this frontend
        never saw their records.
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
                group = self._groups[key] = _Group(GroupKey(*key))
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
        group: _Group,
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
        group.cohorts[checksum] = cohort = _Cohort(checksum, group.seq)
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
        hold = group.tenure.hold = _Hold(start, until, pre_hold, last_known_until)
        hold.last_known = served
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

    def _end_tenure(self, group: _Group, *, hand_over: bool = False) -> None:
        """End the tenure; with ``hand_over`` its committed build and receiver stay serving."""
        tenure = group.tenure
        checksum = tenure.checksum
        receiver = tenure.receiver
        assert checksum is not None
        assert receiver is not None
        if group.handover is not None:
            self._end_handover(group, "superseded")
        if tenure.in_flight is not None:
            self._out.append(fx.CancelBuild(group.key, checksum, tenure.in_flight))
            self.builds_in_flight -= 1
        if hand_over:
            assert tenure.committed_generation is not None
            assert group.generation is not None
            members = dict(tenure.parked)
            handover = group.handover = _Handover(
                checksum, receiver, tenure.committed_generation, members
            )
            handover.card = tenure.card
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
        group.tenure = _Tenure()
        group.dirty = group.lora_dirty = False

    def _end_handover(
        self,
        group: _Group,
        reason: Literal["committed", "departed", "undrained", "superseded"],
    ) -> None:
        """Withdraw a drained tenure that handed over, and retire its receiver."""
        handover = group.handover
        assert handover is not None
        group.handover = None
        key = group.key
        self._out.append(fx.WithdrawGroup(key, handover.checksum, handover.generation))
        self._out.append(fx.RetireReceiver(key, handover.receiver, handover.checksum))
        self._out.append(
            fx.HandoverEnded(key, handover.checksum, handover.generation, handover.receiver, reason)
        )

    def _succeed(self, group: _Group, *, drained: bool = False) -> None:
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

    def _report(self, group: _Group, cohort: _Cohort) -> None:
        assert group.tenure.checksum is not None
        group.tenure.reported.add(cohort.checksum)
        representative = _representative(cohort)
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

    def _note_outage_removal(self, group: _Group, reg: Registration, outage: float) -> None:
        """Remember an incumbent member an outage's removal took: a hold may serve it."""
        if not self._settings.tenure_hold > 0:
            return
        gone = group.tenure.outage_gone
        if gone is None or gone[0] != outage:
            gone = group.tenure.outage_gone = (outage, {})
        gone[1][reg.instance_id] = reg.key

    def _hold(self, group: _Group, outage: float) -> None:
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
        old = group.tenure.hold
        if old is not None:
            # A second emptying within an earlier hold's window: those not back stay served.
            members = {**old.last_known, **members}
        until = outage + settings.tenure_hold
        last_known_until = min(outage + settings.registration_ttl, until)
        hold = group.tenure.hold = _Hold(outage, until, members, last_known_until)
        self._timer_seq += 1
        heapq.heappush(self._holds, (until, self._timer_seq, group))
        if last_known_until > self._now and members:
            log = group.cohorts[checksum].log
            for iid in members:
                log.append(iid)  # served again (or still) on its last known record
            heapq.heappush(self._last_known_ends, (last_known_until, self._timer_seq, group))
        else:
            hold.last_known = {}
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

    def _add_during_hold(self, group: _Group, hold: _Hold, reg: Registration) -> None:
        """Place an instance of the checksum a hold (or its last-known-good window) is about."""
        key = reg.key
        iid = reg.instance_id
        self._regs[key] = reg
        prior = hold.members.get(iid)
        returning = prior == key
        if hold.held and not returning:
            # A new instance does not end the hold: tracked, not admitted (see _expire_holds).
            if not hold.arrivals:
                group.seq += 1
                hold.arrival_seq = group.seq
            hold.arrivals[iid] = reg
            self._out.append(fx.WorkerPlaced(key, group.key, reg.mdc_checksum, False))
            return
        checksum = reg.mdc_checksum
        cohort = group.cohorts[checksum]
        cohort.members[iid] = reg
        cohort.log.append(iid)
        hold.last_known.pop(iid, None)
        self._out.append(fx.WorkerPlaced(key, group.key, checksum, True))
        rejoined = hold.held
        if rejoined:
            # A pre-hold member is back: the emptying was the outage's; the new instances
            # join the incumbent with it.
            for arrival in hold.arrivals.values():
                cohort.members[arrival.instance_id] = arrival
                cohort.log.append(arrival.instance_id)
            hold.arrivals = {}
            hold.arrival_seq = None
            self._end_hold(group, hold, "rejoined")
        if not hold.last_known:
            group.tenure.hold = None
        self._mark_dirty(group)
        if key in self._adapters_at or rejoined:
            self._mark_lora(group)
        state = group.status.state
        if state is _RETRYING or state is _BLOCKED:
            self._rebuild_now(group)
        elif state is _QUEUED and rejoined:
            # Its queue entry may have been passed over while held: queue it again, under a
            # fresh generation so that no build starts after a newer one.
            group.generation = generation = self._next_generation()
            self._queue.append((group, generation))

    @staticmethod
    def _drop_arrival(hold: _Hold, reg: Registration) -> None:
        """Take an instance that arrived during a hold off the hold's list (it left, or drained)."""
        del hold.arrivals[reg.instance_id]
        if not hold.arrivals:
            hold.arrival_seq = None  # it would have emptied and left: a return is new again

    def _end_hold(
        self, group: _Group, hold: _Hold, outcome: Literal["rejoined", "expired"]
    ) -> None:
        assert group.tenure.checksum is not None
        hold.held = False
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
            self._end_hold(group, hold, "expired")
            del group.cohorts[checksum]
            group.tenure.reported.discard(checksum)
            if hold.arrivals:
                # The new instances make the cohort they would have made with no hold, in the
                # place their first registration would have put it.
                assert hold.arrival_seq is not None
                cohort = _Cohort(checksum, hold.arrival_seq)
                cohort.members = hold.arrivals
                ordered = sorted([*group.cohorts.values(), cohort], key=_by_seq)
                group.cohorts = {c.checksum: c for c in ordered}
            self._succeed(group)

    def _stop_serving_last_known(self, group: _Group, hold: _Hold) -> None:
        """One registration TTL is over: members not back by now were not alive."""
        assert group.tenure.checksum is not None
        log = group.cohorts[group.tenure.checksum].log
        for iid in hold.last_known:
            log.append(~iid)
        hold.last_known = {}
        if not hold.held:
            group.tenure.hold = None
        self._mark_dirty(group)

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
                self._end_handover(group, "committed")
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

    def _schedule_retry(self, group: _Group, generation: int, error: str) -> None:
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

    def _rebuild_now(self, group: _Group) -> None:
        """Queue a rebuild at once: the incumbent's membership changed during a backoff."""
        # The failure being waited out was about other members, so the backoff restarts from
        # its first step (1.6.1 resets its attempt count too); the pending timer goes stale.
        group.tenure.deadline = None
        group.tenure.attempt = 0
        group.generation = self._next_generation()
        self._transition(group, StatusEvent.MEMBERS_CHANGED)
        self._queue.append((group, group.generation))
        self._mark_dirty(group)

    def _start_build(self, group: _Group) -> None:
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
            representative = _representative(cohort)
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
            self._loras[reg.key] = reg
            self._adapters_at[_base_key(reg)][reg.key] = reg
            self._adapter_logs[_base_key(reg)].put(_adapter(reg))
        if taints_changed:
            self._out.append(fx.TaintsUpdated(reg.key, reg.taints, self._serving(reg)))
        if fingerprint_changed:
            base_key = _base_key(reg)
            host = self._admitted_host(base_key)
            if host is not None and base_key in self._adapters_at:
                self._mark_lora(host)

    def _add_lora(self, reg: Registration) -> None:
        old = self._loras.get(reg.key)
        if old is not None:
            self._update_in_place(old, reg)
            return
        base_key = _base_key(reg)
        self._loras[reg.key] = reg
        self._adapters_at.setdefault(base_key, {})[reg.key] = reg
        log = self._adapter_logs.get(base_key)
        if log is None:
            log = self._adapter_logs[base_key] = AdapterLog()
        log.put(_adapter(reg))
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
        self._adapter_logs[base_key].remove(key)
        if not adapters:
            del self._adapters_at[base_key]
            del self._adapter_logs[base_key]
            self._lora_workers.pop(base_key, None)
        host = self._admitted_host(base_key)
        if host is not None:
            self._mark_lora(host)

    def _projection(self, group: _Group) -> tuple[fx.LoraWorker, ...]:
        """Return the adapters of each admitted worker: one entry per worker that has any.

        A worker's entry is made again only when its adapters or its base card changed, and
        its adapters are read from its change log (``lora.py``): an adapter that comes
        or goes costs O(1) amortised here, however many the worker carries, plus one step per
        admitted worker that has adapters.
        """
        assert group.tenure.checksum is not None
        workers = []
        logs = self._adapter_logs
        made = self._lora_workers
        for reg in group.cohorts[group.tenure.checksum].members.values():
            log = logs.get(reg.key)
            if log:
                adapters = log.adapters()
                worker = made.get(reg.key)
                if (
                    worker is None
                    or worker.adapters is not adapters
                    or worker.base_fingerprint != reg.lora_fingerprint
                    or worker.instance_id != reg.instance_id
                ):
                    worker = made[reg.key] = fx.LoraWorker(
                        endpoint=reg.endpoint,
                        instance_id=reg.instance_id,
                        base_fingerprint=reg.lora_fingerprint,
                        adapters=adapters,
                    )
                workers.append(worker)
        workers.sort(key=lambda w: w.instance_id)
        return tuple(workers)

    def _serving(self, reg: Registration) -> GroupKey | None:
        """Name the group whose tenure serves ``reg`` (a base card or an adapter), if any."""
        if reg.model_suffix is not None:
            host = self._admitted_host(_base_key(reg))
            return None if host is None else host.key
        group = self._group_of(reg)
        if group.tenure.checksum != reg.mdc_checksum:
            return None
        hold = group.tenure.hold
        if hold is not None and hold.arrivals.get(reg.instance_id) is reg:
            return None  # a new instance of a held incumbent's checksum: in no cohort yet
        return group.key

    def _admitted_host(self, base_key: str) -> _Group | None:
        """Find the group whose incumbent cohort holds this base card, if any."""
        base = self._regs.get(base_key)
        if base is None:
            return None
        group = self._group_of(base)
        return group if group.tenure.checksum == base.mdc_checksum else None

    # ------------------------------------------------------------------ end of a call

    def _publication(self, group: _Group) -> fx.PublishAdmissions:
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
                projection = self._projection(group)
                if not _same_projection(projection, group.tenure.lora):
                    group.tenure.lora = projection
                    assert group.tenure.receiver is not None
                    assert group.generation is not None
                    conflict = self._conflicts.check(group.key, group.tenure.receiver, projection)
                    if conflict is None:
                        out.append(
                            fx.LoraProjectionChanged(
                                group.key, group.tenure.receiver, group.generation, projection
                            )
                        )
                    else:
                        self._refuse_projection(group, conflict)
            self._lora_dirty.clear()

    def _refuse_projection(self, group: _Group, reason: str) -> None:
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

    def _group_of(self, reg: Registration) -> _Group:
        gk = reg.group
        return self._groups[(gk.model, gk.worker_set)]

    def _discard(self, attempt: AttemptId, reason: str) -> None:
        self._out.append(
            fx.BuildDiscarded(attempt.group, attempt.mdc_checksum, attempt.generation, reason)
        )

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
        return [self._drains[w] for w in sorted(self._drains)]

    def _drained_in(self, group: _Group) -> list[tuple[Registration, Drain]]:
        if not self._drained:
            return []
        key = group.key
        return [
            (reg, self._drains[(reg.endpoint.namespace, reg.instance_id)])
            for reg in self._drained.values()
            if reg.group == key
        ]

    def registration(self, key: str) -> Registration | None:
        """Return the registration held for ``key`` (base or LoRA): its first incarnation."""
        return self._regs.get(key) or self._drained.get(key) or self._loras.get(key)

    def registrations(self) -> Iterator[Registration]:
        yield from self._regs.values()
        yield from self._drained.values()
        yield from self._loras.values()

    def placement(self, key: str) -> PlacementView | None:
        """Where ``key`` stands: cohort position, whether admitted, adapter attachment."""
        reg = self._regs.get(key)
        if reg is not None:
            return readout.base_placement(self._group_of(reg), reg)
        drained = self._drained.get(key)
        if drained is not None:
            drain = self._drains[(drained.endpoint.namespace, drained.instance_id)]
            return readout.drained_placement(drained, drain)
        lora = self._loras.get(key)
        if lora is None:
            return None
        return readout.adapter_placement(lora, self._admitted_host(_base_key(lora)))
