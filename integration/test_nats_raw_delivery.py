"""The watch's two delivery paths against a real nats-server: same events, flow control, gaps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NatsClient
from natsfixture import NatsServer
from support.aio import eventually, time_limit
from support.buckets import kv_bucket
from workerset_admission.adapters.nats.connect import (
    ConnectionCallbacks,
    NatsConnectOptions,
    connect,
)
from workerset_admission.adapters.nats.kv import stream_name
from workerset_admission.adapters.nats.raw_delivery import RawDeliveryClient
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.ports import SourceDelete, SourceEvent, SourceListing, SourcePut

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def plain_connector(url: str):  # type: ignore[no-untyped-def]
    """A connector handing the source an ordinary nats-py client (the callback path)."""

    async def open_plain(callbacks: ConnectionCallbacks) -> NatsClient:
        client = NatsClient()
        await client.connect(
            servers=[url],
            disconnected_cb=callbacks.disconnected,
            reconnected_cb=callbacks.reconnected,
            closed_cb=callbacks.closed,
            error_cb=callbacks.error,
        )
        return client

    return open_plain


def raw_connector(url: str):  # type: ignore[no-untyped-def]
    options = NatsConnectOptions(servers=(url,), reconnect_wait=0.1, max_reconnect_wait=0.5)

    async def open_raw(callbacks: ConnectionCallbacks) -> NatsClient:
        return await connect(options, callbacks)

    return open_raw


async def drain(events: AsyncIterator[SourceEvent], count: int) -> list[SourceEvent]:
    async with time_limit(60):
        return [await events.__anext__() for _ in range(count)]


@pytest.mark.parametrize("path", ["raw", "callback"])
async def test_both_delivery_paths_give_the_same_listing_and_live_events(
    nats_server: NatsServer, bucket_name: str, path: str
) -> None:
    connector = (raw_connector if path == "raw" else plain_connector)(nats_server.url)
    async with kv_bucket(nats_server.url, bucket_name) as kv:
        for i in range(1, 301):
            await kv.put(f"v1.mdc.ns.c.e.{i:x}", f'{{"n":{i}}}'.encode())
        await kv.delete("v1.mdc.ns.c.e.3")
        await kv.put("other.key", b"ignored")
        source = JetStreamDiscoverySource(connector=connector, bucket=bucket_name)
        events = source.events().__aiter__()
        try:
            (snapshot,) = await drain(events, 1)
            assert isinstance(snapshot, SourceListing)
            assert source._watch is not None
            assert source._watch.raw is (path == "raw")
            assert len(snapshot.entries) == 299
            assert {e.key for e in snapshot.entries} == {
                f"v1.mdc.ns.c.e.{i:x}" for i in range(1, 301) if i != 3
            }
            await kv.put("v1.instances.ns.c.e.1", b"{}")
            await kv.delete("v1.mdc.ns.c.e.1")
            await kv.purge("v1.mdc.ns.c.e.2")
            put, deleted, purged = await drain(events, 3)
            assert isinstance(put, SourcePut)
            assert (put.entry.key, put.entry.value) == ("v1.instances.ns.c.e.1", b"{}")
            assert isinstance(deleted, SourceDelete)
            assert (deleted.key, deleted.operation) == ("v1.mdc.ns.c.e.1", "delete")
            assert isinstance(purged, SourceDelete)
            assert (purged.key, purged.operation) == ("v1.mdc.ns.c.e.2", "purge")
            listing = await source.list_all()
            assert len(listing.entries) == 298
            assert source.restarts == 0
        finally:
            await source.close()


async def test_a_live_burst_past_the_queue_is_held_back_by_flow_control_and_arrives_whole(
    nats_server: NatsServer, bucket_name: str
) -> None:
    count = 12_000
    async with kv_bucket(nats_server.url, bucket_name) as kv:
        source = JetStreamDiscoverySource(
            connector=raw_connector(nats_server.url), bucket=bucket_name, queue_size=50
        )
        events = source.events().__aiter__()
        try:
            await drain(events, 1)
            publisher = await nats.connect(nats_server.url)
            try:
                js = publisher.jetstream()
                for start in range(0, count, 500):
                    await asyncio.gather(
                        *(
                            js.publish(f"$KV.{bucket_name}.v1.mdc.ns.c.e.{i:x}", b"x" * 200)
                            for i in range(start, start + 500)
                        )
                    )
            finally:
                await publisher.close()
            watch = source._watch
            assert watch is not None
            assert watch.raw
            # Nobody reads: the server must stop at its flow-control window, well short of
            # the whole burst, with the watch holding back its answer.
            await eventually(lambda: bool(watch.held_replies), "a flow-control answer is held", 30)
            queued = watch.queue.qsize()
            await asyncio.sleep(0.5)
            assert watch.queue.qsize() == queued < count
            received = await drain(events, count)
            keys = [e.entry.key for e in received if isinstance(e, SourcePut)]
            assert keys == [f"v1.mdc.ns.c.e.{i:x}" for i in range(count)]
            assert watch.held_replies == []
            assert source.restarts == 0
            await kv.put("v1.mdc.ns.c.e.last", b"y")
            (last,) = await drain(events, 1)
            assert isinstance(last, SourcePut)
            assert last.entry.key == "v1.mdc.ns.c.e.last"
        finally:
            await source.close()


async def test_a_consumer_removed_under_a_raw_watch_is_noticed_and_the_watch_re_created(
    nats_server: NatsServer, bucket_name: str
) -> None:
    async with kv_bucket(nats_server.url, bucket_name) as kv:
        await kv.put("v1.mdc.ns.c.e.1", b"one")
        source = JetStreamDiscoverySource(
            connector=raw_connector(nats_server.url),
            bucket=bucket_name,
            idle_heartbeat=0.2,
            health_interval=0.2,
        )
        events = source.events().__aiter__()
        try:
            (first,) = await drain(events, 1)
            assert isinstance(first, SourceListing)
            assert first.reason == "initial"
            admin = await nats.connect(nats_server.url)
            try:
                jsm = admin.jsm()
                (consumer,) = await jsm.consumers_info(stream_name(bucket_name))
                await jsm.delete_consumer(stream_name(bucket_name), consumer.name)
                await kv.put("v1.mdc.ns.c.e.2", b"two")
            finally:
                await admin.close()
            # No consumer, no heartbeats: two silent checks in a row and the watch is re-created,
            # and its listing has what was written meanwhile.
            (again,) = await drain(events, 1)
            assert isinstance(again, SourceListing)
            assert again.reason == "reconnect"
            assert sorted(e.key for e in again.entries) == ["v1.mdc.ns.c.e.1", "v1.mdc.ns.c.e.2"]
            assert source.restarts == 1
            assert isinstance(source._nc, RawDeliveryClient)
        finally:
            await source.close()
