"""The file bridge: a file store change until the bucket holds it, inotify against polling alone.

A plain script, not a test: ``python integration/bench/bench_bridge.py [--changes N]`` (200 by
default; ``BENCH_QUICK=1`` runs 40). It starts its own loopback nats-server and two
``workerset-admission bridge`` processes, each on its own file store and bucket: one as
shipped (inotify, with the 0.5 s scan as a safety net) and one with ``--no-notify`` (the scan
alone). Both are fed the same changes at the same moments, in one run, so both see the same
machine load: a record file appears (staged and linked into place, as Dynamo does) or
disappears (what a SIGTERMed worker does with its records). The gaps between changes are
random (50 to 250 ms), so a change falls anywhere in the poller's interval, and a record is
removed only after it has lived a second (a shorter life could fall between two scans, and the
poller would never see it at all).

The figure is, per bridge, the time from the file operation's return to the moment a KV watcher
in this process sees the put or the delete in the bucket: p50, p99 and max over every change,
and over removals alone. Writes ``integration/bench/results/bench_bridge.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import nats
from nats.js.kv import KeyValue
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer

HERE = Path(__file__).parent
RESULTS = HERE / "results"
MODES = {"inotify": (), "poll only": ("--no-notify",)}
RECORD = json.dumps({"type": "Model", "card": "x" * 900}).encode()


def _percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _summary(values: Sequence[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "count": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(_percentile(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
    }


class Store:
    """One file store the bench writes, and the bucket its bridge mirrors it into."""

    def __init__(self, root: Path, bucket: str) -> None:
        self.root = root
        self.bucket = bucket
        self.folder = root / "v1" / "mdc"
        self.folder.mkdir(parents=True)
        self.changed_at: dict[tuple[str, bool], float] = {}
        self.seen_at: dict[tuple[str, bool], float] = {}
        self.arrived = asyncio.Event()

    def _file(self, instance: int) -> Path:
        return self.folder / quote(f"benchns/backend/generate/{instance:x}", safe="")

    def key(self, instance: int) -> str:
        return f"v1.mdc.benchns.backend.generate.{instance:x}"

    def create(self, instance: int) -> None:
        staged = self.folder / f".tmp_{instance:016x}"
        staged.write_bytes(RECORD)
        os.link(staged, self._file(instance))
        self.changed_at[(self.key(instance), True)] = time.monotonic()
        staged.unlink()

    def remove(self, instance: int) -> None:
        self._file(instance).unlink()
        self.changed_at[(self.key(instance), False)] = time.monotonic()

    async def watch(self, kv: KeyValue) -> None:
        watcher = await kv.watchall()
        async for entry in watcher:
            if entry is None:
                continue
            present = entry.operation is None and bool(entry.value)
            self.seen_at.setdefault((entry.key, present), time.monotonic())
            self.arrived.set()

    async def reached(self, key: str, present: bool, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (key, present) not in self.seen_at:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{key} never reached bucket {self.bucket}")
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), left)
            except asyncio.TimeoutError:
                continue


def _bridge(url: str, store: Store, flags: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    command = [
        *(sys.executable, "-m", "workerset_admission.cli", "bridge"),
        *("--file-kv", str(store.root), "--ttl", "3600", *flags),
        *("--nats-server", url, "--discovery-bucket", store.bucket),
    ]
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


async def main(changes: int) -> dict[str, Any]:
    rng = random.Random(27)
    with tempfile.TemporaryDirectory(prefix="bench-bridge-") as tmp:
        folder = Path(tmp)
        server = EmbeddedNatsServer(folder / "nats")
        await server.astart()
        bridges: list[subprocess.Popen[bytes]] = []
        watches: list[asyncio.Task[None]] = []
        nc = await nats.connect(server.url)
        try:
            stores = {
                mode: Store(folder / f"store-{i}", f"bench-{i}") for i, mode in enumerate(MODES)
            }
            js = nc.jetstream()
            for mode, store in stores.items():
                status = await ensure_bucket(js, BucketSpec(name=store.bucket))
                watches.append(asyncio.create_task(store.watch(status.kv)))
                bridges.append(_bridge(server.url, store, MODES[mode], folder / f"{mode}.log"))
            # Both bridges are up once a first record has gone through each.
            for store in stores.values():
                store.create(0)
            for store in stores.values():
                await store.reached(store.key(0), True, 30)
            fallback = (folder / "inotify.log").read_text(errors="replace")
            if "notifications unavailable" in fallback:
                # Its figures would be the scan's: say so instead of reporting them as inotify's.
                raise SystemExit(f"the inotify bridge could not watch its store: {fallback}")

            born: dict[int, float] = {}
            next_id = 1
            operations: list[tuple[int, bool]] = []
            for _ in range(changes):
                await asyncio.sleep(rng.uniform(0.05, 0.25))
                # Only records older than two scan intervals go: one that lived shorter could
                # come and go between two scans, and the poller would never see it at all.
                old = sorted(i for i, at in born.items() if time.monotonic() - at > 1.0)
                if old and (len(born) >= 8 or rng.random() < 0.5):
                    instance = rng.choice(old)
                    del born[instance]
                    for store in stores.values():
                        store.remove(instance)
                    operations.append((instance, False))
                else:
                    instance, next_id = next_id, next_id + 1
                    born[instance] = time.monotonic()
                    for store in stores.values():
                        store.create(instance)
                    operations.append((instance, True))
            results: dict[str, Any] = {}
            for mode, store in stores.items():
                every: list[float] = []
                removals: list[float] = []
                for instance, present in operations:
                    key = store.key(instance)
                    await store.reached(key, present, 10)
                    latency = store.seen_at[(key, present)] - store.changed_at[(key, present)]
                    every.append(latency)
                    if not present:
                        removals.append(latency)
                results[mode] = {"all": _summary(every), "removals": _summary(removals)}
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
            await nc.close()
            for process in bridges:
                process.terminate()
                process.wait(20)
            await server.aclose()
    return {
        "changes": changes,
        "load": os.getloadavg(),
        "cpus": os.cpu_count(),
        "results": results,
    }


def _print(report: dict[str, Any]) -> None:
    print(f"{report['changes']} changes; load average {report['load'][0]:.2f}")
    print(f"{'bridge':<10} {'which':<9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'n':>5}")
    for mode, figures in report["results"].items():
        for which, row in figures.items():
            print(
                f"{mode:<10} {which:<9} {row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} "
                f"{row['max_ms']:>8.2f} {row['count']:>5}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    quick = os.environ.get("BENCH_QUICK") == "1"
    parser.add_argument("--changes", type=int, default=40 if quick else 200)
    options = parser.parse_args()
    report = asyncio.run(main(options.changes))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_bridge.json").write_text(json.dumps(report, indent=2) + "\n")
    _print(report)
