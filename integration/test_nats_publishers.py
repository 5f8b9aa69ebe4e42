"""Discovery and admission publishers against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from natsfixture import NatsServer
from support.aio import time_limit
from support.buckets import live_keys
from workerset_admission.adapters.nats.admission_publisher import (
    NatsAdmissionPublisher,
    admission_keys,
    heartbeat_key,
)
from workerset_admission.adapters.nats.admission_reader import NatsRecordSource
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket, stream_name
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.peers import members_served_by_peers, peers_resynced_ago
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.card import parse_key
from workerset_admission.card.serving_record import live_records, parse_record
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.ports import SourceDelete, SourceListing, SourcePut
from workerset_admission.rollout.drain import Worker, check_drained

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ENDPOINT = EndpointId("dgd-v1", "backend", "generate")
CARD = {"display_name": "m", "service_name": "m"}


async def test_a_registration_is_a_dynamo_model_record_under_its_escaped_key(
    client: NatsClient, bucket_name: str
) -> None:
    publisher = WorkerRegistrar(client.jetstream(), bucket=bucket_name, ttl=None)
    endpoint = EndpointId("team a", "backend", "generate")
    key = await publisher.register(endpoint, 0xABC, CARD, suffix="my-lora")
    endpoint_key = await publisher.register_endpoint(endpoint, 0xABC)
    assert key == "v1.mdc.team=20a.backend.generate.abc.my-lora"
    parsed = parse_key(key)
    assert (parsed.endpoint, parsed.instance_id, parsed.model_suffix) == (
        endpoint,
        0xABC,
        "my-lora",
    )
    kv = await client.jetstream().key_value(bucket_name)
    record = json.loads((await kv.get(key)).value)
    assert record["type"] == "Model"
    assert record["instance_id"] == 0xABC
    assert record["card_json"] == CARD
    assert record["model_suffix"] == "my-lora"
    assert json.loads((await kv.get(endpoint_key)).value)["type"] == "Endpoint"

    await publisher.deregister(endpoint, 0xABC, "my-lora", endpoint_record=True)
    with pytest.raises(KeyNotFoundError):
        await kv.get(key)
    with pytest.raises(KeyNotFoundError):
        await kv.get(endpoint_key)
    await publisher.close()


async def test_a_heartbeat_keeps_a_registration_alive_and_a_crash_lets_it_expire(
    nats_server: NatsServer, client: NatsClient, bucket_name: str
) -> None:
    publisher = WorkerRegistrar(client.jetstream(), bucket=bucket_name, ttl=1, heartbeat=0.3)
    source = JetStreamDiscoverySource(
        NatsConnectOptions(servers=(nats_server.url,)), bucket=bucket_name
    )
    events = source.events()
    try:
        key = await publisher.register(
            ENDPOINT, 7, CARD, headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        )
        snapshot = await asyncio.wait_for(anext(events), 10)
        assert isinstance(snapshot, SourceListing)
        assert [e.key for e in snapshot.entries] == [key]
        assert (snapshot.entries[0].headers or {}).get("traceparent", "").startswith("00-111")
        # Three TTLs pass; the heartbeat's refreshes arrive as puts, never as a removal.
        refreshes: list[SourcePut] = []
        async with time_limit(3):
            while len(refreshes) < 5:
                event = await anext(events)
                assert isinstance(event, SourcePut), event
                refreshes.append(event)
        # The watch can see a refresh before the publisher has its acknowledgement and counts it.
        for _ in range(100):
            if publisher.refreshes >= 5:
                break
            await asyncio.sleep(0.02)
        assert publisher.refreshes >= 5

        await publisher.stop_heartbeat()
        async with time_limit(10):
            while True:
                event = await anext(events)
                if isinstance(event, SourceDelete):
                    break
        assert (event.key, event.operation) == (key, "expired")
    finally:
        await publisher.close()
        await source.close()
        await events.aclose()


async def test_a_heartbeat_never_revives_a_key_deleted_elsewhere(
    client: NatsClient, bucket_name: str
) -> None:
    publisher = WorkerRegistrar(client.jetstream(), bucket=bucket_name, ttl=3, heartbeat=0.2)
    try:
        key = await publisher.register(ENDPOINT, 9, CARD)
        kv = await client.jetstream().key_value(bucket_name)
        await kv.delete(key)
        await asyncio.sleep(0.8)
        with pytest.raises(KeyNotFoundError):
            await kv.get(key)
        assert key not in publisher.keys
        assert publisher.lost == {key: "deleted"}
        assert publisher.lost_event.is_set()
    finally:
        await publisher.close()


async def test_a_publisher_told_to_reregister_writes_a_deleted_key_again_with_a_warning(
    client: NatsClient, bucket_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    publisher = WorkerRegistrar(
        client.jetstream(), bucket=bucket_name, ttl=3, heartbeat=0.2, on_removed="reregister"
    )
    try:
        key = await publisher.register(ENDPOINT, 10, CARD)
        kv = await client.jetstream().key_value(bucket_name)
        for round_ in range(1, 3):
            await kv.delete(key)
            for _ in range(100):
                if publisher.reregistrations >= round_:
                    break
                await asyncio.sleep(0.1)
            await wait_until_exists(kv, key, wanted=True)
        assert publisher.reregistrations == 2
        assert publisher.lost == {}
        assert "was deleted while this worker is alive" in caplog.text
    finally:
        await publisher.close()


async def test_a_key_another_writer_took_over_is_given_up_and_reported_never_overwritten(
    client: NatsClient, bucket_name: str
) -> None:
    publisher = WorkerRegistrar(
        client.jetstream(), bucket=bucket_name, ttl=3, heartbeat=0.2, on_removed="reregister"
    )
    try:
        key = await publisher.register(ENDPOINT, 11, CARD)
        kv = await client.jetstream().key_value(bucket_name)
        await kv.put(key, b"someone else's record")
        await asyncio.wait_for(publisher.lost_event.wait(), 10)
        assert publisher.lost == {key: "taken"}
        await asyncio.sleep(0.5)
        assert (await kv.get(key)).value == b"someone else's record"
    finally:
        await publisher.close(withdraw=False)


async def test_an_existing_bucket_is_bound_as_is_and_a_mismatch_is_reported(
    client: NatsClient, bucket_name: str
) -> None:
    js = client.jetstream()
    first = await ensure_bucket(js, BucketSpec(name=bucket_name, history=1))
    assert first.created
    again = await ensure_bucket(js, BucketSpec(name=bucket_name, history=1))
    assert not again.created
    assert again.mismatches == ()
    other = await ensure_bucket(js, BucketSpec(name=bucket_name, history=5, limit_marker_ttl=None))
    assert not other.created
    assert any("history" in m for m in other.mismatches)
    assert any("limit_marker_ttl" in m for m in other.mismatches)
    info = await js.stream_info(f"KV_{bucket_name}")
    assert info.config.max_msgs_per_subject == 1


async def test_admission_records_are_coalesced_published_and_withdrawn(
    client: NatsClient, bucket_name: str
) -> None:
    js = client.jetstream()
    publisher = NatsAdmissionPublisher(js, "fe 1", bucket=bucket_name, min_interval=0.2)
    await publisher.publish_capability()
    for n in range(20):
        await publisher.publish_members(
            "dgd-v1", [f"dgd-v1/backend/generate/{i:x}" for i in range(n + 1)]
        )
    await publisher.publish_members(
        "dgd-v2",
        ["dgd-v2/backend/generate/a"],
        groups=[
            {
                "model": "m",
                "worker_set": "[]",
                "checksum": "c",
                "generation": 3,
                "members": ["dgd-v2/backend/generate/a"],
            }
        ],
    )
    await asyncio.wait_for(publisher.flushed(), 5)
    assert publisher.write_rounds <= 2

    kv = await js.key_value(bucket_name)
    keys = await live_keys(kv)
    assert keys == [
        "v1.fe=201.capability",
        "v1.fe=201.heartbeat",
        "v1.fe=201.members.dgd-v1",
        "v1.fe=201.members.dgd-v2",
    ]
    capability = json.loads((await kv.get("v1.fe=201.capability")).value)
    assert capability == {
        "protocol": "v1",
        "capability": True,
        "frontend": "fe 1",
        "liveness": "heartbeat",
    }
    v1 = json.loads((await kv.get("v1.fe=201.members.dgd-v1")).value)
    assert v1["protocol"] == "v1"
    assert v1["frontend"] == "fe 1"
    assert v1["namespace"] == "dgd-v1"
    assert len(v1["members"]) == 20
    v2 = json.loads((await kv.get("v1.fe=201.members.dgd-v2")).value)
    assert v2["groups"][0]["generation"] == 3

    await publisher.publish_members("dgd-v1", [])
    await asyncio.wait_for(publisher.flushed(), 5)
    with pytest.raises(KeyNotFoundError):
        await kv.get("v1.fe=201.members.dgd-v1")

    await publisher.withdraw_all()
    assert await live_keys(kv) == []


async def test_at_rest_only_the_heartbeat_is_written_and_a_crash_ends_liveness_not_content(
    nats_server: NatsServer, client: NatsClient, bucket_name: str
) -> None:
    frontend = await nats.connect(nats_server.url)
    publisher = NatsAdmissionPublisher(
        frontend.jetstream(), "fe-crash", bucket=bucket_name, min_interval=0.05, record_ttl=1.5
    )
    capability_key, member_key = admission_keys("fe-crash")
    records = (capability_key, member_key("dgd-v1"))
    beat = heartbeat_key("fe-crash")
    try:
        await publisher.publish_capability()
        await publisher.publish_members("dgd-v1", ["dgd-v1/backend/generate/1"])
        await asyncio.wait_for(publisher.flushed(), 5)
        assert publisher.leased
        kv = await client.jetstream().key_value(bucket_name)
        written = [(await kv.get(key)).revision for key in records]
        beats = publisher.heartbeats
        await asyncio.sleep(3.5)  # more than two heartbeat TTLs at rest
        # The content was not written again and is still there; the heartbeat was.
        assert [(await kv.get(key)).revision for key in records] == written
        assert publisher.heartbeats - beats >= 4
        assert await exists(kv, beat)
        assert await live_frontends(client, bucket_name) == {"fe-crash"}

        await frontend.close()  # the frontend is gone without withdrawing anything
        gone_at = asyncio.get_running_loop().time()
        await wait_until_exists(kv, beat, wanted=False)
        # Seen dead within the heartbeat's TTL (plus the server's expiry sweep), as records
        # expiring by the bucket's max age were.
        assert asyncio.get_running_loop().time() - gone_at < 1.5 + 1.5
        assert await live_frontends(client, bucket_name) == set()
        assert [await exists(kv, key) for key in records] == [True, True]
    finally:
        with contextlib.suppress(Exception):
            await publisher.withdraw_all()
        await frontend.close()


async def live_frontends(client: NatsClient, bucket: str) -> set[str]:
    """The frontends every reader takes for live, read as the gate reads the bucket."""
    kv = await client.jetstream().key_value(bucket)
    records = []
    for key in await live_keys(kv):
        entry = await kv.get(key)
        if entry.value:
            records.append(parse_record(key, entry.value))
    return {record.frontend for record in live_records(records)}


async def test_a_record_removed_behind_the_publishers_back_is_written_again_at_once(
    client: NatsClient, bucket_name: str
) -> None:
    js = client.jetstream()
    publisher = NatsAdmissionPublisher(
        js, "fe-a", bucket=bucket_name, min_interval=0.05, audit_interval=None
    )
    _capability, member_key = admission_keys("fe-a")
    try:
        await publisher.publish_capability()
        await publisher.publish_members("dgd-v1", ["dgd-v1/backend/generate/1"])
        await asyncio.wait_for(publisher.flushed(), 5)
        kv = await js.key_value(bucket_name)
        written = (await kv.get(member_key("dgd-v1"))).value
        await asyncio.sleep(0.3)  # the watch of its own keys is in place
        await kv.delete(member_key("dgd-v1"))
        await wait_until_exists(kv, member_key("dgd-v1"), wanted=True, timeout=2.0)
        assert (await kv.get(member_key("dgd-v1"))).value == written
        await kv.purge(member_key("dgd-v1"))
        await wait_until_exists(kv, member_key("dgd-v1"), wanted=True, timeout=2.0)
    finally:
        await publisher.withdraw_all()


async def test_a_bucket_recreated_empty_has_every_record_written_again(
    client: NatsClient, bucket_name: str
) -> None:
    js = client.jetstream()
    publisher = NatsAdmissionPublisher(
        js, "fe-a", bucket=bucket_name, min_interval=0.05, audit_interval=0.2
    )
    capability_key, member_key = admission_keys("fe-a")
    wanted = {capability_key, member_key("dgd-v1"), heartbeat_key("fe-a")}
    try:
        await publisher.publish_capability()
        await publisher.publish_members("dgd-v1", ["dgd-v1/backend/generate/1"])
        await asyncio.wait_for(publisher.flushed(), 5)
        await js.delete_key_value(bucket_name)
        await ensure_bucket(js, BucketSpec(name=bucket_name, max_age=None))
        kv = await js.key_value(bucket_name)
        for key in wanted:
            await wait_until_exists(kv, key, wanted=True, timeout=5.0)
    finally:
        await publisher.withdraw_all()


async def exists(kv: KeyValue, key: str) -> bool:
    # nats-py's get() hands back a server-placed expiry marker as an entry with an empty value;
    # a registration always has one.
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return False
    return bool(entry.value)


async def stored_messages(client: NatsClient, bucket: str) -> int:
    """How many records the bucket's stream holds, read atomically on the server."""
    info = await client.jetstream().stream_info(stream_name(bucket))
    return info.state.messages


