"""Peers' served checksums attached to the listings a frontend starts or resyncs from."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import weakref
from collections.abc import AsyncIterator

import pytest
from support.fakes import FakeSource, settle
from workerset_admission.adapters.nats import peers as peers_module
from workerset_admission.adapters.nats.peers import (
    PeerListings,
    members_served_by_peers,
    peers_resynced_ago,
    served_by_peers,
)
from workerset_admission.card.serving_record import BucketRead, RawEntry
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.ports import (
    DiscoveryEntry,
    ListingPeers,
    SourceEvent,
    SourceListing,
    SourcePut,
)
from workerset_admission.service.admission_service import AdmissionService


def record(frontend: str, checksum: str, members: list[str]) -> RawEntry:
    value = {
        "protocol": "v1",
        "frontend": frontend,
        "namespace": "ns",
        "members": members,
        "groups": [
            {
                "model": "m",
                "worker_set": "ws",
                "checksum": checksum,
                "generation": 1,
                "members": members,
            }
        ],
    }
    return RawEntry(f"v1.{frontend}.members.ns", json.dumps(value).encode())


BUCKET = BucketRead(
    entries=(
        record("fe-1", "A", ["ns/c/e/1"]),
        record("fe-2", "A", ["ns/c/e/1"]),
        record("fe-3", "B", ["ns/c/e/3"]),
        record("me", "C", ["ns/c/e/4"]),
        record("fe-4", "D", []),
        RawEntry("v1.fe-5.members.ns", b"not json"),
    )
)


def test_every_other_frontend_serving_a_group_counts_once() -> None:
    assert served_by_peers(BUCKET, "me") == {("m", "ws"): ("A", "A", "B")}


class Reader:
    def __init__(self, read: BucketRead | Exception) -> None:
        self.read_result = read
        self.reads = 0

    async def read(self) -> BucketRead:
        self.reads += 1
        if isinstance(self.read_result, Exception):
            raise self.read_result
        return self.read_result


class Listed:
    """A source that yields the events it was given, then ends."""

    def __init__(self, *events: SourceEvent) -> None:
        self._events = events

    async def events(self) -> AsyncIterator[SourceEvent]:
        for event in self._events:
            yield event

    async def list_all(self) -> SourceListing:
        return SourceListing((), reason="periodic")

    async def close(self) -> None:
        return None


class Attached:
    """A ``ListingPeers`` that notes every listing the service hands it."""

    def __init__(self) -> None:
        self.handed: list[SourceListing] = []

    async def attach(self, listing: SourceListing) -> SourceListing:
        self.handed.append(listing)
        return listing


def test_peer_listings_are_the_services_listing_peers() -> None:
    assert isinstance(PeerListings(Reader(BUCKET), "me"), ListingPeers)


async def test_initial_and_reconnect_listings_carry_the_peers() -> None:
    reader = Reader(BUCKET)
    peers = PeerListings(reader, "me")
    for reason in ("initial", "reconnect"):
        listing = SourceListing((), reason=reason)  # type: ignore[arg-type]
        attached = await peers.attach(listing)
        assert attached.peers == {("m", "ws"): ("A", "A", "B")}
        assert (attached.reason, attached.entries) == (reason, listing.entries)
    assert reader.reads == 2


async def test_only_the_sources_initial_and_reconnect_listings_reach_the_peers() -> None:
    # Live updates and the periodic reconciliation's listings never wait on the peers.
    source = FakeSource()
    source.listing = [DiscoveryEntry("v1.mdc.ns.c.e.1", b"{}", 1)]
    peers = Attached()
    service = AdmissionService(source, peers=peers)
    await service.start()
    try:
        initial, reconnect = SourceListing(()), SourceListing((), reason="reconnect")
        source.queue.put_nowait(initial)
        source.queue.put_nowait(SourcePut(DiscoveryEntry("k", b"v", 1)))
        source.queue.put_nowait(reconnect)
        await settle(lambda: service.counters.listings == 2 and service.counters.puts == 1)
        assert await service.reconcile()
        assert service.counters.listings == 3
        assert peers.handed == [initial, reconnect]
        assert all(a is b for a, b in zip(peers.handed, (initial, reconnect), strict=True))
    finally:
        await service.stop()


async def test_the_service_applies_the_listing_with_what_the_peers_attached() -> None:
    source = FakeSource()
    service = AdmissionService(source, peers=PeerListings(Reader(BUCKET), "me"))
    steps: list[object] = []
    service.subscribe(type("Heard", (), {"heard": lambda self, r: steps.append(r.came_in)})())
    await service.start()
    try:
        source.queue.put_nowait(SourceListing(()))
        await settle(lambda: service.synced)
        (listing,) = steps
        assert isinstance(listing, SourceListing)
        assert listing.peers == {("m", "ws"): ("A", "A", "B")}
    finally:
        await service.stop()


async def test_a_bucket_that_cannot_be_read_leaves_the_listing_without_peers() -> None:
    for failure in (ConnectionError("away"), BucketRead(problem="no server")):
        attached = await PeerListings(Reader(failure), "me").attach(SourceListing(()))
        assert attached.peers is None
        assert (attached.peer_members, attached.peers_resynced_ago) == (None, None)


async def test_a_bucket_that_cannot_be_read_is_said_at_warning_with_what_the_listing_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for failure in (ConnectionError("away"), BucketRead(problem="no server")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=peers_module.__name__):
            attached = await PeerListings(Reader(failure), "me").attach(SourceListing(()))
        assert attached.peers is None
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(said) == 1
        assert said[0].startswith("could not read the peers' serving records (")
        assert said[0].endswith("); the listing goes on without what they serve")
        assert ("away" in said[0]) == isinstance(failure, Exception)


class _Entries(list[DiscoveryEntry]):
    """A listing's entries that a weak reference can follow."""


