"""Admission receivers: watch semantics, clean retirement, and no leaks across tenures."""

from __future__ import annotations

import asyncio

import pytest
from support.fakes import handle_all
from support.registrations import reg
from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    StartBuild,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.errors import ReceiverClosed, ReceiverRetired, UsageError
from workerset_admission.identity import (
    EndpointId,
    GroupKey,
    Registration,
    WorkerType,
)
from workerset_admission.service.receivers import AdmissionChannels, open_admission_channel

EP = EndpointId("ns1", "workers", "generate")
G = GroupKey.build("m", EP, "chat|completions", WorkerType.DECODE)


def _reg(instance_id: int, checksum: str) -> Registration:
    return reg(instance_id, checksum, group=G, card={"name": checksum})


def test_current_shows_the_latest_value_without_waiting() -> None:
    sender, receiver = open_admission_channel(G, 1, "A", 1, [1])
    sender.send([1, 2])
    sender.send([2])
    state = receiver.current()
    assert (state.admitted, state.version, state.mdc_checksum) == (frozenset({2}), 2, "A")


async def test_changed_waits_for_a_newer_value_and_skips_intermediate_ones() -> None:
    sender, receiver = open_admission_channel(G, 1, "A", 1)
    waiter = asyncio.create_task(receiver.changed())
    await asyncio.sleep(0)
    assert not waiter.done()
    sender.send([1])
    sender.send([1, 2])
    assert (await asyncio.wait_for(waiter, 5)).admitted == frozenset({1, 2})
    sender.send([3])
    assert (await receiver.changed()).admitted == frozenset({3})


async def test_async_iteration_yields_changes_and_ends_when_retired() -> None:
    sender, receiver = open_admission_channel(G, 1, "A", 1)
    seen: list[frozenset[int]] = []

    async def read() -> None:
        async for state in receiver:
            seen.append(state.admitted)
            if len(seen) == 1:
                sender.retire()

    sender.send([5])
    await asyncio.wait_for(read(), 5)
    assert seen == [frozenset({5})]


async def test_a_retired_receiver_raises_the_distinct_retired_error() -> None:
    sender, receiver = open_admission_channel(G, 1, "A", 1, [1])
    waiter = asyncio.create_task(receiver.changed())
    await asyncio.sleep(0)
    sender.retire()
    with pytest.raises(ReceiverRetired):
        await asyncio.wait_for(waiter, 5)
    with pytest.raises(ReceiverRetired):
        receiver.current()
    with pytest.raises(UsageError):
        sender.send([1])


def test_closing_one_receiver_leaves_its_clones_working() -> None:
    sender, receiver = open_admission_channel(G, 1, "A", 1, [1])
    clone = receiver.clone()
    receiver.close()
    with pytest.raises(ReceiverClosed):
        receiver.current()
    sender.send([2])
    assert clone.current().admitted == frozenset({2})


def test_a_retained_receiver_never_sees_successor_ids_even_for_a_returning_checksum() -> None:
    core, channels = AdmissionCore(), AdmissionChannels()
    effects = core.apply(WorkerAdded(_reg(1, "A")))
    handle_all(channels, effects)
    old = channels.subscribe(G)
    assert old is not None
    assert old.current().admitted == frozenset({1})
    handle_all(channels, core.apply(WorkerAdded(_reg(2, "B"))))
    handle_all(channels, core.apply(WorkerRemoved(_reg(1, "A").key)))
    handle_all(channels, core.apply(WorkerAdded(_reg(1, "A"))))
    handle_all(channels, core.apply(WorkerRemoved(_reg(2, "B").key)))
    new = channels.subscribe(G)
    assert new is not None
    assert new.current().mdc_checksum == "A"
    assert new.current().admitted == frozenset({1})
    assert new.receiver_id != old.receiver_id
    assert old.retired
    with pytest.raises(ReceiverRetired):
        old.current()


def test_channels_follow_the_core_through_a_build_with_the_selected_card() -> None:
    core, channels = AdmissionCore(), AdmissionChannels()
    effects = core.apply(WorkerAdded(_reg(1, "A")))
    handle_all(channels, effects)
    start = next(e for e in effects if isinstance(e, StartBuild))
    handle_all(channels, core.apply(BuildFinished(G, "A", start.generation, True)))
    handle_all(channels, core.apply(WorkerAdded(_reg(2, "A"))))
    receiver = channels.subscribe(G)
    assert receiver is not None
    state = receiver.current()
    assert (state.admitted, state.generation, state.card) == (
        frozenset({1, 2}),
        start.generation,
        {"name": "A"},
    )


def test_publishing_to_an_unknown_channel_is_a_usage_error() -> None:
    from workerset_admission.admission import PublishAdmissions

    with pytest.raises(UsageError):
        AdmissionChannels().publish(PublishAdmissions(G, 9, "A", 1, frozenset()))


def test_a_burst_of_publications_is_worked_out_once_when_a_reader_looks() -> None:
    core, channels = AdmissionCore(), AdmissionChannels()
    handle_all(channels, core.apply(WorkerAdded(_reg(1, "A"))))
    receiver = channels.subscribe(G)
    assert receiver is not None
    states = []
    for iid in range(2, 12):
        handle_all(channels, core.apply(WorkerAdded(_reg(iid, "A"))))
        states.append(receiver.current())
    handle_all(channels, core.apply(WorkerRemoved(_reg(5, "A").key)))
    # The channel carried each snapshot as published; none was worked out on the way
    # (_ids is the snapshot's cache, None until someone reads the ids).
    assert all(state.ids._ids is None for state in states)
    assert receiver.current().admitted == frozenset(range(1, 12)) - {5}
    assert all(state.ids._ids is None for state in states)
    # An older state, read later, still holds exactly its own moment.
    assert states[3].admitted == frozenset(range(1, 6))
