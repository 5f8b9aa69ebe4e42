"""The view writer owns its pass loop: ended on close and awaited, a failure said at WARNING."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

import pytest
from workerset_admission.adapters.dynamo.view import ViewWriter
from workerset_admission.view.records import RecordTable


class _View:
    """The writer's view as its pass loop reads it; ``keep_alive`` may be made to fail."""

    refresh_interval = 0.02
    refreshing = False
    unsettled = False
    holding = False

    def __init__(self, failure: BaseException | None = None) -> None:
        self.failure = failure
        self.kept_alive = 0

    def keep_alive(self) -> None:
        self.kept_alive += 1
        if self.failure is not None:
            raise self.failure

    def unremoved_cards(self) -> Mapping[str, Collection[str]]:
        return {}


class _Service:
    def __init__(self) -> None:
        self.subscribers: list[Any] = []

    def subscribe(self, subscriber: Any) -> None:
        self.subscribers.append(subscriber)

    def before_publication(self, hook: Callable[[], object]) -> None:
        pass

    def also_serving(self, provider: Callable[[], Mapping[str, Collection[str]]]) -> None:
        pass


async def test_the_pass_loop_is_cancelled_and_awaited_on_close() -> None:
    view = _View()
    writer = ViewWriter(view, RecordTable())  # type: ignore[arg-type]
    service = _Service()
    writer.attach(service)  # type: ignore[arg-type]
    assert service.subscribers == [writer]
    task = writer._task
    assert task is not None
    for _ in range(100):
        if view.kept_alive:
            break
        await asyncio.sleep(0.01)
    assert view.kept_alive
    await writer.close()
    assert task.done()
    assert task.cancelled()


async def test_a_pass_loop_that_ends_on_an_error_is_said_at_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    view = _View(failure=RuntimeError("the view broke"))
    writer = ViewWriter(view, RecordTable())  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        writer.attach(_Service())  # type: ignore[arg-type]
        task = writer._task
        assert task is not None
        await asyncio.wait({task}, timeout=5.0)
        await asyncio.sleep(0)  # the done callback runs
        await writer.close()  # an ended loop is awaited without raising
    assert task.done()
    [said] = [r for r in caplog.records if "pass loop ended on an error" in r.getMessage()]
    assert said.levelno == logging.WARNING
    assert said.exc_info is not None
    assert isinstance(said.exc_info[1], RuntimeError)
