"""Soak: steady churn over 1,000 groups for a few minutes; memory and open tasks must stay flat.

``python integration/bench/soak.py [--minutes 3] [--groups 1000] [--rate 100] [--out FILE]``

A local nats-server (loopback, free port, temporary store) holds the discovery bucket. Every
group starts with three workers; one group in ten also has a competing configuration. A writer
thread (its own event loop and connection, as workers are separate processes) then churns at
``--rate`` operations per second: a worker leaves and a new one joins, an incumbent drains and
its group is succeeded, a competitor comes and goes. The service runs with the real wiring
(``create_service``), a builder that answers at once, and the receiver watchdog of the fault
tests checking all receivers at most every ``--check-every`` seconds.

After a warm-up, the process's resident memory, its Python object count, the service's open
tasks (those of closed connections, which nats-py ends lazily, not counted) and admission
channels are sampled every ``--sample`` seconds. At the end the state must replay the bucket,
the watchdog must be clean, and the figures must be flat: the script prints a table and a JSON
summary, and exits non-zero when memory grew more than ``--max-growth-mb``, when more tasks
stay open at the end than before the churn or at the peak of the first third of the run (both
the start and the end read once the service has settled), or when any sample shows
an admission channel that belongs to no current tenure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from support.fleet import (  # noqa: E402 - the fault tests' live fleet, reused as it is
    NEW,
    OLD,
    Builder,
    Fleet,
    Watchdog,
    admin,
    assert_replays_bucket,
    bind_fleet,
    endpoint,
    fresh_buckets,
    other_tasks,
    settings_for,
)
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer  # noqa: E402
from workerset_admission.service.admission_service import AdmissionService  # noqa: E402
from workerset_admission.wiring.compose import create_service  # noqa: E402


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of the process and the service."""

    seconds: float
    rss_mb: float
    objects: int
    tasks: int
    channels: int
    tenures: int
    groups: int
    events: int
    invalid: int
    operations: int


def sample(service: AdmissionService, started: float, operations: int) -> Sample:
    counters = service.counters
    snapshot = service.status()
    return Sample(
        seconds=round(time.monotonic() - started, 1),
        rss_mb=round(psutil.Process().memory_info().rss / 2**20, 1),
        objects=len(gc.get_objects()),
        tasks=len(other_tasks()),
        channels=len(service.channels),
        tenures=sum(1 for g in snapshot.groups if g.receiver is not None),
        groups=len(snapshot.groups),
        events=counters.puts + counters.deletes,
        invalid=counters.invalid,
        operations=operations,
    )


class Churn:
    """The writer: registers the starting fleet, then churns at a fixed rate until stopped."""

    def __init__(self, url: str, groups: int, rate: float, seed: int) -> None:
        self.url = url
        self.groups = groups
        self.rate = rate
        self.random = random.Random(seed)
        self.stop = threading.Event()
        self.operations = 0
        self.successions = 0
        self.error: BaseException | None = None
        # Per group: live workers of the incumbent configuration, and of the competitor.
        self.incumbent: dict[int, list[int]] = {}
        self.competitor: dict[int, list[int]] = {}
        self.next_id = 1

    def _ids(self, count: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        return ids

    async def populate(self, fleet: Fleet) -> None:
        for group in range(self.groups):
            self.incumbent[group] = self._ids(3)
            await fleet.register(endpoint(group), self.incumbent[group], OLD)
            if group % 10 == 0:
                self.competitor[group] = self._ids(2)
                await fleet.register(endpoint(group), self.competitor[group], NEW)

    async def _step(self, fleet: Fleet) -> None:
        group = self.random.randrange(self.groups)
        ep = endpoint(group)
        roll = self.random.random()
        incumbent = self.incumbent[group]
        if roll < 0.80 and incumbent:
            # Rolling replacement inside the incumbent cohort.
            leaving = incumbent.pop(self.random.randrange(len(incumbent)))
            joining = self._ids(1)
            await fleet.remove(ep, [leaving])
            await fleet.register(ep, joining, OLD)
            incumbent.extend(joining)
        elif roll < 0.90:
            # The incumbent drains; the competitor (if any) succeeds, then the old
            # configuration comes back as the newest cohort.
            await fleet.remove(ep, incumbent)
            self.successions += 1
            returning = self._ids(3)
            await fleet.register(ep, returning, OLD)
            self.incumbent[group] = returning
        else:
            # A competitor appears, or the one present leaves.
            present = self.competitor.pop(group, None)
            if present:
                await fleet.remove(ep, present)
            else:
                self.competitor[group] = self._ids(2)
                await fleet.register(ep, self.competitor[group], NEW)
        self.operations += 1

    async def _run(self) -> None:
        async with admin(self.url) as nc:
            fleet = await bind_fleet(nc)
            interval = 1.0 / self.rate
            next_at = time.monotonic()
            while not self.stop.is_set():
                await self._step(fleet)
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)

    def run_in_thread(self) -> threading.Thread:
        def target() -> None:
            try:
                asyncio.run(self._run())
            except BaseException as exc:  # reported by the main thread
                self.error = exc

        thread = threading.Thread(target=target, name="churn", daemon=True)
        thread.start()
        return thread


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="workerset-soak-") as tmp:
        server = EmbeddedNatsServer(Path(tmp) / "jetstream")
        await server.astart()
        try:
            return await _soak(args, server.url)
        finally:
            await server.aclose()


