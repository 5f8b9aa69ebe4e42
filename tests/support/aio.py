"""Waiting in tests: a time limit for a block of awaits (3.10 lacks asyncio.timeout), polling."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

__all__ = ["eventually", "time_limit"]


@contextlib.asynccontextmanager
async def time_limit(seconds: float) -> AsyncIterator[None]:
    """Cancel the block after ``seconds`` and raise ``asyncio.TimeoutError`` in its place."""
    task = asyncio.current_task()
    assert task is not None, "time_limit needs a running task"
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    handle = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        yield
    except asyncio.CancelledError:
        if expired:
            raise asyncio.TimeoutError(f"not done within {seconds:g} s") from None
        raise
    finally:
        handle.cancel()


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.02)
