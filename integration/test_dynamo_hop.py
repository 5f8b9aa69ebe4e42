"""The admitted hop against the real Dynamo 1.6.1 runtime: file discovery, in-process workers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from natsfixture import NatsServer
from support.fakes import handle_all
from support.registrations import reg
from support.workers import (
    InProcessWorker,
    file_discovery_environment,
    write_model_dir,
)
from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge
from workerset_admission.adapters.dynamo.hop import AdmittedHop
from workerset_admission.adapters.nats.bucket_writer import JetStreamBucketWriter
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    Input,
    StartBuild,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.errors import NoRoutableInstance, ReceiverRetired
from workerset_admission.identity import (
    EndpointId,
    GroupKey,
    WorkerType,
    instance_key,
)
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.service.bindings import HopRole
from workerset_admission.service.receivers import AdmissionChannels, AdmissionReceiver

pytestmark = [pytest.mark.dynamo, pytest.mark.integration, pytest.mark.timeout(90)]

runtime = pytest.importorskip(
    "dynamo.runtime",
    reason="the Dynamo tests need ai-dynamo-runtime==1.6.1 (pip install ai-dynamo-runtime==1.6.1)",
)

ENDPOINT = EndpointId("hopns", "backend", "generate")
PATH = f"{ENDPOINT.namespace}.{ENDPOINT.component}.{ENDPOINT.endpoint}"
MODEL = "hop-model"
GROUP = GroupKey.build(MODEL, ENDPOINT, "chat|completions", WorkerType.AGGREGATED)
OLD = "1" * 64
NEW = "2" * 64


@pytest.fixture
def file_discovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point every runtime this test creates at a private file store, on loopback only."""
    environment = file_discovery_environment(tmp_path / "dynamo")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return Path(environment["DYN_FILE_KV"])


@pytest.fixture
async def workers() -> AsyncIterator[list[InProcessWorker]]:
    started: list[InProcessWorker] = []
    yield started
    for worker in started:
        worker.stop()


class _Admission:
    """The real core and admission channels, with every build succeeding at once."""

    def __init__(self) -> None:
        self.core = AdmissionCore()
        self.channels = AdmissionChannels()

    def apply(self, event: Input) -> None:
        pending = [event]
        while pending:
            effects = self.core.apply(pending.pop(0))
            handle_all(self.channels, effects)
            pending.extend(
                BuildFinished(e.group, e.mdc_checksum, e.generation, ok=True)
                for e in effects
                if isinstance(e, StartBuild)
            )

    def add(self, instance_id: int, checksum: str) -> None:
        self.apply(WorkerAdded(reg(instance_id, checksum, group=GROUP, fingerprint="")))

    def remove(self, instance_id: int) -> None:
        self.apply(WorkerRemoved(instance_key(ENDPOINT, instance_id)))

    def receiver(self) -> AdmissionReceiver:
        receiver = self.channels.subscribe(GROUP)
        assert receiver is not None
        return receiver


async def _served_by(hop: AdmittedHop, requests: int) -> set[int]:
    seen: set[int] = set()
    for _ in range(requests):
        async for item in await hop.generate({"prompt": "x"}, annotated=False):
            seen.add(item["served_by"])
    return seen


async def _wait_until(condition: Any, what: str = "discovery", seconds: float = 30) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        value = condition()
        if value:
            return value
        assert loop.time() < deadline, f"{what} did not converge within {seconds} s"
        await asyncio.sleep(0.05)


