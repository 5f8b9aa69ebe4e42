"""Routing-hop bindings: what a decode, prefill or encoder hop may route to, and how.

A discovery-managed hop is bound to one committed group and identified by
``(group, successful build generation)``. It routes only to instances that are both live (the
endpoint's instance records) and admitted (its admission receiver), and it takes the routing
mode, KV block size and the rest of its routing settings from the selected card its receiver
carries, never from whatever endpoint card happens to be listed. When the receiver is retired
the hop fails with ``ReceiverRetired``; it never widens to the endpoint's full instance list.

Membership changes that keep the checksum flow through the same binding's receiver; a
succession commits a new build generation, which makes a new binding even when the endpoint
is unchanged.

The explicit-endpoint constructor of Dynamo's public API is a different thing: a caller names
an endpoint and takes every live instance. It is kept separate as
:class:`LegacyExplicitEndpointBinding` so the two can never be confused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from workerset_admission.admission.admitted import routable_ids
from workerset_admission.admission.effects import (
    CommitGroup,
    DrainChanged,
    LoraWorker,
    TaintsUpdated,
    WithdrawGroup,
)
from workerset_admission.admission.topology import TopologyBinding, TopologySet, bind_topology
from workerset_admission.errors import UsageError
from workerset_admission.identity import EndpointId, GroupKey
from workerset_admission.ports import LiveInstances
from workerset_admission.routing import (
    FrontendRouting,
    HopRole,
    RoutingSettings,
    card_field,
    encoder_handoff,
)
from workerset_admission.service.receivers import AdmissionChannels, AdmissionReceiver

# The routing vocabulary (hop roles, routing settings) lives in ``routing.py``; it is named
# here too for the callers that bind hops.
__all__ = [
    "AdmittedHopBinding",
    "BindingId",
    "FrontendRouting",
    "HopBindings",
    "HopRole",
    "LegacyExplicitEndpointBinding",
    "RoutingSettings",
    "card_field",
]


@dataclass(frozen=True, slots=True)
class BindingId:
    """A binding's identity: a succession changes it even when the endpoint does not."""

    group: GroupKey
    generation: int


class AdmittedHopBinding:
    """A discovery-managed hop bound to one committed group and build generation."""

    __slots__ = (
        "_endpoint",
        "_id",
        "_live",
        "_receiver",
        "_role",
        "_settings",
        "handover_from",
        "pipeline",
    )

    def __init__(
        self,
        role: HopRole,
        receiver: AdmissionReceiver,
        generation: int,
        live: LiveInstances,
        frontend: FrontendRouting | None = None,
        handover_from: int | None = None,
        pipeline: object = None,
    ) -> None:
        state = receiver.current()
        # What the pipeline builder made for this build generation (``None`` for the default
        # builder, which makes nothing beyond the binding).
        self.pipeline = pipeline
        # The generation of a drained tenure this binding took over from (``CommitGroup``):
        # a publisher puts this binding in place before it takes that one's workers away.
        self.handover_from = handover_from
        self._role = role
        self._receiver = receiver
        self._id = BindingId(state.group, generation)
        self._endpoint = state.group.endpoint
        self._live = live
        self._settings = RoutingSettings.resolve(state.card, frontend or FrontendRouting())

    @property
    def id(self) -> BindingId:
        return self._id

    @property
    def role(self) -> HopRole:
        return self._role

    @property
    def endpoint(self) -> EndpointId:
        return self._endpoint

    @property
    def settings(self) -> RoutingSettings:
        """Settings from the selected card at commit time; stable for the binding's life."""
        return self._settings

    @property
    def receiver(self) -> AdmissionReceiver:
        return self._receiver

    def admitted(self) -> frozenset[int]:
        """Admitted ids now; raises ``ReceiverRetired`` once the group's tenure ended."""
        return self._receiver.current().admitted

    def routable(self) -> frozenset[int]:
        """Live and admitted: the only instances this hop may pick (:func:`routable_ids`)."""
        state = self._receiver.current()
        return routable_ids(state.admitted, self._live.live_ids(self._endpoint), state.last_known)

    def live_ids(self) -> frozenset[int]:
        """Live instance ids at the binding's endpoint now, admitted or not (an immutable set)."""
        return self._live.live_ids(self._endpoint)

    def last_known(self) -> frozenset[int]:
        """Admitted ids served on their last known records during a hold (usually none)."""
        return self._receiver.current().last_known

    def lora(self) -> tuple[LoraWorker, ...]:
        """Return the group's LoRA projection now: the adapters each admitted worker serves."""
        return self._receiver.current().lora

    def taints(self) -> Mapping[str, tuple[str, ...]]:
        """Return the taints changed in place during the tenure, by registration key."""
        return self._receiver.current().taints

    def close(self) -> None:
        self._receiver.close()

    def __repr__(self) -> str:
        return f"<AdmittedHopBinding {self._role.value} {self._id.group.id} g{self._id.generation}>"


