"""The deadlines the core scheduled (retries, holds), and the loop that ticks it when one is due."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import Callable

__all__ = ["RetryTimers"]


class RetryTimers:
    """The retry deadlines the core scheduled; ``run`` ticks the core when one falls due."""

    def __init__(self, clock: Callable[[], float], tick: Callable[[float], None]) -> None:
        self._clock = clock
        self._tick = tick
        self._deadlines: list[float] = []
        self._wake = asyncio.Event()

    def add(self, deadline: float) -> None:
        heapq.heappush(self._deadlines, deadline)
        self._wake.set()

    def wake(self) -> None:
        """Re-read the clock now (a host or test clock may jump)."""
        self._wake.set()

    async def run(self) -> None:
        deadlines = self._deadlines
        while True:
            self._wake.clear()
            if not deadlines:
                await self._wake.wait()
                continue
            delay = deadlines[0] - self._clock()
            if delay > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                continue
            now = self._clock()
            while deadlines and deadlines[0] <= now:
                heapq.heappop(deadlines)
            self._tick(now)
