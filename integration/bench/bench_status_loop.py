"""Whether status answered during a burst of changes holds up the service's loop: stalls, latency.

``python bench_status_loop.py [--workers 2000,8000,20000] [--changes 2000] [--rate 0]
[--compare OTHER_PYTHON]``. Run with another tree's venv, it measures that tree: it takes only
``bench_sync.records`` from beside it, and the service from the package the interpreter imports.
``--compare`` runs every size under both interpreters (this one and ``OTHER_PYTHON``, e.g.
another checkout's ``.venv/bin/python``), each size and tree in a process of its own, one after
the other, and prints the figures side by side.

A service on a source with no network of its own takes a listing of ``--workers`` workers
sharing one card (one WorkerSet), is committed, and then the source hands it ``--changes``
live changes (a put of a new compatible worker, then its delete, in turn, so the WorkerSet
holds its workers or one more throughout): as fast as the loop takes them, or at ``--rate``
changes a second. The burst's time runs until the service has applied the last change (its
event counters say so), not until the source's queue is empty. Meanwhile two clients ask for
status as fast as they are answered:

* the NATS status responder's own request handler (``NatsStatusResponder`` on an in-process
  stand-in for a connection, with NATS's default ``max_payload`` of 1 MiB): the whole status,
  as ``workerset-admission status`` asks for it;
* a thread, as the frontend's HTTP handlers and the worker-state page read the service:
  ``service.status()`` and that one WorkerSet's JSON.

Every answer is checked complete: the whole status (neither brief nor a summary), the one
WorkerSet in it with every worker admitted (the fleet's size, or one more mid-change); an
answer that is not is counted (``incomplete``), so two trees are compared on the same work.
A ticker on the loop asks to wake every millisecond and records how late each wake came: the
longest and the 99th percentile of those lateness figures are the loop's stalls. It prints them,
each client's answers, latency (median, p99, longest) and answer sizes, and, where the status
says when it was taken (``as_of``), how old the answers were; results go to
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
import subprocess
import sys
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


def _admitted(report: Any) -> int | None:
    """How many workers one WorkerSet's JSON admits (``None``: given as a count, not a list)."""
    admitted = report.get("admitted") if isinstance(report, dict) else None
    return len(admitted) if isinstance(admitted, list) else None


