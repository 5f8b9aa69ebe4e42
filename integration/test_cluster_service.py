"""The admission service on a three-node cluster: admission works, a node dies, nothing is lost.

The service's state after the fail-over must equal a replay of the bucket's final content (the
same trace ``record`` would write), and its serving-admission records must match what it
serves, so the rollout gate reads the truth after a fail-over too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from clusterfixture import NatsCluster, nats_cluster, read_bucket
from nats.aio.client import Client as NatsClient
from workerset_admission.adapters.nats.admission_publisher import NatsAdmissionPublisher
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket, stream_name
from workerset_admission.adapters.nats.connect import (
    ConnectionCallbacks,
    NatsConnectOptions,
    connect,
)
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.identity import EndpointId
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.settings import Settings
from workerset_admission.traces.replay import replay

__all__ = ["nats_cluster"]

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

DISCOVERY = "dynamo-discovery"
ADMISSION = "frontend-model-admission"
FRONTEND = "fe-cluster"
MODELS = ("model-a", "model-b")
ENDPOINT = EndpointId("prod", "backend", "generate")
# Bounded: enough churn on both sides of the kill to lose something if anything could be lost.
CHANGES = 120
TIMEOUT = 45.0


def card(model: str) -> dict[str, Any]:
    return {
        "display_name": model,
        "slug": model,
        "source_path": model,
        "model_info": None,
        "tokenizer": None,
        "context_length": 4096,
        "kv_cache_block_size": 16,
        "migration_limit": 0,
        "model_type": "Chat | Completions",
        "model_input": "Tokens",
        "worker_type": "aggregated",
        "needs": [],
    }


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
        url = None if client is None else client.connected_url
        return None if url is None else url.port


async def until(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def retried(action: Callable[[], Any], what: str) -> None:
    """Run a write until it succeeds; a write is refused while the stream elects a leader."""
    deadline = time.monotonic() + TIMEOUT
    while not await _succeeds(action):
        assert time.monotonic() < deadline, f"{what} never succeeded"
        await asyncio.sleep(0.1)


async def _succeeds(action: Callable[[], Any]) -> bool:
    try:
        await action()
    except Exception:
        # A refused write may still have been stored; the bucket is the truth either way.
        return False
    return True


def comparable(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What must match between the live service and a replay (ids of receivers may differ)."""
    return sorted(
        (
            {
                "model": g["model"],
                "worker_set": g["worker_set_id"],
                "incumbent": g["incumbent"],
                "status": g["status"],
                "admitted": sorted(g["admitted"]),
                "cohorts": [(c["checksum"], sorted(c["members"])) for c in g["cohorts"]],
            }
            for g in groups
        ),
        key=lambda g: (g["model"], g["worker_set"]),
    )


def live_groups(service: AdmissionService) -> list[dict[str, Any]]:
    # A group whose last member left is gone from a replay; compare what is served.
    return comparable([g.to_json() for g in service.status().groups if g.cohorts])


def replayed_groups(bucket: dict[str, bytes]) -> list[dict[str, Any]]:
    entries = [{"key": key, "value": value.decode()} for key, value in bucket.items()]
    trace = [json.dumps({"kind": "snapshot", "entries": entries})]
    return comparable(replay(trace).to_json()["groups"])


