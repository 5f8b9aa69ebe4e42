"""Routing hops over a real Dynamo ``Client``: admitted routing, and the legacy explicit path.

An :class:`AdmittedHop` sends a request with ``Client.direct`` to an instance that is both live
(the client's own discovery watch) and admitted (the binding's admission receiver). It reads the
receiver on every request, so compatible membership changes reach it without a rebuild; once the
receiver is retired (a succession replaced the binding) it refuses every request with
``ReceiverRetired``. An empty intersection is an error, never a reason to route to every
instance. :class:`LegacyExplicitEndpointHop` is the separate, unadmitted path for an endpoint
a caller names explicitly, outside discovery-managed topology.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any, Protocol

from workerset_admission.admission.admitted import routable_ids
from workerset_admission.admission.effects import LoraWorker
from workerset_admission.errors import NoRoutableInstance, UsageError
from workerset_admission.identity import EndpointId, GroupKey
from workerset_admission.routing import HopRole, RoutingSettings

__all__ = [
    "AdmissionValue",
    "AdmittedHop",
    "DynamoClient",
    "DynamoRuntime",
    "HopReceiver",
    "LegacyExplicitEndpointHop",
]


class DynamoClient(Protocol):
    """The part of ``dynamo.runtime.Client`` a hop uses."""

    def instance_ids(self) -> list[int]: ...

    async def direct(
        self, request: Any, instance_id: int, annotated: bool | None = True, context: Any = None
    ) -> AsyncIterator[Any]: ...


class DynamoEndpoint(Protocol):
    async def client(self) -> DynamoClient: ...


class DynamoRuntime(Protocol):
    """The part of ``dynamo.runtime.DistributedRuntime`` a hop uses."""

    def endpoint(self, path: str) -> DynamoEndpoint: ...


class AdmissionValue(Protocol):
    """What a hop reads from a receiver's current state."""

    @property
    def group(self) -> GroupKey: ...

    @property
    def generation(self) -> int: ...

    @property
    def admitted(self) -> Collection[int]: ...

    @property
    def lora(self) -> Sequence[LoraWorker]: ...


class HopReceiver(Protocol):
    """An admission receiver as a hop sees it: ``current()`` raises once retired."""

    def current(self) -> AdmissionValue: ...


class ClonableReceiver(HopReceiver, Protocol):
    """A receiver a hop can take its own copy of (withdrawing a binding closes the original)."""

    def clone(self) -> HopReceiver: ...


class CommittedBinding(Protocol):
    """A committed group's binding as a hop takes it (the service's ``AdmittedHopBinding``)."""

    @property
    def role(self) -> HopRole: ...

    @property
    def endpoint(self) -> EndpointId: ...

    @property
    def settings(self) -> RoutingSettings: ...

    @property
    def receiver(self) -> ClonableReceiver: ...