async def main(
    workers: int, changes: int, seconds: float, rate: float, clients: str = "both"
) -> dict[str, Any]:
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
        extra = records((changes + 1) // 2, distinct=False, offset=10_000_000)
        burst: list[SourceEvent] = []
        for k, v in extra:
            burst.append(SourcePut(DiscoveryEntry(k, v)))
            if len(burst) < changes:
                burst.append(SourceDelete(k))
        # What a complete answer admits: the fleet, or one more between a put and its delete.
        whole = {workers, workers + 1}
        counters = service.counters
        applied_before = counters.puts + counters.deletes
        gc.collect()

        done = asyncio.Event()
        lateness: list[float] = []
        nats_latency: list[float] = []
        thread_latency: list[float] = []
        sizes: list[int] = []
        ages: list[float] = []
        incomplete = {"nats": 0, "thread": 0}
        stop_thread = threading.Event()

        def check_nats(body: bytes) -> None:
            sizes.append(len(body))
            answer = json.loads(body)
            groups = answer.get("groups")
            if (
                "truncated" in answer
                or not isinstance(groups, list)
                or len(groups) != 1
                or _admitted(groups[0]) not in whole
            ):
                incomplete["nats"] += 1
            as_of = answer.get("as_of")
            if isinstance(as_of, (int, float)):
                ages.append(time.time() - as_of)

        async def ask_nats() -> None:
            while not done.is_set():
                msg = _Message()
                start = time.perf_counter()
                # As nats-py runs a subscription's callback: in a task of its own.
                answering = asyncio.ensure_future(handler(msg))
                body = await msg.answer
                await answering
                nats_latency.append(time.perf_counter() - start)
                check_nats(body)

        def ask_thread() -> None:
            while not stop_thread.is_set():
                start = time.perf_counter()
                current = service.status()
                report = current.group(key)
                body = json.dumps(None if report is None else report.to_json())
                thread_latency.append(time.perf_counter() - start)
                if report is None or _admitted(json.loads(body)) not in whole:
                    incomplete["thread"] += 1

        async def apply_burst() -> float:
            loop = asyncio.get_running_loop()
            start = time.perf_counter()
            began = loop.time()
            for index, event in enumerate(burst):
                if rate > 0:
                    await asyncio.sleep(max(0.0, began + index / rate - loop.time()))
                else:
                    # One change per turn of the loop, as a watch hands them over.
                    await asyncio.sleep(0)
                source.queue.put_nowait(event)
            # Until the service has applied the last change, not only taken it off the queue.
            while counters.puts + counters.deletes - applied_before < len(burst):  # noqa: ASYNC110
                await asyncio.sleep(0.001)
            return time.perf_counter() - start

        pauses: list[tuple[int, float]] = []
        collecting: list[float] = []

        def timed_collection(phase: str, info: dict[str, Any]) -> None:
            # The cyclic collector stops every thread, the loop's too: its pauses are stalls.
            if phase == "start":
                collecting[:] = [time.perf_counter()]
            elif collecting:
                pauses.append((info["generation"], time.perf_counter() - collecting[0]))

        gc.callbacks.append(timed_collection)
        ticker = asyncio.create_task(_ticker(lateness, done))
        asker = asyncio.create_task(ask_nats() if clients in ("both", "nats") else done.wait())
        reader = threading.Thread(target=ask_thread, daemon=True)
        if clients in ("both", "thread"):
            reader.start()
        try:
            burst_seconds = await asyncio.wait_for(apply_burst(), seconds)
            await asyncio.sleep(0.2)  # answers asked just after the burst count too
        finally:
            done.set()
            stop_thread.set()
            await asyncio.gather(ticker, asker, return_exceptions=True)
            if reader.is_alive():
                await asyncio.to_thread(reader.join, 30)
            gc.callbacks.remove(timed_collection)
        final = service.status().group(key)
        assert final is not None, "the WorkerSet was lost"
        assert len(final.admitted) == workers, "the burst did not end where it began"
        assert counters.puts + counters.deletes - applied_before == len(burst), "changes lost"
        ordered = sorted(lateness)
        return {
            "workers": workers,
            "changes": len(burst),
            "rate": rate or "as fast as taken",
            "clients": clients,
            "burst_seconds": round(burst_seconds, 3),
            "loop_ticks": len(ordered),
            "loop_stall_max_ms": round(1e3 * ordered[-1], 2),
            "loop_stall_p99_ms": round(1e3 * ordered[int(0.99 * (len(ordered) - 1))], 2),
            "nats_status": _figures(nats_latency)
            | {
                "bytes_min": min(sizes, default=0),
                "bytes_max": max(sizes, default=0),
                "incomplete": incomplete["nats"],
                "age_max_ms": round(1e3 * max(ages), 1) if ages else None,
            },
            "thread_status": _figures(thread_latency) | {"incomplete": incomplete["thread"]},
            "gc": {
                "collections": len(pauses),
                "oldest": sum(1 for generation, _ in pauses if generation == 2),
                "pause_max_ms": round(1e3 * max((t for _, t in pauses), default=0.0), 2),
                "pause_total_ms": round(1e3 * sum(t for _, t in pauses), 1),
            },
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_1m": round(os.getloadavg()[0], 2),
        }
    finally:
        await service.stop()


def _run_one(python: str, workers: int, options: argparse.Namespace) -> dict[str, Any]:
    """Run one size under ``python`` in a process of its own; return its figures."""
    command = [
        python,
        str(Path(__file__).resolve()),
        "--workers",
        str(workers),
        "--changes",
        str(options.changes),
        "--rate",
        str(options.rate),
        "--seconds",
        str(options.seconds),
        "--clients",
        options.clients,
        "--one",
    ]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["python_path"] = python
    return result


def _row(label: str, result: dict[str, Any]) -> str:
    nats = result["nats_status"]
    return (
        f"{result['workers']:>7} {label:<6} stall max {result['loop_stall_max_ms']:>8.2f} ms"
        f"  p99 {result['loop_stall_p99_ms']:>7.2f} ms  burst {result['burst_seconds']:>7.2f} s"
        f"  nats {nats['answers']:>5} answers p50 {nats.get('p50_ms', 0):>7.2f} ms"
        f" bytes {nats['bytes_min']}..{nats['bytes_max']} incomplete {nats['incomplete']}"
        f"  thread {result['thread_status']['answers']:>6} incomplete "
        f"{result['thread_status']['incomplete']}"
        f"  gc {result['gc']['collections']} ({result['gc']['oldest']} full)"
        f" max {result['gc']['pause_max_ms']} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    quick = os.environ.get("BENCH_QUICK") == "1"
    parser.add_argument(
        "--workers",
        default="2000" if quick else "2000,8000,20000",
        help="fleet sizes, comma-separated",
    )
    parser.add_argument("--changes", type=int, default=200 if quick else 2_000)
    parser.add_argument("--rate", type=float, default=0.0, help="changes a second (0: at once)")
    parser.add_argument("--seconds", type=float, default=300.0, help="bound on the burst")
    parser.add_argument("--compare", metavar="PYTHON", help="another tree's interpreter")
    parser.add_argument(
        "--clients",
        choices=("both", "nats", "thread", "none"),
        default="both",
        help="which status clients ask during the burst (none: the burst alone)",
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    sizes = [int(size) for size in options.workers.split(",")]
    if options.one:
        (size,) = sizes
        figures = main(size, options.changes, options.seconds, options.rate, options.clients)
        print(json.dumps(asyncio.run(figures)))
        raise SystemExit(0)
    trees = [("this", sys.executable)]
    if options.compare:
        trees.insert(0, ("other", options.compare))
    results = []
    for size in sizes:
        for label, python in trees:
            result = _run_one(python, size, options) | {"tree": label}
            print(_row(label, result), flush=True)
            results.append(result)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_status_loop.json").write_text(json.dumps(results, indent=2) + "\n")
