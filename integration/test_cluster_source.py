"""The discovery source against a three-node JetStream cluster: a node dies, nothing is lost."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from clusterfixture import NatsCluster, nats_cluster, quiet_client, read_bucket
from nats.aio.client import Client as NatsClient
from nats.js.kv import KeyValue
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket, stream_name
from workerset_admission.adapters.nats.connect import (
    ConnectionCallbacks,
    NatsConnectOptions,
    connect,
)
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.ports import SourceDelete, SourceListing, SourcePut

__all__ = ["nats_cluster"]

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

BUCKET = "dynamo-discovery"
# Bounded on purpose: a few hundred writes spread over the fail-over are enough to show that
# nothing is lost, and keep the test well under a minute on two shared cores.
WRITES = 300
CONVERGE_TIMEOUT = 45.0


@dataclass
class Mirror:
    """What a consumer of the source knows: the latest value per key."""

    state: dict[str, bytes] = field(default_factory=dict)
    snapshots: list[str] = field(default_factory=list)

    async def follow(self, source: JetStreamDiscoverySource) -> None:
        async for event in source.events():
            if isinstance(event, SourceListing):
                self.snapshots.append(event.reason)
                self.state = {entry.key: entry.value for entry in event.entries}
            elif isinstance(event, SourcePut):
                self.state[event.entry.key] = event.entry.value
            elif isinstance(event, SourceDelete):
                self.state.pop(event.key, None)


@dataclass
class TrackedConnector:
    """Opens the source's connections and remembers the latest, to know which node it uses."""

    options: NatsConnectOptions
    clients: list[NatsClient] = field(default_factory=list)

    async def __call__(self, callbacks: ConnectionCallbacks) -> NatsClient:
        client = await connect(self.options, callbacks)
        self.clients.append(client)
        return client

    def connected_port(self) -> int | None:
        client = self.clients[-1] if self.clients else None
        if client is None or client.connected_url is None:
            return None
        return client.connected_url.port


async def bucket_state(cluster: NatsCluster) -> dict[str, bytes] | None:
    return await read_bucket(cluster.urls, BUCKET)


async def write(kv: KeyValue, index: int) -> None:
    """Write one change, retrying while the stream elects a new leader."""
    key = f"v1.mdc.prod.backend.generate.{index % 40:x}"
    deadline = time.monotonic() + CONVERGE_TIMEOUT
    while not await attempt_write(kv, key, index):
        assert time.monotonic() < deadline, f"write {index} never succeeded"
        await asyncio.sleep(0.1)


async def attempt_write(kv: KeyValue, key: str, index: int) -> bool:
    try:
        if index % 7 == 6:
            await kv.delete(key)
        else:
            await kv.put(key, f"value-{index}".encode())
    except Exception:
        # A timed-out write may or may not have been stored; the bucket is the truth either
        # way, and the final comparison reads it.
        return False
    return True


@contextlib.asynccontextmanager
async def following(
    cluster: NatsCluster,
) -> AsyncIterator[tuple[Mirror, TrackedConnector, JetStreamDiscoverySource]]:
    connector = TrackedConnector(NatsConnectOptions(servers=tuple(cluster.urls)))
    source = JetStreamDiscoverySource(connector=connector, bucket=BUCKET, health_interval=1.0)
    mirror = Mirror()
    task = asyncio.create_task(mirror.follow(source))
    try:
        yield mirror, connector, source
    finally:
        await source.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)


async def converged(mirror: Mirror, cluster: NatsCluster) -> dict[str, bytes]:
    """The bucket's content once the mirror equals it, or at the deadline whatever it is."""
    deadline = time.monotonic() + CONVERGE_TIMEOUT
    while True:
        expected = await bucket_state(cluster)
        if expected is not None and (mirror.state == expected or time.monotonic() > deadline):
            return expected
        assert time.monotonic() < deadline + 15, "the bucket could not be read"
        await asyncio.sleep(0.25)


async def wait_for(predicate: object, timeout: float = 10.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


@pytest.mark.rollout  # a node killed under a stream of writes: the slower tier
@pytest.mark.parametrize("victim", ["connected node", "stream leader"])
async def test_the_source_carries_on_through_a_node_failure_and_misses_nothing(
    nats_cluster: NatsCluster, victim: str
) -> None:
    producer = await quiet_client(nats_cluster.urls)
    try:
        js = producer.jetstream(timeout=5)
        status = await ensure_bucket(js, BucketSpec(name=BUCKET, replicas=3))
        kv = status.kv
        for index in range(40):
            await write(kv, index)

        async with following(nats_cluster) as (mirror, connector, _source):
            await wait_for(lambda: mirror.snapshots == ["initial"])
            for index in range(40, WRITES // 2):
                await write(kv, index)

            if victim == "connected node":
                port = connector.connected_port()
                name = next(n.name for n in nats_cluster.nodes if n.client_port == port)
            else:
                name = await nats_cluster.leader_of(stream_name(BUCKET))
            nats_cluster.kill(name)

            for index in range(WRITES // 2, WRITES):
                await write(kv, index)
            expected = await converged(mirror, nats_cluster)
            assert mirror.state == expected
            assert len(expected) > 20

            nats_cluster.restart(name)
            await nats_cluster.wait_current(stream_name(BUCKET))
            for index in range(WRITES, WRITES + 40):
                await write(kv, index)
            expected = await converged(mirror, nats_cluster)
            assert mirror.state == expected
            if victim == "connected node":
                # The connection moved to a surviving node and the watch was re-created.
                assert "reconnect" in mirror.snapshots
    finally:
        await producer.close()
