"""``register``'s first write is tried again while the bucket refuses it for now, then given up."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from workerset_admission.cli.workers import until_accepted
from workerset_admission.errors import Unreachable


class ForNow(ConnectionError):
    """A refusal that passes (a stream electing a leader): a transport error, as NATS's are."""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _writer(refusals: int) -> tuple[list[int], Callable[[], Awaitable[str]]]:
    calls: list[int] = []

    async def write() -> str:
        calls.append(1)
        if len(calls) <= refusals:
            raise ForNow("nats: timeout")
        return "written"

    return calls, write


def test_a_write_refused_for_now_is_tried_again_until_it_is_accepted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = Clock()
    calls, write = _writer(refusals=4)
    result = asyncio.run(
        until_accepted(
            write,
            within=30,
            unavailable=lambda error: isinstance(error, ForNow),
            what="the registration",
            clock=clock,
            sleep=clock.sleep,
        )
    )
    assert (result, len(calls)) == ("written", 5)
    assert clock.slept == [0.25, 0.5, 1.0, 2.0]
    # Said once, in words.
    assert capsys.readouterr().err.count("not accepted yet (timeout); retrying") == 1


def test_past_its_deadline_the_refusal_is_an_outage_and_another_error_is_not_retried() -> None:
    clock = Clock()
    _calls, write = _writer(refusals=1000)
    with pytest.raises(Unreachable, match=r"did not accept it within 5 s \(timeout\)"):
        asyncio.run(
            until_accepted(
                write,
                within=5,
                unavailable=lambda error: isinstance(error, ForNow),
                what="the registration",
                clock=clock,
                sleep=clock.sleep,
            )
        )
    assert clock.now <= 5
    calls, write = _writer(refusals=1)
    with pytest.raises(ForNow):
        asyncio.run(
            until_accepted(
                write,
                within=5,
                unavailable=lambda error: False,
                what="the registration",
                clock=clock,
                sleep=clock.sleep,
            )
        )
    assert len(calls) == 1


def test_the_refusals_of_an_election_count_as_for_now() -> None:
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeoutError
    from nats.js.errors import BadRequestError, ServiceUnavailableError
    from workerset_admission.adapters.nats.errors import is_unavailable_for_now

    for error in (NatsTimeoutError(), NoRespondersError(), ServiceUnavailableError()):
        assert is_unavailable_for_now(error)
    assert not is_unavailable_for_now(BadRequestError())