class AdmittedHop:
    """Route only to instances that are live and admitted by one binding.

    ``choose()`` and ``generate()`` pick round robin among the routable instances; a caller with
    its own selection (a KV router, say) reads ``routable()`` and sends with ``direct()``.
    ``settings`` holds the routing mode and KV block size resolved from the selected card.
    """

    def __init__(
        self,
        client: DynamoClient,
        receiver: HopReceiver,
        *,
        role: HopRole | None = None,
        settings: RoutingSettings | None = None,
    ) -> None:
        first = receiver.current()
        natural = HopRole.for_worker_type(first.group.worker_type)
        if role is not None and role is not natural:
            raise UsageError(
                f"a {role.value} hop was given the binding of a "
                f"{first.group.worker_type.value} WorkerSet ({first.group.id})"
            )
        self._client = client
        self._receiver = receiver
        # One receiver is one tenure of one group: a succession retires it rather than
        # re-pointing it, so the hop can never reach a successor's instances.
        self._group = first.group
        self._role = natural
        self._settings = settings
        self._turn = itertools.count()

    @classmethod
    def for_binding(cls, client: DynamoClient, binding: CommittedBinding) -> AdmittedHop:
        """Wrap ``client`` with a committed binding's receiver and routing settings."""
        # A clone of our own: withdrawing the binding closes its receiver, while this hop must
        # keep answering ReceiverRetired once the tenure has ended.
        return cls(client, binding.receiver.clone(), role=binding.role, settings=binding.settings)

    @classmethod
    async def connect(cls, runtime: DynamoRuntime, binding: CommittedBinding) -> AdmittedHop:
        """Open a Dynamo client on the binding's own endpoint and wrap it."""
        endpoint = binding.endpoint
        client = await runtime.endpoint(
            f"{endpoint.namespace}.{endpoint.component}.{endpoint.endpoint}"
        ).client()
        return cls.for_binding(client, binding)

    @property
    def role(self) -> HopRole:
        return self._role

    @property
    def settings(self) -> RoutingSettings | None:
        return self._settings

    @property
    def group(self) -> GroupKey:
        return self._group

    @property
    def generation(self) -> int:
        """The build generation currently serving; raises ``ReceiverRetired`` once retired."""
        return self._receiver.current().generation

    def routable(self) -> tuple[int, ...]:
        """Live instances that the binding admits right now, sorted."""
        return self._routable(self._receiver.current())

    def _routable(self, binding: AdmissionValue) -> tuple[int, ...]:
        # The client can send only to what its own discovery lists: that list is its liveness,
        # and a held member's last known record is in it when the frontend reads the view.
        live = set(self._client.instance_ids())
        return tuple(sorted(routable_ids(binding.admitted, live)))

    def adapter_instances(self, adapter: str) -> tuple[int, ...]:
        """Routable instances serving LoRA adapter ``adapter`` now, from the group's projection.

        The projection reaches the hop through its receiver, so an adapter registered or
        removed on an admitted worker shows here without a rebuild.
        """
        return self._serving(self._receiver.current(), adapter)

    def _serving(self, binding: AdmissionValue, adapter: str) -> tuple[int, ...]:
        serving = {
            worker.instance_id
            for worker in binding.lora
            if any(a.model_suffix == adapter for a in worker.adapters)
        }
        return tuple(i for i in self._routable(binding) if i in serving)

    def choose(self, adapter: str | None = None) -> int:
        """Pick the next routable instance (serving ``adapter``, when named), round robin."""
        binding = self._receiver.current()
        candidates = self._routable(binding) if adapter is None else self._serving(binding, adapter)
        if not candidates:
            raise NoRoutableInstance(self._group.id, binding.generation)
        return candidates[next(self._turn) % len(candidates)]

    async def generate(
        self,
        request: Any,
        *,
        annotated: bool = True,
        context: Any = None,
        adapter: str | None = None,
    ) -> AsyncIterator[Any]:
        """Send ``request`` to a routable instance (serving ``adapter``, when named)."""
        return await self._client.direct(request, self.choose(adapter), annotated, context)

    async def direct(
        self, request: Any, instance_id: int, *, annotated: bool = True, context: Any = None
    ) -> AsyncIterator[Any]:
        """Send to one named instance, only if it is routable now."""
        binding = self._receiver.current()
        if instance_id not in self._routable(binding):
            raise NoRoutableInstance(self._group.id, binding.generation, instance_id)
        return await self._client.direct(request, instance_id, annotated, context)


class LegacyExplicitEndpointHop:
    """The legacy explicit-endpoint path: every live instance, no admission.

    For callers that name an endpoint directly rather than through discovery; discovery-managed
    routing must use :class:`AdmittedHop`.
    """

    def __init__(self, client: DynamoClient) -> None:
        self._client = client
        self._turn = itertools.count()

    def routable(self) -> tuple[int, ...]:
        return tuple(sorted(set(self._client.instance_ids())))

    async def generate(
        self, request: Any, *, annotated: bool = True, context: Any = None
    ) -> AsyncIterator[Any]:
        candidates = self.routable()
        if not candidates:
            raise NoRoutableInstance(None, None)
        instance_id = candidates[next(self._turn) % len(candidates)]
        return await self._client.direct(request, instance_id, annotated, context)
