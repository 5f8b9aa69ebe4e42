"""A status reply always fits one NATS message, whatever the service holds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from workerset_admission.adapters.nats.status import NatsStatusResponder, fitted
from workerset_admission.service.process_figures import process_figures

MAX_PAYLOAD = 64 * 1024


def _render(groups: int, invalid: int) -> object:
    def render(brief: bool) -> bytes:
        group = {"model": "m" * 40, "admitted": 3 if brief else list(range(300))}
        return json.dumps(
            {
                "frontend": "f" * 5000,
                "health": "healthy",
                "invalid_total": invalid,
                "groups": [group] * groups,
                "recent_invalid": [{"key": "k", "detail": "d" * 400}] * min(invalid, 50),
            }
        ).encode()

    return render


def test_a_small_status_is_sent_whole() -> None:
    render = _render(3, 1)
    assert fitted(render, MAX_PAYLOAD) == render(False)  # type: ignore[operator]


def test_a_large_status_is_sent_brief_then_as_a_summary_that_always_fits() -> None:
    brief = _render(100, 5)
    assert fitted(brief, MAX_PAYLOAD) == brief(True)  # type: ignore[operator]
    for groups in (1_000, 100_000):
        body = fitted(_render(groups, 10**6), MAX_PAYLOAD)  # type: ignore[arg-type]
        assert len(body) < 2048
        summary = json.loads(body)
        assert summary["groups"] == []
        assert summary["groups_count"] == groups
        assert summary["invalid_total"] == 10**6
        assert summary["recent_invalid_count"] == 50
        assert summary["health"] == "healthy"
        assert len(summary["frontend"]) == 200
        assert "max_payload" in summary["truncated"]


class _Message:
    reply = "_INBOX.test"

    def __init__(self) -> None:
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def respond(self, data: bytes) -> None:
        self.answer.set_result(data)


class _Connection:
    """What the responder reads of a NATS connection: ``subscribe`` and ``max_payload``."""

    max_payload = MAX_PAYLOAD

    def __init__(self) -> None:
        self.handlers: list[Callable[[Any], Awaitable[None]]] = []

    async def subscribe(self, subject: str, cb: Callable[[Any], Awaitable[None]]) -> Any:
        self.handlers.append(cb)
        return self

    async def unsubscribe(self) -> None:
        return None


def test_the_loop_keeps_turning_while_a_large_answer_is_rendered() -> None:
    """A render that takes 0.3 s of one thread: the loop ticks all along, the answer is whole."""
    rendered_on: list[int] = []

    def render(brief: bool) -> bytes:
        rendered_on.append(threading.get_ident())
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            sum(range(1000))  # busy, as encoding a fleet's JSON is
        return json.dumps({"brief": brief, "figures": process_figures()}).encode()

    settled: list[int] = []

    async def settle() -> None:
        settled.append(threading.get_ident())

    async def scenario() -> tuple[bytes, list[float]]:
        connection = _Connection()
        serving = asyncio.ensure_future(NatsStatusResponder(connection).serve(render, settle))
        while not connection.handlers:  # noqa: ASYNC110 - the responder subscribes in a turn
            await asyncio.sleep(0)
        (handler,) = connection.handlers
        msg = _Message()
        gaps: list[float] = []
        answering = asyncio.ensure_future(handler(msg))
        last = time.monotonic()
        while not msg.answer.done():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        await answering
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        return msg.answer.result(), gaps

    body, gaps = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert rendered_on
    assert threading.get_ident() not in rendered_on
    # The status was brought up to the request on the loop before the thread rendered it.
    assert settled == [threading.get_ident()]
    answer = json.loads(body)
    assert answer["brief"] is False
    # Counted on the loop that asked, though rendered in a thread: this test's tasks.
    assert answer["figures"]["asyncio_tasks"] >= 2
    # The loop turned throughout: many ticks, none held up for the render's length.
    assert len(gaps) >= 10
    assert max(gaps) < 0.15
