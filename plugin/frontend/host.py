"""Run an asyncio service on its own thread and event loop, beside a host that owns the main one.

The Dynamo frontend calls a route provider from inside its own uvloop and serves the routes from
a thread pool; neither may wait on NATS. :class:`ServiceThread` starts the service on a private
loop in a daemon thread, retries a failed or hung start with backoff (the bucket may come up
after the frontend), publishes the running service for synchronous readers, and stops it on
request or when the interpreter exits.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from workerset_admission.aio import cancel_and_wait, owned_task
from workerset_admission.errors import WorkersetAdmissionError
from workerset_admission.service.loop_watch import LoopWatch

__all__ = ["HostState", "RunningService", "ServiceThread"]

_log = logging.getLogger(__name__)

Phase = Literal["starting", "running", "retrying", "stopped"]


class RunningService(Protocol):
    async def stop(self) -> None: ...


S = TypeVar("S", bound=RunningService)


@dataclass(frozen=True, slots=True)
class HostState(Generic[S]):
    """What a synchronous reader sees: the phase, the service once running, the last error."""

    phase: Phase
    service: S | None = None
    error: str | None = None
    attempts: int = 0


class ServiceThread(Generic[S]):
    """Own one service's thread, loop and lifetime."""

    def __init__(
        self,
        start: Callable[[], Awaitable[S]],
        *,
        name: str = "workerset-admission",
        retry_delays: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0),
        start_timeout: float = 15.0,
    ) -> None:
        self._start = start
        self._start_timeout = start_timeout
        self._name = name
        self._retry_delays = retry_delays
        self._state: HostState[S] = HostState("stopped")
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        # The service loop's beat: the health route reports a loop that stopped turning.
        self.watch = LoopWatch()

    @property
    def state(self) -> HostState[S]:
        # One attribute read: readers on other threads always see a whole, consistent state.
        return self._state

    def start(self) -> None:
        """Start the thread (idempotent) and return at once; the service comes up behind it."""
        with self._lock:
            if self._thread is not None:
                return
            self._state = HostState("starting")
            self._ready = threading.Event()
            self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
            self._thread.start()
            # The frontend exits through atexit; a daemon thread would otherwise die mid-publish.
            atexit.register(self.stop)
        self._ready.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the service and join the thread (idempotent, safe from any thread)."""
        with self._lock:
            thread, loop, stop = self._thread, self._loop, self._stop
            if thread is None:
                return
            self._thread = None
        if loop is not None and stop is not None and not loop.is_closed():
            # The loop may close between the check and the call; then there is nothing to stop.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        atexit.unregister(self.stop)

    def _main(self) -> None:
        # asyncio.run also cancels what a client library left running before the loop closes.
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        beating = owned_task(self.watch.run(), name=f"{self._name}'s loop beat", log=_log)
        try:
            await self._run_service()
        finally:
            await cancel_and_wait([beating])

    async def _run_service(self) -> None:
        assert self._stop is not None
        self._ready.set()
        attempts = 0
        service: S | None = None
        while service is None and not self._stop.is_set():
            attempts += 1
            try:
                service = await self._attempt()
            except Exception as exc:  # the start runs parts this thread does not own; retried
                if isinstance(exc, asyncio.TimeoutError):
                    error = f"start timed out after {self._start_timeout:g} s"
                else:
                    error = str(exc) or type(exc).__name__
                delay = self._retry_delays[min(attempts, len(self._retry_delays)) - 1]
                _log.warning("%s failed to start (attempt %d): %s", self._name, attempts, error)
                self._state = HostState("retrying", error=error, attempts=attempts)
                await self._wait_stop(delay)
        if service is not None:
            self._state = HostState("running", service=service, attempts=attempts)
            await self._stop.wait()
            try:
                await service.stop()
            except (WorkersetAdmissionError, OSError, asyncio.TimeoutError) as exc:
                # Stopping must finish even when withdrawal fails; the thread ends anyway.
                _log.warning("%s did not stop cleanly: %s; the thread ends", self._name, exc)
        self._state = HostState("stopped", attempts=attempts)

    async def _attempt(self) -> S | None:
        """Start once; ``None`` when a stop request came first (the attempt is abandoned)."""
        assert self._stop is not None
        # A start that hangs (an unreachable server) is given up like one that fails, so the
        # health route can say why the service is not up.
        starting: asyncio.Task[S] = asyncio.ensure_future(self._start())
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait(
                {starting, stopping},
                timeout=self._start_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            await cancel_and_wait([stopping])
        if starting.done():
            return starting.result()
        await cancel_and_wait([starting])
        stopped = self._stop.is_set()
        await self._abandon(starting, "for a stop" if stopped else "as timed out")
        if stopped:
            return None
        raise asyncio.TimeoutError

    async def _abandon(self, starting: asyncio.Task[S], why: str) -> None:
        """Say how a start given up ended, and stop what it started, if anything."""
        if starting.cancelled():
            return
        error = starting.exception()
        if error is not None:
            _log.warning(
                "%s: a start abandoned %s had failed: %s",
                self._name,
                why,
                str(error) or type(error).__name__,
            )
            return
        service = starting.result()
        # The start won the race after all: what it started is stopped, not left running.
        try:
            await service.stop()
        except (WorkersetAdmissionError, OSError, asyncio.TimeoutError) as exc:
            _log.warning("%s did not stop cleanly: %s; the thread ends", self._name, exc)

    async def _wait_stop(self, delay: float) -> None:
        assert self._stop is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=delay)
