"""Ports between the service and the outside world, as ``typing.Protocol`` classes.

Adapters implement them (``adapters/nats`` for JetStream, tests with small fakes); the service
depends only on these shapes. This module holds the protocols and the plain values that cross
them, and nothing else: no implementation, and no import of a room (it sits below all of them).
Sources deliver raw key/value entries and never decide anything: decoding and judging a record
is the card boundary's job, deciding admission is the core's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from workerset_admission.identity import EndpointId, GroupKey

__all__ = [
    "AcceptedRecord",
    "AdmissionFeed",
    "AdmissionPublisher",
    "BuildRequest",
    "DeltaSubscriber",
    "DiscoveryEntry",
    "DiscoverySource",
    "ListingPeers",
    "LiveInstances",
    "PipelineBuilder",
    "ReadModel",
    "SourceDelete",
    "SourceEvent",
    "SourceListing",
    "SourcePut",
    "StatusResponder",
    "StepDelta",
    "SteppedRecord",
    "TenureFacts",
]


class DiscoveryEntry(NamedTuple):
    """One discovery record as a source holds it: its key, its raw value, its revision.

    The key is the record's name in the discovery key space (``keys.py``: ``model_kv_key``,
    ``endpoint_kv_key``, ``drain_kv_key``; ``card.event_kv_key``), whatever the store: the
    boundary tells what the record is from the key alone (``card.entry``). ``revision`` is the
    store's own ordering of writes when it has one (a KV sequence, an etcd or Kubernetes
    resource version), else 0. ``headers`` carries message headers when the transport has
    them (W3C ``traceparent`` for example); ``received_at`` is the monotonic time the entry
    reached this process, and ``published_at`` the wall-clock time the store took it, when
    known. A named tuple: the source makes one per message, and a tuple is built in one step.
    """

    key: str
    value: bytes
    revision: int = 0
    headers: Mapping[str, str] | None = None
    received_at: float = 0.0
    published_at: float | None = None


@dataclass(frozen=True, slots=True)
class SourceListing:
    """A full listing of the source: every key not listed is gone.

    Emitted once when the watch's initial values end, again after every reconnect or re-created
    watch, and for periodic reconciliation.
    """

    entries: Sequence[DiscoveryEntry]
    reason: Literal["initial", "reconnect", "periodic"] = "initial"
    # Per group (model, worker_set), the checksum each live peer frontend serves, when known:
    # the listing is then observed peer-aligned (admission.ordering).
    peers: Mapping[tuple[str, str], Sequence[str]] | None = None
    # An initial listing only: the store could not be reached before it (the frontend started
    # during an outage, or lost its connection before its first listing).
    after_outage: bool = False
    # Per group and checksum the peers serve, the instance ids they serve it with.
    peer_members: Mapping[tuple[str, str], Mapping[str, Sequence[int]]] | None = None
    # Seconds since the latest resync a live peer frontend made after losing its connection,
    # as its capability record said when the listing was taken; None when none said so.
    peers_resynced_ago: float | None = None


@dataclass(frozen=True, slots=True)
class SourcePut:
    """A live update: a key was created or overwritten."""

    entry: DiscoveryEntry


@dataclass(frozen=True, slots=True)
class SourceDelete:
    """A live removal: delete, purge, or a TTL-expiry marker (``operation`` says which).

    A store without purges or TTLs says ``delete``; ``expired`` is for a record its writer
    stopped refreshing (a lease, a TTL), which the core may judge an outage's doing.
    """

    key: str
    revision: int = 0
    operation: Literal["delete", "purge", "expired"] = "delete"
    headers: Mapping[str, str] | None = field(default=None)
    received_at: float = 0.0


SourceEvent = SourceListing | SourcePut | SourceDelete


@runtime_checkable
class DiscoverySource(Protocol):
    """Where discovery records come from: any store with a listing and a watch.

    The JetStream KV bucket (``adapters/nats/source.py``) is one; a store with a watch of its
    own (Kubernetes custom resources through an informer, say) is another, and needs no KV
    bucket: it names each record by its discovery key and yields the events below.
    ``docs/sources.md`` says when to write a source and when a bridge into the bucket.
    """

    def events(self) -> AsyncIterator[SourceEvent]:
        """Yield a listing first, then live updates; a new listing after each reconnect.

        A listing's reason says why it came (``initial``, ``reconnect``): after a reconnect
        the core may hold a tenure the listing empties, so say ``reconnect`` only when the
        store may have missed changes.
        """
        ...

    async def list_all(self) -> SourceListing:
        """Read every record now (reason ``periodic``), for periodic reconciliation.

        A store that keeps a current cache of its watch (an informer) may answer from it.
        """
        ...

    async def close(self) -> None: ...


@runtime_checkable
class ListingPeers(Protocol):
    """What the other live frontends serve, attached to a listing a frontend starts or resyncs from.

    The service asks it of each initial and reconnect listing before the step takes it; live
    updates and periodic listings never reach it. The serving-admission bucket's reader
    (``adapters/nats/peers.py``) is one; it answers, whatever it could read, with a listing.
    """

    async def attach(self, listing: SourceListing) -> SourceListing: ...


@runtime_checkable
class AdmissionPublisher(Protocol):
    """Where a frontend announces what it serves, so operators can gate rolling updates."""

    async def publish_members(
        self,
        worker_namespace: str,
        members: Sequence[str],
        *,
        groups: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Replace the record for one worker namespace with the instance keys served.

        ``groups`` details each committed group behind those members (model, WorkerSet,
        checksum, generation): what a rollout gate needs to tell generations apart.
        """
        ...

    async def publish_capability(self, resynced_at: float | None = None) -> None:
        """Say this frontend publishes admissions; ``resynced_at``: when it last resynced.

        ``resynced_at`` is the wall-clock time (Unix seconds) of its last listing after a lost
        connection: a peer that starts soon after takes its first listing as one within that
        outage's hold (see the core).
        """
        ...

    async def republish(self) -> None:
        """Write every record again: the store behind them may have been wiped or re-created."""
        ...

    async def withdraw_all(self) -> None:
        """Remove every record this frontend published (on shutdown).

        A frontend whose view outlives this process keeps what that view still routes by.
        """
        ...

    async def settle(self) -> int:
        """Withdraw records under this frontend's id it does not publish now; return how many.

        Called once, when what it publishes follows its first listing: a predecessor under the
        same id may have left records this process no longer holds.
        """
        ...


