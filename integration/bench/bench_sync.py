"""The admission service against a bare nats-py watch: sync, resync, latency and memory.

A plain script: ``python integration/bench/bench_sync.py [--max-workers N] [--runs R]``. It starts
a private nats-server (loopback, free port, temporary store) and measures:

* initial sync: registrations per second from start to "first snapshot applied" (decoded,
  hashed, admitted, receivers notified), next to a bare ``KeyValue.watchall()`` with
  ``json.loads`` per value up to its end-of-initial-values marker over the same bucket. Two
  fleets: every worker shares one card text, or every card text differs (each worker reports
  its own KV capacity, which the checksum ignores, so all still join one cohort). Fleet sizes
  1k to ``--max-workers``;
* reconciliation after a server restart with nothing changed: time from the server being back
  to the reconnect snapshot being applied, against the bare sync time, and whether any receiver
  was notified (none should be);
* publish-to-receiver latency at a steady 1,000 updates per second: each update is a new
  compatible worker, timed from the publish to the moment the group's receiver shows its id;
* Python heap held per tracked worker (traced with ``tracemalloc``, after a full collection) once
  each shared-card fleet is synced, and again before the restart above.

The largest fleet's figures come from ``--runs`` pairs of runs (bare and service back to back,
alternating which goes first); its ratio is the median of the pairs' ratios and its rates the
medians of each side. Smaller fleets run one pair. Compare ratios, not absolute rates: client
and server share the machine's cores, and other work on the machine slows both sides alike.
Results go to ``integration/bench/results/bench_sync.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import gc
import json
import os
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

import nats
from baseline import bare_watchall_seconds, fill_bucket
from nats.js.api import KeyValueConfig
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.card import encode_model_record, model_kv_key
from workerset_admission.identity import EndpointId
from workerset_admission.service.admission_service import AdmissionService

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
    "runtime_config": {
        "total_kv_blocks": 4096,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
        "tool_call_parser": "hermes",
        "reasoning_parser": "qwen3",
        "data_parallel_start_rank": 0,
        "data_parallel_size": 1,
        "enable_local_indexer": True,
        "enable_eagle": False,
    },
}
SIZES = (1_000, 10_000, 50_000)
LATENCY_SECONDS = 5.0
# The targets' floors and ceilings, read by run.py; ratios are service over bare nats-py.
TARGETS = {"sync_shared_ratio": 2.0, "sync_distinct_ratio": 1.0, "p99_ms": 5.0, "p50_ms": 1.0}


def card_for(i: int, distinct: bool) -> dict[str, Any]:
    if not distinct:
        return CARD
    card = copy.deepcopy(CARD)
    card["runtime_config"]["total_kv_blocks"] = 4096 + i
    return card


def records(count: int, distinct: bool, offset: int = 0) -> list[tuple[str, bytes]]:
    shared = None if distinct else json.dumps(CARD, separators=(",", ":"))
    return [
        (
            model_kv_key(EP, i),
            encode_model_record(EP, i, shared if shared is not None else card_for(i, True)),
        )
        for i in range(offset + 1, offset + count + 1)
    ]


def new_service(url: str, bucket: str) -> AdmissionService:
    source = JetStreamDiscoverySource(
        NatsConnectOptions(servers=(url,), reconnect_wait=0.05, max_reconnect_wait=0.2),
        bucket=bucket,
    )
    return AdmissionService(source)


async def plugin_sync(url: str, bucket: str, count: int) -> float:
    """Seconds from starting the service to its first snapshot being applied."""
    start = time.perf_counter()
    service = new_service(url, bucket)
    await service.start()
    try:
        await service.wait_synced(120)
        elapsed = time.perf_counter() - start
        groups = service.core.groups()
        assert sum(len(c.members) for g in groups for c in g.cohorts) == count
    finally:
        await service.stop()
    return elapsed


async def heap_growth(url: str, bucket: str, count: int) -> int:
    """Bytes of Python heap a synced service holds for ``count`` workers (traced, collected)."""
    gc.collect()
    # Traced heap, not RSS: the process's RSS would hide reuse of memory freed earlier.
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        service = new_service(url, bucket)
        await service.start()
        try:
            await service.wait_synced(120)
            gc.collect()
            return int(tracemalloc.get_traced_memory()[0] - before)
        finally:
            await service.stop()
    finally:
        tracemalloc.stop()


async def sync_rates(
    url: str, sizes: tuple[int, ...], runs: int, memory: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Initial sync rates per fleet; with ``memory``, also the heap held per shared fleet."""
    rows = []
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        for distinct in (False, True):
            for size in sizes:
                bucket = f"sync-{'distinct' if distinct else 'shared'}-{size}"
                await js.create_key_value(KeyValueConfig(bucket=bucket, history=1))
                await fill_bucket(url, bucket, records(size, distinct))
                # Only the largest fleet is repeated: it is the figure the targets apply to.
                # Bare and plugin runs alternate, each pair back to back and in turn first, so
                # a change in the machine's load between runs hits both sides of a pair.
                repeat = runs if size == sizes[-1] else 1
                bare: list[float] = []
                plugin: list[float] = []
                for round_ in range(repeat):
                    if round_ % 2:
                        plugin.append(await plugin_sync(url, bucket, size))
                        bare.append(await bare_watchall_seconds(url, bucket, size))
                    else:
                        bare.append(await bare_watchall_seconds(url, bucket, size))
                        plugin.append(await plugin_sync(url, bucket, size))
                if memory is not None and not distinct:
                    held = await heap_growth(url, bucket, size)
                    memory.append(
                        {
                            "workers": size,
                            "heap_bytes": held,
                            "per_worker_bytes": round(held / size),
                        }
                    )
                    print(f"heap {size:>6,} workers: {held / 2**20:.1f} MiB", flush=True)
                await js.delete_key_value(bucket)
                row = {
                    "fleet": "distinct" if distinct else "shared",
                    "workers": size,
                    "bare_rate": size / statistics.median(bare),
                    "plugin_rate": size / statistics.median(plugin),
                    "bare_runs_s": [round(t, 3) for t in bare],
                    "plugin_runs_s": [round(t, 3) for t in plugin],
                }
                # The median of the pairs' ratios: robust to load that shifts during the run.
                row["pair_ratios"] = [round(b / p, 3) for b, p in zip(bare, plugin, strict=True)]
                row["ratio"] = statistics.median(b / p for b, p in zip(bare, plugin, strict=True))
                rows.append(row)
                print(
                    f"sync {row['fleet']:8s} {size:>6,}  bare {row['bare_rate']:>8,.0f}/s  "
                    f"plugin {row['plugin_rate']:>8,.0f}/s  ratio {row['ratio']:.2f}",
                    flush=True,
                )
    finally:
        await nc.close()
    return rows


