"""The handover table and the drains registry: a handover ends once; a refusal changes nothing."""

from __future__ import annotations

import pytest
from workerset_admission.admission.drain import (
    HANDOVER_TRANSITIONS,
    Drains,
    Handover,
    HandoverEvent,
    HandoverPhase,
)
from workerset_admission.errors import TransitionRefused
from workerset_admission.identity import Drain, EndpointId, GroupKey, Registration, WorkerType

ALL_PAIRS = [(p, e) for p in HandoverPhase for e in HandoverEvent]
ENDINGS = [e for e in HandoverEvent if e is not HandoverEvent.MEMBER_LEFT]


def _handover(phase: HandoverPhase) -> Handover:
    handover = Handover("cs", 4, 7, {1: "ns/c/e/1", 2: "ns/c/e/2"}, {"card": 1})
    handover.phase = phase
    return handover


def _state(handover: Handover) -> tuple[object, ...]:
    return (
        handover.phase,
        handover.checksum,
        handover.receiver,
        handover.generation,
        dict(handover.members),
        handover.card,
    )


@pytest.mark.parametrize(("phase", "event"), sorted(HANDOVER_TRANSITIONS, key=str))
def test_every_listed_handover_transition_moves_to_its_table_entry(
    phase: HandoverPhase, event: HandoverEvent
) -> None:
    handover = _handover(phase)
    assert handover.process(event) is HANDOVER_TRANSITIONS[(phase, event)]
    assert handover.phase is HANDOVER_TRANSITIONS[(phase, event)]


@pytest.mark.parametrize(
    ("phase", "event"), [p for p in ALL_PAIRS if p not in HANDOVER_TRANSITIONS], ids=str
)
def test_a_refused_handover_transition_leaves_the_handover_equal_to_before(
    phase: HandoverPhase, event: HandoverEvent
) -> None:
    handover = _handover(phase)
    before = _state(handover)
    with pytest.raises(TransitionRefused):
        handover.process(event)
    assert _state(handover) == before


@pytest.mark.parametrize("event", ENDINGS, ids=str)
def test_a_handover_ends_once_and_says_why(event: HandoverEvent) -> None:
    handover = _handover(HandoverPhase.SERVING)
    assert handover.end(event) == event.value
    before = _state(handover)
    with pytest.raises(TransitionRefused):
        handover.end(event)
    assert _state(handover) == before


def test_a_member_leaving_is_no_ending_of_its_own() -> None:
    handover = _handover(HandoverPhase.SERVING)
    before = _state(handover)
    with pytest.raises(TransitionRefused):
        handover.end(HandoverEvent.MEMBER_LEFT)
    assert _state(handover) == before


def test_members_leave_one_by_one_and_the_last_one_is_left_to_end_it() -> None:
    handover = _handover(HandoverPhase.SERVING)
    assert handover.serves(1, "ns/c/e/1")
    assert not handover.serves(1, "ns/c/e/9")
    assert handover.member_left(1)
    assert handover.phase is HandoverPhase.SERVING
    assert not handover.member_left(2)
    assert handover.phase is HandoverPhase.SERVING
    assert handover.end(HandoverEvent.DEPARTED) == "departed"
    assert handover.phase is HandoverPhase.ENDED


def _reg(namespace: str, iid: int, key_suffix: str = "") -> Registration:
    endpoint = EndpointId(namespace, "c", "e")
    group = GroupKey.build("m", endpoint, "chat", WorkerType.AGGREGATED)
    key = f"{namespace}/c/e/{iid:x}{key_suffix}"
    return Registration(key, endpoint, iid, None, group, "a", "f", None, ())


def test_the_drains_registry_tells_new_from_changed_from_the_same() -> None:
    drains = Drains()
    first = Drain("ns", 5, by="ops", at=1.0)
    assert drains.put(first) == "new"
    assert drains.put(first) == "same"
    assert drains.put(Drain("ns", 5, by="ops", at=2.0)) == "changed"
    assert set(drains.in_force) == {("ns", 5)}
    assert drains.drain_of(_reg("ns", 5)).at == 2.0
    assert [d.at for d in drains.workers()] == [2.0]


def test_lifting_gives_back_what_the_drain_set_aside_in_key_order() -> None:
    drains = Drains()
    drains.put(Drain("ns", 5))
    for reg in (_reg("ns", 5, "/b"), _reg("ns", 5, "/a"), _reg("other", 5)):
        drains.drained[reg.key] = reg
    assert drains.lift(("ns", 6)) is None  # not drained: nothing to give back
    returning = drains.lift(("ns", 5))
    assert returning is not None
    assert [r.key for r in returning] == ["ns/c/e/5/a", "ns/c/e/5/b"]
    assert drains.in_force == {}
