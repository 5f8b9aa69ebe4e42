"""A permission refusal ends the read waiting for its answer at once, not at its timeout."""

from __future__ import annotations

import asyncio

import pytest
from nats.errors import Error as NatsError
from workerset_admission.adapters.nats import connect
from workerset_admission.adapters.nats.connect import (
    _noting_refusals,
    refusal_mark,
    unless_refused,
)
from workerset_admission.errors import PermissionRefused


@pytest.fixture(autouse=True)
def _refusals_stay_in_their_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a process was refused is its command's: a test's refusals must not reach the next."""
    heard = connect._REFUSED_HERE
    monkeypatch.setattr(heard, "count", heard.count)
    monkeypatch.setattr(heard, "last", heard.last)


async def _ignore(_error: Exception) -> None:
    return None


async def _refuse_soon(subject: str) -> None:
    """What a connection's error callback hears when the server refuses a publish."""
    await asyncio.sleep(0.01)
    on_error = _noting_refusals(_ignore, [])
    await on_error(NatsError(f'nats: permissions violation for publish to "{subject}"'))


async def _unanswered() -> None:
    await asyncio.get_running_loop().create_future()  # a request the server never answers


async def test_a_refusal_heard_while_waiting_is_raised_at_once_and_the_wait_cancelled() -> None:
    mark = refusal_mark()
    waiting = asyncio.ensure_future(_unanswered())
    refusing = asyncio.ensure_future(_refuse_soon("$JS.API.STREAM.INFO.KV_adm"))
    with pytest.raises(PermissionRefused, match=r'publish to "\$JS\.API\.STREAM\.INFO\.KV_adm"'):
        await asyncio.wait_for(unless_refused(waiting, mark), timeout=5.0)
    await refusing
    assert waiting.cancelled()


async def test_work_that_ends_first_returns_its_answer() -> None:
    async def answered() -> str:
        return "entries"

    assert await unless_refused(answered(), refusal_mark()) == "entries"


async def test_an_earlier_refusal_does_not_end_later_work() -> None:
    await _refuse_soon("$JS.API.STREAM.INFO.KV_old")
    mark = refusal_mark()

    async def answered() -> int:
        await asyncio.sleep(0.05)
        return 3

    assert await unless_refused(answered(), mark) == 3


async def test_an_optional_subscription_refused_does_not_end_the_work() -> None:
    mark = refusal_mark()
    on_error = _noting_refusals(_ignore, [])

    async def answered() -> int:
        await on_error(
            NatsError('nats: permissions violation for subscription to "$JS.EVENT.ADVISORY.x"')
        )
        await asyncio.sleep(0.05)
        return 7

    assert await unless_refused(answered(), mark) == 7
