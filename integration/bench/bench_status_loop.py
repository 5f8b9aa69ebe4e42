"""Whether status answered during a burst of changes holds up the service's loop: stalls, latency.

``python bench_status_loop.py [--workers 20000] [--changes 2000] [--seconds 60]``. Run with
another tree's venv, it measures that tree: it takes only ``bench_sync.records`` from beside it,
and the service from the package the interpreter imports.

A service on a source with no network of its own takes a listing of ``--workers`` workers
sharing one card (one WorkerSet), is committed, and then the source hands it ``--changes``
live changes as fast as the loop takes them (a put of a new compatible worker, then its delete,
in turn). Meanwhile two clients ask for status as fast as they are answered:

* the NATS status responder's own request handler (``NatsStatusResponder`` on an in-process
  stand-in for a connection, with NATS's default ``max_payload`` of 1 MiB): the whole status,
  as ``workerset-admission status`` asks for it;
* a thread, as the frontend's HTTP handlers and the worker-state page read the service:
  ``service.status()`` and that one WorkerSet's JSON.

A ticker on the loop asks to wake every millisecond and records how late each wake came: the
longest and the 99th percentile of those lateness figures are the loop's stalls. It prints them,
each client's answers and latency (median, p99, longest), and writes
``results/bench_status_loop.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bench_sync import records
from workerset_admission.adapters.nats.status import NatsStatusResponder
from workerset_admission.ports import (
    DiscoveryEntry,
    SourceDelete,
    SourceEvent,
    SourceListing,
    SourcePut,
)
from workerset_admission.service.admission_service import AdmissionService

RESULTS = Path(__file__).parent / "results"
MAX_PAYLOAD = 1024 * 1024
TICK = 0.001


class _Source:
    """A discovery source: one listing, then the changes put on its queue, as they come."""

    def __init__(self, listing: SourceListing) -> None:
        self._listing = listing
        self.queue: asyncio.Queue[SourceEvent | None] = asyncio.Queue()

    async def events(self) -> AsyncIterator[SourceEvent]:
        yield self._listing
        while (event := await self.queue.get()) is not None:
            yield event

    async def list_all(self) -> SourceListing:
        return self._listing

    async def close(self) -> None:
        self.queue.put_nowait(None)


class _Message:
    def __init__(self) -> None:
        self.reply = "_INBOX.bench"
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def respond(self, data: bytes) -> None:
        self.answer.set_result(data)


class _Connection:
    """What ``NatsStatusResponder`` reads of a NATS connection: subscribe and max_payload."""

    max_payload = MAX_PAYLOAD

    def __init__(self) -> None:
        self.handlers: list[Callable[[Any], Any]] = []
        self.subscribed = asyncio.Event()

    async def subscribe(self, subject: str, cb: Callable[[Any], Any]) -> Any:
        self.handlers.append(cb)
        self.subscribed.set()
        return self

    async def unsubscribe(self) -> None:
        return None


def _figures(latencies: list[float]) -> dict[str, Any]:
    if not latencies:
        return {"answers": 0}
    ordered = sorted(latencies)
    return {
        "answers": len(ordered),
        "p50_ms": round(1e3 * statistics.median(ordered), 2),
        "p99_ms": round(1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
        "max_ms": round(1e3 * ordered[-1], 2),
    }


async def _ticker(lateness: list[float], done: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not done.is_set():
        due = loop.time() + TICK
        await asyncio.sleep(TICK)
        lateness.append(max(0.0, loop.time() - due))


async def main(workers: int, changes: int, seconds: float) -> dict[str, Any]:
    listing = SourceListing(tuple(DiscoveryEntry(k, v) for k, v in records(workers, False)))
    source = _Source(listing)
    connection = _Connection()
    service = AdmissionService(source, status=NatsStatusResponder(connection))
    await service.start()
    try:
        await service.wait_synced(120)
        (group,) = service.core.groups()
        key = group.key
        while service.binding(key) is None:  # noqa: ASYNC110 - polling a plain read
            await asyncio.sleep(0.01)
        await asyncio.wait_for(connection.subscribed.wait(), 10)
        (handler,) = connection.handlers
        service.status()  # the first picture, before the burst
        extra = records(changes, distinct=False, offset=10_000_000)
        burst: list[SourceEvent] = []
        for k, v in extra[: changes // 2]:
            burst.append(SourcePut(DiscoveryEntry(k, v)))
        for k, _ in extra[: changes - changes // 2]:
            burst.append(SourceDelete(k))
        gc.collect()

        done = asyncio.Event()
        lateness: list[float] = []
        nats_latency: list[float] = []
        thread_latency: list[float] = []
        sizes: list[int] = []
        stop_thread = threading.Event()

        async def ask_nats() -> None:
            while not done.is_set():
                msg = _Message()
                start = time.perf_counter()
                # As nats-py runs a subscription's callback: in a task of its own.
                answering = asyncio.ensure_future(handler(msg))
                sizes.append(len(await msg.answer))
                await answering
                nats_latency.append(time.perf_counter() - start)

        def ask_thread() -> None:
            while not stop_thread.is_set():
                start = time.perf_counter()
                current = service.status()
                report = current.group(key)
                json.dumps(None if report is None else report.to_json())
                thread_latency.append(time.perf_counter() - start)

        async def apply_burst() -> float:
            start = time.perf_counter()
            for event in burst:
                source.queue.put_nowait(event)
                # One change per turn of the loop, as a watch hands them over.
                await asyncio.sleep(0)
            while not source.queue.empty():  # noqa: ASYNC110 - the source's task drains it
                await asyncio.sleep(0.001)
            return time.perf_counter() - start

        ticker = asyncio.create_task(_ticker(lateness, done))
        asker = asyncio.create_task(ask_nats())
        reader = threading.Thread(target=ask_thread, daemon=True)
        reader.start()
        try:
            burst_seconds = await asyncio.wait_for(apply_burst(), seconds)
            await asyncio.sleep(0.2)  # answers asked just after the burst count too
        finally:
            done.set()
            stop_thread.set()
            await asyncio.gather(ticker, asker, return_exceptions=True)
            await asyncio.to_thread(reader.join, 30)
        admitted = service.status().group(key)
        assert admitted is not None, "the WorkerSet was lost"
        assert len(admitted.admitted) == workers, "the burst was lost"
        ordered = sorted(lateness)
        return {
            "workers": workers,
            "changes": len(burst),
            "burst_seconds": round(burst_seconds, 3),
            "loop_ticks": len(ordered),
            "loop_stall_max_ms": round(1e3 * ordered[-1], 2),
            "loop_stall_p99_ms": round(1e3 * ordered[int(0.99 * (len(ordered) - 1))], 2),
            "nats_status": _figures(nats_latency) | {"bytes_max": max(sizes, default=0)},
            "thread_status": _figures(thread_latency),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_1m": round(os.getloadavg()[0], 2),
        }
    finally:
        await service.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    quick = os.environ.get("BENCH_QUICK") == "1"
    parser.add_argument("--workers", type=int, default=2_000 if quick else 20_000)
    parser.add_argument("--changes", type=int, default=200 if quick else 2_000)
    parser.add_argument("--seconds", type=float, default=300.0, help="bound on the burst")
    options = parser.parse_args()
    result = asyncio.run(main(options.workers, options.changes, options.seconds))
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_status_loop.json").write_text(json.dumps(result, indent=2) + "\n")
