"""Holding a tenure across an outage: a post-outage resync that lists no incumbent member."""

from __future__ import annotations

import pytest
from admission_support import G, finish, of, one, reg
from workerset_admission.admission import (
    AdmissionCore,
    CoreSettings,
    GroupStatus,
    PublishAdmissions,
    RejectionReported,
    RetireReceiver,
    Snapshot,
    StartBuild,
    Succession,
    TenureHeld,
    TenureHoldEnded,
    Tick,
    WithdrawGroup,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.errors import ConfigError


def _ready_a_with_b_waiting(hold: float = 30.0) -> AdmissionCore:
    core = AdmissionCore(CoreSettings(tenure_hold=hold))
    core.apply(Tick(100.0))
    finish(core, core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "A"))]))
    core.apply(WorkerAdded(reg(3, "B")))
    return core


def _outage_lists_only_b(core: AdmissionCore) -> list[object]:
    return list(core.apply(Snapshot([reg(3, "B"), reg(4, "B")], reconnect=True)))


def test_a_resync_after_an_outage_that_lists_no_incumbent_member_holds_the_tenure() -> None:
    core = _ready_a_with_b_waiting()
    before = core.group(G)
    assert before is not None
    effects = _outage_lists_only_b(core)
    held = one(effects, TenureHeld)
    assert (held.mdc_checksum, held.receiver, held.deadline) == ("A", before.receiver, 130.0)
    assert of(effects, Succession) == []
    assert of(effects, RetireReceiver) == []
    assert of(effects, WithdrawGroup) == []
    # No vanished worker stays admitted, and the competitor is not admitted either.
    assert one(effects, PublishAdmissions).admitted == frozenset()
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.receiver, view.admitted) == ("A", before.receiver, ())
    assert view.status is GroupStatus.READY
    assert view.held_until == 130.0
    assert [c.mdc_checksum for c in view.cohorts] == ["A", "B"]
    assert view.cohorts[0].members == ()


def test_a_member_that_registers_again_during_the_hold_rejoins_the_same_tenure() -> None:
    core = _ready_a_with_b_waiting()
    receiver = core.group(G).receiver  # type: ignore[union-attr]
    _outage_lists_only_b(core)
    core.apply(Tick(110.0))
    effects = core.apply(WorkerAdded(reg(1, "A")))
    ended = one(effects, TenureHoldEnded)
    assert (ended.outcome, ended.held_for) == ("rejoined", 10.0)
    assert one(effects, PublishAdmissions).admitted == frozenset({1})
    assert of(core.apply(Tick(1000.0)), Succession) == []
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.receiver, view.held_until) == ("A", receiver, None)


def test_a_competitor_registering_during_the_hold_is_rejected_not_admitted() -> None:
    core = _ready_a_with_b_waiting()
    _outage_lists_only_b(core)
    effects = core.apply(WorkerAdded(reg(5, "C")))
    assert one(effects, RejectionReported).rejected_checksum == "C"
    assert core.group(G).admitted == ()  # type: ignore[union-attr]


def test_when_no_member_returns_the_succession_happens_at_the_deadline() -> None:
    core = _ready_a_with_b_waiting()
    _outage_lists_only_b(core)
    assert of(core.apply(Tick(129.9)), Succession) == []
    effects = core.apply(Tick(130.0))
    assert one(effects, TenureHoldEnded).outcome == "expired"
    succession = one(effects, Succession)
    assert (succession.old_checksum, succession.new_checksum) == ("A", "B")
    assert one(effects, WithdrawGroup).mdc_checksum == "A"
    assert one(effects, StartBuild).mdc_checksum == "B"
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.admitted, view.held_until) == ("B", (3, 4), None)
    assert [c.mdc_checksum for c in view.cohorts] == ["B"]


def test_an_incumbent_member_returning_after_the_deadline_joins_the_end() -> None:
    core = _ready_a_with_b_waiting()
    _outage_lists_only_b(core)
    core.apply(Tick(200.0))
    effects = core.apply(WorkerAdded(reg(1, "A")))
    assert one(effects, RejectionReported).rejected_checksum == "A"
    assert [c.mdc_checksum for c in core.group(G).cohorts] == ["B", "A"]  # type: ignore[union-attr]


def test_a_held_group_with_no_cohort_left_drains_at_the_deadline() -> None:
    core = AdmissionCore(CoreSettings(tenure_hold=5.0))
    finish(core, core.apply(WorkerAdded(reg(1, "A"))))
    core.apply(Snapshot([], reconnect=True))
    succession = one(core.apply(Tick(5.0)), Succession)
    assert succession.new_checksum is None
    assert core.group(G).incumbent is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "emptying",
    [
        pytest.param(lambda core: core.apply(Snapshot([reg(3, "B")])), id="periodic listing"),
        pytest.param(
            lambda core: core.apply_many([WorkerRemoved(reg(1).key), WorkerRemoved(reg(2).key)]),
            id="live removals",
        ),
    ],
)
def test_only_a_post_outage_resync_holds_other_removals_succeed_at_once(emptying: object) -> None:
    core = _ready_a_with_b_waiting()
    effects = emptying(core)  # type: ignore[operator]
    assert of(effects, TenureHeld) == []
    assert one(effects, Succession).new_checksum == "B"


def test_a_hold_of_zero_seconds_disables_holding() -> None:
    core = _ready_a_with_b_waiting(hold=0.0)
    effects = _outage_lists_only_b(core)
    assert of(effects, TenureHeld) == []
    assert one(effects, Succession).new_checksum == "B"


def test_a_pending_retry_rebuilds_at_once_from_the_card_the_held_tenure_keeps() -> None:
    core = AdmissionCore(CoreSettings(tenure_hold=30.0, retry_delays=(5.0,)))
    start = one(core.apply(WorkerAdded(reg(1, "A"))), StartBuild)
    finish(core, [start], ok=False)
    # Emptied by the resync is a membership change: the backoff ends, as for any other.
    retry = one(core.apply(Snapshot([], reconnect=True)), StartBuild)
    assert (retry.representative, retry.card, retry.admitted) == (
        start.representative,
        start.card,
        frozenset(),
    )
    assert core.group(G).held_until == 30.0  # type: ignore[union-attr]


def test_a_negative_hold_is_refused() -> None:
    with pytest.raises(ConfigError):
        CoreSettings(tenure_hold=-1.0)


def test_an_expiry_reported_just_after_an_outage_holds_like_the_listing_would() -> None:
    core = _ready_a_with_b_waiting()
    core.apply(WorkerRemoved(reg(1, "A").key))
    effects = core.apply(WorkerRemoved(reg(2, "A").key, hold=True))
    assert one(effects, TenureHeld).deadline == 130.0
    assert of(effects, Succession) == []
