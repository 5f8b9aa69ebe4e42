"""The drain protocol's machine: every transition its table names, and no other."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import pytest
from workerset_admission.card.drain_record import BudgetRead, budget_kv_key, decode_budget_record
from workerset_admission.card.serving_record import Record
from workerset_admission.rollout.drain import Emptied, Worker
from workerset_admission.rollout.drain_protocol import (
    TRANSITIONS,
    DrainProtocol,
    Event,
    Finish,
    Prepare,
    ProtocolError,
    Read,
    Release,
    Snapshot,
    State,
    Swap,
    Write,
)

W1, W2 = Worker("dgd", 1), Worker("dgd", 2)
GONE = Emptied("tiny", "fe-1", ("dgd/backend/generate/1",))


def judge_with(*answers: tuple[Emptied, ...]) -> Callable[..., tuple[Emptied, ...]]:
    """A check answering ``answers`` in turn (the last one again after that)."""
    given = list(answers)

    def judge(
        records: Sequence[Record],
        listing: Sequence[tuple[str, bytes]],
        workers: Sequence[Worker],
        drained: Sequence[Worker],
    ) -> tuple[Emptied, ...]:
        return given.pop(0) if len(given) > 1 else given[0]

    return judge


def snapshot(**budgets: BudgetRead) -> Snapshot:
    return Snapshot(budgets=budgets, in_force=(), serving=(), listing=(), server_now=100.0)


def machine(*answers: tuple[Emptied, ...], allow_empty: bool = False) -> DrainProtocol:
    return DrainProtocol((W1,), ("tiny",), judge_with(*answers or ((),)), allow_empty=allow_empty)


def test_a_drain_that_passes_reads_prepares_swaps_writes_releases_and_is_done() -> None:
    m = machine()
    assert m.next_action() == Read(("tiny",), listing=False)
    m.read(snapshot())
    assert m.state is State.PREPARING
    assert m.next_action() == Prepare((budget_kv_key("tiny"),))
    m.prepare_done()
    swap = m.next_action()
    assert isinstance(swap, Swap)
    assert (swap.key, swap.revision, swap.ttl) == (budget_kv_key("tiny"), None, 60.0)
    assert [(p.namespace, p.instance_id, p.since) for p in decode_budget_record(swap.value)] == [
        ("dgd", 1, None)
    ]
    m.swapped_one()
    assert m.next_action() == Write((W1,))
    m.written()
    assert m.next_action() == Release(("tiny",))
    m.released()
    assert m.next_action() == Finish(State.DONE)
    assert m.finished


def test_a_refusal_before_any_swap_ends_at_once_and_one_after_a_race_releases_first() -> None:
    m = machine((GONE,))
    m.read(snapshot())
    assert m.next_action() == Finish(State.REFUSED, (GONE,), raced=False)
    # Passed, swapped one budget, lost the race on the next, and refused on the second look.
    m = DrainProtocol((W1,), ("a", "b"), judge_with((), (GONE,)))
    m.read(snapshot())
    m.prepare_done()
    m.swapped_one()
    m.raced(past_deadline=False)
    assert m.state is State.READING
    read = m.next_action()
    assert isinstance(read, Read)
    assert read.listing
    assert 0 < read.pause <= 0.3
    m.read(snapshot())
    assert m.next_action() == Release(("a",))
    m.released()
    assert m.next_action() == Finish(State.REFUSED, (GONE,), raced=True)


def test_a_race_past_the_deadline_gives_up_and_takes_back_what_it_swapped() -> None:
    m = machine()
    m.read(snapshot())
    m.prepare_done()
    m.raced(past_deadline=True)
    assert m.next_action() == Finish(State.GAVE_UP, model="tiny")
    m = DrainProtocol((W1,), ("a", "b"), judge_with(()))
    m.read(snapshot())
    m.prepare_done()
    m.swapped_one()
    m.raced(past_deadline=True)
    assert m.next_action() == Release(("a",))
    m.released()
    assert m.next_action() == Finish(State.GAVE_UP, model="b")


def test_allow_empty_goes_on_and_says_what_it_allowed() -> None:
    m = machine((GONE,), allow_empty=True)
    m.read(snapshot())
    m.prepare_done()
    m.swapped_one()
    assert m.next_action() == Write((W1,), (GONE,))


def test_a_second_pass_after_a_race_is_not_prepared_again() -> None:
    m = machine()
    m.read(snapshot())
    m.prepare_done()
    m.raced(past_deadline=False)
    m.read(snapshot(tiny=BudgetRead(7, None, None)))
    assert m.state is State.SWAPPING
    swap = m.next_action()
    assert isinstance(swap, Swap)
    assert swap.revision == 7


def test_no_models_means_nothing_to_swap() -> None:
    m = DrainProtocol((W1,), (), judge_with(()))
    m.read(snapshot())
    m.prepare_done()
    assert m.next_action() == Write((W1,))


# -- the table -------------------------------------------------------------------------------


def _steps(m: DrainProtocol, count: int) -> None:
    """Walk a passing drain ``count`` reports along: read, prepared, swapped, written."""
    steps = [lambda: m.read(snapshot()), m.prepare_done, m.swapped_one, m.written]
    for step in steps[:count]:
        step()


# One way into each state a driver reports in, from a fresh machine.
_REACH: dict[State, int] = {
    State.READING: 0,
    State.PREPARING: 1,
    State.SWAPPING: 2,
    State.WRITING: 3,
    State.RELEASING: 4,
}

# What each driver report fires, and how to report it.
_REPORTS: dict[Event, Callable[[DrainProtocol], None]] = {
    Event.READ: lambda m: m.read(snapshot()),
    Event.PREPARED: lambda m: m.prepare_done(),
    Event.SWAPPED: lambda m: m.swapped_one(),
    Event.RACED: lambda m: m.raced(past_deadline=False),
    Event.WRITTEN: lambda m: m.written(),
    Event.RELEASED: lambda m: m.released(),
}


@pytest.mark.parametrize("state", list(_REACH))
@pytest.mark.parametrize("event", list(_REPORTS))
def test_every_report_the_table_does_not_name_raises_and_changes_nothing(
    state: State, event: Event
) -> None:
    m = machine()
    _steps(m, _REACH[state])
    assert m.state is state
    if (state, event) in TRANSITIONS:
        _REPORTS[event](m)  # named: it goes through
        return
    before = copy.copy(m)
    swaps, swapped = list(m.swaps), list(m.swapped)
    with pytest.raises(ProtocolError):
        _REPORTS[event](m)
    assert (m.state, m.attempt, m.prepared, m.swaps, m.swapped) == (
        before.state,
        before.attempt,
        before.prepared,
        swaps,
        swapped,
    )


def test_every_state_but_the_final_ones_can_be_left_and_every_state_reached() -> None:
    sources = {s for s, _e in TRANSITIONS}
    targets = set(TRANSITIONS.values())
    assert sources | targets == set(State)
    assert set(State) - sources == {State.DONE, State.REFUSED, State.GAVE_UP}
    for final in (State.DONE, State.REFUSED, State.GAVE_UP):
        m = machine()
        m.state = final
        for report in _REPORTS.values():
            with pytest.raises(ProtocolError):
                report(m)
        assert m.state is final


def test_a_check_that_raises_leaves_the_machine_where_it_was() -> None:
    def broken(*_args: object) -> tuple[Emptied, ...]:
        raise RuntimeError("the listing could not be judged")

    m = DrainProtocol((W1,), ("tiny",), broken)
    with pytest.raises(RuntimeError):
        m.read(snapshot())
    assert (m.state, m.snapshot) == (State.READING, None)
