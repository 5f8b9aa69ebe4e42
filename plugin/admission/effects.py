"""Effects returned by the admission core: decisions for the service to carry out and trace.

Every effect is a frozen value. Effects that touch an admission channel name the receiver id;
effects that concern a build name the ``(group, mdc_checksum, generation)`` triple, which is
also the fence the core applies to results. ``card`` fields hold the opaque normalized card the
boundary produced; they do not take part in equality.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from workerset_admission.admission.admitted import AdmittedIds, HoldsAdmittedIds
from workerset_admission.admission.status import GroupStatus
from workerset_admission.identity import EndpointId, GroupKey

__all__ = [
    "BuildDiscarded",
    "CancelBuild",
    "CommitGroup",
    "Effect",
    "LoraAdapter",
    "LoraProjectionChanged",
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
    "WorkerPlaced",
]


@dataclass(frozen=True, slots=True)
class WorkerPlaced:
    """A new registration joined a cohort; ``admitted``: that cohort is the incumbent."""

    key: str
    group: GroupKey
    mdc_checksum: str
    admitted: bool


@dataclass(frozen=True, slots=True)
class WorkerDeparted:
    """A registration left its cohort; ``was_admitted`` says whether it was being served."""

    key: str
    group: GroupKey
    mdc_checksum: str
    was_admitted: bool


@dataclass(frozen=True, slots=True)
class OpenReceiver:
    """A tenure began: create a fresh admission channel with this id for the group."""

    group: GroupKey
    receiver: int
    mdc_checksum: str
    generation: int


@dataclass(frozen=True, slots=True)
class PublishAdmissions(HoldsAdmittedIds):
    """Set the admitted instance ids (and the selected card) seen through one receiver.

    ``ids`` is a lazy snapshot (a plain set of ids given here is wrapped in one): publishing
    does not copy the cohort, and ``admitted`` works the frozenset out when first read.
    """

    group: GroupKey
    receiver: int
    mdc_checksum: str
    generation: int
    ids: AdmittedIds
    card: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class RetireReceiver:
    """The tenure ended: clear the channel's admissions and close it for good."""

    group: GroupKey
    receiver: int
    mdc_checksum: str


@dataclass(frozen=True, slots=True)
class StartBuild:
    """Construct the pipeline for the incumbent; answer with ``BuildFinished`` for this triple.

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
class CancelBuild:
    """Abandon the build in flight for this triple; any late result will be discarded."""

    group: GroupKey
    mdc_checksum: str
    generation: int


@dataclass(frozen=True, slots=True)
class CommitGroup:
    """Serve the successful build: the binding is identified by ``(group, generation)``."""

    group: GroupKey
    mdc_checksum: str
    generation: int
    receiver: int
    members: tuple[str, ...]
    admitted: frozenset[int]
    representative: str
    card: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class WithdrawGroup:
    """Stop serving the committed build ``(group, generation)``."""

    group: GroupKey
    mdc_checksum: str
    generation: int


@dataclass(frozen=True, slots=True)
class Succession:
    """The incumbent cohort drained and the oldest remaining cohort took over.

    ``new_checksum`` and ``new_generation`` are ``None`` when no cohort was left to succeed.
    """

    group: GroupKey
    old_checksum: str
    new_checksum: str | None
    old_generation: int | None
    new_generation: int | None
    old_receiver: int
    new_receiver: int | None


@dataclass(frozen=True, slots=True)
class TenureHeld:
    """A resync after a lost connection listed no incumbent member: the tenure is held.

    The receiver, generation and any committed build stay, with nothing admitted, until a
    member of ``mdc_checksum`` registers again or the clock reaches ``deadline``.
    """

    group: GroupKey
    mdc_checksum: str
    receiver: int
    generation: int | None
    deadline: float


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
    # The two cards compared, so a report can say what differs; None when a held incumbent
    # has no member left to take its card from.
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
    """A registration's taints changed in place (the one mutation allowed); nothing is rebuilt."""

    key: str
    taints: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RetryScheduled:
    """A build (or commit) failed; a new attempt is due at ``deadline`` on the core's clock."""

    group: GroupKey
    mdc_checksum: str
    generation: int
    attempt: int
    delay: float
    deadline: float
    error: str


@dataclass(frozen=True, slots=True)
class BuildDiscarded:
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
    adapters: tuple[LoraAdapter, ...]


@dataclass(frozen=True, slots=True)
class LoraProjectionChanged:
    """The group's LoRA projection changed; update the binding, do not rebuild."""

    group: GroupKey
    receiver: int
    generation: int
    workers: tuple[LoraWorker, ...]


Effect = (
    WorkerPlaced
    | WorkerDeparted
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
)