async def resync_and_memory(server: EmbeddedNatsServer, size: int) -> dict[str, Any]:
    """Restart the server under a synced service: time the resync, count notifications."""
    url = server.url
    bucket = "resync"
    nc = await nats.connect(url)
    await nc.jetstream().create_key_value(KeyValueConfig(bucket=bucket, history=1))
    await nc.close()
    await fill_bucket(url, bucket, records(size, distinct=False))
    bare = statistics.median([await bare_watchall_seconds(url, bucket, size) for _ in range(3)])
    held = await heap_growth(url, bucket, size)
    service = new_service(url, bucket)
    await service.start()
    try:
        await service.wait_synced(120)
        (group,) = service.core.groups()
        receiver = service.receiver_for(group.key)
        assert receiver is not None
        version = receiver.current().version
        notifications = service.counters.notifications
        snapshots = service.counters.listings
        await asyncio.to_thread(server.restart)
        back = time.perf_counter()
        while service.counters.listings == snapshots:
            await asyncio.sleep(0.005)
            assert time.perf_counter() - back < 60, "no resync after the restart"
        resync = time.perf_counter() - back
        # The listing itself, read and applied as periodic reconciliation does it.
        start = time.perf_counter()
        listing = await service._source.list_all()
        service.handle_event(listing)
        reconcile = time.perf_counter() - start
        result = {
            "workers": size,
            "bare_sync_s": round(bare, 3),
            "resync_after_restart_s": round(resync, 3),
            "resync_vs_bare_sync": round(resync / bare, 3),
            "periodic_reconcile_s": round(reconcile, 3),
            "periodic_reconcile_vs_bare_sync": round(reconcile / bare, 3),
            "receiver_notified": receiver.current().version != version,
            "notifications_during_resync": service.counters.notifications - notifications,
            "heap_per_worker_bytes": round(held / size),
        }
    finally:
        await service.stop()
    print(
        f"resync after restart {result['resync_after_restart_s']:.3f} s "
        f"({result['resync_vs_bare_sync']:.2f}x bare sync {bare:.3f} s), periodic "
        f"{result['periodic_reconcile_s']:.3f} s, receiver notified: "
        f"{result['receiver_notified']}, memory {result['heap_per_worker_bytes']} B/worker",
        flush=True,
    )
    return result


