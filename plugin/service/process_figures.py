"""Read-only figures of the serving process for ``status``: its open asyncio tasks."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["process_figures"]


def process_figures() -> dict[str, Any]:
    """Return the open asyncio tasks of the running loop (0 off any loop).

    A soak samples it over time: a count that keeps growing is a task leak.
    """
    try:
        tasks = len(asyncio.all_tasks())
    except RuntimeError:  # no running loop in this thread
        tasks = 0
    return {"asyncio_tasks": tasks}