class LegacyExplicitEndpointBinding:
    """The public explicit-endpoint path: every live instance of a named endpoint.

    There is no admission here by design; it exists for callers that name an endpoint
    themselves and is never used for discovery-managed topology.
    """

    __slots__ = ("_endpoint", "_live", "_settings")

    def __init__(
        self, endpoint: EndpointId, live: LiveInstances, settings: RoutingSettings
    ) -> None:
        self._endpoint = endpoint
        self._live = live
        self._settings = settings

    @property
    def endpoint(self) -> EndpointId:
        return self._endpoint

    @property
    def settings(self) -> RoutingSettings:
        return self._settings

    def routable(self) -> frozenset[int]:
        return self._live.live_ids(self._endpoint)


class HopBindings:
    """Every committed group's binding, driven by ``CommitGroup`` / ``WithdrawGroup`` effects.

    These are the live objects the hops route through, made and closed by effects only; which
    generation and checksum each group serves is the core's to say (``AdmissionCore.serving``).
    :meth:`commit` expects the admission channels to have opened the group's channel first (the
    core opens a tenure's receiver before it commits it).
    """

    __slots__ = ("_bindings", "_channels", "_drained", "_frontend", "_handoff", "_live")

    def __init__(
        self,
        channels: AdmissionChannels,
        live: LiveInstances,
        frontend: FrontendRouting | None = None,
    ) -> None:
        self._channels = channels
        self._live = live
        self._frontend = frontend or FrontendRouting()
        self._bindings: dict[GroupKey, AdmittedHopBinding] = {}
        self._handoff: dict[GroupKey, bool] = {}
        # The workers a drain in force names (namespace, instance id), kept by ``DrainChanged``.
        self._drained: set[tuple[str, int]] = set()

    def commit(self, effect: CommitGroup, pipeline: object = None) -> None:
        """Bind a committed group's hop to its open channel; raises if the hop refuses it."""
        receiver = self._channels.subscribe(effect.group)
        if receiver is None or receiver.receiver_id != effect.receiver:
            raise UsageError(f"no open admission channel {effect.receiver} to bind")
        old = self._bindings.pop(effect.group, None)
        if old is not None:
            old.close()
        role = HopRole.for_worker_type(effect.group.worker_type)
        binding = AdmittedHopBinding(
            role,
            receiver,
            effect.generation,
            self._live,
            self._frontend,
            effect.handover_from,
            pipeline,
        )
        self._bindings[effect.group] = binding
        self._handoff[effect.group] = encoder_handoff(effect.card)

    def withdraw(self, effect: WithdrawGroup) -> None:
        """Close a group's binding, if it is still the withdrawn generation's."""
        current = self._bindings.get(effect.group)
        if current is not None and current.id.generation == effect.generation:
            del self._bindings[effect.group]
            del self._handoff[effect.group]
            current.close()

    def withdraw_all(self) -> None:
        """Close every binding (the service stops)."""
        for group in sorted(self._bindings):
            binding = self._bindings.pop(group)
            del self._handoff[group]
            binding.close()

    def drain_changed(self, effect: DrainChanged) -> None:
        """Follow the drains in force (the view keeps a drained worker's endpoint records)."""
        worker = (effect.namespace, effect.instance_id)
        if effect.drain is None:
            self._drained.discard(worker)
        else:
            self._drained.add(worker)

    def drained(self) -> frozenset[tuple[str, int]]:
        """Return the workers a drain in force names: (namespace, instance id)."""
        return frozenset(self._drained)

    def carry_taints(self, effect: TaintsUpdated) -> bool:
        """Carry a worker's new taints to the tenure the core says serves it, if any."""
        if effect.serving is None:
            return False
        return self._channels.update_taints(effect.serving, effect.key, effect.taints)

    def binding(self, group: GroupKey) -> AdmittedHopBinding | None:
        return self._bindings.get(group)

    def bindings(self) -> list[AdmittedHopBinding]:
        return [self._bindings[k] for k in sorted(self._bindings)]

    def topology(self) -> Mapping[GroupKey, TopologyBinding]:
        """Prefill and encoder targets for every committed group (facts section 8 rules)."""
        return bind_topology(
            TopologySet(key, b.id.generation, self._handoff[key])
            for key, b in self._bindings.items()
        )

    def peer(self, group: GroupKey, role: HopRole) -> AdmittedHopBinding | None:
        """Find the committed binding a group's hop of ``role`` routes to, if any."""
        peer_type = role.peer_type
        if peer_type is None:
            return self._bindings.get(group)
        bound = self.topology().get(group)
        target = None if bound is None else bound.target(peer_type)
        return None if target is None else self._bindings.get(target.group)