class AdmissionFeed(Protocol):
    """A tenure's admission receiver, as a builder holds it (the service's ``AdmissionReceiver``).

    ``current()`` is the tenure's admission state now (its group, generation, admitted ids,
    selected card and LoRA projection) and raises ``ReceiverRetired`` once the tenure ended;
    ``changed()`` waits for the next one.
    """

    @property
    def receiver_id(self) -> int: ...

    @property
    def group(self) -> GroupKey: ...

    @property
    def retired(self) -> bool: ...

    def current(self) -> Any: ...

    def admitted(self) -> frozenset[int]: ...

    async def changed(self) -> Any: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class AcceptedRecord:
    """A discovery record the core accepted: its key, its raw bytes and its kind (in a delta).

    ``kind`` is ``"model"`` (a model card), ``"instance"`` (an endpoint-instance record) or
    ``"event"`` (an event source or channel); ``worker_id`` is the worker an event source
    names (``None`` for everything else).
    """

    key: str
    value: bytes
    kind: Literal["model", "instance", "event"]
    worker_id: int | None = None


class LiveInstances(Protocol):
    """Which instances of an endpoint are live (from its endpoint-instance records)."""

    def live_ids(self, endpoint: EndpointId) -> frozenset[int]: ...


@dataclass(frozen=True, slots=True)
class BuildRequest:
    """What a builder gets for one attempt: the incumbent's identity, card and receiver.

    The receiver is the tenure's admission channel; a pipeline built from it keeps seeing
    compatible membership changes without being rebuilt, and goes dark when the tenure ends.
    """

    group: GroupKey
    mdc_checksum: str
    generation: int
    attempt: int
    representative: str
    card: Any
    receiver: AdmissionFeed
    liveness: LiveInstances


