"""Effects returned by the admission core: decisions for the service to carry out and trace.

Every effect is a value, never changed once made: a frozen dataclass, or, for the three made on
nearly every input, a slotted class with an explicit ``__init__`` (``_Value``). Effects that touch
an admission channel name the receiver id; effects that concern a build name the attempt by its
``group``, ``mdc_checksum`` and ``generation`` (``attempt_id`` gives the three as one
:class:`~workerset_admission.identity.AttemptId`), the fence the core applies to results. ``card``
fields hold the opaque normalized card the boundary produced; they do not take part in equality.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from workerset_admission.admission.admitted import AdmittedIds
from workerset_admission.admission.status import GroupStatus
from workerset_admission.identity import CarriesAttempt, Drain, EndpointId, GroupKey

__all__ = [
    "BuildDiscarded",
    "CancelBuild",
    "CommitGroup",
    "DrainChanged",
    "Effect",
    "HandoverEnded",
    "LoraAdapter",
    "LoraProjectionChanged",
    "LoraProjectionRefused",
    "LoraWorker",
    "MutationRefused",
    "OpenReceiver",
    "PublishAdmissions",
    "RejectionReported",
    "RetireReceiver",
    "RetryScheduled",
    "StartBuild",
    "StatusChanged",
    "Succession",
    "TaintsUpdated",
    "TenureHeld",
    "TenureHoldEnded",
    "WithdrawGroup",
    "WorkerDeparted",
    "WorkerDrained",
    "WorkerPlaced",
    "groups_named",
]


class _Value:
    """Base of the three effects made on nearly every input: slotted, with an explicit ``__init__``.

    A frozen dataclass writes each field through ``object.__setattr__`` when it is made, and
    for the effects every discovery input emits that was a third of the core's time. These
    three are therefore slotted classes whose ``__init__`` stores their fields plainly. They are
    values all the same: they compare and hash by their ``_compared`` fields (and their type),
    and nothing writes them after ``__init__`` (the core never does, and neither may a reader).
    """

    __slots__ = ()
    _compared: ClassVar[tuple[str, ...]]

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._compared)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _Value)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._compared)
        return f"{type(self).__name__}({fields})"


class WorkerPlaced(_Value):
    """A new registration joined a cohort; ``admitted``: that cohort is the incumbent."""

    __slots__ = ("admitted", "group", "key", "mdc_checksum")
    _compared = ("key", "group", "mdc_checksum", "admitted")

    def __init__(self, key: str, group: GroupKey, mdc_checksum: str, admitted: bool) -> None:
        self.key = key
        self.group = group
        self.mdc_checksum = mdc_checksum
        self.admitted = admitted


class WorkerDeparted(_Value):
    """A registration left its cohort; ``was_admitted`` says whether it was being served."""

    __slots__ = ("group", "key", "mdc_checksum", "was_admitted")
    _compared = ("key", "group", "mdc_checksum", "was_admitted")

    def __init__(self, key: str, group: GroupKey, mdc_checksum: str, was_admitted: bool) -> None:
        self.key = key
        self.group = group
        self.mdc_checksum = mdc_checksum
        self.was_admitted = was_admitted


@dataclass(frozen=True, slots=True)
class OpenReceiver(CarriesAttempt):
    """A tenure began: create a fresh admission channel with this id for the group."""

    group: GroupKey
    receiver: int
    mdc_checksum: str
    generation: int


class PublishAdmissions(_Value, CarriesAttempt):
    """Set the admitted instance ids (and the selected card) seen through one receiver.

    ``ids`` is a lazy ``AdmittedIds`` (a plain set of ids given here is wrapped in one): publishing
    does not copy the cohort, and ``admitted`` works the frozenset out when first read.
    ``last_known`` names the admitted ids a held tenure serves on their last known records:
    routable whether or not their instance records are listed now. The card does not take
    part in equality.
    """

    __slots__ = ("card", "generation", "group", "ids", "last_known", "mdc_checksum", "receiver")
    _compared = ("group", "receiver", "mdc_checksum", "generation", "ids", "last_known")

    def __init__(
        self,
        group: GroupKey,
        receiver: int,
        mdc_checksum: str,
        generation: int,
        ids: Iterable[int],
        card: Any = None,
        last_known: frozenset[int] = frozenset(),
    ) -> None:
        self.group = group
        self.receiver = receiver
        self.mdc_checksum = mdc_checksum
        self.generation = generation
        # The core hands in its ``AdmittedIds`` as they are; anything else is wrapped in one.
        self.ids = ids if type(ids) is AdmittedIds else AdmittedIds.of(ids)
        self.card = card
        self.last_known = last_known

    @property
    def admitted(self) -> frozenset[int]:
        """The admitted ids as a frozenset (materialised once per ``AdmittedIds``)."""
        return self.ids.as_frozenset()


@dataclass(frozen=True, slots=True)
class RetireReceiver:
    """The tenure ended: clear the channel's admissions and close it for good."""

    group: GroupKey
    receiver: int
    mdc_checksum: str