async def _soak(args: argparse.Namespace, url: str) -> dict[str, Any]:
    churn = Churn(url, args.groups, args.rate, args.seed)
    async with admin(url) as nc:
        fleet = await fresh_buckets(nc)
        await churn.populate(fleet)

    service = await create_service(settings_for(url, reconcile_interval=10.0), builder=Builder())
    watchdog = Watchdog(service, min_interval=args.check_every)
    started = time.monotonic()
    samples: list[Sample] = []
    try:
        await service.wait_synced(60)
        await _settled(service)
        # What a settled service holds before the churn: the middle reading, so that a wait
        # being re-armed at the moment of one reading does not lower the baseline.
        idle_tasks = statistics.median_low(await _task_readings(service, started, churn.operations))
        thread = churn.run_in_thread()
        await asyncio.sleep(args.warmup)
        gc.collect()
        samples.append(sample(service, started, churn.operations))
        print(_header())
        print(_row(samples[-1]))
        deadline = time.monotonic() + args.minutes * 60
        while time.monotonic() < deadline:
            await asyncio.sleep(min(args.sample, max(0.0, deadline - time.monotonic())))
            if churn.error is not None:
                raise RuntimeError("the churn writer failed") from churn.error
            gc.collect()
            samples.append(sample(service, started, churn.operations))
            print(_row(samples[-1]), flush=True)
        churn.stop.set()
        await asyncio.to_thread(thread.join, 30)
        await _settled(service)
        # The end figures are read before the replay check below, which loads the whole bucket
        # into this process and would be counted as the service's growth.
        gc.collect()
        # A re-listing or a publication in flight adds a task for a moment: the end count is
        # the lowest of a few readings, so only tasks that stay are counted.
        end = sample(service, started, churn.operations)
        readings = await _task_readings(service, started, end.operations)
        samples.append(replace(end, tasks=min(readings)))
        print(_row(samples[-1]))
        await assert_replays_bucket(service, url, same_order=False, timeout=60)
        watchdog.check()
    finally:
        await service.stop()

    first, last = samples[0], samples[-1]
    return {
        "groups": args.groups,
        "rate_per_s": args.rate,
        "minutes": args.minutes,
        "operations": churn.operations,
        "successions": churn.successions,
        "events_applied": last.events - first.events,
        "watchdog_checks": watchdog.checks,
        "watchdog_violations": len(watchdog.violations),
        "start": asdict(first),
        "end": asdict(last),
        "rss_growth_mb": round(last.rss_mb - first.rss_mb, 1),
        "object_growth": last.objects - first.objects,
        "idle_tasks": idle_tasks,
        # Builds and writes in flight make the task count move by a few from one sample to the
        # next, and a settled service holds more tasks than a busy one (see _task_readings); a
        # leak shows as an end (after the churn, settled) above both the settled service before
        # the churn and the early peak.
        "task_growth": last.tasks
        - max([idle_tasks] + [x.tasks for x in samples[: max(1, len(samples) // 3)]]),
        "channel_growth": last.channels - first.channels,
        "orphan_channels": max(s.channels - s.tenures for s in samples),
        "samples": [asdict(s) for s in samples],
    }


async def _settled(service: AdmissionService, quiet: float = 2.0, limit: float = 60.0) -> None:
    """Wait until the service has applied no event for ``quiet`` seconds (at most ``limit``)."""
    deadline = time.monotonic() + limit
    last = -1
    while time.monotonic() < deadline:
        counters = service.counters
        seen = counters.puts + counters.deletes
        if seen == last:
            return
        last = seen
        await asyncio.sleep(quiet)


async def _task_readings(service: AdmissionService, started: float, operations: int) -> list[int]:
    """Five readings of the task count, 0.3 s apart.

    What a reading shows depends on what the service's loops are doing: before Python 3.12,
    ``asyncio.wait_for`` runs what it waits on in a task of its own, so a loop idling on an event
    or a queue with a timeout holds one task more than the same loop busy writing, and a
    re-listing or a publication in flight adds one for a moment. A count read during the churn
    can thus be lower than the same service's count once settled, so the end is compared with a
    settled reading too.
    """
    readings = []
    for _ in range(5):
        readings.append(sample(service, started, operations).tasks)
        await asyncio.sleep(0.3)
    return readings


def _header() -> str:
    names = ("s", "rss MB", "objects", "tasks", "chans", "tenure", "groups", "events", "ops")
    widths = (7, 8, 9, 6, 6, 6, 7, 8, 7)
    return " ".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))


def _row(s: Sample) -> str:
    return (
        f"{s.seconds:>7.1f} {s.rss_mb:>8.1f} {s.objects:>9} {s.tasks:>6} {s.channels:>6} "
        f"{s.tenures:>6} {s.groups:>7} {s.events:>8} {s.operations:>7}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0, help="churn operations per second")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before the baseline")
    parser.add_argument("--sample", type=float, default=15.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--check-every", type=float, default=0.05, help="seconds between receiver checks"
    )
    parser.add_argument("--max-growth-mb", type=float, default=25.0)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON summary here")
    args = parser.parse_args(argv)

    result = asyncio.run(soak(args))
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    failures = []
    if result["watchdog_violations"]:
        failures.append("a receiver showed a worker outside its incumbent cohort")
    if result["rss_growth_mb"] > args.max_growth_mb:
        failures.append(f"memory grew by {result['rss_growth_mb']} MB")
    if result["task_growth"] > 0:
        failures.append(f"{result['task_growth']} more tasks at the end than early in the run")
    if result["orphan_channels"] > 0:
        failures.append(f"{result['orphan_channels']} admission channels without a tenure")
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
