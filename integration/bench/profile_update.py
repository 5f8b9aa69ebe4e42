"""Updates one at a time through the service's step, as the latency run sends them: CPU, profile.

``python profile_update.py [--updates 3000] [--base 1000] [--profile N | --setup-only]``. Run with
another tree's venv, it measures that tree: it takes only ``bench_sync.records`` from beside it,
and the service from the package the interpreter imports.

A service on a source with no network of its own takes a listing of ``--base`` workers sharing one
card (``bench_sync``'s records), is committed, then takes ``--updates`` puts of new compatible
workers, each handed to the step as the source's task hands it (``step.handle_event``); after
each, the group's receiver is read as the latency run's watcher reads it (its admitted ids).
No NATS, no sleeping and one process: it prints the CPU time per update (the step, the read
models' delta, and the watcher's read). ``--profile N`` prints cProfile's N functions with the
most own time instead; ``--setup-only`` stops before the updates, so that two runs under
``valgrind --tool=callgrind`` (with and without it, ``PYTHONHASHSEED=0``) give the instructions
of the updates alone as the difference of their totals.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import time
from collections.abc import AsyncIterator

from bench_sync import records
from workerset_admission.ports import DiscoveryEntry, SourceEvent, SourceListing, SourcePut
from workerset_admission.service.admission_service import AdmissionService


class _Source:
    """A discovery source that hands over one listing and then waits: the puts go to the step."""

    def __init__(self, listing: SourceListing) -> None:
        self._listing = listing
        self._closed = asyncio.Event()

    async def events(self) -> AsyncIterator[SourceEvent]:
        yield self._listing
        await self._closed.wait()

    async def list_all(self) -> SourceListing:
        return self._listing

    async def close(self) -> None:
        self._closed.set()


async def main(updates: int, base: int, profile: int, setup_only: bool) -> None:
    listing = SourceListing(tuple(DiscoveryEntry(k, v) for k, v in records(base, distinct=False)))
    service = AdmissionService(_Source(listing))
    await service.start()
    try:
        await service.wait_synced(60)
        (group,) = service.core.groups()
        while service.binding(group.key) is None:  # noqa: ASYNC110 - polling a plain read
            await asyncio.sleep(0.01)
        receiver = service.receiver_for(group.key)
        assert receiver is not None
        seen = set(receiver.current().admitted)
        puts = [
            SourcePut(DiscoveryEntry(k, v))
            for k, v in records(updates, distinct=False, offset=1_000_000)
        ]
        gc.collect()
        if setup_only:
            return
        handle, current = service.step.handle_event, receiver.current

        def run() -> None:
            for put in puts:
                handle(put)
                seen.update(current().admitted - seen)

        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            run()
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(profile)
        else:
            cpu = time.process_time()
            run()
            used = time.process_time() - cpu
            print(f"{1e6 * used / updates:.1f} us CPU per update ({updates} after {base} workers)")
        assert len(seen) == base + updates
    finally:
        await service.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=3000)
    parser.add_argument("--base", type=int, default=1000)
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    parser.add_argument("--setup-only", action="store_true")
    options = parser.parse_args()
    asyncio.run(main(options.updates, options.base, options.profile, options.setup_only))
