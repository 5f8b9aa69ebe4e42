"""The one boundary where telemetry meets code it does not own: exporters, propagators, callbacks.

Telemetry never breaks admission, so what an exporter, a propagator chosen by
``OTEL_PROPAGATORS`` or the gauges' state callback raises is stopped here, and only here. It is
never hidden: the first failure of each kind is logged at WARNING with its traceback, saying what
was kept; the same kind failing again within ``QUIET_FOR`` seconds is counted, and the count is
given with the next warning of that kind, so a broken exporter costs one line a minute, not one
line per export. Cancellation (a ``BaseException``) always passes through.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["QUIET_FOR", "FailureGuard", "guarded"]

_log = logging.getLogger(__name__)

QUIET_FOR = 60.0
"""Seconds during which the same kind of failure is counted rather than logged again."""


class FailureGuard:
    """Stops what code it does not own raises, and says so at most once per kind per minute."""

    def __init__(
        self, quiet_for: float = QUIET_FOR, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._quiet_for = quiet_for
        self._clock = clock
        self._lock = threading.Lock()
        self._last_said: dict[str, float] = {}
        self._unsaid: dict[str, int] = {}

    def failures_unsaid(self, kind: str) -> int:
        """How many failures of ``kind`` were counted since its last warning."""
        with self._lock:
            return self._unsaid.get(kind, 0)

    def _due(self, kind: str) -> int | None:
        """Return the failures to report with this one, or None while ``kind`` is quiet."""
        now = self._clock()
        with self._lock:
            last = self._last_said.get(kind)
            if last is not None and now - last < self._quiet_for:
                self._unsaid[kind] = self._unsaid.get(kind, 0) + 1
                return None
            # Marked before the warning is written: a failure while writing it (a log record
            # factory that fails again) finds the kind quiet instead of recursing.
            self._last_said[kind] = now
            return self._unsaid.pop(kind, 0)

    def guarded(self, kind: str, kept: str) -> contextlib.AbstractContextManager[None, bool]:
        """Run the block; a failure of it is stopped and said as ``kind`` failing, ``kept`` kept."""
        return self._guarded(kind, kept)  # type: ignore[return-value]  # it may swallow

    @contextlib.contextmanager
    def _guarded(self, kind: str, kept: str) -> Iterator[None]:
        try:
            yield
        except Exception:  # code of an exporter, a propagator or a callback: see the docstring
            self.warning(kind, kept)

    def warning(self, kind: str, kept: str) -> None:
        """Say at WARNING, with the traceback being handled, that ``kind`` failed and ``kept``.

        For a handler of its own (a hot path that cannot afford a context manager per call):
        the same rule, once a minute per kind, the failures in between counted.
        """
        more = self._due(kind)
        if more is not None:
            since = f" ({more} more since the last warning)" if more else ""
            _log.warning(
                "telemetry: %s failed%s; %s (admission is unaffected; said at most once a minute)",
                kind,
                since,
                kept,
                exc_info=True,
            )


_GUARD = FailureGuard()


def guarded(kind: str, kept: str) -> contextlib.AbstractContextManager[None, bool]:
    """Guard one call of code telemetry does not own with the process's guard (see above)."""
    return _GUARD.guarded(kind, kept)
