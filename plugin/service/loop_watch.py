"""Whether the service's event loop still turns: its beat, the stalls it notices, who hears of them.

Everything the service does runs on one event loop, so a loop that stops turning (a process
paused, CPU throttled to nothing, a call that never returns) stops every publication at once,
while the process still looks alive to anything that only checks for it. :class:`LoopWatch`
beats on that loop: each beat records when it came, tells its listeners (systemd's watchdog
is one), and when a beat comes much later than asked, says at WARNING for how long the loop
stood still. Readers on other threads (a health endpoint) ask :meth:`LoopWatch.silent_for`,
so a loop that is stuck right now is seen while it is stuck, not only once it turns again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

__all__ = ["STALLED_AFTER", "LoopWatch"]

_log = logging.getLogger("workerset_admission.service")

# A loop silent this long is stuck, and a supervisor should restart its process: the largest
# pass measured (a 20,000-worker listing) holds the loop for about half a second, a garbage
# collection at fleet size for less.
STALLED_AFTER = 20.0


class LoopWatch:
    """Beat every ``interval`` seconds on the running loop; report beats ``stall_after`` late."""

    def __init__(
        self,
        *,
        interval: float = 1.0,
        stall_after: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0 or stall_after <= 0:
            raise ValueError("a loop watch needs a positive interval and stall threshold")
        self.interval = interval
        self.stall_after = stall_after
        self._clock = clock
        self._listeners: list[Callable[[], None]] = []
        # One float written by the loop and read by other threads: always a whole value.
        self.last_beat = clock()
        self.stalls = 0
        self.longest_stall = 0.0

    def on_beat(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` on the loop at every beat (it must not block).

        A listener tells a supervisor over a socket: its ``OSError`` (the supervisor away) is
        said at WARNING and the other listeners still hear the beat. Anything else it raises
        is a defect: it stops the beat, and the beat's owner says so.
        """
        self._listeners.append(listener)

    def silent_for(self) -> float:
        """Seconds since the last beat (safe from any thread)."""
        return max(0.0, self._clock() - self.last_beat)

    def stuck(self, after: float = STALLED_AFTER) -> bool:
        """Whether the loop has been silent for ``after`` seconds (safe from any thread)."""
        return self.silent_for() >= after

    def beat(self) -> None:
        """Record a beat now; say so when it came ``stall_after`` or more late."""
        now = self._clock()
        late = now - self.last_beat - self.interval
        self.last_beat = now
        if late >= self.stall_after:
            self.stalls += 1
            self.longest_stall = max(self.longest_stall, late)
            _log.warning(
                "the event loop stood still for %.1f s (a beat due every %g s came %.1f s "
                "late): nothing was published meanwhile; the admitted view outlives such a "
                "stall for its horizon",
                late + self.interval,
                self.interval,
                late,
            )
        for listener in self._listeners:
            self._tell(listener)

    @staticmethod
    def _tell(listener: Callable[[], None]) -> None:
        try:
            listener()
        except OSError as exc:  # a supervisor away must not stop the beat
            _log.warning(
                "a loop-beat listener could not tell its supervisor (%s); the beat goes on", exc
            )

    async def run(self) -> None:
        """Beat until cancelled."""
        self.last_beat = self._clock()
        while True:
            await asyncio.sleep(self.interval)
            self.beat()
