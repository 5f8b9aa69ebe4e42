"""Read-only figures of the serving process for ``status``: its open asyncio tasks."""

from __future__ import annotations

import asyncio
from typing import Any

from workerset_admission.aio import serving_loop

__all__ = ["process_figures"]


def process_figures() -> dict[str, Any]:
    """Return the open asyncio tasks of the running loop (0 off any loop).

    Called in a thread a loop handed the call to (:func:`~workerset_admission.aio.off_loop`),
    it counts that loop's tasks. A soak samples it over time: a count that keeps growing is a
    task leak.
    """
    loop = serving_loop()
    tasks = 0 if loop is None else len(asyncio.all_tasks(loop))
    return {"asyncio_tasks": tasks}