async def matches_bucket(service: AdmissionService, cluster: NatsCluster) -> tuple[Any, Any]:
    """Wait until the live state equals a replay of the bucket; return both for the assert."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        bucket = await read_bucket(cluster.urls, DISCOVERY)
        if bucket is not None:
            expected, actual = replayed_groups(bucket), live_groups(service)
            if expected == actual or time.monotonic() > deadline:
                return expected, actual
        assert time.monotonic() < deadline + 15, "the discovery bucket could not be read"
        await asyncio.sleep(0.25)


async def published_members(cluster: NatsCluster) -> dict[str, list[str]] | None:
    bucket = await read_bucket(cluster.urls, ADMISSION)
    if bucket is None:
        return None
    out: dict[str, list[str]] = {}
    for value in bucket.values():
        record = json.loads(value)
        if record.get("frontend") == FRONTEND and "members" in record:
            out[record["namespace"]] = record["members"]
    return out


@contextlib.asynccontextmanager
async def frontend(
    cluster: NatsCluster,
) -> AsyncIterator[tuple[AdmissionService, TrackedConnector]]:
    options = NatsConnectOptions(servers=tuple(cluster.urls), name=FRONTEND)
    connector = TrackedConnector(options)
    source = JetStreamDiscoverySource(connector=connector, bucket=DISCOVERY, health_interval=1.0)
    publisher_client = await connect(options)
    publisher = NatsAdmissionPublisher(
        publisher_client.jetstream(), FRONTEND, bucket=ADMISSION, min_interval=0.05
    )
    service = AdmissionService(
        source,
        publisher=publisher,
        settings=Settings(publish_interval=0.05, publish_retry=0.2),
    )
    await service.start()
    try:
        await service.wait_synced(TIMEOUT)
        yield service, connector
    finally:
        await service.stop()
        await publisher_client.close()


class Churn:
    """Registers and removes workers of two models in a fixed, repeatable pattern."""

    def __init__(self, workers: WorkerRegistrar) -> None:
        self._workers = workers
        self.step = 0

    async def run(self, count: int) -> None:
        for _ in range(count):
            index = self.step
            self.step += 1
            instance = 0x100 + index % 30
            if index % 5 == 4:
                await retried(
                    lambda i=instance: self._workers.deregister(ENDPOINT, i), f"remove {index}"
                )
            else:
                model = MODELS[instance % 2]
                await retried(
                    lambda i=instance, m=model: self._workers.register(ENDPOINT, i, card(m)),
                    f"register {index}",
                )


async def test_admission_carries_on_when_the_frontends_node_dies_and_comes_back(
    nats_cluster: NatsCluster,
) -> None:
    writer = await connect(NatsConnectOptions(servers=tuple(nats_cluster.urls)))
    try:
        js = writer.jetstream(timeout=5)
        await ensure_bucket(js, BucketSpec(name=DISCOVERY, replicas=3))
        await ensure_bucket(
            js, BucketSpec(name=ADMISSION, replicas=3, limit_marker_ttl=None, max_age=60.0)
        )
        churn = Churn(WorkerRegistrar(js, bucket=DISCOVERY, ttl=None, create_bucket=False))
        await churn.run(20)

        async with frontend(nats_cluster) as (service, connector):
            # Admission works on the cluster: both models admitted, records published.
            expected, actual = await matches_bucket(service, nats_cluster)
            assert actual == expected
            assert {g["model"] for g in actual} == set(MODELS)
            assert all(g["status"] == "ready" and g["admitted"] for g in actual)

            await churn.run(CHANGES // 2)
            port = connector.connected_port()
            victim = next(n.name for n in nats_cluster.nodes if n.client_port == port)
            nats_cluster.kill(victim)
            await churn.run(CHANGES // 2)

            expected, actual = await matches_bucket(service, nats_cluster)
            assert actual == expected
            assert connector.connected_port() != port
            served = {ns: list(keys) for ns, keys in service.serving_members().items()}
            await until_published(nats_cluster, served)

            # The node comes back, catches up, and the service keeps following.
            nats_cluster.restart(victim)
            await nats_cluster.wait_current(stream_name(DISCOVERY))
            await nats_cluster.wait_current(stream_name(ADMISSION))
            await churn.run(20)
            expected, actual = await matches_bucket(service, nats_cluster)
            assert actual == expected
    finally:
        await writer.close()


async def until_published(cluster: NatsCluster, served: dict[str, list[str]]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while (found := await published_members(cluster)) != served:
        assert time.monotonic() < deadline, f"published {found}, serving {served}"
        await asyncio.sleep(0.2)
