"""Small asyncio helpers shared by the service and its adapters."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

__all__ = ["cancel_and_wait"]


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
