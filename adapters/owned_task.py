"""A long-lived task an adapter object starts, stops and answers for: its failure is said aloud.

An adapter that keeps a loop running beside its callers (a heartbeat, a coalesced writer, a
watch of its own records) owns that loop through an :class:`OwnedTask`. The object starts it,
and stops it on close: cancelled and waited for, so nothing of it is pending afterwards. A loop
that ends with an error is never lost as "Task exception was never retrieved": the error is
logged at WARNING with what the owner keeps doing, counted, kept in :attr:`OwnedTask.failure`,
and, when the owner says so, the loop starts again after a pause (the owner's state lives in
the owner, not in the loop, so a fresh loop carries on from it).

Shared by the adapters and importing none of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from workerset_admission.aio import cancel_and_wait

__all__ = ["OwnedTask", "say_unread_failure"]


class OwnedTask:
    """One long-lived task of an adapter object (see the module).

    ``work`` makes the loop's coroutine; ``keeps`` says, for the WARNING, what the owner goes on
    doing when the loop fails; ``restart_after`` (seconds) starts it again after a failure,
    ``None`` leaves it stopped with the failure kept for the owner's health to show.
    """

    def __init__(
        self,
        work: Callable[[], Coroutine[Any, Any, None]],
        *,
        name: str,
        log: logging.Logger,
        keeps: str,
        restart_after: float | None = None,
    ) -> None:
        self._work = work
        self.name = name
        self._log = log
        self._keeps = keeps
        self._restart_after = restart_after
        self._task: asyncio.Task[None] | None = None
        # Loops cancelled without waiting (:meth:`detach`), still ending: ``stop`` waits for them.
        self._ending: set[asyncio.Task[None]] = set()
        self._restart: asyncio.TimerHandle | None = None
        self._stopped = False
        self.starts = 0
        self.failures = 0
        self.failure: BaseException | None = None

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task running the loop now, if one does (the loop compares itself with it)."""
        return self._task

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Run the loop, unless it runs already or is to start again after its pause.

        After :meth:`stop` too: the owner asks for it again.
        """
        self._stopped = False
        if self.running or self._restart is not None:
            return
        self.starts += 1
        task = asyncio.get_running_loop().create_task(self._work(), name=self.name)
        task.add_done_callback(self._ended)
        self._task = task

    def detach(self) -> None:
        """Cancel the running loop without waiting for it; ``start`` may run a new one at once."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            self._ending.add(task)

    def _again(self) -> None:
        self._restart = None
        if not self._stopped:
            self.start()

    async def stop(self) -> None:
        """Cancel the loop (and a pending restart) and wait until it has ended; none follows."""
        self._stopped = True
        if self._restart is not None:
            self._restart.cancel()
            self._restart = None
        task, self._task = self._task, None
        tasks = [*self._ending, *([task] if task is not None else [])]
        if tasks:
            await cancel_and_wait(tasks)

    def _ended(self, task: asyncio.Task[None]) -> None:
        detached = task in self._ending
        self._ending.discard(task)
        if self._task is task:
            self._task = None
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        self.failures += 1
        self.failure = error
        again = self._restart_after
        if self._stopped or detached or again is None or self._task is not None:
            self._log.warning("%s failed: %r; %s", self.name, error, self._keeps, exc_info=error)
            return
        self._log.warning(
            "%s failed: %r; %s, and starts it again in %g s",
            self.name,
            error,
            self._keeps,
            again,
            exc_info=error,
        )
        self._restart = asyncio.get_running_loop().call_later(again, self._again)


def say_unread_failure(task: asyncio.Future[Any], *, log: logging.Logger, what: str) -> None:
    """Read how a task its caller stopped has ended, and say a failure nobody else will read.

    For a task that lives as long as the call that made it (a watch beside a probe, a relay):
    when the call ends for another reason, the task's own failure, if it had one, is said at
    WARNING here instead of being lost as "Task exception was never retrieved".
    """
    if not task.done() or task.cancelled():
        return
    error = task.exception()
    if error is not None:
        log.warning("%s had failed as well: %r", what, error, exc_info=error)
