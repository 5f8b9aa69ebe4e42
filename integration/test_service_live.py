"""The admission service end to end: real nats-server, real bucket, real source and publishers."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from natsfixture import NatsServer
from support.aio import eventually
from support.cards import base_card as demo_card
from workerset_admission.adapters.nats.admission_publisher import NatsAdmissionPublisher
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.errors import ReceiverRetired
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

EP = EndpointId("dgd", "backend", "generate")
CARD: dict[str, Any] = demo_card(16)
OLD = CARD
NEW = demo_card(32)
GROUP = GroupKey.build(CARD["display_name"], EP, "chat|completions", WorkerType.AGGREGATED)


@pytest.fixture
async def workers(client: NatsClient, bucket_name: str) -> AsyncIterator[WorkerRegistrar]:
    publisher = WorkerRegistrar(client.jetstream(), bucket=bucket_name, ttl=None)
    yield publisher
    await publisher.close(withdraw=False)


async def start_service(url: str, bucket: str, **kwargs: Any) -> AdmissionService:
    source = JetStreamDiscoverySource(
        NatsConnectOptions(servers=(url,), reconnect_wait=0.1, max_reconnect_wait=0.5),
        bucket=bucket,
        create_bucket=True,
        health_interval=0.5,
    )
    service = AdmissionService(source, **kwargs)
    await service.start()
    await service.wait_synced(15)
    return service


def group(service: AdmissionService) -> Any:
    return service.status().group(GROUP)


def serving(service: AdmissionService, ids: tuple[int, ...]) -> Callable[[], bool]:
    def check() -> bool:
        g = group(service)
        return g is not None and g.status == "ready" and g.admitted == ids

    return check


async def test_a_registration_becomes_an_admission_with_a_routable_binding(
    nats_server: NatsServer, workers: WorkerRegistrar, bucket_name: str
) -> None:
    await workers.register(EP, 0x1A, OLD)
    service = await start_service(nats_server.url, bucket_name)
    try:
        await eventually(serving(service, (0x1A,)), "the first worker is served")
        await workers.register_endpoint(EP, 0x1A)
        await workers.register(EP, 0x2B, OLD)
        await eventually(serving(service, (0x1A, 0x2B)), "the second worker joins")
        binding = service.binding(GROUP)
        assert binding is not None
        # 2b has no endpoint record yet: admitted but not routable.
        await eventually(lambda: binding.routable() == {0x1A}, "liveness is applied")
        await workers.register_endpoint(EP, 0x2B)
        await eventually(lambda: binding.routable() == {0x1A, 0x2B}, "2b becomes live")
    finally:
        await service.stop()


async def test_a_conflicting_cohort_is_rejected_and_logged_once_at_error(
    nats_server: NatsServer,
    workers: WorkerRegistrar,
    bucket_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="workerset_admission")
    service = await start_service(nats_server.url, bucket_name)
    try:
        await workers.register(EP, 1, OLD)
        await eventually(serving(service, (1,)), "the incumbent is served")
        for instance_id in (2, 3):
            await workers.register(EP, instance_id, NEW)
        await workers.register(EP, 2, NEW)  # a re-sent registration
        await eventually(
            lambda: (
                len(group(service).cohorts) == 2 and group(service).cohorts[1].members == (2, 3)
            ),
            "the rejected cohort is tracked",
        )
        errors = [r for r in caplog.records if "rejected cohort" in r.getMessage()]
        assert len(errors) == 1
        assert errors[0].levelno == logging.ERROR
        assert getattr(errors[0], "instance", None) == "dgd/backend/generate/2"
        assert group(service).admitted == (1,)
    finally:
        await service.stop()


async def test_drain_and_succession_bring_a_new_receiver_and_generation_and_old_receivers_stay_dark(
    nats_server: NatsServer, workers: WorkerRegistrar, bucket_name: str
) -> None:
    service = await start_service(nats_server.url, bucket_name)
    try:
        await workers.register(EP, 1, OLD)
        await workers.register(EP, 2, NEW)
        await eventually(serving(service, (1,)), "v1 is served")
        old_receiver = service.receiver_for(GROUP)
        old_binding = service.binding(GROUP)
        assert old_receiver is not None
        assert old_binding is not None
        seen: list[frozenset[int]] = []

        async def watch() -> None:
            seen.extend([state.admitted async for state in old_receiver])

        watcher = asyncio.create_task(watch())
        await workers.deregister(EP, 1)
        await eventually(serving(service, (2,)), "v2 is served")
        new_binding = service.binding(GROUP)
        assert new_binding is not None
        assert new_binding.id.generation > old_binding.id.generation
        assert new_binding.settings.kv_cache_block_size == 32
        # The old configuration and even the old instance id come back: still not for the old
        # receiver, which is retired for good.
        await workers.register(EP, 1, NEW)
        await eventually(serving(service, (1, 2)), "the returning worker joins v2")
        await asyncio.wait_for(watcher, 5)
        assert all(ids <= {1} for ids in seen)
        with pytest.raises(ReceiverRetired):
            old_receiver.current()
        assert new_binding.admitted() == {1, 2}
    finally:
        await service.stop()


async def test_a_crashed_worker_expires_by_ttl_and_leaves_the_admissions(
    nats_server: NatsServer, client: NatsClient, bucket_name: str
) -> None:
    service = await start_service(nats_server.url, bucket_name)
    steady = WorkerRegistrar(client.jetstream(), bucket=bucket_name, ttl=None)
    crashing = WorkerRegistrar(client.jetstream(), bucket=bucket_name, ttl=1.0, heartbeat=0.3)
    try:
        await steady.register(EP, 1, OLD)
        await crashing.register(EP, 2, OLD)
        await eventually(serving(service, (1, 2)), "both workers are served")
        await crashing.stop_heartbeat()  # the process dies: nobody refreshes its key
        await eventually(serving(service, (1,)), "the crashed worker expires", timeout=20)
    finally:
        await service.stop()
        await crashing.close(withdraw=False)
        await steady.close(withdraw=False)


async def test_a_server_restart_with_the_same_store_keeps_incumbent_order_and_receiver(
    nats_server_fn: NatsServer, bucket_name: str
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    nc = await nats.connect(nats_server_fn.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    workers = WorkerRegistrar(nc.jetstream(), bucket=bucket_name, ttl=None)
    service = await start_service(nats_server_fn.url, bucket_name)
    try:
        await workers.register(EP, 1, OLD)
        await workers.register(EP, 2, NEW)
        await eventually(serving(service, (1,)), "v1 is served")
        await eventually(lambda: len(group(service).cohorts) == 2, "v2 is tracked")
        receiver = service.receiver_for(GROUP)
        assert receiver is not None
        before = group(service)
        snapshots = service.counters.listings
        await asyncio.to_thread(handle.restart)
        await eventually(lambda: service.counters.listings > snapshots, "the watch resyncs", 30)
        after = group(service)
        assert after.incumbent == before.incumbent
        assert after.cohorts == before.cohorts
        assert after.generation == before.generation
        assert receiver.current().admitted == {1}
    finally:
        await service.stop()
        await nc.close()


async def test_a_server_restart_with_a_wiped_store_clears_admissions_and_starts_afresh(
    nats_server_fn: NatsServer, bucket_name: str
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    # The resync after the wipe holds the tenure briefly (its worker might re-register), then
    # the tenure ends.
    service = await start_service(
        nats_server_fn.url, bucket_name, settings=Settings(tenure_hold=1.0)
    )
    nc = await nats.connect(nats_server_fn.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    try:
        workers = WorkerRegistrar(nc.jetstream(), bucket=bucket_name, ttl=None)
        await workers.register(EP, 1, OLD)
        await eventually(serving(service, (1,)), "v1 is served")
        receiver = service.receiver_for(GROUP)
        assert receiver is not None
        await asyncio.to_thread(handle.restart, wipe=True)
        await eventually(lambda: group(service).status == "idle", "the stale worker is gone", 30)
        with pytest.raises(ReceiverRetired):
            receiver.current()
        # The bucket is re-created by the source; a new configuration now reserves the set.
        workers = WorkerRegistrar(nc.jetstream(), bucket=bucket_name, ttl=None)
        await workers.register(EP, 3, NEW)
        await eventually(serving(service, (3,)), "the new worker is served", 30)
    finally:
        await service.stop()
        await nc.close()


async def test_serving_admissions_are_published_per_namespace_and_withdrawn_on_stop(
    nats_server: NatsServer, client: NatsClient, workers: WorkerRegistrar, bucket_name: str
) -> None:
    admission_bucket = f"{bucket_name}-adm"
    publisher = NatsAdmissionPublisher(client.jetstream(), "fe-1", bucket=admission_bucket)
    service = await start_service(nats_server.url, bucket_name, publisher=publisher)
    await workers.register(EP, 0x1A, OLD)
    await workers.register(EP, 0x2B, NEW)
    await eventually(serving(service, (0x1A,)), "v1 is served")
    js = client.jetstream()

    async def record() -> dict[str, Any] | None:
        try:
            kv = await js.key_value(admission_bucket)
            entry = await kv.get("v1.fe-1.members.dgd")
        except Exception:
            return None
        assert entry.value is not None
        value: dict[str, Any] = json.loads(entry.value)
        return value

    async def members() -> list[str] | None:
        value = await record()
        return None if value is None else list(value["members"])

    deadline = time.monotonic() + 10
    while await members() != ["dgd/backend/generate/1a"]:
        assert time.monotonic() < deadline, "the serving record was never written"
        await asyncio.sleep(0.05)
    served = await record()
    assert served is not None
    (served_group,) = served["groups"]
    assert served_group["checksum"] == group(service).incumbent
    assert served_group["generation"] == group(service).committed_generation
    kv = await js.key_value(admission_bucket)
    capability = json.loads((await kv.get("v1.fe-1.capability")).value or b"{}")
    assert capability["capability"] is True
    await service.stop()
    assert await members() is None


async def test_two_frontends_fed_conflicting_orders_keep_their_own_incumbents_and_both_serve(
    nats_server: NatsServer, client: NatsClient
) -> None:
    bucket_a, bucket_b = f"order-a-{time.monotonic_ns()}", f"order-b-{time.monotonic_ns()}"
    first = WorkerRegistrar(client.jetstream(), bucket=bucket_a, ttl=None)
    second = WorkerRegistrar(client.jetstream(), bucket=bucket_b, ttl=None)
    # The services start first: the registrations reach each as live puts, in the order each
    # bucket receives them (a listing would be observed in key order by both).
    service_a = await start_service(nats_server.url, bucket_a)
    service_b = await start_service(nats_server.url, bucket_b)
    for publisher in (first, second):
        for instance_id in (1, 2):
            await publisher.register_endpoint(EP, instance_id)
    await first.register(EP, 1, OLD)
    await first.register(EP, 2, NEW)
    await second.register(EP, 2, NEW)
    await second.register(EP, 1, OLD)
    try:
        await eventually(serving(service_a, (1,)), "frontend A serves its first configuration")
        await eventually(serving(service_b, (2,)), "frontend B serves its first configuration")
        for service in (service_a, service_b):
            await eventually(lambda s=service: len(group(s).cohorts) == 2, "both cohorts seen")
        a, b = group(service_a), group(service_b)
        assert a.incumbent != b.incumbent
        assert a.rejected[0].mdc_checksum == b.incumbent
        assert b.rejected[0].mdc_checksum == a.incumbent
        ready_a = service_a.status().readiness
        ready_b = service_b.status().readiness
        assert [r.ready for r in ready_a] == [True]
        assert [r.ready for r in ready_b] == [True]
    finally:
        await service_a.stop()
        await service_b.stop()
