"""LoRA projections and taints reach the routing hops through the service, without a rebuild."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from support.cards import base_card, endpoint_entry, group_of, lora_card, model_entry, model_put
from support.cards import model_delete as delete
from support.fakes import FakeClock, FakeSource, settle
from workerset_admission.adapters.dynamo.hop import AdmittedHop
from workerset_admission.ports import SourceListing
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.settings import Settings

BASE = base_card()
G = group_of(BASE)
ADAPTER = "sql-lora"


@dataclass
class _Client:
    """The part of a Dynamo client a hop uses: live ids and direct sends."""

    live: list[int]
    sent: list[int] = field(default_factory=list)

    def instance_ids(self) -> list[int]:
        return list(self.live)

    async def direct(
        self, request: Any, instance_id: int, annotated: bool | None = True, context: Any = None
    ) -> AsyncIterator[Any]:
        self.sent.append(instance_id)

        async def stream() -> AsyncIterator[Any]:
            yield {"from": instance_id}

        return stream()


async def _serving(source: FakeSource, **kwargs: Any) -> tuple[AdmissionService, AdmittedHop]:
    svc = AdmissionService(source, **kwargs)
    await svc.start()
    listing = (model_entry(1), model_entry(2), endpoint_entry(1), endpoint_entry(2))
    source.queue.put_nowait(SourceListing(listing))
    await settle(lambda: svc.binding(G) is not None)
    binding = svc.binding(G)
    assert binding is not None
    return svc, AdmittedHop.for_binding(_Client([1, 2]), binding)


async def test_a_lora_adapter_registered_on_an_admitted_worker_is_seen_by_the_hop() -> None:
    source = FakeSource()
    svc, hop = await _serving(source)
    try:
        generation = hop.generation
        assert hop.adapter_instances(ADAPTER) == ()
        source.queue.put_nowait(model_put(1, lora_card(ADAPTER), suffix=ADAPTER))
        await settle(lambda: hop.adapter_instances(ADAPTER) == (1,))
        assert hop.choose(ADAPTER) == 1
        await hop.generate({"model": ADAPTER}, adapter=ADAPTER)
        binding = svc.binding(G)
        assert binding is not None
        assert [w.instance_id for w in binding.lora()] == [1]
        # The projection changed the binding in place: no rebuild, the same generation.
        assert hop.generation == generation
        source.queue.put_nowait(delete(1, suffix=ADAPTER))
        await settle(lambda: hop.adapter_instances(ADAPTER) == ())
    finally:
        await svc.stop()


async def test_an_adapter_name_with_two_fingerprints_blocks_the_projection_and_keeps_the_last_one() -> (  # noqa: E501
    None
):
    source = FakeSource()
    clock = FakeClock()
    svc, hop = await _serving(source, clock=clock, settings=Settings(retry_delays=(5.0,)))
    try:
        source.queue.put_nowait(model_put(1, lora_card(ADAPTER, capacity=4), suffix=ADAPTER))
        await settle(lambda: hop.adapter_instances(ADAPTER) == (1,))
        # Worker 2 announces the same adapter name with other settings: other weights.
        source.queue.put_nowait(model_put(2, lora_card(ADAPTER, capacity=8), suffix=ADAPTER))
        await settle(lambda: svc.status().groups[0].status == "blocked_ready")
        # The last safe projection is still served, and the group's workers too.
        assert hop.adapter_instances(ADAPTER) == (1,)
        assert hop.routable() == (1, 2)
        # The clash resolves; at the retry deadline the new projection is applied.
        source.queue.put_nowait(delete(2, suffix=ADAPTER))
        clock.now += 5.0
        svc.wake_timers()
        await settle(lambda: svc.status().groups[0].status == "ready")
        assert hop.adapter_instances(ADAPTER) == (1,)
    finally:
        await svc.stop()


async def test_taints_changed_in_place_reach_the_hop_binding() -> None:
    source = FakeSource()
    svc, _hop = await _serving(source)
    try:
        binding = svc.binding(G)
        assert binding is not None
        assert dict(binding.taints()) == {}
        source.queue.put_nowait(model_put(2, base_card(runtime_config={"taints": ["maint"]})))
        key = "dgd-v1/backend/generate/2"
        await settle(lambda: key in binding.taints())
        assert binding.taints()[key] == ("maint",)
    finally:
        await svc.stop()
