"""Holding a tenure across an outage: a post-outage resync that lists no incumbent member."""

from __future__ import annotations

import pytest
from admission_support import EP, G, finish, group_key, lora, of, one, reg
from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    CoreSettings,
    Drain,
    DrainSet,
    GroupStatus,
    Listing,
    LoraProjectionChanged,
    PublishAdmissions,
    RejectionReported,
    RetireReceiver,
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


def _ready_a_with_b_waiting(hold: float = 30.0, ttl: float = 10.0) -> AdmissionCore:
    core = AdmissionCore(CoreSettings(tenure_hold=hold, registration_ttl=ttl))
    core.apply(Tick(100.0))
    finish(core, core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "A"))]))
    core.apply(WorkerAdded(reg(3, "B")))
    return core


def _outage_lists_only_b(core: AdmissionCore) -> list[object]:
    return list(core.apply(Listing([reg(3, "B"), reg(4, "B")], reconnect=True)))


def test_a_resync_after_an_outage_that_lists_no_incumbent_member_holds_the_tenure() -> None:
    core = _ready_a_with_b_waiting()
    before = core.group(G)
    assert before is not None
    effects = _outage_lists_only_b(core)
    held = one(effects, TenureHeld)
    assert (held.mdc_checksum, held.receiver, held.deadline) == ("A", before.receiver, 130.0)
    assert (held.last_known, held.last_known_until) == ((reg(1).key, reg(2).key), 110.0)
    assert of(effects, Succession) == []
    assert of(effects, RetireReceiver) == []
    assert of(effects, WithdrawGroup) == []
    # The members it had stay admitted on last known good; the competitor is not admitted.
    assert one(effects, PublishAdmissions).admitted == frozenset({1, 2})
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.receiver, view.admitted) == ("A", before.receiver, (1, 2))
    assert (view.last_known, view.last_known_until) == ((1, 2), 110.0)
    assert view.status is GroupStatus.READY
    assert view.held_until == 130.0
    assert [c.mdc_checksum for c in view.cohorts] == ["A", "B"]
    assert view.cohorts[0].members == ()


def test_after_one_registration_ttl_the_members_not_back_are_withdrawn_and_the_hold_stays() -> None:
    core = _ready_a_with_b_waiting()
    _outage_lists_only_b(core)
    assert of(core.apply(Tick(109.9)), PublishAdmissions) == []
    effects = core.apply(Tick(110.0))
    assert one(effects, PublishAdmissions).admitted == frozenset()
    assert of(effects, Succession) == []
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.admitted, view.last_known, view.held_until) == ("A", (), (), 130.0)


def test_the_registration_ttl_is_a_setting_and_never_outlasts_the_hold() -> None:
    core = _ready_a_with_b_waiting(hold=30.0, ttl=4.0)
    assert one(_outage_lists_only_b(core), TenureHeld).last_known_until == 104.0
    short = _ready_a_with_b_waiting(hold=3.0, ttl=10.0)
    assert one(_outage_lists_only_b(short), TenureHeld).last_known_until == 103.0
    with pytest.raises(ConfigError):
        CoreSettings(registration_ttl=0.0)


def test_a_member_that_registers_again_during_the_hold_rejoins_the_same_tenure() -> None:
    core = _ready_a_with_b_waiting()
    receiver = core.group(G).receiver  # type: ignore[union-attr]
    _outage_lists_only_b(core)
    core.apply(Tick(105.0))
    effects = core.apply(WorkerAdded(reg(1, "A")))
    ended = one(effects, TenureHoldEnded)
    assert (ended.outcome, ended.held_for) == ("rejoined", 5.0)
    # Worker 2 is not back yet: still served on last known good until one TTL is over.
    assert one(effects, PublishAdmissions).admitted == frozenset({1, 2})
    assert one(core.apply(Tick(110.0)), PublishAdmissions).admitted == frozenset({1})
    assert of(core.apply(Tick(1000.0)), Succession) == []
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.receiver, view.held_until) == ("A", receiver, None)


