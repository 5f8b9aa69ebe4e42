"""The status as a published snapshot: read from any thread without the loop, and never mutated.

A running service rebuilds its status in rounds (copies of the changed groups taken on the loop,
read out in a thread) and publishes each result as an immutable picture; a reader in another
thread takes the latest one. These tests hold that a reader there never waits for the loop,
that a picture says when it was taken and is replaced within its stated bound after a step, and
that a picture handed out is never changed by the steps after it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from support.cards import EP, base_card, model_entry, model_put
from support.fakes import FakeSource, settle
from workerset_admission.identity import GroupKey, WorkerType
from workerset_admission.ports import SourceListing
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.service.status_fold import ROUND_WAIT_MAX

CARD: dict[str, Any] = base_card(16)
KEY = GroupKey.build(CARD["display_name"], EP, "chat|completions", WorkerType.AGGREGATED)
# The stated bound: the longest wait before a round, plus the round (milliseconds for a
# handful of workers; the second allowed is for a loaded machine).
BOUND = ROUND_WAIT_MAX + 1.0


async def committed(ids: tuple[int, ...]) -> tuple[AdmissionService, FakeSource]:
    source = FakeSource()
    service = AdmissionService(source)
    await service.start()
    source.queue.put_nowait(SourceListing(tuple(model_entry(i) for i in ids)))
    await settle(lambda: service.binding(KEY) is not None)
    return service, source


def in_thread(call: Any) -> tuple[Any, float]:
    """Run ``call`` in a thread of its own; return its result and how long it took."""
    out: list[Any] = []

    def run() -> None:
        began = time.perf_counter()
        out.append((call(), time.perf_counter() - began))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert out, "the call in the thread did not return"
    result: tuple[Any, float] = out[0]
    return result


async def shown(service: AdmissionService, admitted: tuple[int, ...]) -> float:
    """Wait until a thread's read shows ``admitted``; return the seconds it took."""
    began = time.perf_counter()
    while True:
        current, _ = await asyncio.to_thread(in_thread, service.status)
        group = current.group(KEY)
        if group is not None and group.admitted == admitted:
            return time.perf_counter() - began
        assert time.perf_counter() - began < 10, "the change never showed"
        await asyncio.sleep(0.005)


async def test_a_status_read_in_another_thread_returns_while_the_loop_is_blocked() -> None:
    service, source = await committed((1,))
    try:
        await shown(service, (1,))
        source.queue.put_nowait(model_put(2))
        await settle(lambda: service.counters.puts == 1)
        # The loop is held by a long synchronous stretch; a thread reads meanwhile.
        release = threading.Event()
        answers: list[tuple[Any, float]] = []

        def read() -> None:
            answers.append(in_thread(service.status))
            answers.append(in_thread(service.render_status))
            release.set()

        reader = threading.Thread(target=read)
        reader.start()
        held = release.wait(5)  # blocks the loop: nothing can run on it until released
        reader.join(5)

        assert held, "a status read in a thread waited for the blocked loop"
        (current, status_took), (body, render_took) = answers
        assert status_took < 0.5
        assert render_took < 0.5
        # The picture published before the change: complete, and saying when it was taken.
        assert current.group(KEY).admitted == (1,)
        assert json.loads(body)["groups"][0]["admitted"] == [1]
        assert json.loads(body)["as_of"] == current.as_of
    finally:
        await service.stop()


async def test_a_step_shows_in_the_threads_snapshot_within_its_stated_bound() -> None:
    service, source = await committed((1,))
    try:
        await shown(service, (1,))
        for instance_id in (2, 3, 4):
            stepped = time.time()
            source.queue.put_nowait(model_put(instance_id))
            took = await shown(service, tuple(range(1, instance_id + 1)))
            current, _ = in_thread(service.status)

            assert took <= BOUND
            # Every step that ended before ``as_of`` is in the picture: this one is.
            assert current.as_of is not None
            assert current.as_of >= stepped
            assert current.as_of <= time.time()
    finally:
        await service.stop()


