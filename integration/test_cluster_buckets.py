"""Replicated buckets on a three-node cluster: created once, never changed behind anyone's back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import pytest
from clusterfixture import NatsCluster, nats_cluster, quiet_client
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import StreamInfo
from nats.js.errors import KeyNotFoundError, NotFoundError
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket, stream_name
from workerset_admission.settings import load_settings
from workerset_admission.wiring.compose import create_service

__all__ = ["nats_cluster"]

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

BUCKET = "dynamo-discovery"


async def test_frontends_creating_the_bucket_at_once_get_one_replicated_bucket(
    nats_cluster: NatsCluster,
) -> None:
    # One client per node, as three frontends starting together would be spread.
    clients = [await quiet_client([url]) for url in nats_cluster.urls]
    try:
        spec = BucketSpec(name=BUCKET, replicas=3)
        statuses = await asyncio.gather(
            *(ensure_bucket(client.jetstream(timeout=10), spec) for client in clients)
        )
        assert all(status.mismatches == () for status in statuses)
        assert any(status.created for status in statuses)

        info = await clients[0].jetstream(timeout=10).stream_info(stream_name(BUCKET))
        assert info.config.num_replicas == 3
        assert info.cluster is not None
        assert len(info.cluster.replicas or []) == 2

        # Every frontend reads and writes the same bucket, whichever node it talks to.
        await statuses[0].kv.put("v1.probe", b"written on one node")
        for status in statuses:
            entry = await status.kv.get("v1.probe")
            assert entry.value == b"written on one node"
    finally:
        for client in clients:
            await client.close()


async def test_an_existing_bucket_is_left_as_it_is_and_each_difference_is_reported(
    nats_cluster: NatsCluster, caplog: pytest.LogCaptureFixture
) -> None:
    client = await quiet_client(nats_cluster.urls)
    try:
        js = client.jetstream(timeout=10)
        # The operator made the bucket first, single-replica and with history.
        await ensure_bucket(js, BucketSpec(name=BUCKET, replicas=1, history=5))
        caplog.set_level(logging.WARNING)

        status = await ensure_bucket(js, BucketSpec(name=BUCKET, replicas=3))

        assert not status.created
        assert "replicas is 1, expected 3" in status.mismatches
        assert "history is 5, expected 1" in status.mismatches
        info = await js.stream_info(stream_name(BUCKET))
        assert info.config.num_replicas == 1
        assert info.config.max_msgs_per_subject == 5
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("replicas is 1, expected 3" in message for message in warnings)
        # Asking again with matching settings reports nothing.
        same = await ensure_bucket(js, BucketSpec(name=BUCKET, replicas=1, history=5))
        assert same.mismatches == ()
    finally:
        await client.close()


async def test_a_frontend_configured_for_the_cluster_creates_replicated_buckets_and_names_itself(
    nats_cluster: NatsCluster,
) -> None:
    settings = load_settings(
        flags={
            "nats_servers": ",".join(nats_cluster.urls),
            "bucket_replicas": 3,
            "frontend_id": "fe-east-1",
        },
        env={},
    )
    service = await create_service(settings)
    try:
        await service.wait_synced(30)
        client = await quiet_client(nats_cluster.urls)
        try:
            js = client.jetstream(timeout=10)
            for bucket in (settings.discovery_bucket, settings.admission_bucket):
                info = await _stream_info_when_created(js, stream_name(bucket))
                assert info.config.num_replicas == 3, bucket
            capability = await _value_when_written(
                js, settings.admission_bucket, "v1.fe-east-1.capability"
            )
            assert json.loads(capability)["frontend"] == "fe-east-1"
        finally:
            await client.close()
        assert json.loads(service.render_status())["frontend"] == "fe-east-1"
    finally:
        await service.stop()


async def _stream_info_when_created(js: JetStreamContext, stream: str) -> StreamInfo:
    for _ in range(100):
        with contextlib.suppress(NotFoundError, NatsTimeoutError):
            return await js.stream_info(stream)
        await asyncio.sleep(0.1)
    raise AssertionError(f"{stream} was never created")


async def _value_when_written(js: JetStreamContext, bucket: str, key: str) -> bytes:
    kv = await js.key_value(bucket)
    for _ in range(100):
        # A fresh replicated stream may not answer reads for a moment.
        with contextlib.suppress(KeyNotFoundError, NatsTimeoutError):
            entry = await kv.get(key)
            return entry.value or b""
        await asyncio.sleep(0.1)
    raise AssertionError(f"{key} was never written")