def test_a_new_instance_of_the_incumbents_checksum_does_not_end_the_hold() -> None:
    core = _ready_a_with_b_waiting()
    _outage_lists_only_b(core)
    core.apply(Tick(105.0))
    effects = core.apply(WorkerAdded(reg(7, "A")))
    assert of(effects, TenureHoldEnded) == []
    assert of(effects, PublishAdmissions) == []
    view = core.group(G)
    assert view is not None
    assert (view.admitted, view.arrivals, view.held_until) == ((1, 2), (7,), 130.0)
    placement = core.placement(reg(7).key)
    assert placement is not None
    assert (placement.admitted, placement.position) == (False, None)


def test_on_expiry_the_new_instances_join_the_end_as_with_no_hold() -> None:
    core = _ready_a_with_b_waiting()
    _outage_lists_only_b(core)
    core.apply(WorkerAdded(reg(7, "A")))
    effects = core.apply(Tick(130.0))
    assert one(effects, TenureHoldEnded).outcome == "expired"
    assert one(effects, Succession).new_checksum == "B"
    assert one(effects, RejectionReported).rejected_checksum == "A"
    view = core.group(G)
    assert view is not None
    assert [(c.mdc_checksum, c.instance_ids) for c in view.cohorts] == [("B", (3, 4)), ("A", (7,))]
    assert view.admitted == (3, 4)


def test_new_instances_keep_their_place_among_cohorts_that_came_after_them() -> None:
    core = _ready_a_with_b_waiting()
    _outage_lists_only_b(core)
    core.apply_many([WorkerAdded(reg(7, "A")), WorkerAdded(reg(8, "C"))])
    core.apply(Tick(130.0))
    order = [c.mdc_checksum for c in core.group(G).cohorts]  # type: ignore[union-attr]
    assert order == ["B", "A", "C"]


def test_a_returning_pre_hold_member_brings_the_new_instances_into_the_incumbent() -> None:
    core = _ready_a_with_b_waiting()
    _outage_lists_only_b(core)
    core.apply(WorkerAdded(reg(7, "A")))
    effects = core.apply(WorkerAdded(reg(2, "A")))
    assert one(effects, TenureHoldEnded).outcome == "rejoined"
    assert one(effects, PublishAdmissions).admitted == frozenset({1, 2, 7})
    view = core.group(G)
    assert view is not None
    assert (view.cohorts[0].instance_ids, view.arrivals) == ((2, 7), ())


def test_a_new_instance_that_leaves_during_the_hold_leaves_no_cohort_behind() -> None:
    core = _ready_a_with_b_waiting()
    _outage_lists_only_b(core)
    core.apply(WorkerAdded(reg(7, "A")))
    core.apply(WorkerRemoved(reg(7).key))
    core.apply(Tick(130.0))
    assert [c.mdc_checksum for c in core.group(G).cohorts] == ["B"]  # type: ignore[union-attr]


