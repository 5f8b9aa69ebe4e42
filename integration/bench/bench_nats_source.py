"""How fast the discovery source reads a bucket, next to a bare nats-py ``watchall()``.

A plain script, not a test: ``python integration/bench/bench_nats_source.py [KEYS] [RUNS]``.
It starts a private nats-server (loopback, free port, temporary store), fills a bucket with KEYS
model records of about 1 KB, and times three readers from connect to the end of the initial
values, each decoding every value with ``json.loads``:

* ``watchall``: nats-py's ``KeyValue.watchall()`` up to its end-of-initial-values marker;
* ``source snapshot``: :class:`JetStreamDiscoverySource` up to its first snapshot;
* ``watchall live`` and ``source live``: KEYS puts published by another process after the
  initial values, received and decoded (bounded by that producer on a small machine).

Each figure is the median of RUNS runs. Compare ratios from one run on one machine: client and
server share the CPU, so absolute rates move from machine to machine.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

import nats
from baseline import bare_watchall_seconds, fill_bucket
from nats.js.api import KeyValueConfig
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.ports import SourceListing, SourcePut

BUCKET = "bench-discovery"
PAD = "x" * 900


def record(i: int) -> bytes:
    value = {
        "type": "Model",
        "namespace": "bench",
        "component": "backend",
        "endpoint": "generate",
        "instance_id": i,
        "card_json": {"display_name": "m", "pad": PAD},
    }
    return json.dumps(value, separators=(",", ":")).encode()


def key(i: int) -> str:
    return f"v1.mdc.bench.backend.generate.{i:x}"


async def fill(url: str, count: int, offset: int = 0) -> None:
    await fill_bucket(url, BUCKET, ((key(i), record(i)) for i in range(offset, offset + count)))


async def bare_watchall(url: str, count: int) -> float:
    return count / await bare_watchall_seconds(url, BUCKET, count, timeout=30)


async def source_snapshot(url: str, count: int) -> float:
    start = time.perf_counter()
    source = JetStreamDiscoverySource(NatsConnectOptions(servers=(url,)), bucket=BUCKET)
    events = source.events()
    try:
        snapshot = await anext(events)
        assert isinstance(snapshot, SourceListing)
        for entry in snapshot.entries:
            json.loads(entry.value)
        elapsed = time.perf_counter() - start
    finally:
        await source.close()
        await events.aclose()
    assert len(snapshot.entries) == count, len(snapshot.entries)
    return count / elapsed


async def producer(url: str, count: int, offset: int) -> asyncio.subprocess.Process:
    # A separate process, so the reader's event loop does not also carry the writes.
    return await asyncio.create_subprocess_exec(
        sys.executable, __file__, "produce", url, str(count), str(offset)
    )


async def source_live(url: str, count: int, offset: int) -> float:
    source = JetStreamDiscoverySource(NatsConnectOptions(servers=(url,)), bucket=BUCKET)
    events = source.events()
    try:
        await anext(events)
        process = await producer(url, count, offset)
        start = time.perf_counter()
        seen = 0
        while seen < count:
            event = await anext(events)
            if isinstance(event, SourcePut):
                json.loads(event.entry.value)
                seen += 1
        elapsed = time.perf_counter() - start
        await process.wait()
    finally:
        await source.close()
        await events.aclose()
    return count / elapsed


async def bare_live(url: str, count: int, offset: int) -> float:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(BUCKET)
        watcher = await kv.watchall()
        while await watcher.updates(timeout=30) is not None:  # type: ignore[no-untyped-call]
            pass
        process = await producer(url, count, offset)
        start = time.perf_counter()
        seen = 0
        while seen < count:
            entry = await watcher.updates(timeout=30)  # type: ignore[no-untyped-call]
            json.loads(entry.value)
            seen += 1
        elapsed = time.perf_counter() - start
        await process.wait()
        await watcher.stop()  # type: ignore[no-untyped-call]
    finally:
        await nc.close()
    return count / elapsed


async def main(count: int, runs: int) -> None:
    with EmbeddedNatsServer() as server:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.create_key_value(KeyValueConfig(bucket=BUCKET, history=1))
        await nc.close()
        await fill(server.url, count)
        print(f"nats-server {server.version()}, {count} keys of ~1 KB, median of {runs} runs")
        readers: list[tuple[str, Callable[[str, int], Awaitable[float]]]] = [
            ("watchall + json.loads", bare_watchall),
            ("source snapshot + json.loads", source_snapshot),
        ]
        results: dict[str, float] = {}
        for name, reader in readers:
            rates = [await reader(server.url, count) for _ in range(runs)]
            results[name] = statistics.median(rates)
            print(f"{name:32s} {results[name]:>10,.0f}/s  runs: {[round(r) for r in rates]}")
        ratio = results["source snapshot + json.loads"] / results["watchall + json.loads"]
        print(f"{'snapshot / watchall':32s} {ratio:>10.2f}x")
        # Live rates are bounded by the producer process sharing the same cores.
        offset = 10_000_000
        for name, live_reader in (("watchall live", bare_live), ("source live", source_live)):
            rates = []
            for _ in range(runs):
                offset += count
                rates.append(await live_reader(server.url, count, offset))
            label = f"{name} + json.loads"
            median = statistics.median(rates)
            print(f"{label:32s} {median:>10,.0f}/s  runs: {[round(r) for r in rates]}")


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "produce":
    asyncio.run(fill(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
elif __name__ == "__main__":
    keys = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    asyncio.run(main(keys, repeat))
