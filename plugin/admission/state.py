"""The admission core's state: settings, per-group records and the base its parts share."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from workerset_admission.admission import effects as fx
from workerset_admission.admission.admitted import AdmittedLog
from workerset_admission.admission.status import GroupStatus, StatusEvent, StatusMachine
from workerset_admission.errors import ConfigError
from workerset_admission.identity import GroupKey, Registration, instance_key

if TYPE_CHECKING:
    from workerset_admission.admission.inputs import Snapshot

__all__ = ["CoreSettings"]

_QUEUED = GroupStatus.QUEUED
_RETRYING = GroupStatus.RETRYING
_BLOCKED = GroupStatus.BLOCKED
_BLOCKED_READY = GroupStatus.BLOCKED_READY
_READY = GroupStatus.READY
_by_key = attrgetter("key")


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
        self, since: float, until: float, members: dict[int, Registration], last_known_until: float
    ) -> None:
        self.held = True
        # The clock value of the reconnect the hold counts from, and its deadline.
        self.since = since
        self.until = until
        # The members the incumbent had when the hold began: only one of these ends it.
        self.members = members
        # Those of them not back yet, still admitted on their last known records.
        self.last_known = dict(members)
        self.last_known_until = last_known_until
        # New instances of the incumbent's checksum registered during the hold: tracked, not
        # admitted; they join the incumbent on a rejoin, or the end of the order on expiry.
        self.arrivals: dict[int, Registration] = {}
        self.arrival_seq: int | None = None


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
        "hold",
        "in_flight",
        "key",
        "lora",
        "lora_dirty",
        "outage_gone",
        "receiver",
        "reported",
        "representative",
        "seq",
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
        # How many cohorts the group has made: each new one is numbered with it.
        self.seq = 0
        # Set while the tenure is held after an outage, or its members are still served on
        # last known good (see the theory of operation).
        self.hold: _Hold | None = None
        # The clock value of the last reconnect whose removals took incumbent members away,
        # and those members: a hold that reconnect causes serves them on last known good.
        self.outage_gone: tuple[float, dict[int, Registration]] | None = None

    def new_cohort(self, checksum: str) -> _Cohort:
        """Make a cohort and put it at the end of the order."""
        self.seq += 1
        cohort = self.cohorts[checksum] = _Cohort(checksum, self.seq)
        return cohort

    def served_ids(self, cohort: _Cohort) -> Iterable[int]:
        """Return the incumbent's admitted ids: its members, and any served on last known good."""
        hold = self.hold
        if hold is None or not hold.last_known:
            return cohort.members
        return cohort.members.keys() | hold.last_known.keys()


def _base_key(reg: Registration) -> str:
    """Return the instance key of the base card an adapter rides on (a base card's own key)."""
    return instance_key(reg.endpoint, reg.instance_id)


def _representative(cohort: _Cohort) -> Registration:
    # Dynamo keeps members in a BTreeSet and takes the first: the smallest key.
    return min(cohort.members.values(), key=_by_key)


class _CoreState:
    """The fields and small shared steps of ``AdmissionCore``, which the core's parts extend."""

    # Set by AdmissionCore.__init__; see there for what each holds.
    _settings: CoreSettings
    _groups: dict[tuple[str, str], _Group]
    _regs: dict[str, Registration]
    _loras: dict[str, Registration]
    _adapters_at: dict[str, dict[str, Registration]]
    _last_generation: int
    _last_receiver: int
    _now: float
    _queue: deque[tuple[_Group, int]]
    # How many builds are started and not yet answered (read it; only the core changes it).
    builds_in_flight: int
    _timers: list[tuple[float, int, _Group, int]]
    _timer_seq: int
    _holds: list[tuple[float, int, _Group]]
    _last_known_ends: list[tuple[float, int, _Group]]
    _dirty: list[_Group]
    _lora_dirty: list[_Group]
    _out: list[fx.Effect]
    _handlers: dict[type, Callable[[Any], None]]

    if TYPE_CHECKING:
        # Steps defined by one part and called from another.
        def _add(self, reg: Registration) -> None: ...
        def _remove(self, key: str, outage: float | None = None) -> None: ...
        def _on_snapshot(self, event: Snapshot) -> None: ...
        def _update_in_place(self, old: Registration, reg: Registration) -> None: ...
        def _start_tenure(self, group: _Group) -> None: ...
        def _hold(self, group: _Group, outage: float) -> None: ...
        def _expire_holds(self) -> None: ...
        def _succeed(self, group: _Group) -> None: ...
        def _report(self, group: _Group, cohort: _Cohort) -> None: ...
        def _rebuild_now(self, group: _Group) -> None: ...
        def _start_build(self, group: _Group) -> None: ...

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