async def latency(url: str, rate: int = 1000, seconds: float = LATENCY_SECONDS) -> dict[str, Any]:
    """Publish new compatible workers at ``rate``/s; time publish -> receiver shows the id."""
    bucket = f"latency-{time.monotonic_ns()}"
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.create_key_value(KeyValueConfig(bucket=bucket, history=1))
    await fill_bucket(url, bucket, records(1_000, distinct=False))
    service = new_service(url, bucket)
    await service.start()
    sent: dict[int, float] = {}
    delays: list[float] = []
    try:
        await service.wait_synced(60)
        (group,) = service.core.groups()
        while service.binding(group.key) is None:  # noqa: ASYNC110 - polling a plain read
            await asyncio.sleep(0.01)
        receiver = service.receiver_for(group.key)
        assert receiver is not None
        seen = set(receiver.current().admitted)

        async def watch() -> None:
            async for state in receiver:
                now = time.perf_counter()
                delays.extend(now - sent[i] for i in state.admitted - seen if i in sent)
                seen.update(state.admitted)

        watcher = asyncio.create_task(watch())
        total = int(rate * seconds)
        items = records(total, distinct=False, offset=1_000_000)
        start = time.perf_counter()
        for n, (key, value) in enumerate(items):
            due = start + n / rate
            pause = due - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)
            sent[1_000_001 + n] = time.perf_counter()
            await nc.publish(f"$KV.{bucket}.{key}", value)
        deadline = time.perf_counter() + 10
        while len(delays) < total and time.perf_counter() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    finally:
        await service.stop()
        await nc.close()
    delays.sort()
    result = {
        "rate_per_s": rate,
        "updates": len(delays),
        "p50_ms": round(1000 * delays[len(delays) // 2], 3),
        "p99_ms": round(1000 * delays[int(len(delays) * 0.99) - 1], 3),
        "max_ms": round(1000 * delays[-1], 3),
    }
    print(
        f"publish -> receiver at {rate}/s: p50 {result['p50_ms']} ms, p99 "
        f"{result['p99_ms']} ms, max {result['max_ms']} ms ({len(delays)} updates)",
        flush=True,
    )
    return result


async def main(
    max_workers: int, runs: int, latency_seconds: float = LATENCY_SECONDS
) -> dict[str, Any]:
    sizes = (*(s for s in SIZES if s < max_workers), max_workers)
    with EmbeddedNatsServer() as server:
        print(f"nats-server {server.version()} at {server.url}; median of {runs} runs", flush=True)
        version = server.version()
        memory: list[dict[str, Any]] = []
        sync = await sync_rates(server.url, sizes, runs, memory)
        resync = await resync_and_memory(server, sizes[-1])
        lat = await latency(server.url, seconds=latency_seconds)
    largest = {row["fleet"]: row for row in sync if row["workers"] == sizes[-1]}
    summary = {
        "sync_shared_ratio": round(largest["shared"]["ratio"], 3),
        "sync_distinct_ratio": round(largest["distinct"]["ratio"], 3),
        "targets": TARGETS,
    }
    return {
        "nats_server": version,
        "sync": sync,
        "memory": memory,
        "resync": resync,
        "latency": lat,
        "summary": summary,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-workers", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=5)
    options = parser.parse_args()
    latency_seconds = LATENCY_SECONDS
    if os.environ.get("BENCH_QUICK"):
        # Small fleets, but still three pairs: a single pair is at the mercy of the load.
        options.max_workers, options.runs = min(options.max_workers, 5_000), 3
        latency_seconds = 2.0
    results = asyncio.run(main(options.max_workers, options.runs, latency_seconds))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_sync.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["summary"]))
