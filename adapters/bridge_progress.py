"""How far a bridge's bucket is behind its source, readable from any thread.

A bridge (the file store's or etcd's) is the only writer of its records into the bucket the
frontends read: while it stands still, a worker that stopped stays admitted and routed to.
Whether its process is alive says little; what a supervisor needs is how far behind the
source the bucket is, and whether the bridge still tries. :class:`BridgeProgress` keeps four
moments, each a single float written on the bridge's loop and read by other threads (the
health endpoint, a metrics scrape), so a bridge that is stuck right now is seen while it is
stuck:

* ``in_sync_at``: the newest moment the bucket is known to have equalled the source (the
  start of the last pass, listing or probe after which nothing seen was left unwritten). The
  *lag* is the time since: it stays below a pass interval while all is well and grows without
  bound when the source cannot be read, the bucket refuses writes, or the bridge's loop stops.
* ``pending_since``: the oldest change seen in the source (an inotify event, a watch event)
  not yet written to the bucket.
* ``written_at``: the last write the bucket acknowledged.
* ``tried_at``: the last time the bridge's source loop finished an attempt, successful or not
  (a pass, a listing, a probe, a retry after a failure): its beat. A bridge whose loop died or
  hangs stops beating; one that cannot read etcd keeps beating while its lag grows, which a
  restart would not cure.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["BridgeProgress"]


class BridgeProgress:
    """The moments that say how far behind its source a bridge's bucket is."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.started_at = clock()
        self.in_sync_at: float | None = None
        self.pending_since: float | None = None
        self.written_at: float | None = None
        self.tried_at = self.started_at

    def now(self) -> float:
        return self._clock()

    def change_seen(self) -> None:
        """Note a change in the source that the bucket does not hold yet."""
        if self.pending_since is None:
            self.pending_since = self._clock()

    def wrote(self) -> None:
        """Note a write the bucket acknowledged."""
        self.written_at = self._clock()

    def tried(self) -> None:
        """Note that the source loop finished an attempt (its beat)."""
        self.tried_at = self._clock()

    def in_sync(self, since: float) -> None:
        """Note that the bucket held the whole source as read at ``since`` (from :meth:`now`).

        A change seen after ``since`` stays pending: the read that ended in sync may have
        missed it.
        """
        self.tried_at = self._clock()
        if self.in_sync_at is None or since > self.in_sync_at:
            self.in_sync_at = since
        pending = self.pending_since
        if pending is not None and pending <= since:
            self.pending_since = None

    @property
    def synced(self) -> bool:
        """Whether the bucket has held the whole source at least once."""
        return self.in_sync_at is not None

    def lag(self) -> float:
        """Seconds since the bucket last equalled the source (since the start, before that)."""
        since = self.in_sync_at if self.in_sync_at is not None else self.started_at
        return max(0.0, self._clock() - since)

    def unwritten_for(self) -> float:
        """Seconds the oldest change seen in the source has waited for the bucket (0: none)."""
        pending = self.pending_since
        return 0.0 if pending is None else max(0.0, self._clock() - pending)

    def last_write_age(self) -> float | None:
        """Seconds since the last acknowledged write, or None before the first."""
        written = self.written_at
        return None if written is None else max(0.0, self._clock() - written)

    def silent_for(self) -> float:
        """Seconds since the source loop last finished an attempt."""
        return max(0.0, self._clock() - self.tried_at)

    def as_json(self) -> dict[str, object]:
        """Return the figures the health endpoints show, rounded to the millisecond."""
        age = self.last_write_age()
        return {
            "synced": self.synced,
            "lag_seconds": round(self.lag(), 3),
            "unwritten_seconds": round(self.unwritten_for(), 3),
            "last_write_age_seconds": None if age is None else round(age, 3),
            "source_loop_silent_for": round(self.silent_for(), 3),
        }
