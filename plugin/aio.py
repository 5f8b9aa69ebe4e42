"""Small runtime helpers shared by the service and its adapters (tasks, loops, the collector)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import logging
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

__all__ = [
    "cancel_and_wait",
    "collector_paused",
    "off_loop",
    "on_loop",
    "owned_task",
    "serving_loop",
    "unwrap_group",
]

_T = TypeVar("_T")

# The loop a call handed to a thread by :func:`off_loop` was made for.
_SERVING_LOOP: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "serving_loop", default=None
)


async def cancel_and_wait(tasks: Iterable[asyncio.Task[object]], *, retry: float = 0.5) -> None:
    """Cancel ``tasks`` and wait until every one has finished.

    On Python 3.11 ``asyncio.wait_for`` (which nats-py's requests use) can lose a cancellation
    when the awaited result lands at the same moment, leaving a ``while True`` loop running; a
    plain ``cancel()`` then ``await`` would wait forever. Cancelling again every ``retry``
    seconds until the task is done makes stopping certain. Results and errors are not read.
    """
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=retry)


def owned_task(
    coro: Coroutine[Any, Any, object], *, name: str, log: logging.Logger
) -> asyncio.Task[object]:
    """Start ``coro`` as a task whose failure is said at WARNING on ``log`` when it ends.

    The caller owns the task: it cancels and awaits it on the way out (``cancel_and_wait``).
    A failure is read here, so it is never lost as "Task exception was never retrieved";
    a cancellation is the owner's own doing and says nothing.
    """
    task: asyncio.Task[object] = asyncio.ensure_future(coro)
    task.set_name(name)

    def report(done: asyncio.Task[object]) -> None:
        if done.cancelled():
            return
        error = done.exception()
        if error is not None:
            log.warning("%s stopped: %s: %s", name, type(error).__name__, error, exc_info=error)

    task.add_done_callback(report)
    return task


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Hold the cyclic garbage collector off during one synchronous stretch.

    Decoding a listing builds the fleet's state and no reference cycles; every collection the
    allocations trigger meanwhile would only walk that growing state again (a quarter of a
    large initial sync's time). Nothing awaits inside, so no other task runs while it is off.
    A status round's read-out in a thread holds it off too (``service/status_fold.py``): the
    loop's steps go on meanwhile, freed by reference counting, and their cycles wait for the
    next collection. Whoever found it off leaves it off: the first to pause it turns it back on.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def unwrap_group(exc: Exception) -> Exception:
    # A task group wraps the one task failure that stopped it; callers want the failure itself.
    inner = getattr(exc, "exceptions", None)
    while isinstance(inner, tuple) and len(inner) == 1 and isinstance(inner[0], Exception):
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    return exc


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return threading.current_thread() is threading.main_thread() and not loop.is_running()


async def off_loop(call: Callable[[], _T]) -> _T:
    """Run ``call`` in a thread and await its result, so the loop keeps turning meanwhile.

    Inside the call :func:`serving_loop` names the loop that handed it over (a status answer
    rendered in a thread still counts that loop's tasks).
    """
    token = _SERVING_LOOP.set(asyncio.get_running_loop())
    try:
        # ``to_thread`` runs the call in a copy of this context, the loop set above included.
        return await asyncio.to_thread(call)
    finally:
        _SERVING_LOOP.reset(token)


def serving_loop() -> asyncio.AbstractEventLoop | None:
    """Return the loop running in this thread, or the one that handed this call to a thread."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return _SERVING_LOOP.get()
