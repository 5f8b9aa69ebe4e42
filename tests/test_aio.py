import asyncio

import pytest
from support.aio import time_limit
from workerset_admission.aio import cancel_and_wait


async def test_a_task_that_swallows_one_cancellation_is_still_stopped() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:  # noqa: PERF203 - the loop is the point
                # What a lost cancellation inside asyncio.wait_for looks like to the loop.
                if swallowed == 0:
                    swallowed += 1
                    continue
                raise

    task = asyncio.get_running_loop().create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait([task], retry=0.05), timeout=5)
    assert task.cancelled()
    assert swallowed == 1


async def test_finished_tasks_are_left_as_they_are() -> None:
    async def answer() -> int:
        return 42

    task = asyncio.get_running_loop().create_task(answer())
    await task
    await cancel_and_wait([task])
    assert task.result() == 42


async def test_a_time_limit_raises_timeout_in_place_of_a_block_that_runs_over() -> None:
    with pytest.raises(asyncio.TimeoutError):
        async with time_limit(0.05):
            await asyncio.sleep(10)
    async with time_limit(5):
        await asyncio.sleep(0)
