"""JetStreamDiscoverySource against a real nats-server: snapshot, live changes, restarts."""

from __future__ import annotations

import asyncio
import contextlib

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import KeyValueConfig
from natsfixture import NatsServer
from support.aio import time_limit
from support.buckets import kv_bucket
from workerset_admission.adapters.nats.connect import (
    ConnectionCallbacks,
    NatsConnectOptions,
    connect,
)
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.card import BoundarySettings, decode_model_record, parse_key
from workerset_admission.errors import InvalidRecordError
from workerset_admission.ports import SourceDelete, SourceEvent, SourceListing, SourcePut

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class Collector:
    """Runs a source's event loop in a task and hands events out one at a time."""

    def __init__(self, source: JetStreamDiscoverySource) -> None:
        self.source = source
        self.queue: asyncio.Queue[SourceEvent] = asyncio.Queue()
        self.state: dict[str, bytes] = {}
        self.reasons: list[str] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for event in self.source.events():
            await self.queue.put(event)

    async def next(self, timeout: float = 10.0) -> SourceEvent:
        event = await asyncio.wait_for(self.queue.get(), timeout)
        self._apply(event)
        return event

    def _apply(self, event: SourceEvent) -> None:
        # The state a consumer of the port would hold: a snapshot replaces everything.
        if isinstance(event, SourceListing):
            self.reasons.append(event.reason)
            self.state = {e.key: e.value for e in event.entries}
        elif isinstance(event, SourcePut):
            self.state[event.entry.key] = event.entry.value
        else:
            self.state.pop(event.key, None)

    async def next_snapshot(self, timeout: float = 30.0) -> SourceListing:
        async with time_limit(timeout):
            while True:
                event = await self.next(timeout)
                if isinstance(event, SourceListing):
                    return event

    async def close(self) -> None:
        await self.source.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 10)


def source_for(url: str, bucket: str, **kwargs: object) -> JetStreamDiscoverySource:
    return JetStreamDiscoverySource(
        NatsConnectOptions(servers=(url,), reconnect_wait=0.1, max_reconnect_wait=0.5),
        bucket=bucket,
        **kwargs,  # type: ignore[arg-type]
    )


async def test_initial_values_become_one_listing_then_puts_and_removals_stream_live(
    nats_server: NatsServer, bucket_name: str
) -> None:
    async with kv_bucket(nats_server.url, bucket_name) as kv:
        await kv.put("v1.mdc.ns.backend.generate.1", b'{"a":1}')
        await kv.put("v1.instances.ns.backend.generate.1", b'{"b":1}')
        await kv.put("v1.mdc.ns.backend.generate.2", b'{"a":2}')
        await kv.delete("v1.mdc.ns.backend.generate.2")
        await kv.put("other.key", b"ignored")
        collector = Collector(source_for(nats_server.url, bucket_name))
        try:
            snapshot = await collector.next()
            assert isinstance(snapshot, SourceListing)
            assert snapshot.reason == "initial"
            assert {e.key: e.value for e in snapshot.entries} == {
                "v1.mdc.ns.backend.generate.1": b'{"a":1}',
                "v1.instances.ns.backend.generate.1": b'{"b":1}',
            }

            await kv.put("v1.mdc.ns.backend.generate.3", b'{"a":3}')
            await kv.put("elsewhere.x", b"ignored")
            await kv.delete("v1.mdc.ns.backend.generate.1")
            await kv.purge("v1.instances.ns.backend.generate.1")

            put = await collector.next()
            assert isinstance(put, SourcePut)
            assert put.entry.key == "v1.mdc.ns.backend.generate.3"
            assert put.entry.value == b'{"a":3}'
            assert put.entry.published_at is not None
            deleted = await collector.next()
            assert isinstance(deleted, SourceDelete)
            assert (deleted.key, deleted.operation) == ("v1.mdc.ns.backend.generate.1", "delete")
            purged = await collector.next()
            assert isinstance(purged, SourceDelete)
            assert (purged.key, purged.operation) == ("v1.instances.ns.backend.generate.1", "purge")
            assert deleted.revision < purged.revision
        finally:
            await collector.close()


