"""The bare nats-py baseline every benchmark ratio is taken against, and a pipelined bucket fill.

Kept in one place so that "bare" means the same reader in every benchmark: nats-py's
``KeyValue.watchall()`` with ``json.loads`` of every value, up to its end of initial values.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Iterable

import nats

__all__ = ["bare_watchall_seconds", "fill_bucket"]


async def fill_bucket(url: str, bucket: str, items: Iterable[tuple[str, bytes]]) -> None:
    """Write raw ``(key, value)`` pairs into a KV bucket, 500 publishes in flight at a time."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        window: list[Awaitable[object]] = []
        for key, value in items:
            window.append(js.publish(f"$KV.{bucket}.{key}", value))
            if len(window) >= 500:
                await asyncio.gather(*window)
                window.clear()
        await asyncio.gather(*window)
    finally:
        await nc.close()


async def bare_watchall_seconds(url: str, bucket: str, count: int, timeout: float = 60) -> float:
    """Seconds from connect until ``watchall()`` has delivered and decoded all ``count`` values.

    A bucket that holds fewer values never gets there: ``updates`` then times out and raises.
    """
    start = time.perf_counter()
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        watcher = await kv.watchall()
        seen = 0
        while seen < count:
            entry = await watcher.updates(timeout=timeout)  # type: ignore[no-untyped-call]
            if entry is None:
                # nats-py's end-of-initial-values marker. On a loaded machine it can come first:
                # when every value has reached the client before nats-py's consumer-info call
                # returns but none has been handed over yet, it sees nothing pending and nothing
                # received. The values still follow, and the baseline waits for them.
                continue
            json.loads(entry.value)
            seen += 1
        elapsed = time.perf_counter() - start
        await watcher.stop()  # type: ignore[no-untyped-call]
    finally:
        await nc.close()
    return elapsed
