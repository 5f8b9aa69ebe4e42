"""The trace a live frontend writes of what it observes: a step subscriber that writes lines."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from workerset_admission.admission import BuildFinished, CommitFailed, Effect, Tick
from workerset_admission.ports import SourceEvent
from workerset_admission.service.step import StepRecord
from workerset_admission.traces.digest import effects_digest
from workerset_admission.traces.format import (
    build_line,
    commit_failed_line,
    event_line,
    header_line,
)

__all__ = ["TraceWriter"]

_log = logging.getLogger(__name__)


class TraceWriter:
    """Writes a version 3 trace: every input a step feeds the core, and its effects' digest.

    Times are the step's own clock (``now`` as the step read it), counted from the first line,
    so ``replay`` drives its clock with exactly the readings the live decisions were made on.
    A source event, build result or tick is written when its step is over, with the digest of
    the effects its core step returned; a commit a hop refused is written as its own line, with
    the digest of the core step it made, so each line answers for exactly one core step.
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
        # The line of the step in progress and the effects it has returned so far.
        self._pending: dict[str, Any] | None = None
        self._effects: list[Effect] = []

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

    def tick(self, now: float) -> None:
        """Write a tick at ``now`` (for a recorder that is not a step: its recording's end)."""
        self._begin_line({"kind": "tick", "t": self._since(now)})

    def _since(self, now: float) -> float:
        if self._start is None:
            self.begin(now)
        assert self._start is not None
        return max(0.0, now - self._start)

    def heard(self, record: StepRecord) -> None:
        """Write the lines of one step: what came in, then each input the step made itself."""
        came_in = record.came_in
        if isinstance(came_in, tuple):
            return  # inputs applied outside a step (a restored state) are no line of a trace
        t = self._since(record.now)
        if isinstance(came_in, BuildFinished):
            self._begin_line(build_line(came_in, t))
        elif isinstance(came_in, Tick):
            self.tick(record.now)
        else:
            self._begin_line(event_line(came_in, t, record.keep))
        for step in record.steps:
            if isinstance(step.made, CommitFailed):
                self._begin_line(commit_failed_line(step.made, t))
            if self._pending is not None and not self._failed:
                self._effects.extend(step.effects)
        self._end_line()

    def __repr__(self) -> str:
        return f"TraceWriter({self._observer}, {self.lines} lines)"

    def _begin_line(self, line: dict[str, Any]) -> None:
        self._end_line()
        self._pending = line
        self._effects = []

    def _end_line(self) -> None:
        line = self._pending
        if line is None:
            return
        self._pending = None
        if self._failed:
            return
        if self._observer == "frontend":
            # Only a frontend's own step returns effects; a second watch on the bucket has none.
            line["effects"] = effects_digest(self._effects, self._start or 0.0)
        self._effects = []
        self._write(line)

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
        self._end_line()
        if not self._failed:
            try:
                self._out.flush()
            except (OSError, ValueError):
                self._failed = True

    def close(self) -> None:
        self.flush()
        if self._owned:
            self._out.close()