async def test_a_listing_taken_while_heartbeats_rewrite_keys_still_holds_every_key(
    nats_server: NatsServer, bucket_name: str
) -> None:
    # Workers refresh their registrations all the time, and the bucket keeps one value per key:
    # a key rewritten while a listing is delivered must still be in that listing.
    keys = [f"v1.mdc.ns.backend.generate.{i:x}" for i in range(200)]
    async with kv_bucket(nats_server.url, bucket_name) as kv:
        for key in keys:
            await kv.put(key, b"{}")
        stop = asyncio.Event()

        async def heartbeats() -> int:
            written = 0
            while not stop.is_set() and written < 200_000:
                # Newest first: the keys the listing reaches last are rewritten first.
                await kv.put(keys[-1 - written % len(keys)], b"{}")
                written += 1
            return written

        writer = asyncio.create_task(heartbeats())
        try:
            for _ in range(10):
                collector = Collector(source_for(nats_server.url, bucket_name))
                try:
                    snapshot = await collector.next_snapshot()
                finally:
                    await collector.close()
                assert sorted(e.key for e in snapshot.entries) == sorted(keys)
            # The periodic reconciliation's listing too.
            for _ in range(5):
                source = source_for(nats_server.url, bucket_name)
                try:
                    listed = await source.list_all()
                finally:
                    await source.close()
                assert sorted(e.key for e in listed.entries) == sorted(keys)
        finally:
            stop.set()
        assert await writer > 0


async def test_an_empty_bucket_gives_an_empty_listing_at_once(
    nats_server: NatsServer, bucket_name: str
) -> None:
    async with kv_bucket(nats_server.url, bucket_name):
        collector = Collector(source_for(nats_server.url, bucket_name))
        try:
            snapshot = await collector.next(timeout=5)
            assert isinstance(snapshot, SourceListing)
            assert snapshot.entries == ()
        finally:
            await collector.close()


async def test_a_key_that_ages_out_is_reported_as_expired(
    nats_server: NatsServer, bucket_name: str
) -> None:
    async with kv_bucket(nats_server.url, bucket_name, limit_marker_ttl=5) as kv:
        collector = Collector(source_for(nats_server.url, bucket_name))
        try:
            await collector.next_snapshot()
            await kv.create("v1.instances.ns.c.e.7", b"{}", msg_ttl=1)
            put = await collector.next()
            assert isinstance(put, SourcePut)
            expired = await collector.next(timeout=15)
            assert isinstance(expired, SourceDelete)
            assert (expired.key, expired.operation) == ("v1.instances.ns.c.e.7", "expired")
        finally:
            await collector.close()


async def test_values_over_any_size_and_odd_keys_are_passed_through_untouched(
    nats_server: NatsServer, bucket_name: str
) -> None:
    big = b"x" * 200_000
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket=bucket_name)
        await kv.put("v1.mdc.ns.c.e.b", big)
        await kv.put("v1.mdc.ns.c.e.a:b@c", b"odd", validate_keys=False)
        await kv.put("v1.mdc.ns.c.e.ä*", b"odder", validate_keys=False)
        collector = Collector(source_for(nats_server.url, bucket_name))
        try:
            snapshot = await collector.next()
            assert isinstance(snapshot, SourceListing)
            values = {e.key: e.value for e in snapshot.entries}
            # The source only translates; the card boundary refuses the oversized value, with
            # its key, so the service reports it like any other invalid record.
            with pytest.raises(InvalidRecordError, match="value_too_large") as refused:
                decode_model_record(
                    parse_key("v1.mdc.ns.c.e.b"),
                    values["v1.mdc.ns.c.e.b"],
                    BoundarySettings(max_value_size=100_000),
                )
            assert refused.value.key == "v1.mdc.ns.c.e.b"
            assert values == {
                "v1.mdc.ns.c.e.b": big,
                "v1.mdc.ns.c.e.a:b@c": b"odd",
                "v1.mdc.ns.c.e.ä*": b"odder",
            }
        finally:
            await collector.close()
    finally:
        await nc.close()


async def test_list_all_reads_the_whole_bucket_for_reconciliation(
    nats_server: NatsServer, bucket_name: str
) -> None:
    async with kv_bucket(nats_server.url, bucket_name) as kv:
        for i in range(50):
            await kv.put(f"v1.mdc.ns.c.e.{i:x}", str(i).encode())
        await kv.delete("v1.mdc.ns.c.e.0")
        source = source_for(nats_server.url, bucket_name)
        try:
            listing = await source.list_all()
            assert listing.reason == "periodic"
            assert len(listing.entries) == 49
            assert "v1.mdc.ns.c.e.0" not in {e.key for e in listing.entries}
        finally:
            await source.close()