def test_a_competitor_registering_during_the_hold_is_rejected_not_admitted() -> None:
    core = _ready_a_with_b_waiting()
    _outage_lists_only_b(core)
    effects = core.apply(WorkerAdded(reg(5, "C")))
    assert one(effects, RejectionReported).rejected_checksum == "C"
    assert core.group(G).admitted == (1, 2)  # type: ignore[union-attr]


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
    core.apply(Listing([], reconnect=True))
    succession = one(core.apply(Tick(5.0)), Succession)
    assert succession.new_checksum is None
    assert core.group(G).incumbent is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "emptying",
    [
        pytest.param(lambda core: core.apply(Listing([reg(3, "B")])), id="periodic listing"),
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


def test_a_hold_pauses_a_pending_retry_and_a_rejoin_rebuilds_at_once() -> None:
    core = AdmissionCore(CoreSettings(tenure_hold=30.0, retry_delays=(5.0,)))
    start = one(core.apply(WorkerAdded(reg(1, "A"))), StartBuild)
    finish(core, [start], ok=False)
    effects = core.apply(Listing([], reconnect=True))
    assert of(effects, StartBuild) == []
    # The retry falls due during the hold: nothing is built or committed for no member.
    assert of(core.apply(Tick(6.0)), StartBuild) == []
    assert core.group(G).status is GroupStatus.RETRYING  # type: ignore[union-attr]
    retry = one(core.apply(WorkerAdded(reg(1, "A"))), StartBuild)
    assert (retry.representative, retry.admitted) == (start.representative, frozenset({1}))


def test_a_build_queued_when_the_hold_begins_waits_for_a_member() -> None:
    core = AdmissionCore(CoreSettings(tenure_hold=30.0, max_concurrent_builds=1))
    busy = reg(9, "A", group=group_key("other"))
    one(core.apply(WorkerAdded(busy)), StartBuild)
    assert of(core.apply(WorkerAdded(reg(1, "A"))), StartBuild) == []
    core.apply(Listing([busy], reconnect=True))
    other = core.group(busy.group)
    assert other is not None
    assert other.generation is not None
    finished = core.apply(BuildFinished(other.key, "A", other.generation, True))
    assert of(finished, StartBuild) == []
    assert one(core.apply(WorkerAdded(reg(1, "A"))), StartBuild).admitted == frozenset({1})


def test_a_negative_hold_is_refused() -> None:
    with pytest.raises(ConfigError):
        CoreSettings(tenure_hold=-1.0)


def test_an_expiry_soon_after_a_reconnect_holds_until_the_reconnect_plus_the_hold() -> None:
    core = _ready_a_with_b_waiting()
    core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")], reconnect=True))
    core.apply(WorkerRemoved(reg(1, "A").key, expired_at=125.0))
    effects = core.apply(WorkerRemoved(reg(2, "A").key, expired_at=125.0))
    held = one(effects, TenureHeld)
    # Counted from the reconnect at 100, not from the expiry at 125.
    assert (held.deadline, held.last_known, held.last_known_until) == (130.0, (), None)
    assert one(effects, PublishAdmissions).admitted == frozenset()
    assert one(core.apply(Tick(130.0)), Succession).new_checksum == "B"


def test_expiries_within_one_ttl_of_the_reconnect_serve_every_member_they_took() -> None:
    core = _ready_a_with_b_waiting()
    core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")], reconnect=True))
    core.apply(WorkerRemoved(reg(1, "A").key, expired_at=103.0))
    effects = core.apply(WorkerRemoved(reg(2, "A").key, expired_at=103.0))
    held = one(effects, TenureHeld)
    assert (held.last_known, held.last_known_until) == ((reg(1).key, reg(2).key), 110.0)
    assert one(effects, PublishAdmissions).admitted == frozenset({1, 2})


def test_an_expiry_after_the_hold_would_be_over_succeeds_at_once() -> None:
    core = _ready_a_with_b_waiting()
    core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")], reconnect=True))
    core.apply(WorkerRemoved(reg(1, "A").key, expired_at=131.0))
    effects = core.apply(WorkerRemoved(reg(2, "A").key, expired_at=131.0))
    assert of(effects, TenureHeld) == []
    assert one(effects, Succession).new_checksum == "B"


def _adapters(core: AdmissionCore) -> dict[int, tuple[str, ...]]:
    view = core.group(G)
    assert view is not None
    return {w.instance_id: tuple(a.model_suffix for a in w.adapters) for w in view.lora}


def _ready_a_with_adapters() -> AdmissionCore:
    core = _ready_a_with_b_waiting()
    core.apply_many([WorkerAdded(lora(1)), WorkerAdded(lora(2)), WorkerAdded(lora(2, "second"))])
    assert _adapters(core) == {1: ("my-lora",), 2: ("my-lora", "second")}
    return core


def test_a_hold_serves_its_members_adapters_beside_their_last_known_base_cards() -> None:
    core = _ready_a_with_adapters()
    effects = _outage_lists_only_b(core)  # the listing has neither base cards nor adapters
    one(effects, TenureHeld)
    assert of(effects, LoraProjectionChanged) == []  # the projection stays as it was
    assert _adapters(core) == {1: ("my-lora",), 2: ("my-lora", "second")}
    # A member back on its own records is projected from its own adapters again.
    effects = core.apply(WorkerAdded(reg(1, "A")))
    assert _adapters(core) == {2: ("my-lora", "second")}
    core.apply(WorkerAdded(lora(1)))
    assert _adapters(core) == {1: ("my-lora",), 2: ("my-lora", "second")}
    # Once one TTL is over, the member not back leaves with its adapters.
    effects = core.apply(Tick(110.0))
    assert one(effects, PublishAdmissions).admitted == frozenset({1})
    assert one(effects, LoraProjectionChanged).workers[0].instance_id == 1
    assert _adapters(core) == {1: ("my-lora",)}


def test_adapters_that_expire_before_their_base_card_are_served_by_the_hold_all_the_same() -> None:
    core = _ready_a_with_adapters()
    core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B"), lora(1), lora(2)], reconnect=True))
    # The outage left their records to run out: each worker's adapters go first, one by one.
    core.apply(WorkerRemoved(lora(2, "second").key, expired_at=101.0))
    core.apply(WorkerRemoved(lora(1).key, expired_at=101.1))
    core.apply(WorkerRemoved(lora(2).key, expired_at=101.2))
    assert _adapters(core) == {}  # their base cards are still registered: nothing is held
    core.apply(WorkerRemoved(reg(1, "A").key, expired_at=101.3))
    effects = core.apply(WorkerRemoved(reg(2, "A").key, expired_at=101.4))
    one(effects, TenureHeld)
    change = one(effects, LoraProjectionChanged)
    assert [w.instance_id for w in change.workers] == [1, 2]
    # As they were before the outage's first removal: those that went first are served too.
    assert _adapters(core) == {1: ("my-lora",), 2: ("my-lora", "second")}
    # A drained member stops being served, adapters and all.
    core.apply(DrainSet(Drain(EP.namespace, 2, "ops", 1_700_000_000.0)))
    assert _adapters(core) == {1: ("my-lora",)}


def test_a_live_removal_of_an_adapter_is_never_held() -> None:
    core = _ready_a_with_adapters()
    core.apply(WorkerRemoved(lora(1).key))
    assert _adapters(core) == {2: ("my-lora", "second")}
    core.apply_many([WorkerRemoved(reg(1, "A").key), WorkerRemoved(reg(2, "A").key)])
    view = core.group(G)
    assert view is not None
    assert view.incumbent == "B"
    assert _adapters(core) == {}


def test_an_adapter_removed_live_during_a_hold_is_no_longer_served() -> None:
    core = _ready_a_with_adapters()
    # The resync lists the adapters' records but neither base card: the tenure is held.
    adapters = [lora(1), lora(2), lora(2, "second")]
    one(core.apply(Listing([reg(3, "B"), *adapters], reconnect=True)), TenureHeld)
    assert _adapters(core) == {1: ("my-lora",), 2: ("my-lora", "second")}
    # A delete the store reports while reachable is no outage's doing.
    effects = core.apply(WorkerRemoved(lora(2, "second").key))
    assert [len(w.adapters) for w in one(effects, LoraProjectionChanged).workers] == [1, 1]
    assert _adapters(core) == {1: ("my-lora",), 2: ("my-lora",)}


def test_an_adapter_put_again_with_another_fingerprint_during_a_hold_ends_its_held_copy() -> None:
    core = _ready_a_with_adapters()
    one(_outage_lists_only_b(core), TenureHeld)
    assert _adapters(core) == {1: ("my-lora",), 2: ("my-lora", "second")}
    # Its base card is still gone: the new adapter cannot be projected yet, and the copy held
    # from before the outage is no longer what the worker registers.
    core.apply(WorkerAdded(lora(2, "second", fingerprint="other")))
    assert _adapters(core) == {1: ("my-lora",), 2: ("my-lora",)}
    # The same fingerprint put again is the same adapter back: its held copy stays.
    core.apply(WorkerAdded(lora(1)))
    assert _adapters(core) == {1: ("my-lora",), 2: ("my-lora",)}
