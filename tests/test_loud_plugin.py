"""Failures in the shell are said at WARNING and caught only as far as they can happen; tasks
that outlive their call have an owner that ends them and hears how they ended."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from support.fakes import FakePublisher
from workerset_admission.aio import cancel_and_wait, owned_task
from workerset_admission.errors import Unreachable
from workerset_admission.frontend.host import ServiceThread
from workerset_admission.service.publication import ServingPublication
from workerset_admission.wiring.compose import _close_after_failed_start, _InWords


def _warnings(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == logger and r.levelno >= logging.WARNING
    ]


# ------------------------------------------------------------------- owned tasks


async def test_an_owned_task_that_fails_is_said_at_warning_and_its_owner_leaves_nothing_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("the beat broke")

    async def runs() -> None:
        await asyncio.Event().wait()

    log = logging.getLogger("owner.test")
    failing = owned_task(fails(), name="the failing part", log=log)
    running = owned_task(runs(), name="the running part", log=log)
    await asyncio.wait({failing}, timeout=2)
    await cancel_and_wait([failing, running])
    assert running.cancelled()
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert _warnings(caplog, "owner.test") == [
        "the failing part stopped: ValueError: the beat broke"
    ]


def test_a_frontend_thread_stopped_mid_start_says_how_the_start_ended_and_leaves_no_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    left: list[set[asyncio.Task[Any]]] = []

    class Stoppable:
        async def stop(self) -> None:
            return None

    began = threading.Event()

    async def start() -> Stoppable:
        began.set()
        try:
            await asyncio.Event().wait()
        finally:
            # Cancelled by the stop: this is what a start does when it fails on the way out.
            raise OSError("the connection closed while starting")
        return Stoppable()

    host: ServiceThread[Stoppable] = ServiceThread(start, name="test-host", start_timeout=30)
    original = host._serve

    async def serve_and_look() -> None:
        await original()
        left.append(asyncio.all_tasks() - {asyncio.current_task()})  # type: ignore[arg-type]

    host._serve = serve_and_look  # type: ignore[method-assign]
    host.start()
    assert began.wait(5)
    host.stop(timeout=5)
    assert host.state.phase == "stopped"
    assert left == [set()]
    messages = _warnings(caplog, "workerset_admission.frontend.host")
    assert messages == [
        "test-host: a start abandoned for a stop had failed: the connection closed while starting"
    ]


# --------------------------------------------------------------- the publication


class _Flaky(FakePublisher):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error: Exception | None = error

    async def publish_capability(self, resynced_at: float | None = None) -> None:
        error, self.error = self.error, None
        if error is not None:
            raise error
        await super().publish_capability(resynced_at)


async def test_a_round_the_store_refuses_is_said_at_warning_and_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    publisher = _Flaky(ConnectionError("nats is away"))
    publication = ServingPublication(publisher, dict, interval=0.01, retry=0.01)
    running = asyncio.ensure_future(publication.run())
    try:
        for _ in range(200):
            if publisher.capability:
                break
            await asyncio.sleep(0.01)
    finally:
        await cancel_and_wait([running])
    assert publisher.capability
    (warning,) = _warnings(caplog, "workerset_admission.service.publication")
    assert "nats is away" in warning
    assert "tried again" in warning


async def test_a_defect_in_a_round_is_not_taken_for_an_outage() -> None:
    publication = ServingPublication(_Flaky(RuntimeError("a bug")), dict, interval=0.01, retry=0.01)
    with pytest.raises(RuntimeError, match="a bug"):
        await asyncio.wait_for(publication.run(), timeout=2)


async def test_the_nats_clients_errors_reach_the_service_as_unreachable() -> None:
    from nats.errors import ConnectionClosedError

    class Closed(FakePublisher):
        async def withdraw_all(self) -> None:
            raise ConnectionClosedError

    with pytest.raises(Unreachable, match="ConnectionClosedError") as caught:
        await _InWords(Closed()).withdraw_all()
    assert isinstance(caught.value.__cause__, ConnectionClosedError)
    # What succeeds passes through as it was.
    publisher = FakePublisher()
    await _InWords(publisher).publish_members("ns", ["a"])
    assert publisher.records == {"ns": ("a",)}


async def test_a_close_that_fails_after_a_failed_start_is_said_and_a_defect_is_not_hidden(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def away() -> None:
        raise ConnectionResetError("reset by peer")

    async def defect() -> None:
        raise AttributeError("no such thing")

    await _close_after_failed_start("the NATS connection", away)
    (warning,) = _warnings(caplog, "workerset_admission.wiring.compose")
    assert "could not close the NATS connection" in warning
    with pytest.raises(AttributeError):
        await _close_after_failed_start("the view", defect)
