"""A periodic relist is spared when the watch missed nothing; a namespace watch gets only its own.

Against a real nats-server: the source's watch of the discovery bucket, its consumer asked of
the server, and a full service whose reconciliation counts the listings it applied.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import KeyValueConfig
from natsfixture import NatsServer
from support.aio import eventually, time_limit
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.kv import stream_name
from workerset_admission.adapters.nats.source import (
    JetStreamDiscoverySource,
    namespace_key_prefixes,
)
from workerset_admission.ports import SourceEvent, SourceListing, SourcePut

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def until_true(check: Callable[[], Awaitable[bool]], what: str) -> None:
    for _ in range(100):
        if await check():
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"{what}: not within 10 s")


def source_for(url: str, bucket: str, **kwargs: object) -> JetStreamDiscoverySource:
    return JetStreamDiscoverySource(
        NatsConnectOptions(servers=(url,), reconnect_wait=0.1, max_reconnect_wait=0.5),
        bucket=bucket,
        **kwargs,  # type: ignore[arg-type]
    )


class Events:
    """The source's events, read in a task."""

    def __init__(self, source: JetStreamDiscoverySource) -> None:
        self.source = source
        self.queue: asyncio.Queue[SourceEvent] = asyncio.Queue()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for event in self.source.events():
            await self.queue.put(event)

    async def next(self, timeout: float = 10.0) -> SourceEvent:
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def close(self) -> None:
        await self.source.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 10)


async def test_a_watch_that_took_in_everything_spares_the_relist_and_one_that_did_not_does_not(
    nats_server: NatsServer, client: NatsClient, bucket_name: str
) -> None:
    js = client.jetstream()
    kv = (await ensure_bucket(js, BucketSpec(name=bucket_name))).kv
    await kv.put("v1.mdc.ns.c.e.1", b"{}")
    events = Events(source_for(nats_server.url, bucket_name, idle_heartbeat=0.5))
    try:
        assert isinstance(await events.next(), SourceListing)
        # Quiet once the consumer's idle heartbeat has said it sent what arrived.
        await until_true(events.source.missed_nothing, "the watch is quiet")
        for n in range(2, 12):
            await kv.put(f"v1.mdc.ns.c.e.{n:x}", b"{}")
        # Deliveries since the last heartbeat: not shown yet that nothing is pending.
        assert not await events.source.missed_nothing()
        async with time_limit(10):
            for _ in range(10):
                assert isinstance(await events.next(), SourcePut)
        await until_true(events.source.missed_nothing, "the watch is quiet again")

        # The consumer is deleted behind the watch: the watch is re-created, with a listing
        # of its own (the reconciliation the relist would have been), and is quiet after it.
        watch = events.source._watch
        assert watch is not None
        await js.delete_consumer(stream_name(bucket_name), watch.consumer)
        assert isinstance(await events.next(15), SourceListing)
        assert events.source._watch is not watch
        await until_true(events.source.missed_nothing, "the new watch is quiet")
        # Nothing the watch missed is taken for quiet: a heartbeat naming a consumer
        # sequence that never arrived breaks the watch instead (the raw path's check).
        new = events.source._watch
        assert new is not None
        new.next_consumer_seq += 1  # as if one delivery had been lost on the way
        assert not await events.source.missed_nothing()
    finally:
        await events.close()


async def test_on_a_bucket_whose_keys_expire_without_a_marker_a_silent_expiry_is_relisted(
    nats_server: NatsServer, client: NatsClient, bucket_name: str
) -> None:
    js = client.jetstream()
    kv = await js.create_key_value(KeyValueConfig(bucket=bucket_name, ttl=4.0))
    await kv.put("v1.mdc.ns.c.e.1", b"{}")
    events = Events(source_for(nats_server.url, bucket_name, idle_heartbeat=0.5))
    try:
        assert isinstance(await events.next(), SourceListing)
        await asyncio.sleep(0.8)  # the consumer's first idle heartbeat
        # The first check has nothing to compare the stream with; the next, at rest, does.
        assert not await events.source.missed_nothing()
        assert await events.source.missed_nothing()
        await asyncio.sleep(5.0)  # the key ages out, and no watch hears of it
        assert events.queue.empty()
        assert not await events.source.missed_nothing()
        assert await events.source.missed_nothing()
    finally:
        await events.close()


async def test_a_namespace_watch_receives_only_its_namespaces_records(
    nats_server: NatsServer, client: NatsClient, bucket_name: str
) -> None:
    kv = (await ensure_bucket(client.jetstream(), BucketSpec(name=bucket_name))).kv
    ours = [
        "v1.mdc.ns-a.c.e.1",
        "v1.instances.ns-a.c.e.1",
        "v1.drain.ns-a.1",
        "v1.event_sources.namespace.ns-a.topic.t.1",
    ]
    theirs = ["v1.mdc.ns-b.c.e.2", "v1.instances.ns-b.c.e.2", "v1.mdc.ns-ab.c.e.3"]
    for key in ours[:2] + theirs[:2]:
        await kv.put(key, b"{}")
    source = source_for(nats_server.url, bucket_name, key_prefixes=namespace_key_prefixes("ns-a"))
    events = Events(source)
    try:
        listing = await events.next()
        assert isinstance(listing, SourceListing)
        assert sorted(e.key for e in listing.entries) == sorted(ours[:2])
        for key in [*theirs, *ours[2:]]:
            await kv.put(key, b"{}")
        received = []
        async with time_limit(10):
            while len(received) < 2:
                event = await events.next()
                assert isinstance(event, SourcePut)
                received.append(event.entry.key)
        assert received == ours[2:]
        await asyncio.sleep(0.3)
        assert events.queue.empty()  # nothing of another namespace arrived behind them
        # The server sent this frontend's consumer only its namespace's messages.
        watch = source._watch
        assert watch is not None
        info = await client.jetstream().consumer_info(stream_name(bucket_name), watch.consumer)
        assert info.delivered.stream_seq == watch.last_seen_seq
        assert info.delivered.consumer_seq == 4
    finally:
        await events.close()


def test_namespace_prefixes_escape_the_namespace_as_keys_do() -> None:
    assert namespace_key_prefixes("a.b")[0] == "v1.mdc.a=2Eb"


async def test_a_service_at_rest_applies_no_periodic_listing_and_relists_once_one_may_be_due(
    nats_server: NatsServer, client: NatsClient, bucket_name: str
) -> None:
    from workerset_admission.settings import Settings
    from workerset_admission.wiring.compose import create_service

    await ensure_bucket(client.jetstream(), BucketSpec(name=bucket_name))
    settings = Settings(discovery_bucket=bucket_name, reconcile_interval=0.2)
    service = await create_service(settings, servers=[nats_server.url], publish=False, status=False)
    try:
        await service.wait_synced(10)
        await asyncio.sleep(6.0)  # the watch consumer's first idle heartbeat (every 5 s)
        applied = service.counters.listings
        await asyncio.sleep(1.5)  # seven reconciliation periods at rest
        assert service.counters.listings == applied
        # The watch's consumer is gone: the next period cannot show nothing was missed.
        source = service._source
        assert isinstance(source, JetStreamDiscoverySource)
        watch = source._watch
        assert watch is not None
        await client.jetstream().delete_consumer(stream_name(bucket_name), watch.consumer)
        await eventually(lambda: service.counters.listings > applied, "a relist")
    finally:
        await service.stop()