@dataclass(frozen=True, slots=True)
class StartBuild(CarriesAttempt):
    """Construct the pipeline for the incumbent; answer with ``BuildFinished`` for this attempt.

    ``attempt`` counts from 1 within a tenure; ``representative`` is the instance key whose
    card was selected.
    """

    group: GroupKey
    mdc_checksum: str
    generation: int
    attempt: int
    receiver: int
    admitted: frozenset[int]
    representative: str
    card: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class CancelBuild(CarriesAttempt):
    """Abandon the build in flight for this attempt; any late result will be discarded."""

    group: GroupKey
    mdc_checksum: str
    generation: int


@dataclass(frozen=True, slots=True)
class CommitGroup(CarriesAttempt):
    """Serve the successful build: the binding is identified by ``(group, generation)``.

    ``handover_from`` is the committed generation of a drained tenure this commit takes over
    from (see ``Succession.drained``): its withdrawal follows in the same step, and a
    publisher puts this tenure in place before it takes the drained one away.
    """

    group: GroupKey
    mdc_checksum: str
    generation: int
    receiver: int
    members: tuple[str, ...]
    admitted: frozenset[int]
    representative: str
    card: Any = field(default=None, compare=False, repr=False)
    handover_from: int | None = None


@dataclass(frozen=True, slots=True)
class WithdrawGroup(CarriesAttempt):
    """Stop serving the committed build ``(group, generation)``."""

    group: GroupKey
    mdc_checksum: str
    generation: int


@dataclass(frozen=True, slots=True)
class Succession:
    """The incumbent cohort drained and the oldest remaining cohort took over.

    ``new_checksum`` and ``new_generation`` are ``None`` when no cohort was left to succeed.
    ``drained``: the last incumbent members were drained, not gone. They still serve, so the
    old tenure's committed build and receiver stay in place (a handover) until the successor
    is committed (``CommitGroup.handover_from``) or the drained workers really leave; then
    ``WithdrawGroup``, ``RetireReceiver`` and ``HandoverEnded`` follow.
    """

    group: GroupKey
    old_checksum: str
    new_checksum: str | None
    old_generation: int | None
    new_generation: int | None
    old_receiver: int
    new_receiver: int | None
    drained: bool = False


@dataclass(frozen=True, slots=True)
class HandoverEnded(CarriesAttempt):
    """A drained tenure's handover is over; its build was withdrawn and its receiver retired.

    ``reason``: ``committed`` (the successor serves), ``departed`` (the drained workers left),
    ``undrained`` (a drained worker was given back, and rejoins behind the successor) or
    ``superseded`` (the successor's own tenure ended first).
    """

    group: GroupKey
    mdc_checksum: str
    generation: int
    receiver: int
    reason: Literal["committed", "departed", "undrained", "superseded"]


@dataclass(frozen=True, slots=True)
class WorkerDrained:
    """A registration was set aside by a drain: for admission it has left its cohort.

    It stays tracked: its real removal forgets it, and lifting the drain places it again as a
    returning member would be placed.
    """

    key: str
    group: GroupKey
    mdc_checksum: str
    was_admitted: bool
    drain: Drain


@dataclass(frozen=True, slots=True)
class DrainChanged:
    """A drain began or changed (``drain`` set) or was lifted (``drain`` is ``None``)."""

    namespace: str
    instance_id: int
    drain: Drain | None


@dataclass(frozen=True, slots=True)
class TenureHeld:
    """An outage's resync (or expiry) emptied the incumbent cohort: the tenure is held.

    The receiver, generation and any committed build stay until a member the cohort had when
    the hold began (``last_known`` names those, by instance key) registers again or the clock
    reaches ``deadline``. Those members stay admitted on their last known records until
    ``last_known_until`` (one registration TTL; ``None`` when none is served).
    """

    group: GroupKey
    mdc_checksum: str
    receiver: int
    generation: int | None
    deadline: float
    last_known: tuple[str, ...] = ()
    last_known_until: float | None = None


