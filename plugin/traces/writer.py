"""The trace a live frontend writes of what it observes: a step observer that writes lines."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from workerset_admission.admission import BuildFinished
from workerset_admission.admission.ordering import GroupId
from workerset_admission.ports import SourceEvent
from workerset_admission.service.step import StepObserver
from workerset_admission.traces.format import build_line, event_line, header_line

__all__ = ["TraceWriter"]

_log = logging.getLogger(__name__)


class TraceWriter(StepObserver):
    """Writes a version 2 trace of every source event, build result and tick a step sees.

    Times are the step's own clock (``now`` as the step read it), counted from the first line,
    so ``replay`` drives its clock with exactly the readings the live decisions were made on.
    A write that fails (a full disk) is logged once and turns the writer off: recording must
    never stop admission.
    """

    def __init__(
        self,
        out: IO[str],
        *,
        observer: str = "frontend",
        settings: Mapping[str, Any] | None = None,
        wall: Callable[[], float] = time.time,
        owned: bool = False,
    ) -> None:
        self._out = out
        self._observer = observer
        self._settings = settings
        self._wall = wall
        self._owned = owned
        self._start: float | None = None
        self._failed = False
        self.lines = 0

    @classmethod
    def open(cls, path: Path, settings: Mapping[str, Any] | None = None) -> TraceWriter:
        """Write to ``path`` (created or truncated), line-buffered; the writer closes it."""
        return cls(path.open("w", encoding="utf-8", buffering=1), settings=settings, owned=True)

    def begin(self, now: float, state: Mapping[str, Any] | None = None) -> None:
        """Start the trace at clock ``now``: its header, then a ``state`` line when given."""
        if self._start is not None:
            return
        self._start = now
        self._write(header_line(self._wall(), self._observer, self._settings))
        if state is not None:
            self._write({**state, "t": 0.0})

    def write_event(self, event: SourceEvent, now: float) -> None:
        """Write one source event seen at ``now`` (for a recorder that is not a step)."""
        self._write(event_line(event, self._since(now)))

    def _since(self, now: float) -> float:
        if self._start is None:
            self.begin(now)
        assert self._start is not None
        return max(0.0, now - self._start)

    def source_event(
        self,
        event: SourceEvent,
        now: float,
        keep: Collection[str],
        recorded: Mapping[GroupId, Sequence[str]] | None,
    ) -> None:
        self._write(event_line(event, self._since(now), keep))

    def build_result(self, result: BuildFinished, now: float) -> None:
        self._write(build_line(result, self._since(now)))

    def tick(self, now: float) -> None:
        self._write({"kind": "tick", "t": self._since(now)})

    def _write(self, line: Mapping[str, Any]) -> None:
        if self._failed:
            return
        try:
            self._out.write(json.dumps(line, separators=(",", ":")) + "\n")
            self.lines += 1
        except (OSError, ValueError) as exc:
            self._failed = True
            _log.warning("stopped writing the trace: %s", exc)

    def flush(self) -> None:
        if not self._failed:
            try:
                self._out.flush()
            except (OSError, ValueError):
                self._failed = True

    def close(self) -> None:
        self.flush()
        if self._owned:
            self._out.close()
