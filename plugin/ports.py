"""Ports between the service and the outside world, as ``typing.Protocol`` classes.

Adapters implement them (``adapters/nats`` for JetStream, tests with small fakes); the service
depends only on these shapes. Sources deliver raw key/value entries and never decide anything:
decoding and judging a record is the card boundary's job, deciding admission is the core's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, runtime_checkable

from workerset_admission.identity import GroupKey

if TYPE_CHECKING:
    from workerset_admission.service.bindings import FrontendRouting
    from workerset_admission.service.liveness import LivenessIndex
    from workerset_admission.service.receivers import AdmissionReceiver

__all__ = [
    "AdmissionPublisher",
    "BuildRequest",
    "DefaultPipelineBuilder",
    "DiscoveryEntry",
    "DiscoverySource",
    "PipelineBuilder",
    "SourceDelete",
    "SourceEvent",
    "SourcePut",
    "SourceSnapshot",
    "StatusResponder",
]


class DiscoveryEntry(NamedTuple):
    """One KV entry as the bucket holds it.

    ``headers`` carries message headers when the transport has them (W3C ``traceparent`` for
    example); ``received_at`` is the monotonic time the entry reached this process, and
    ``published_at`` the wall-clock time the server stored it, when known. A named tuple: the
    source makes one per message, and a tuple is built in one step.
    """

    key: str
    value: bytes
    revision: int
    headers: Mapping[str, str] | None = None
    received_at: float = 0.0
    published_at: float | None = None


@dataclass(frozen=True, slots=True)
class SourceSnapshot:
    """A full listing of the bucket: every key not listed is gone.

    Emitted once when the watch's initial values end, again after every reconnect or re-created
    watch, and for periodic reconciliation.
    """

    entries: Sequence[DiscoveryEntry]
    reason: Literal["initial", "reconnect", "periodic"] = "initial"
    # Per group (model, worker_set), the checksum each live peer frontend serves, when known:
    # the listing is then observed peer-aligned (admission.ordering).
    peers: Mapping[tuple[str, str], Sequence[str]] | None = None


@dataclass(frozen=True, slots=True)
class SourcePut:
    """A live update: a key was created or overwritten."""

    entry: DiscoveryEntry


@dataclass(frozen=True, slots=True)
class SourceDelete:
    """A live removal: delete, purge, or a TTL-expiry marker (``operation`` says which)."""

    key: str
    revision: int
    operation: Literal["delete", "purge", "expired"] = "delete"
    headers: Mapping[str, str] | None = field(default=None)
    received_at: float = 0.0


SourceEvent = SourceSnapshot | SourcePut | SourceDelete


@runtime_checkable
class DiscoverySource(Protocol):
    """Where discovery records come from (a JetStream KV bucket in production)."""

    def events(self) -> AsyncIterator[SourceEvent]:
        """Yield a snapshot first, then live updates; a new snapshot after each reconnect."""
        ...

    async def list_all(self) -> SourceSnapshot:
        """Read the whole bucket now, for periodic reconciliation."""
        ...

    async def close(self) -> None: ...


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

    async def publish_capability(self) -> None: ...

    async def republish(self) -> None:
        """Write every record again: the store behind them may have been wiped or re-created."""
        ...

    async def withdraw_all(self) -> None:
        """Remove every record this frontend published (on shutdown)."""
        ...


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
    receiver: AdmissionReceiver
    liveness: LivenessIndex


class PipelineBuilder(Protocol):
    """The host's pipeline construction for one incumbent.

    ``build`` returns whatever the host wants to keep for the committed group (kept beside the
    hop binding), raises to fail the attempt (the core retries with backoff), and is cancelled
    when the tenure ends or the attempt becomes stale.
    """

    async def build(self, request: BuildRequest) -> object: ...


class DefaultPipelineBuilder:
    """Builds nothing beyond the hop binding: checks the selected card yields routing settings.

    The hop binding itself is made by the service when the build is committed, from the
    group's receiver and selected card.
    """

    def __init__(self, frontend: FrontendRouting | None = None) -> None:
        self._frontend = frontend

    async def build(self, request: BuildRequest) -> object:
        from workerset_admission.service.bindings import FrontendRouting, RoutingSettings

        return RoutingSettings.resolve(request.card, self._frontend or FrontendRouting())


class StatusResponder(Protocol):
    """Answers status requests until cancelled.

    ``render(brief)`` gives the current status as JSON bytes; the brief form replaces member
    lists with counts, for fleets whose full listing exceeds a message.
    """

    async def serve(self, render: Callable[[bool], bytes]) -> None: ...
