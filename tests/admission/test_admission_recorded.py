"""A core started from a recorded tenure goes on as the core the recording was taken from."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from admission_support import G, finish, of, one, reg
from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    CoreSettings,
    GroupStatus,
    GroupView,
    Input,
    Listing,
    OpenReceiver,
    StartBuild,
    TenureHeld,
    TenureRecorded,
    Tick,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.errors import UsageError

SETTINGS = CoreSettings(tenure_hold=30.0, registration_ttl=10.0)


def _recorded(view: GroupView) -> TenureRecorded:
    """What a ``state`` line carries of a group, read from the live core's view."""
    assert view.incumbent is not None
    assert view.receiver is not None
    assert view.generation is not None
    return TenureRecorded(
        view.key,
        view.incumbent,
        view.receiver,
        view.generation,
        view.committed_generation,
        view.held_until,
        view.hold_members,
        view.last_known,
        view.last_known_until,
    )


def _decision(view: GroupView | None) -> tuple[object, ...]:
    assert view is not None
    return (
        view.incumbent,
        view.status,
        view.receiver,
        view.generation,
        view.committed_generation,
        view.admitted,
        [(c.mdc_checksum, c.instance_ids) for c in view.cohorts],
        view.held_until,
        view.hold_members,
        view.last_known,
        view.last_known_until,
        view.arrivals,
    )


def _answer_builds(core: AdmissionCore, effects: Sequence[object]) -> None:
    for start in of(effects, StartBuild):
        core.apply(BuildFinished(start.group, start.mdc_checksum, start.generation, True))


def _live_held_at_105() -> AdmissionCore:
    """A/1 and A/2 serve at generation 1, B/3 waits; a reconnect at 100 lists only B."""
    core = AdmissionCore(SETTINGS)
    core.apply(Tick(90.0))
    finish(core, core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "A"))]))
    core.apply(WorkerAdded(reg(3, "B")))
    core.apply(Tick(100.0))
    core.apply(Listing([reg(3, "B")], reconnect=True))
    core.apply(WorkerAdded(reg(7, "A")))  # a new instance of A during the hold
    core.apply(Tick(105.0))
    return core


CONTINUATIONS: dict[str, list[Input]] = {
    "the hold runs out": [Tick(111.0), Tick(131.0)],
    "a pre-hold member comes back": [Tick(108.0), WorkerAdded(reg(2, "A")), Tick(140.0)],
    "the new instance leaves, then the hold runs out": [WorkerRemoved(reg(7).key), Tick(131.0)],
    "the competitor leaves during the hold": [WorkerRemoved(reg(3).key), Tick(131.0)],
}


@pytest.mark.parametrize("name", CONTINUATIONS)
def test_a_recording_begun_mid_hold_replays_as_the_live_core_goes_on(name: str) -> None:
    live = _live_held_at_105()
    view = live.group(G)
    assert view is not None
    assert view.held_until == 130.0
    # The recording: the live core's state, then a listing of what the store holds now.
    replayed = AdmissionCore(SETTINGS)
    listing = [reg(3, "B"), reg(7, "A")]
    _answer_builds(replayed, replayed.apply_many([Tick(105.0), _recorded(view)]))
    _answer_builds(replayed, replayed.apply(Listing(listing)))
    assert _decision(replayed.group(G)) == _decision(view)
    for event in CONTINUATIONS[name]:
        _answer_builds(live, live.apply(event))
        _answer_builds(replayed, replayed.apply(event))
        assert _decision(replayed.group(G)) == _decision(live.group(G)), event


def test_a_recorded_tenure_that_is_not_held_keeps_its_receiver_and_generation() -> None:
    core = AdmissionCore(SETTINGS)
    effects = core.apply_many([TenureRecorded(G, "A", receiver=4, generation=9)])
    assert effects == []
    effects = core.apply(Listing([reg(3, "B"), reg(1, "A")]))
    opened = one(effects, OpenReceiver)
    assert (opened.mdc_checksum, opened.receiver, opened.generation) == ("B", 1, 1)
    # The listing's order chose B here (a replay orders it by the recorded cohorts first).
    core = AdmissionCore(SETTINGS)
    core.apply(TenureRecorded(G, "A", receiver=4, generation=9))
    effects = core.apply(Listing([reg(1, "A"), reg(3, "B")]))
    opened = one(effects, OpenReceiver)
    assert (opened.receiver, opened.generation) == (4, 9)
    finish(core, effects)
    # Later tenures are numbered after the recorded ones.
    effects = core.apply(WorkerRemoved(reg(1).key))
    successor = one(effects, OpenReceiver)
    assert (successor.mdc_checksum, successor.receiver, successor.generation) == ("B", 5, 10)


def test_a_recorded_hold_is_in_place_before_the_listing_and_serves_its_last_known() -> None:
    core = AdmissionCore(SETTINGS)
    core.apply(Tick(3.0))
    recorded = TenureRecorded(
        G,
        "A",
        receiver=2,
        generation=5,
        committed_generation=5,
        held_until=20.0,
        hold_members=(1, 2),
        last_known=(2,),
        last_known_until=8.0,
    )
    effects = core.apply(recorded)
    held = one(effects, TenureHeld)
    assert (held.deadline, held.last_known, held.last_known_until) == (20.0, (reg(2).key,), 8.0)
    assert of(effects, StartBuild) == []
    core.apply(Listing([reg(3, "B")]))
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.status, view.admitted) == ("A", GroupStatus.READY, (2,))
    assert [c.mdc_checksum for c in view.cohorts] == ["A", "B"]
    core.apply(Tick(8.0))
    view = core.group(G)
    assert view is not None
    assert (view.admitted, view.held_until) == ((), 20.0)


def test_a_recorded_tenure_after_its_group_has_inputs_is_refused() -> None:
    core = AdmissionCore(SETTINGS)
    core.apply(WorkerAdded(reg(1, "A")))
    with pytest.raises(UsageError, match="comes after"):
        core.apply(TenureRecorded(G, "A", receiver=1, generation=1))
