"""A frontend run inside the soak's own process, on a clock the soak can make jump.

``serve`` reads the machine's monotonic clock, which a test must not move; this frontend is the
same service (``create_service`` with a view directory, as ``serve --view-dir`` runs it) on its
own thread and event loop, given a clock whose offset the soak changes. After a jump the soak
wakes the service's timers, as a host whose clock jumps must. It takes part in every check.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

from workerset_admission.settings import Settings
from workerset_admission.wiring.compose import create_service

__all__ = ["ClockedFrontend", "JumpClock"]


class JumpClock:
    """The monotonic clock plus an offset that only the soak changes."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


class ClockedFrontend:
    def __init__(
        self, name: str, view: Path, urls: list[str], bucket: str, replicas: int, log: Path
    ) -> None:
        self.name = name
        self.log = log
        self.clock = JumpClock()
        self.settings = Settings(
            nats_servers=tuple(urls),
            discovery_bucket=bucket,
            admission_bucket=f"{bucket}-adm",
            bucket_replicas=replicas,
            frontend_id=name,
            status_subject=f"soak.status.{name}",
            view_dir=view,
            registration_ttl=10.0,
            tenure_hold=10.0,
            reconcile_interval=15.0,
            tracing=False,
            metrics=False,
        )
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._service: Any = None
        self._error: BaseException | None = None
        self._handler: logging.Handler | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        # The service's log goes to a file of its own, in serve's plain format, so the soak
        # reads it as it reads every serve's.
        self._handler = logging.FileHandler(self.log)
        self._handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
        )
        logger = logging.getLogger("workerset_admission")
        logger.addHandler(self._handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"{self.name} did not start within {timeout:g} s")
        if self._error is not None:
            raise RuntimeError(f"{self.name} failed to start") from self._error

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by start() or close()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._service = await create_service(self.settings, clock=self.clock)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self._service.stop()

    def jump(self, seconds: float) -> None:
        """Move the clock by ``seconds`` (either way) and wake the service's timers."""
        self.clock.offset += seconds
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._service.wake_timers)

    def close(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        if self._handler is not None:
            logging.getLogger("workerset_admission").removeHandler(self._handler)
            self._handler.close()
