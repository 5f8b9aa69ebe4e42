"""A periodic relist is spared when the watch missed nothing; a namespace watch gets only its own.

Against a real nats-server: the source's watch of the discovery bucket, its consumer asked of
the server, and a full service whose reconciliation counts the listings it applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
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
from workerset_admission.identity import EndpointId
from workerset_admission.keys import endpoint_kv_key, model_kv_key
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
        # The watch's own listing accounts for the stream as it found it: nothing to relist.
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


async def quiet_answer(source: JetStreamDiscoverySource) -> bool:
    """Wait until the watch's idle heartbeat has confirmed it took in all, then ask once."""
    for _ in range(100):
        watch = source._watch
        if watch is not None and watch.confirmed_idle(time.monotonic(), source._idle_heartbeat):
            return await source.missed_nothing()
        await asyncio.sleep(0.1)
    pytest.fail("the watch was not confirmed idle within 10 s")


async def test_a_quiet_check_lists_once_after_any_change_a_removal_without_a_marker_included(
    nats_server: NatsServer, client: NatsClient, bucket_name: str
) -> None:
    js = client.jetstream()
    kv = (await ensure_bucket(js, BucketSpec(name=bucket_name))).kv
    stream = stream_name(bucket_name)
    for n in range(1, 4):
        await kv.put(f"v1.mdc.ns.c.e.{n}", b"{}")
    await kv.put("other.key", b"outside the watch's filters, and left alone")
    events = Events(source_for(nats_server.url, bucket_name, idle_heartbeat=0.5))
    try:
        assert isinstance(await events.next(), SourceListing)
        assert await quiet_answer(events.source)
        # New keys, a rewrite, a removal with its marker: listed once, then accounted for.
        await kv.put("v1.mdc.ns.c.e.4", b"{}")
        await kv.put("v1.mdc.ns.c.e.1", b'{"again": 1}')
        await kv.delete("v1.mdc.ns.c.e.2")
        async with time_limit(10):
            for _ in range(3):
                await events.next()
        assert not await quiet_answer(events.source)
        assert await quiet_answer(events.source)
        assert await quiet_answer(events.source)

        # A subject purged through the stream's own API leaves no marker and reaches no watch.
        await js.purge_stream(stream, subject=f"$KV.{bucket_name}.v1.mdc.ns.c.e.3")
        assert not await quiet_answer(events.source)
        assert await quiet_answer(events.source)  # accounted for from the relist on
        # A write outside the watch's filters is not one the watch can account for.
        await kv.put("other.key", b"rewritten")
        assert not await quiet_answer(events.source)
        assert await quiet_answer(events.source)
        assert events.queue.empty()
    finally:
        await events.close()


async def test_the_bucket_is_listed_after_the_full_relist_interval_however_quiet_it_is(
    nats_server: NatsServer, client: NatsClient, bucket_name: str
) -> None:
    kv = (await ensure_bucket(client.jetstream(), BucketSpec(name=bucket_name))).kv
    await kv.put("v1.mdc.ns.c.e.1", b"{}")
    source = source_for(nats_server.url, bucket_name, idle_heartbeat=0.5, full_relist_interval=2.0)
    events = Events(source)
    try:
        assert isinstance(await events.next(), SourceListing)
        started = time.monotonic()
        answers = []
        while time.monotonic() - started < 3.0:
            answers.append(await quiet_answer(source))
            await asyncio.sleep(0.2)
        # Spared while the interval runs, listed once it has passed, then spared again.
        assert answers[0]
        assert answers[-1]
        assert answers.count(False) == 1
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


@pytest.mark.rollout
async def test_a_workers_records_purged_without_a_marker_leave_admission_within_the_period(
    nats_server: NatsServer, client: NatsClient, bucket_name: str
) -> None:
    from support.fleet import Fleet, card
    from workerset_admission.settings import Settings
    from workerset_admission.wiring.compose import create_service

    js = client.jetstream()
    kv = (await ensure_bucket(js, BucketSpec(name=bucket_name))).kv
    ep = EndpointId("ns-purge", "backend", "generate")
    await Fleet(kv).register(ep, [1, 2], card())
    settings = Settings(discovery_bucket=bucket_name, reconcile_interval=0.5)
    service = await create_service(settings, servers=[nats_server.url], publish=False, status=False)

    def members() -> tuple[str, ...]:
        return service.serving_members().get("ns-purge", ())

    try:
        await service.wait_synced(10)
        await eventually(lambda: len(members()) == 2, "both workers served")
        await asyncio.sleep(6.0)  # the watch consumer's first idle heartbeat (every 5 s)
        applied = service.counters.listings
        await asyncio.sleep(2.0)  # four reconciliation periods at rest
        assert service.counters.listings == applied  # the checks read no listing
        held = members()

        # An operator purges one worker's records by subject: no marker, no watch event.
        for key in (model_kv_key(ep, 2), endpoint_kv_key(ep, 2)):
            await js.purge_stream(stream_name(bucket_name), subject=f"$KV.{bucket_name}.{key}")
        purged = time.monotonic()
        await eventually(lambda: len(members()) == 1, "the purged worker leaves admission")
        # Within a period of the watch's next idle heartbeat (the heartbeat every 5 s).
        assert time.monotonic() - purged < 5.0 + 2 * 0.5 + 1.0
        assert set(members()) < set(held)
        assert service.counters.listings > applied
        # And at rest again, nothing more is listed.
        await asyncio.sleep(6.0)
        relisted = service.counters.listings
        await asyncio.sleep(2.0)
        assert service.counters.listings == relisted
    finally:
        await service.stop()
