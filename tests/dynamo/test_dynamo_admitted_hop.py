"""The Dynamo routing hop: live and admitted only, following its binding, never falling back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field
from typing import Any

import pytest
from support.fakes import LiveInstanceSet
from workerset_admission.adapters.dynamo.hop import AdmittedHop, LegacyExplicitEndpointHop
from workerset_admission.errors import NoRoutableInstance, ReceiverRetired, UsageError
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.service.bindings import AdmittedHopBinding, HopRole
from workerset_admission.service.receivers import open_admission_channel

ENDPOINT = EndpointId("ns", "backend", "generate")
DECODE = GroupKey.build("m", ENDPOINT, "chat|completions", WorkerType.DECODE)


@dataclass(frozen=True, slots=True)
class _Binding:
    group: GroupKey
    generation: int
    admitted: Collection[int]


@dataclass
class _Receiver:
    """A receiver as the hop reads it: a current value, and retired for good once told."""

    binding: _Binding
    retired: bool = False

    def current(self) -> _Binding:
        if self.retired:
            raise ReceiverRetired("retired")
        return self.binding


@dataclass
class _Client:
    live: list[int]
    sent: list[tuple[Any, int]] = field(default_factory=list)

    def instance_ids(self) -> list[int]:
        return list(self.live)

    async def direct(
        self, request: Any, instance_id: int, annotated: bool | None = True, context: Any = None
    ) -> AsyncIterator[Any]:
        self.sent.append((request, instance_id))

        async def stream() -> AsyncIterator[Any]:
            yield {"from": instance_id}

        return stream()


async def _route(hop: AdmittedHop | LegacyExplicitEndpointHop, times: int) -> set[int]:
    seen: set[int] = set()
    for n in range(times):
        async for item in await hop.generate({"n": n}):
            seen.add(item["from"])
    return seen


async def test_requests_go_only_to_instances_both_live_and_admitted() -> None:
    client = _Client(live=[1, 2, 3])
    hop = AdmittedHop(client, _Receiver(_Binding(DECODE, 1, [2, 3, 4])))

    assert hop.routable() == (2, 3)
    assert await _route(hop, 6) == {2, 3}


async def test_membership_changes_reach_the_same_hop_without_a_rebuild() -> None:
    client = _Client(live=[1, 2, 3])
    receiver = _Receiver(_Binding(DECODE, 1, [1]))
    hop = AdmittedHop(client, receiver)
    assert await _route(hop, 2) == {1}

    receiver.binding = _Binding(DECODE, 1, [1, 3])

    assert await _route(hop, 4) == {1, 3}
    assert hop.generation == 1


async def test_an_empty_intersection_refuses_instead_of_using_every_instance() -> None:
    client = _Client(live=[1, 2])
    hop = AdmittedHop(client, _Receiver(_Binding(DECODE, 7, [9])))

    with pytest.raises(NoRoutableInstance) as caught:
        await hop.generate({})

    assert caught.value.group == DECODE.id
    assert caught.value.generation == 7
    assert client.sent == []


async def test_a_named_instance_outside_the_admitted_set_is_refused() -> None:
    client = _Client(live=[1, 2])
    hop = AdmittedHop(client, _Receiver(_Binding(DECODE, 1, [1])))

    with pytest.raises(NoRoutableInstance):
        await hop.direct({}, 2)
    async for item in await hop.direct({}, 1):
        assert item == {"from": 1}
    assert client.sent == [({}, 1)]


async def test_a_retired_binding_stops_the_hop_for_good() -> None:
    client = _Client(live=[1, 2])
    receiver = _Receiver(_Binding(DECODE, 1, [1]))
    hop = AdmittedHop(client, receiver)

    receiver.retired = True

    with pytest.raises(ReceiverRetired):
        await hop.generate({})
    assert client.sent == []


def test_a_hop_refuses_the_binding_of_another_role() -> None:
    with pytest.raises(UsageError):
        AdmittedHop(_Client(live=[]), _Receiver(_Binding(DECODE, 1, [])), role=HopRole.PREFILL)


async def test_the_legacy_explicit_endpoint_hop_uses_every_live_instance() -> None:
    client = _Client(live=[5, 6])
    hop = LegacyExplicitEndpointHop(client)

    assert await _route(hop, 4) == {5, 6}
    client.live = []
    with pytest.raises(NoRoutableInstance):
        await hop.generate({})


async def test_a_hop_made_from_a_binding_outlives_its_withdrawal_only_as_retired() -> None:
    sender, receiver = open_admission_channel(DECODE, 4, "c" * 64, 9, admitted=[1])
    card = {"kv_cache_block_size": 32, "router_config": {"router_mode": "kv"}}
    sender.send([1], card=card)
    binding = AdmittedHopBinding(HopRole.DECODE, receiver, 9, LiveInstanceSet())
    client = _Client(live=[1, 2])
    hop = AdmittedHop.for_binding(client, binding)

    assert hop.settings is not None
    assert (hop.settings.router_mode, hop.settings.kv_cache_block_size) == ("kv", 32)
    assert await _route(hop, 2) == {1}

    # A succession retires the channel, then withdrawing the group closes the binding.
    sender.retire()
    binding.close()

    with pytest.raises(ReceiverRetired):
        await hop.generate({})


async def test_a_prefill_binding_makes_a_prefill_hop_and_refuses_to_serve_as_decode() -> None:
    prefill = GroupKey.build("m", ENDPOINT, "", WorkerType.PREFILL)
    _sender, receiver = open_admission_channel(prefill, 5, "d" * 64, 2, admitted=[8])
    binding = AdmittedHopBinding(HopRole.PREFILL, receiver, 2, LiveInstanceSet())
    client = _Client(live=[8, 9])

    hop = AdmittedHop.for_binding(client, binding)

    assert hop.role is HopRole.PREFILL
    assert await _route(hop, 3) == {8}
    with pytest.raises(UsageError):
        AdmittedHop(client, receiver.clone(), role=HopRole.DECODE)