async def test_a_first_listing_after_the_server_could_not_be_reached_says_so(
    nats_server_fn: NatsServer, bucket_name: str
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    async with kv_bucket(nats_server_fn.url, bucket_name) as kv:
        await kv.put("v1.mdc.ns.c.e.1", b"one")
    # A source that reaches its server at once says nothing of an outage.
    collector = Collector(source_for(nats_server_fn.url, bucket_name))
    try:
        assert not (await collector.next_snapshot()).after_outage
    finally:
        await collector.close()
    # One that starts while the server is down does, on its first listing only.
    await asyncio.to_thread(handle.stop)
    collector = Collector(source_for(nats_server_fn.url, bucket_name))
    try:
        await asyncio.sleep(1.0)  # its first connection fails
        await asyncio.to_thread(handle.start)
        first = await collector.next_snapshot()
        assert (first.reason, first.after_outage) == ("initial", True)
        assert [e.key for e in first.entries] == ["v1.mdc.ns.c.e.1"]
        await asyncio.to_thread(handle.restart, kill=True)
        again = await collector.next_snapshot()
        assert (again.reason, again.after_outage) == ("reconnect", False)
    finally:
        await collector.close()
    # So does one made for a frontend that already found the server away.
    collector = Collector(source_for(nats_server_fn.url, bucket_name, started_in_outage=True))
    try:
        assert (await collector.next_snapshot()).after_outage
    finally:
        await collector.close()


async def test_a_restart_with_the_same_store_gives_a_new_listing_and_loses_nothing(
    nats_server_fn: NatsServer, bucket_name: str
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    async with kv_bucket(nats_server_fn.url, bucket_name) as kv:
        await kv.put("v1.mdc.ns.c.e.1", b"one")
    collector = Collector(source_for(nats_server_fn.url, bucket_name))
    try:
        first = await collector.next_snapshot()
        assert [e.key for e in first.entries] == ["v1.mdc.ns.c.e.1"]
        await asyncio.to_thread(handle.restart, kill=True)
        async with kv_bucket(nats_server_fn.url, bucket_name) as kv:
            await kv.put("v1.mdc.ns.c.e.2", b"two")
        async with time_limit(30):
            while not (
                collector.reasons.count("reconnect") and "v1.mdc.ns.c.e.2" in collector.state
            ):
                await collector.next()
        assert collector.state == {"v1.mdc.ns.c.e.1": b"one", "v1.mdc.ns.c.e.2": b"two"}
    finally:
        await collector.close()


async def test_a_restart_with_a_wiped_store_drops_the_stale_keys(
    nats_server_fn: NatsServer, bucket_name: str
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    async with kv_bucket(nats_server_fn.url, bucket_name) as kv:
        await kv.put("v1.mdc.ns.c.e.1", b"stale")
        await kv.put("v1.mdc.ns.c.e.2", b"stale")
    collector = Collector(source_for(nats_server_fn.url, bucket_name))
    try:
        first = await collector.next_snapshot()
        assert len(first.entries) == 2
        await asyncio.to_thread(handle.restart, wipe=True)
        async with kv_bucket(nats_server_fn.url, bucket_name) as kv:
            await kv.put("v1.mdc.ns.c.e.3", b"fresh")
        async with time_limit(30):
            while True:
                snapshot = await collector.next_snapshot()
                keys = {e.key for e in snapshot.entries}
                if "v1.mdc.ns.c.e.3" in keys or not keys:
                    break
        assert snapshot.reason == "reconnect"
        assert "v1.mdc.ns.c.e.1" not in keys
        assert "v1.mdc.ns.c.e.2" not in keys
    finally:
        await collector.close()


async def test_a_bucket_deleted_and_re_created_under_a_live_watch_is_noticed(
    nats_server: NatsServer, bucket_name: str
) -> None:
    async with kv_bucket(nats_server.url, bucket_name) as kv:
        await kv.put("v1.mdc.ns.c.e.1", b"old")
        await kv.put("v1.mdc.ns.c.e.2", b"old")
    collector = Collector(source_for(nats_server.url, bucket_name, health_interval=0.3))
    try:
        first = await collector.next_snapshot()
        assert len(first.entries) == 2
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            await js.delete_key_value(bucket_name)
            kv = await js.create_key_value(KeyValueConfig(bucket=bucket_name))
            await kv.put("v1.mdc.ns.c.e.3", b"new")
        finally:
            await nc.close()
        async with time_limit(20):
            while collector.state != {"v1.mdc.ns.c.e.3": b"new"}:
                await collector.next()
        assert collector.reasons == ["initial", "reconnect"]
    finally:
        await collector.close()


async def test_a_connection_closed_for_good_is_replaced_by_a_new_one(
    nats_server: NatsServer, bucket_name: str
) -> None:
    clients: list[NatsClient] = []
    options = NatsConnectOptions(servers=(nats_server.url,))

    async def connector(callbacks: ConnectionCallbacks) -> NatsClient:
        client = await connect(options, callbacks)
        clients.append(client)
        return client

    async with kv_bucket(nats_server.url, bucket_name) as kv:
        await kv.put("v1.mdc.ns.c.e.1", b"one")
        collector = Collector(JetStreamDiscoverySource(connector=connector, bucket=bucket_name))
        try:
            await collector.next_snapshot()
            await clients[0].close()
            second = await collector.next_snapshot()
            assert second.reason == "reconnect"
            assert [e.key for e in second.entries] == ["v1.mdc.ns.c.e.1"]
            assert len(clients) == 2
            await kv.put("v1.mdc.ns.c.e.2", b"two")
            put = await collector.next()
            assert isinstance(put, SourcePut)
            assert put.entry.key == "v1.mdc.ns.c.e.2"
        finally:
            await collector.close()
        assert all(c.is_closed for c in clients)


async def test_a_missing_bucket_is_waited_for_and_then_read(
    nats_server: NatsServer, bucket_name: str
) -> None:
    collector = Collector(
        source_for(nats_server.url, bucket_name, bind_retry_initial=0.05, bind_retry_max=0.2)
    )
    try:
        with pytest.raises(TimeoutError):
            await collector.next(timeout=0.5)
        async with kv_bucket(nats_server.url, bucket_name) as kv:
            await kv.put("v1.instances.ns.c.e.1", b"{}")
        snapshot = await collector.next_snapshot()
        assert [e.key for e in snapshot.entries] == ["v1.instances.ns.c.e.1"]
    finally:
        await collector.close()


async def test_a_source_started_while_the_server_is_down_reads_it_once_it_is_up(
    nats_server_fn: NatsServer, bucket_name: str
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    async with kv_bucket(nats_server_fn.url, bucket_name) as kv:
        await kv.put("v1.mdc.ns.c.e.1", b"one")
    handle.stop()
    collector = Collector(
        source_for(nats_server_fn.url, bucket_name, bind_retry_initial=0.05, bind_retry_max=0.3)
    )
    try:
        with pytest.raises(TimeoutError):
            await collector.next(timeout=1.0)
        await asyncio.to_thread(handle.start)
        snapshot = await collector.next_snapshot()
        assert snapshot.reason == "initial"
        assert [e.key for e in snapshot.entries] == ["v1.mdc.ns.c.e.1"]
    finally:
        await collector.close()


async def test_a_slow_reader_with_a_tiny_queue_still_receives_every_change(
    nats_server: NatsServer, bucket_name: str
) -> None:
    async with kv_bucket(nats_server.url, bucket_name, history=64) as kv:
        source = source_for(nats_server.url, bucket_name, queue_size=4)
        events = source.events()
        try:
            snapshot = await asyncio.wait_for(anext(events), 10)
            assert isinstance(snapshot, SourceListing)
            writes = [kv.put(f"v1.mdc.ns.c.e.{i % 50:x}", str(i).encode()) for i in range(1000)]
            writer = asyncio.gather(*writes)
            seen: dict[str, bytes] = {}
            revisions: list[int] = []
            async with time_limit(30):
                while len(revisions) < 1000:
                    event = await anext(events)
                    assert isinstance(event, SourcePut)
                    seen[event.entry.key] = event.entry.value
                    revisions.append(event.entry.revision)
                    if len(revisions) % 100 == 0:
                        await asyncio.sleep(0.05)  # a reader that falls behind now and then
            await writer
            assert revisions == sorted(revisions)
            assert len(set(revisions)) == 1000
            latest = {k: (await kv.get(k)).value for k in seen}
            assert len(seen) == 50
            assert seen == latest
        finally:
            await source.close()
            await events.aclose()
