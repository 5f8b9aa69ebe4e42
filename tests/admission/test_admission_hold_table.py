"""The hold table: every listed move works, every other move is refused and changes nothing."""

from __future__ import annotations

import pytest
from workerset_admission.admission.hold import (
    HOLD_TRANSITIONS,
    Hold,
    HoldEvent,
    HoldPhase,
    expiry_outage,
    listing_outage,
)
from workerset_admission.errors import TransitionRefused
from workerset_admission.identity import EndpointId, GroupKey, Registration, WorkerType

ALL_PAIRS = [(p, e) for p in HoldPhase for e in HoldEvent]


def _hold(phase: HoldPhase) -> Hold:
    """A hold with two pre-hold members, one served on its last known record, put in ``phase``."""
    hold = Hold(10.0, 40.0, {1: "ns/c/e/1", 2: "ns/c/e/2"}, {1: "ns/c/e/1"}, 20.0)
    hold.phase = phase
    return hold


def _state(hold: Hold) -> tuple[object, ...]:
    return (
        hold.phase,
        hold.since,
        hold.until,
        dict(hold.members),
        dict(hold.last_known),
        hold.last_known_until,
        dict(hold.arrivals),
        hold.arrival_seq,
    )


@pytest.mark.parametrize(("phase", "event"), sorted(HOLD_TRANSITIONS, key=str))
def test_every_listed_hold_transition_moves_to_its_table_entry(
    phase: HoldPhase, event: HoldEvent
) -> None:
    hold = _hold(phase)
    assert hold.process(event) is HOLD_TRANSITIONS[(phase, event)]
    assert hold.phase is HOLD_TRANSITIONS[(phase, event)]


@pytest.mark.parametrize(
    ("phase", "event"), [p for p in ALL_PAIRS if p not in HOLD_TRANSITIONS], ids=str
)
def test_a_refused_hold_transition_leaves_the_hold_equal_to_before(
    phase: HoldPhase, event: HoldEvent
) -> None:
    hold = _hold(phase)
    before = _state(hold)
    with pytest.raises(TransitionRefused):
        hold.process(event)
    assert _state(hold) == before


def test_an_over_hold_takes_no_event_at_all() -> None:
    assert not [e for e in HoldEvent if (HoldPhase.OVER, e) in HOLD_TRANSITIONS]


def test_every_phase_but_over_can_end() -> None:
    for phase in HoldPhase:
        if phase is HoldPhase.OVER:
            continue
        reached = {phase}
        frontier = [phase]
        while frontier:
            here = frontier.pop()
            for (source, _event), target in HOLD_TRANSITIONS.items():
                if source is here and target not in reached:
                    reached.add(target)
                    frontier.append(target)
        assert HoldPhase.OVER in reached, phase


def test_only_the_reserved_phases_are_held() -> None:
    assert {p for p in HoldPhase if p.held} == {HoldPhase.HELD, HoldPhase.HELD_BARE}


def test_a_hold_starts_held_or_bare_as_its_last_known_members_say() -> None:
    assert Hold(0.0, 30.0, {1: "k"}, {1: "k"}, 10.0).phase is HoldPhase.HELD
    assert Hold(0.0, 30.0, {1: "k"}, {}, 30.0).phase is HoldPhase.HELD_BARE


def test_the_last_member_back_ends_the_last_known_window_and_a_rejoin_then_ends_the_hold() -> None:
    hold = _hold(HoldPhase.HELD)
    hold.back(2)  # not served on a last known record: nothing moves
    assert hold.phase is HoldPhase.HELD
    hold.back(1)
    assert hold.phase is HoldPhase.HELD_BARE
    hold.process(HoldEvent.REJOIN)
    assert hold.over


def test_a_rejoin_while_others_are_served_keeps_the_window_until_they_are_back() -> None:
    hold = Hold(0.0, 30.0, {1: "a", 2: "b"}, {1: "a", 2: "b"}, 10.0)
    hold.back(1)
    hold.process(HoldEvent.REJOIN)
    assert hold.phase is HoldPhase.LAST_KNOWN
    assert not hold.held
    assert hold.forget(2)
    assert hold.over


def test_the_window_running_out_says_whom_it_served() -> None:
    hold = Hold(0.0, 30.0, {1: "a", 2: "b"}, {1: "a", 2: "b"}, 10.0)
    assert hold.last_known_over() == {1: "a", 2: "b"}
    assert hold.phase is HoldPhase.HELD_BARE
    with pytest.raises(TransitionRefused):
        hold.last_known_over()  # a bare hold serves nothing: there is no window to end
    assert hold.phase is HoldPhase.HELD_BARE


def test_forgetting_a_member_not_served_moves_nothing() -> None:
    hold = _hold(HoldPhase.HELD)
    assert not hold.forget(2)
    assert hold.phase is HoldPhase.HELD
    assert 2 not in hold.members


def test_arrivals_are_numbered_by_the_first_and_forgotten_with_the_last() -> None:
    hold = _hold(HoldPhase.HELD)
    endpoint = EndpointId("ns", "c", "e")
    group = GroupKey.build("m", endpoint, "chat", WorkerType.AGGREGATED)

    def reg(iid: int) -> Registration:
        return Registration(f"ns/c/e/{iid:x}", endpoint, iid, None, group, "a", "f", None, ())

    hold.arrive(reg(7), 3)
    hold.arrive(reg(8), 4)
    assert hold.arrival_seq == 3
    hold.drop_arrival(reg(7))
    assert hold.arrival_seq == 3
    hold.drop_arrival(reg(8))
    assert hold.arrival_seq is None
    hold.arrive(reg(9), 5)
    assert list(hold.take_arrivals()) == [9]
    assert hold.arrivals == {}
    assert hold.arrival_seq is None


def test_an_expiry_is_the_outages_only_within_the_hold_of_the_reconnect() -> None:
    assert expiry_outage(at=105.0, reconnect=100.0, tenure_hold=30.0) == 100.0
    assert expiry_outage(at=130.0, reconnect=100.0, tenure_hold=30.0) is None
    assert expiry_outage(at=105.0, reconnect=None, tenure_hold=30.0) is None


def _listing_outage(
    *, reconnect: bool = False, outage_start: bool = False, peer_outage_at: float | None = None
) -> float | None:
    return listing_outage(
        100.0,
        30.0,
        reconnect=reconnect,
        outage_start=outage_start,
        peer_outage_at=peer_outage_at,
    )


def test_a_listing_follows_an_outage_only_when_told_so() -> None:
    assert _listing_outage() is None
    assert _listing_outage(reconnect=True) == 100.0
    assert _listing_outage(outage_start=True) == 100.0
    assert _listing_outage(peer_outage_at=90.0) == 90.0
    assert _listing_outage(peer_outage_at=60.0) is None  # too long ago: not this start's outage
    assert _listing_outage(peer_outage_at=60.0, outage_start=True) == 100.0
    assert _listing_outage(peer_outage_at=120.0) == 100.0  # a peer's clock ahead counts as now