async def test_a_snapshot_handed_to_a_thread_is_not_changed_by_later_steps() -> None:
    service, source = await committed((1, 2))
    try:
        await shown(service, (1, 2))
        handed, _ = in_thread(service.status)
        before = json.dumps(handed.to_json(), sort_keys=True)

        for instance_id in (3, 4, 5):
            source.queue.put_nowait(model_put(instance_id))
        await shown(service, (1, 2, 3, 4, 5))

        assert json.dumps(handed.to_json(), sort_keys=True) == before
        assert handed.group(KEY).admitted == (1, 2)
        later, _ = in_thread(service.status)
        assert later is not handed
        assert later.group(KEY).admitted == (1, 2, 3, 4, 5)
    finally:
        await service.stop()


def test_a_group_copy_reads_out_the_group_as_it_was_copied() -> None:
    service = AdmissionService(FakeSource())
    service.handle_event(SourceListing(tuple(model_entry(i) for i in (1, 2))))
    copy = service.core.group_copy(KEY)
    assert copy is not None
    then = service.core.group(KEY)

    service.handle_event(model_put(3))

    assert copy.view() == then
    assert service.core.group(KEY) != then
    assert [m.instance_id for m in service.core.group(KEY).cohorts[0].members] == [1, 2, 3]


def test_the_status_of_a_service_not_running_is_exact_after_each_step() -> None:
    service = AdmissionService(FakeSource())
    service.handle_event(SourceListing((model_entry(1),)))
    assert service.status().group(KEY).cohorts[0].members == (1,)

    service.handle_event(model_put(2))

    assert service.status().group(KEY).cohorts[0].members == (1, 2)


@pytest.mark.parametrize("readers", [1, 4])
async def test_readers_in_threads_during_a_burst_see_only_complete_pictures(readers: int) -> None:
    service, source = await committed((1,))
    try:
        await shown(service, (1,))
        stop = threading.Event()
        seen: list[tuple[int, ...]] = []

        def read() -> None:
            while not stop.is_set():
                group = service.status().group(KEY)
                assert group is not None
                seen.append(group.cohorts[0].members)

        threads = [threading.Thread(target=read) for _ in range(readers)]
        for thread in threads:
            thread.start()
        try:
            for instance_id in range(2, 40):
                source.queue.put_nowait(model_put(instance_id))
                await asyncio.sleep(0)
            await shown(service, tuple(range(1, 40)))
        finally:
            stop.set()
            for thread in threads:
                thread.join(5)

        # Each picture is one group as some step left it: the ids 1..n for some n, in order.
        assert seen
        assert all(members == tuple(range(1, len(members) + 1)) for members in seen)
    finally:
        await service.stop()


def test_a_rendered_answer_is_made_again_for_each_new_snapshot() -> None:
    service = AdmissionService(FakeSource())
    service.handle_event(SourceListing((model_entry(1),)))
    first = json.loads(service.render_status())
    again = json.loads(service.render_status(brief=True))

    service.handle_event(model_put(2))
    later = json.loads(service.render_status())

    assert set(first) == {*service.status().to_json(), "process"}
    assert first["groups"][0]["admitted"] == [1]
    assert again["groups"][0]["admitted"] == 1
    assert later["groups"][0]["admitted"] == [1, 2]
    assert json.loads(service.render_status(brief=True))["groups"][0]["admitted"] == 2


async def test_a_round_overtaken_by_an_inline_refresh_publishes_nothing_older() -> None:
    service = AdmissionService(FakeSource())
    fold = service._fold
    service.handle_event(SourceListing(tuple(model_entry(i) for i in (1, 2))))
    service.handle_event(model_put(3))

    # The round copies the group (3 members) and reads it out in a thread; meanwhile the loop
    # applies another step and a reader on the loop refreshes inline.
    round_ = asyncio.create_task(fold.refresh_off_loop())
    await asyncio.sleep(0)
    service.handle_event(model_put(4))
    inline = fold.refresh()
    await round_

    assert inline.groups[0].cohorts[0].members == (1, 2, 3, 4)
    assert fold.snapshot is inline
    assert not fold.dirty
    assert service.status().group(KEY).cohorts[0].members == (1, 2, 3, 4)