async def test_a_listing_applied_is_not_held_while_the_next_event_is_awaited() -> None:
    # A listing carries every raw value of the bucket: kept until the next change arrives, it
    # would double what a quiet fleet costs. The peers' copy of it is let go as well.
    handed = [SourceListing(_Entries([DiscoveryEntry("k", b"v", 1)]))]
    held = weakref.ref(handed[0].entries)
    more = asyncio.Event()

    class Waiting(Listed):
        async def events(self) -> AsyncIterator[SourceEvent]:
            yield handed.pop()
            await more.wait()
            yield SourcePut(DiscoveryEntry("k", b"w", 2))

    service = AdmissionService(Waiting(), peers=PeerListings(Reader(BUCKET), "me"))
    await service.start()
    try:
        await settle(lambda: service.synced)
        await asyncio.sleep(0)
        gc.collect()
        assert held() is None
        more.set()
        await settle(lambda: service.counters.puts == 1)
    finally:
        await service.stop()


def _served(frontend: str, worker_set: str, checksum: str, members: list[str]) -> RawEntry:
    entry = record(frontend, checksum, members)
    value = json.loads(entry.value)
    value["groups"][0]["worker_set"] = worker_set
    return RawEntry(entry.key, json.dumps(value).encode())


def test_the_members_each_checksum_is_served_with_are_read_as_instance_ids() -> None:
    ws = GroupKey.build("m", EndpointId("ns", "c", "e"), "chat", WorkerType.DECODE).worker_set
    read = BucketRead(
        entries=(
            _served("fe-1", ws, "A", ["ns/c/e/10", "ns/c/e/1f"]),
            _served("fe-2", ws, "A", ["ns/c/e/10", "ns/c/e/2a"]),
            # Not of this group's endpoint, not an id, or this frontend's own: left out.
            _served("fe-3", ws, "B", ["other/c/e/3", "ns/c/e/zz", "ns/c/e/4"]),
            _served("me", ws, "C", ["ns/c/e/5"]),
            record("fe-4", "D", ["ns/c/e/6"]),  # a worker_set that names no endpoint
        )
    )
    assert members_served_by_peers(read, "me") == {("m", ws): {"A": (0x10, 0x1F, 0x2A), "B": (4,)}}


async def test_listings_carry_the_peers_members_beside_their_checksums() -> None:
    ws = GroupKey.build("m", EndpointId("ns", "c", "e"), "chat", WorkerType.DECODE).worker_set
    read = BucketRead(entries=(_served("fe-1", ws, "A", ["ns/c/e/10"]),))
    seen = await PeerListings(Reader(read), "me").attach(SourceListing((), after_outage=True))
    assert (seen.peers, seen.peer_members, seen.after_outage) == (
        {("m", ws): ("A",)},
        {("m", ws): {"A": (0x10,)}},
        True,
    )