async def wait_until_exists(kv: KeyValue, key: str, wanted: bool, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.1)):
        if await exists(kv, key) == wanted:
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"{key} {'never appeared' if wanted else 'never went away'}")


async def test_a_registration_that_aged_out_during_an_outage_is_written_again(
    client: NatsClient, bucket_name: str
) -> None:
    publisher = WorkerRegistrar(client.jetstream(), bucket=bucket_name, ttl=1, heartbeat=0.2)
    try:
        key = await publisher.register(ENDPOINT, 0x51, CARD)
        kv = await client.jetstream().key_value(bucket_name)
        await publisher.stop_heartbeat()  # the outage: no refresh reaches the server
        await wait_until_exists(kv, key, wanted=False)
        await publisher.register(ENDPOINT, 0x52, CARD)  # the publisher is back and beating
        await wait_until_exists(kv, key, wanted=True)
        assert json.loads((await kv.get(key)).value)["instance_id"] == 0x51
        assert key in publisher.keys
    finally:
        await publisher.close()


async def test_a_resync_is_read_on_the_servers_clock_whatever_the_writers_clock_says(
    nats_server: NatsServer, client: NatsClient, bucket_name: str
) -> None:
    js = client.jetstream()
    peer = NatsAdmissionPublisher(js, "fe-peer", bucket=bucket_name, min_interval=0.05)
    options = NatsConnectOptions(servers=(nats_server.url,))
    try:
        for skew in (-120.0, 120.0):
            # The peer's host clock is two minutes off when it says it resynced.
            await peer.publish_capability(resynced_at=time.time() + skew)
            await asyncio.wait_for(peer.flushed(), 5)
            await asyncio.sleep(1.0)
            read = await NatsRecordSource(options, bucket_name).read()
            assert read.server_time is not None
            assert abs(read.server_time - time.time()) < 5  # the same host's server
            for wall in (time.time() - 120, time.time() + 120):  # the reader's clock, off too
                ago = peers_resynced_ago(read, "fe-new", wall)
                assert ago is not None
                assert 0.9 <= ago < 4.0, (skew, wall, ago)
    finally:
        await peer.withdraw_all()