class PipelineBuilder(Protocol):
    """The host's pipeline construction for one incumbent.

    ``build`` returns whatever the host wants to keep for the committed group (kept beside the
    hop binding), raises to fail the attempt (the core retries with backoff), and is cancelled
    when the tenure ends or the attempt becomes stale.
    """

    async def build(self, request: BuildRequest) -> object: ...


class StatusResponder(Protocol):
    """Answers status requests until cancelled.

    ``render(brief)`` gives the current status as JSON bytes; the brief form replaces member
    lists with counts, for fleets whose full listing exceeds a message. It may be called in a
    thread. ``settle()``, awaited on the loop before each answer is rendered, brings the status
    up to the request (every step before it) without holding the loop.
    """

    async def serve(
        self, render: Callable[[bool], bytes], settle: Callable[[], Awaitable[object]]
    ) -> None: ...


# -- what the read models are handed --------------------------------------------------------------
#
# One core step as the read models (the admitted view, the status and serving records) hear it:
# a typed delta, made by the service's step from the core's effects and the inputs as the core
# accepted them, and pushed once per step:
#
# * ``groups``: every group the step may have changed (an effect named it, or the liveness of its
#   endpoint moved), with its tenure's facts after the step (``None``: no committed tenure);
# * ``records``: the discovery records the core accepted or that left, by key, with exactly the
#   bytes it accepted (``None``: the key holds nothing now). A card whose in-place change the
#   core refused is not among them: the key keeps its first incarnation's bytes;
# * ``relisted``: the step was a listing, and ``records`` is the whole store but the ``kept``
#   keys, which keep what they hold; a reader treats every one of its owners as changed;
# * ``endpoints``: endpoints whose liveness (their instance records) moved;
# * ``drained``: the workers a drain names after the step, when the drains changed.
#
# A read model never looks a record up beside the core and never asks the service back: what
# it publishes comes from the deltas it was handed.


@dataclass(frozen=True, slots=True)
class TenureFacts:
    """One committed tenure as the read models see it after a step."""

    group: GroupKey
    generation: int
    # The admitted ids that are live (the last-known members of a hold count as live).
    routable: frozenset[int]
    # Routable ids a held tenure serves on their last known records.
    last_known: frozenset[int] = frozenset()
    # The generation of a drained tenure of the same group this one takes over from.
    handover_from: int | None = None
    # The LoRA adapters the tenure serves: (instance id, adapter suffix), as the core projected
    # them. An adapter card outside it (a projection the core refused) is not served.
    adapters: frozenset[tuple[int, str]] = frozenset()


@dataclass(frozen=True, slots=True)
class StepDelta:
    """What one core step changed, for every read model (see the module doc).

    A step that changed nothing a read model keeps has no delta (``None``), never an empty one.
    """

    groups: Mapping[GroupKey, TenureFacts | None] = field(default_factory=dict)
    records: Mapping[str, AcceptedRecord | None] = field(default_factory=dict)
    relisted: bool = False
    kept: frozenset[str] = frozenset()
    endpoints: frozenset[EndpointId] = frozenset()
    drained: frozenset[tuple[str, int]] | None = None


class ReadModel(Protocol):
    """A fold over the service's steps: handed each step's delta, once, on the loop."""

    def step(self, delta: StepDelta) -> None:
        """Take one step's delta; a read model must not raise, and must not call back."""


class SteppedRecord(Protocol):
    """A step's record as a reader below the service reads it: the step's delta.

    The service's :class:`~workerset_admission.service.step.StepRecord` is one; it carries
    what came in, the clock and the effects as well.
    """

    @property
    def delta(self) -> StepDelta | None: ...


class DeltaSubscriber(Protocol):
    """A subscriber that reads only the delta of each step it hears."""

    def heard(self, record: SteppedRecord) -> None: ...