async def test_a_step_during_a_round_leaves_its_group_for_the_next_round() -> None:
    service = AdmissionService(FakeSource())
    fold = service._fold
    service.handle_event(SourceListing(tuple(model_entry(i) for i in (1, 2))))
    fold.refresh()
    service.handle_event(model_put(3))

    round_ = asyncio.create_task(fold.refresh_off_loop())
    await asyncio.sleep(0)
    service.handle_event(model_put(4))
    first = await round_

    assert first.groups[0].cohorts[0].members == (1, 2, 3)
    assert fold.dirty
    second = await fold.refresh_off_loop()
    assert second.groups[0].cohorts[0].members == (1, 2, 3, 4)
    assert not fold.dirty


async def test_an_answer_the_loop_awaits_shows_every_step_before_it_without_an_inline_rebuild(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service, source = await committed((1,))
    try:
        # No reader in another thread for a while: rounds wait their longest.
        source.queue.put_nowait(model_put(2))
        await settle(lambda: service.counters.puts == 1)
        inline: list[int] = []
        refresh = type(service._fold).refresh

        def counted(fold: Any) -> Any:
            inline.append(1)
            return refresh(fold)

        monkeypatch.setattr(type(service._fold), "refresh", counted)
        began = time.perf_counter()
        current = await service.fresh_status()
        took = time.perf_counter() - began
        group = current.group(KEY)
        assert group is not None
        assert group.admitted == (1, 2)
        # Brought up to date by a round (copies on the loop, read-out in a thread), not by
        # the inline rebuild, and long before the rounds' own wait would have passed.
        assert inline == []
        assert took < ROUND_WAIT_MAX / 2
    finally:
        await service.stop()


async def test_rounds_asked_for_together_run_one_after_the_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from workerset_admission.service import status_fold

    service, source = await committed((1,))
    # The first round's read-out is held in its thread until the test lets it go.
    held = threading.Event()
    calls: list[int] = []
    read_out = status_fold._round

    def first_held(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            assert held.wait(10)
        return read_out(*args)

    monkeypatch.setattr(status_fold, "_round", first_held)
    try:
        source.queue.put_nowait(model_put(2))
        await settle(lambda: service.counters.puts == 1)
        first = asyncio.ensure_future(service._fold.refresh_off_loop())
        await settle(lambda: len(calls) == 1)
        source.queue.put_nowait(model_put(3))
        await settle(lambda: service.counters.puts == 2)
        # Asked for after the next put while the first round is still out: it starts once the
        # first has ended, with copies taken after that put, so it shows it.
        second = asyncio.ensure_future(service._fold.refresh_off_loop())
        await asyncio.sleep(0.05)
        assert len(calls) == 1
        held.set()
        assert (await second).entries[KEY].status.admitted == (1, 2, 3)
        assert (await first).entries[KEY].status.admitted in ((1, 2), (1, 2, 3))
    finally:
        held.set()
        await service.stop()


async def test_a_reader_in_another_thread_that_settles_sees_every_step_before_its_call() -> None:
    service, source = await committed((1,))
    try:
        await shown(service, (1,))
        # Long enough ago that rounds wait their longest (nobody else reads meanwhile).
        service._read_at -= 60
        source.queue.put_nowait(model_put(2))
        await settle(lambda: service.counters.puts == 1)
        (settled, took) = await asyncio.to_thread(in_thread, service.settled_status)
        group = settled.group(KEY)
        assert group is not None
        assert group.admitted == (1, 2)
        assert took < ROUND_WAIT_MAX / 2
    finally:
        await service.stop()