async def test_a_tenure_held_with_nobody_served_keeps_its_record_for_a_starting_peer(
    nats_server: NatsServer, client: NatsClient, bucket_name: str
) -> None:
    peer = NatsAdmissionPublisher(client.jetstream(), "fe-peer", bucket=bucket_name)
    options = NatsConnectOptions(servers=(nats_server.url,))
    ws = GroupKey.build("m", ENDPOINT, "chat", WorkerType.DECODE).worker_set
    group = {"model": "m", "worker_set": ws, "checksum": "A", "generation": 1, "members": []}
    held = ["dgd-v1/backend/generate/10", "dgd-v1/backend/generate/11"]
    try:
        await peer.publish_capability()
        await peer.publish_members("dgd-v1", [], groups=[{**group, "held": held}])
        await asyncio.wait_for(peer.flushed(), 5)
        read = await NatsRecordSource(options, bucket_name).read()
        # A frontend starting now reserves A for the workers the peer's hold waits for...
        assert members_served_by_peers(read, "fe-new") == {("m", ws): {"A": (0x10, 0x11)}}
        # ...and a drain of them waits for nobody: the peer routes to none.
        records = [parse_record(e.key, e.value, e.published_at) for e in read.entries]
        assert check_drained(records, [Worker("dgd-v1", 0x10)]).safe
        # Once nothing is held, the record is withdrawn.
        await peer.publish_members("dgd-v1", [], groups=[{**group, "held": []}])
        await asyncio.wait_for(peer.flushed(), 5)
        kv = await client.jetstream().key_value(bucket_name)
        with pytest.raises(KeyNotFoundError):
            await kv.get("v1.fe-peer.members.dgd-v1")
    finally:
        await peer.withdraw_all()