async def test_hop_routes_to_admitted_instances_across_membership_change_and_succession(
    file_discovery: Path, workers: list[InProcessWorker]
) -> None:
    frontend = runtime.DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    try:
        workers.extend([await InProcessWorker.start(PATH) for _ in range(3)])
        a, b, c = (w.instance_id for w in workers)
        client = await frontend.endpoint(PATH).client()
        await _wait_until(lambda: {a, b, c} <= set(client.instance_ids()))
        admission = _Admission()
        admission.add(a, OLD)
        admission.add(b, OLD)
        admission.add(c, NEW)  # live, but a rejected cohort
        hop = AdmittedHop(client, admission.receiver(), role=HopRole.DECODE)
        first_generation = hop.generation

        assert await _served_by(hop, 12) == {a, b}

        # A compatible membership change: b's card is gone (its endpoint still serves).
        admission.remove(b)
        assert await _served_by(hop, 12) == {a}
        assert hop.generation == first_generation

        # The last incumbent leaves: c's cohort succeeds it under a fresh receiver.
        admission.remove(a)
        with pytest.raises(ReceiverRetired):
            await hop.generate({"prompt": "x"})
        next_hop = AdmittedHop(client, admission.receiver())
        assert next_hop.generation > first_generation
        assert await _served_by(next_hop, 6) == {c}

        # Admitted but no longer live: refused, never widened to the live instances.
        workers[2].stop()
        await _wait_until(lambda: c not in client.instance_ids())
        with pytest.raises(NoRoutableInstance):
            await next_hop.generate({"prompt": "x"})
    finally:
        frontend.shutdown()


async def test_service_bindings_route_dynamo_workers_registered_through_the_bridge(
    file_discovery: Path,
    workers: list[InProcessWorker],
    nats_server: NatsServer,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    """End to end: register_model, file store, bridge, bucket, service, binding, Client.direct."""
    incumbent_files = write_model_dir(tmp_path / "models" / "v1")
    successor_files = write_model_dir(tmp_path / "models" / "v2", context_length=4096)
    nc = await nats.connect(nats_server.url)
    kv = (await ensure_bucket(nc.jetstream(), BucketSpec(name=bucket_name))).kv
    bridge = DiscoveryBridge(file_discovery, JetStreamBucketWriter(kv), interval=0.1)
    stop_bridge = asyncio.Event()
    bridging = asyncio.create_task(bridge.run(stop_bridge))
    service = AdmissionService(
        JetStreamDiscoverySource(NatsConnectOptions(servers=(nats_server.url,)), bucket=bucket_name)
    )
    await service.start()
    frontend = runtime.DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    try:
        workers.extend([await InProcessWorker.start(PATH) for _ in range(3)])
        a, b, c = workers

        def admitted(ids: set[int]) -> Any:
            binding = service.binding(GROUP)
            return binding is not None and binding.admitted() == ids and binding

        def rejected(instance_id: int) -> bool:
            group = service.status().group(GROUP)
            return group is not None and any(instance_id in r.members for r in group.rejected)

        # The first configuration observed is the incumbent: c registers only once a and b are
        # admitted, so which cohort the service sees first never depends on scheduling.
        await a.register(incumbent_files, MODEL)
        await b.register(incumbent_files, MODEL)
        binding = await _wait_until(lambda: admitted({a.instance_id, b.instance_id}), "admission")
        await c.register(successor_files, MODEL)
        await _wait_until(lambda: rejected(c.instance_id), "c's rejection")
        hop = await AdmittedHop.connect(frontend, binding)
        await _wait_until(lambda: len(hop.routable()) == 2, "liveness")
        assert await _served_by(hop, 12) == {a.instance_id, b.instance_id}

        # b withdraws its card but keeps serving: the same hop stops routing to it.
        await b.unregister()
        await _wait_until(lambda: hop.routable() == (a.instance_id,), "b's removal")
        assert await _served_by(hop, 6) == {a.instance_id}

        # a withdraws too: c's configuration succeeds under a new binding.
        await a.unregister()
        successor = await _wait_until(lambda: admitted({c.instance_id}), "succession")
        assert successor.id.generation > binding.id.generation
        with pytest.raises(ReceiverRetired):
            await hop.generate({"prompt": "x"})
        next_hop = await AdmittedHop.connect(frontend, successor)
        await _wait_until(lambda: next_hop.routable() == (c.instance_id,), "c's liveness")
        assert await _served_by(next_hop, 6) == {c.instance_id}
    finally:
        frontend.shutdown()
        await service.stop()
        stop_bridge.set()
        await bridging
        await nc.close()
