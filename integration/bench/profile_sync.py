"""Profile one initial sync of the admission service over a filled bucket, next to the bare reader.

``python integration/bench/profile_sync.py [--workers 50000] [--fleet distinct|shared] [--top N]``
starts a private nats-server, fills a bucket, times one bare ``watchall()`` + ``json.loads`` read
and one service sync, then runs the service sync again under ``cProfile`` and prints where its
time went: the functions with the most own time, and the share of a few stages (NATS client,
record decoding, admission core, the rest).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import time

import nats
from baseline import bare_watchall_seconds, fill_bucket
from bench_sync import new_service, plugin_sync, records
from nats.js.api import KeyValueConfig
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer

# Where a function's own time is counted, by the path of its source file.
STAGES = (
    ("NATS client (nats-py)", ("/nats/",)),
    ("record decoding (card/, keys.py)", ("/card/", "/keys.py")),
    ("admission core (admission/)", ("/admission/",)),
    (
        "service and source adapters",
        (
            "/service.py",
            "/ingest.py",
            "/status_model.py",
            "/liveness.py",
            "/publication.py",
            "/builds.py",
            "/adapters/",
            "/receivers.py",
            "/bindings.py",
        ),
    ),
    ("asyncio event loop", ("/asyncio/", "uvloop")),
)


def stage_shares(stats: pstats.Stats) -> list[tuple[str, float]]:
    totals = {name: 0.0 for name, _ in STAGES}
    other = 0.0
    for (path, _line, _func), (_cc, _nc, own, _cum, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        for name, marks in STAGES:
            if any(mark in path for mark in marks):
                totals[name] += own
                break
        else:
            other += own
    return [*totals.items(), ("other (builtins, C calls, json)", other)]


async def main(workers: int, distinct: bool, top: int) -> None:
    with EmbeddedNatsServer() as server:
        url = server.url
        nc = await nats.connect(url)
        await nc.jetstream().create_key_value(KeyValueConfig(bucket="profile", history=1))
        await nc.close()
        await fill_bucket(url, "profile", records(workers, distinct))
        bare = min([await bare_watchall_seconds(url, "profile", workers) for _ in range(3)])
        plain = min([await plugin_sync(url, "profile", workers) for _ in range(3)])
        print(
            f"{workers:,} {'distinct' if distinct else 'shared'} cards: bare {bare:.3f} s, "
            f"service {plain:.3f} s, ratio {bare / plain:.2f} x (best of 3 each)"
        )
        profiler = cProfile.Profile()
        started = time.perf_counter()
        profiler.enable()
        service = new_service(url, "profile")
        await service.start()
        await service.wait_synced(120)
        profiler.disable()
        profiled = time.perf_counter() - started
        await service.stop()
    stats = pstats.Stats(profiler)
    total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    print(f"\nprofiled sync {profiled:.3f} s; own time recorded {total:.3f} s")
    for name, own in stage_shares(stats):
        print(f"  {name:36s} {own:7.3f} s  {100 * own / total:5.1f} %")
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    print(out.getvalue())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=50_000)
    parser.add_argument("--fleet", choices=("distinct", "shared"), default="distinct")
    parser.add_argument("--top", type=int, default=25)
    options = parser.parse_args()
    asyncio.run(main(options.workers, options.fleet == "distinct", options.top))
