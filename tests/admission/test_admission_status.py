"""The status table: every listed move works, every other move is refused and changes nothing."""

from __future__ import annotations

import pytest
from workerset_admission.admission import GroupStatus, StatusEvent, StatusMachine
from workerset_admission.admission.status import TRANSITIONS
from workerset_admission.errors import TransitionRefused, UsageError

ALL_PAIRS = [(s, e) for s in GroupStatus for e in StatusEvent]


@pytest.mark.parametrize(("state", "event"), sorted(TRANSITIONS, key=str))
def test_every_listed_transition_moves_to_its_table_entry(
    state: GroupStatus, event: StatusEvent
) -> None:
    machine = StatusMachine(state)
    assert machine.process(event) is TRANSITIONS[(state, event)]
    assert machine.state is TRANSITIONS[(state, event)]


@pytest.mark.parametrize(
    ("state", "event"), [p for p in ALL_PAIRS if p not in TRANSITIONS], ids=str
)
def test_a_refused_transition_leaves_the_status_equal_to_before(
    state: GroupStatus, event: StatusEvent
) -> None:
    machine = StatusMachine(state)
    with pytest.raises(TransitionRefused):
        machine.process(event)
    assert machine.state is state
    assert not machine.allows(event)


def test_a_refused_transition_is_a_usage_error_not_remote_data() -> None:
    assert issubclass(TransitionRefused, UsageError)


def test_every_status_is_reachable_from_idle() -> None:
    reached = {GroupStatus.IDLE}
    frontier = [GroupStatus.IDLE]
    while frontier:
        state = frontier.pop()
        for (source, _event), target in TRANSITIONS.items():
            if source is state and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(GroupStatus)


def test_every_status_but_idle_can_drain_back_to_idle() -> None:
    for state in GroupStatus:
        if state is not GroupStatus.IDLE:
            assert TRANSITIONS[(state, StatusEvent.END_TENURE)] is GroupStatus.IDLE


def test_status_values_are_the_output_spellings() -> None:
    assert [s.value for s in GroupStatus] == [
        "idle",
        "queued",
        "building",
        "ready",
        "retrying",
        "blocked",
        "blocked_ready",
    ]
