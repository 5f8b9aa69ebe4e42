"""The service thread: starts beside the host, retries a failed start, stops on request."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from workerset_admission.frontend.host import HostState, ServiceThread


@dataclass
class _Service:
    stopped: threading.Event = field(default_factory=threading.Event)

    async def stop(self) -> None:
        self.stopped.set()


def _wait_for(host: ServiceThread[_Service], phase: str) -> HostState[_Service]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = host.state
        if state.phase == phase:
            return state
        time.sleep(0.01)
    raise AssertionError(f"host stayed {host.state}")


def test_the_service_runs_on_its_own_thread_and_stops_on_request() -> None:
    service = _Service()
    threads: list[str] = []

    async def start() -> _Service:
        threads.append(threading.current_thread().name)
        return service

    host = ServiceThread(start, name="admission-test")
    host.start()
    state = _wait_for(host, "running")
    assert state.service is service
    assert threads == ["admission-test"]

    host.stop()

    assert service.stopped.is_set()
    assert host.state.phase == "stopped"


def test_a_failed_start_is_retried_and_its_error_shown_meanwhile() -> None:
    failures = [ConnectionRefusedError("nats down"), ConnectionRefusedError("nats down")]
    gate = threading.Event()

    async def start() -> _Service:
        if failures:
            raise failures.pop()
        gate.wait(5)
        return _Service()

    host = ServiceThread(start, retry_delays=(0.01,))
    host.start()
    retrying = _wait_for(host, "retrying")
    assert retrying.error == "nats down"
    assert retrying.service is None
    gate.set()

    running = _wait_for(host, "running")
    assert running.attempts == 3
    host.stop()


def test_stop_while_still_retrying_ends_the_thread() -> None:
    async def start() -> _Service:
        raise OSError("unreachable")

    host = ServiceThread(start, retry_delays=(30.0,))
    host.start()
    _wait_for(host, "retrying")

    host.stop()

    assert host.state.phase == "stopped"


def test_a_start_that_hangs_is_given_up_and_retried() -> None:
    calls: list[int] = []

    async def start() -> _Service:
        calls.append(1)
        if len(calls) == 1:
            await asyncio.Event().wait()  # never answers, like a connect to a silent server
        return _Service()

    host = ServiceThread(start, retry_delays=(0.01,), start_timeout=0.05)
    host.start()

    assert _wait_for(host, "running").attempts == 2
    host.stop()


def test_stop_during_a_hanging_start_abandons_it() -> None:
    entered = threading.Event()

    async def start() -> _Service:
        entered.set()
        await asyncio.Event().wait()
        return _Service()

    host = ServiceThread(start, start_timeout=60)
    host.start()
    assert entered.wait(10)

    host.stop()

    assert host.state.phase == "stopped"