@dataclass(frozen=True, slots=True)
class TenureHoldEnded:
    """A held tenure ended: a member came back (``rejoined``) or time ran out (``expired``)."""

    group: GroupKey
    mdc_checksum: str
    outcome: Literal["rejoined", "expired"]
    held_for: float


@dataclass(frozen=True, slots=True)
class RejectionReported:
    """A cohort disagrees with the incumbent; log it once at ERROR with these fields."""

    group: GroupKey
    model: str
    worker_set: str
    incumbent_checksum: str
    rejected_checksum: str
    instance: str
    # The two cards compared (the incumbent's is its tenure's card), so a report can say what
    # differs; left out of equality.
    incumbent_card: Any = field(default=None, compare=False, repr=False)
    rejected_card: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class MutationRefused:
    """A known key came back with another group or checksum; the first incarnation is kept."""

    key: str
    reason: str
    kept_group: GroupKey
    kept_checksum: str
    offered_group: GroupKey
    offered_checksum: str


@dataclass(frozen=True, slots=True)
class TaintsUpdated:
    """A registration's taints changed in place (the one mutation allowed); nothing is rebuilt.

    ``serving`` is the group whose tenure serves the registration when it changed (its own group
    for an admitted base card, the group admitting its base for an adapter), or ``None`` when
    no tenure serves it: the hops carry the new taints to that group's receiver, and nowhere else.
    """

    key: str
    taints: tuple[str, ...]
    serving: GroupKey | None = None


@dataclass(frozen=True, slots=True)
class RetryScheduled(CarriesAttempt):
    """A build (or commit) failed; a new attempt is due at ``deadline`` on the core's clock."""

    group: GroupKey
    mdc_checksum: str
    generation: int
    attempt: int
    delay: float
    deadline: float
    error: str


@dataclass(frozen=True, slots=True)
class BuildDiscarded(CarriesAttempt):
    """A build or commit result did not match the attempt in flight and was dropped."""

    group: GroupKey
    mdc_checksum: str
    generation: int
    reason: str


@dataclass(frozen=True, slots=True)
class StatusChanged:
    """A group's status moved; ``generation`` is its latest build generation."""

    group: GroupKey
    old: GroupStatus
    new: GroupStatus
    generation: int | None


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """One LoRA adapter registration attached to an admitted worker."""

    key: str
    model_suffix: str
    lora_fingerprint: str
    card: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class LoraWorker:
    """The adapters one admitted worker serves, with its base card's projection fingerprint."""

    endpoint: EndpointId
    instance_id: int
    base_fingerprint: str
    adapters: Sequence[LoraAdapter]  # sorted by key; an ``Adapters`` value from the core


@dataclass(frozen=True, slots=True)
class LoraProjectionChanged:
    """The group's LoRA projection changed; update the binding, do not rebuild."""

    group: GroupKey
    receiver: int
    generation: int
    workers: tuple[LoraWorker, ...]


@dataclass(frozen=True, slots=True)
class LoraProjectionRefused:
    """The group's new LoRA projection serves one adapter name with two fingerprints.

    It is not published: the hops keep the last projection. On a committed group this is a
    failed replacement, and the ``StatusChanged`` to ``blocked_ready`` and the ``RetryScheduled``
    it leads to follow in the same step.
    """

    group: GroupKey
    receiver: int
    generation: int
    reason: str


Effect = (
    WorkerPlaced
    | WorkerDeparted
    | WorkerDrained
    | DrainChanged
    | HandoverEnded
    | OpenReceiver
    | PublishAdmissions
    | RetireReceiver
    | StartBuild
    | CancelBuild
    | CommitGroup
    | WithdrawGroup
    | Succession
    | TenureHeld
    | TenureHoldEnded
    | RejectionReported
    | MutationRefused
    | TaintsUpdated
    | RetryScheduled
    | BuildDiscarded
    | StatusChanged
    | LoraProjectionChanged
    | LoraProjectionRefused
)


def groups_named(effects: Iterable[object]) -> set[GroupKey]:
    """Return the groups a step's effects name: every group whose state the step may have changed.

    An effect names its group as ``group`` (a taint change names the serving one as
    ``serving``). The read-models (the admitted view, the status) rebuild these alone.
    """
    named = set()
    for effect in effects:
        group = getattr(effect, "group", None) or getattr(effect, "serving", None)
        if isinstance(group, GroupKey):
            named.add(group)
    return named
