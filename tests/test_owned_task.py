"""An adapter's long-lived task: its failure said at WARNING, started again, stopped whole."""

from __future__ import annotations

import asyncio
import logging

import pytest
from support.aio import eventually
from workerset_admission.adapters.owned_task import OwnedTask, say_unread_failure

_log = logging.getLogger("tests.owned_task")


def _others(name: str) -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == name and not t.done()]


class Flaky:
    """A loop that fails its first ``failures`` runs, then runs until it is stopped."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.runs = 0
        self.steady = asyncio.Event()

    async def work(self) -> None:
        self.runs += 1
        await asyncio.sleep(0)
        if self.runs <= self.failures:
            raise RuntimeError(f"defect {self.runs}")
        self.steady.set()
        await asyncio.Event().wait()


async def test_a_loop_that_fails_is_said_at_warning_and_starts_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flaky = Flaky(failures=2)
    owned = OwnedTask(
        flaky.work,
        name="flaky loop",
        log=_log,
        keeps="the owner keeps its state",
        restart_after=0.01,
    )
    with caplog.at_level(logging.WARNING, logger=_log.name):
        owned.start()
        await asyncio.wait_for(flaky.steady.wait(), 5)
    said = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in said] == [
        "flaky loop failed: RuntimeError('defect 1'); the owner keeps its state, and starts it "
        "again in 0.01 s",
        "flaky loop failed: RuntimeError('defect 2'); the owner keeps its state, and starts it "
        "again in 0.01 s",
    ]
    assert all(r.exc_info is not None for r in said)  # with the traceback
    assert (owned.failures, owned.starts, owned.running) == (2, 3, True)
    assert str(owned.failure) == "defect 2"
    await owned.stop()
    assert not owned.running
    assert _others("flaky loop") == []


async def test_without_a_restart_the_failure_is_kept_for_the_owner_to_show(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flaky = Flaky(failures=1)
    owned = OwnedTask(flaky.work, name="once", log=_log, keeps="nothing runs it")
    with caplog.at_level(logging.WARNING, logger=_log.name):
        owned.start()
        await eventually(lambda: owned.failures == 1, "the failure noted")
        await asyncio.sleep(0.05)
    assert (owned.running, owned.starts, flaky.runs) == (False, 1, 1)
    assert [r.getMessage() for r in caplog.records] == [
        "once failed: RuntimeError('defect 1'); nothing runs it"
    ]
    await owned.stop()


async def test_stopping_cancels_a_pending_restart_and_a_detached_loop() -> None:
    flaky = Flaky(failures=1)
    owned = OwnedTask(flaky.work, name="stopped loop", log=_log, keeps="-", restart_after=0.05)
    owned.start()
    await eventually(lambda: owned.failures == 1, "the failure noted")
    await owned.stop()  # before the restart is due
    await asyncio.sleep(0.1)
    assert (flaky.runs, owned.running) == (1, False)
    # A loop let go of (its owner's bucket bound again) is still waited for by the stop.
    owned.start()
    await asyncio.wait_for(flaky.steady.wait(), 5)
    owned.detach()
    owned.start()
    assert len(_others("stopped loop")) == 2
    await owned.stop()
    assert _others("stopped loop") == []


async def test_a_task_a_call_stopped_has_its_own_failure_said_not_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails() -> None:
        raise OSError("watch lost")

    task = asyncio.ensure_future(fails())
    await asyncio.wait({task})
    with caplog.at_level(logging.WARNING, logger=_log.name):
        say_unread_failure(task, log=_log, what="the watch")
    assert [r.getMessage() for r in caplog.records] == [
        "the watch had failed as well: OSError('watch lost')"
    ]


async def test_a_start_asked_during_the_pause_after_a_failure_waits_for_the_pause() -> None:
    flaky = Flaky(failures=1)
    owned = OwnedTask(flaky.work, name="paused loop", log=_log, keeps="-", restart_after=0.2)
    owned.start()
    await eventually(lambda: owned.failures == 1, "the failure noted")
    owned.start()  # the owner has news: still, a failing loop does not run again at once
    await asyncio.sleep(0.05)
    assert (flaky.runs, owned.running) == (1, False)
    await asyncio.wait_for(flaky.steady.wait(), 5)
    assert (flaky.runs, owned.starts) == (2, 2)
    await owned.stop()
