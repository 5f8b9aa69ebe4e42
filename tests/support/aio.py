"""A time limit for a block of awaits that also works on Python 3.10 (no ``asyncio.timeout``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["time_limit"]


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