def _capability(
    frontend: str,
    resynced_at: object = None,
    *,
    server_at: float | None = None,
    stored_at: float | None = None,
) -> RawEntry:
    value: dict[str, object] = {"protocol": "v1", "capability": True, "frontend": frontend}
    if resynced_at is not None:
        value["resynced_at"] = resynced_at
    if server_at is not None or stored_at is not None:
        value["liveness"] = "heartbeat"
    if server_at is not None:
        value["resynced_server_at"] = server_at
    return RawEntry(f"v1.{frontend}.capability", json.dumps(value).encode(), stored_at)


def _heartbeat(frontend: str) -> RawEntry:
    value = {"protocol": "v1", "frontend": frontend, "heartbeat": True}
    return RawEntry(f"v1.{frontend}.heartbeat", json.dumps(value).encode())


def test_the_latest_peer_resync_of_an_older_writer_is_read_against_this_hosts_clock() -> None:
    read = BucketRead(
        entries=(
            _capability("fe-1", 1000.0),
            _capability("fe-2", 1010.5),
            _capability("fe-3"),
            _capability("me", 2000.0),  # this frontend's own, from before it restarted
            _capability("fe-4", "yesterday"),  # refused: not a time
        )
    )
    assert peers_resynced_ago(read, "me", wall=1020.5) == 10.0
    assert peers_resynced_ago(BucketRead(entries=(_capability("fe-3"),)), "me", 1.0) is None


def test_a_peer_resync_is_read_on_the_servers_clock_whatever_the_hosts_clocks_say() -> None:
    # The peer's clock is two minutes ahead, this host's two minutes behind: neither is read.
    for wall in (880.0, 1000.0, 1120.0):
        learned = BucketRead(
            entries=(_capability("fe-1", 1120.0, server_at=1000.0), _heartbeat("fe-1")),
            server_time=1004.0,
        )
        assert peers_resynced_ago(learned, "me", wall) == 4.0
        # Before the writer learned the server's time, the record's own store time says it.
        first = BucketRead(
            entries=(_capability("fe-1", 880.0, stored_at=1001.0), _heartbeat("fe-1")),
            server_time=1004.0,
        )
        assert peers_resynced_ago(first, "me", wall) == 3.0


def test_a_stopped_peer_says_nothing_of_a_resync() -> None:
    # Its records said liveness is the heartbeat, and the heartbeat is gone.
    read = BucketRead(entries=(_capability("fe-1", 1000.0, server_at=1000.0),), server_time=1001.0)
    assert peers_resynced_ago(read, "me", 1001.0) is None


async def test_listings_say_how_long_ago_a_peer_resynced() -> None:
    read = BucketRead(entries=(_capability("fe-1", 1000.0),))
    for now, ago in ((1004.0, 4.0), (990.0, 0.0)):  # a peer clock ahead of ours: just now
        peers = PeerListings(Reader(read), "me", wall=lambda now=now: now)
        assert (await peers.attach(SourceListing(()))).peers_resynced_ago == ago


async def test_the_servers_clock_is_carried_on_from_the_last_read_that_said_it() -> None:
    wall = [5000.0]
    peers = PeerListings(Reader(BucketRead(server_time=4000.0)), "me", wall=lambda: wall[0])
    assert peers.server_now() is None  # not read yet
    await peers.attach(SourceListing(()))
    # The server runs 1000 s behind this host; an hour later it still does.
    assert peers.server_now() == 4000.0
    wall[0] += 3600.0
    assert peers.server_now() == 7600.0


def test_a_peer_holding_a_tenure_with_nobody_served_counts_with_the_members_it_waits_for() -> None:
    ws = GroupKey.build("m", EndpointId("ns", "c", "e"), "chat", WorkerType.DECODE).worker_set
    entry = _served("fe-1", ws, "A", [])
    value = json.loads(entry.value)
    value["groups"][0]["held"] = ["ns/c/e/10", "ns/c/e/11"]
    read = BucketRead(entries=(RawEntry(entry.key, json.dumps(value).encode()),))
    assert served_by_peers(read, "me") == {("m", ws): ("A",)}
    assert members_served_by_peers(read, "me") == {("m", ws): {"A": (0x10, 0x11)}}
    # Without them, a group nobody is served on says nothing, as before.
    bare = BucketRead(entries=(_served("fe-1", ws, "A", []),))
    assert served_by_peers(bare, "me") == {}
