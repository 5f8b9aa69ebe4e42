"""Drains: an operator-declared departure, and the handover that keeps a drained tenure serving."""

from __future__ import annotations

from admission_support import EP, G, finish, group_key, lora, of, one, reg
from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    CancelBuild,
    CommitGroup,
    CoreSettings,
    Drain,
    DrainChanged,
    DrainLifted,
    DrainSet,
    GroupStatus,
    HandoverEnded,
    Listing,
    LoraProjectionChanged,
    OpenReceiver,
    PublishAdmissions,
    RejectionReported,
    RetireReceiver,
    StartBuild,
    Succession,
    Tick,
    WithdrawGroup,
    WorkerAdded,
    WorkerDeparted,
    WorkerDrained,
    WorkerPlaced,
    WorkerRemoved,
)
from workerset_admission.identity import AttemptId, EndpointId


def drain(instance_id: int, namespace: str = EP.namespace) -> DrainSet:
    return DrainSet(Drain(namespace, instance_id, by="ops", at=1_700_000_000.0))


def lift(instance_id: int, namespace: str = EP.namespace) -> DrainLifted:
    return DrainLifted(namespace, instance_id)


def ready(core: AdmissionCore, *members: tuple[int, str]) -> None:
    """Admit and commit the first checksum given; the rest wait as they come."""
    finish(core, core.apply_many([WorkerAdded(reg(i, c)) for i, c in members]))


def view(core: AdmissionCore):  # type: ignore[no-untyped-def]
    group = core.group(G)
    assert group is not None
    return group


def test_a_drained_member_leaves_the_admitted_set_and_stays_tracked() -> None:
    core = AdmissionCore()
    ready(core, (1, "A"), (2, "A"))
    effects = core.apply(drain(1))
    drained = one(effects, WorkerDrained)
    assert (drained.key, drained.was_admitted, drained.drain.by) == (reg(1).key, True, "ops")
    assert one(effects, PublishAdmissions).admitted == frozenset({2})
    assert one(effects, DrainChanged).drain == Drain(EP.namespace, 1, "ops", 1_700_000_000.0)
    group = view(core)
    assert group.admitted == (2,)
    assert [d.instance_id for d in group.drained] == [1]
    placement = core.placement(reg(1).key)
    assert placement is not None
    assert (placement.admitted, placement.position, placement.drained_by) == (
        False,
        None,
        Drain(EP.namespace, 1, "ops", 1_700_000_000.0),
    )


def test_a_drain_covers_every_registration_of_the_worker_in_its_namespace_only() -> None:
    other_model = group_key("other", EndpointId(EP.namespace, "prefill", "generate"))
    elsewhere = EndpointId("ns2", "workers", "generate")
    core = AdmissionCore()
    core.apply_many(
        [
            WorkerAdded(reg(1, "A")),
            WorkerAdded(reg(1, "X", group=other_model)),
            WorkerAdded(reg(1, "Y", group=group_key(endpoint=elsewhere))),
        ]
    )
    effects = core.apply(drain(1))
    assert sorted(e.group.model for e in of(effects, WorkerDrained)) == ["m", "other"]
    assert core.placement(reg(1, "Y", group=group_key(endpoint=elsewhere)).key).admitted  # type: ignore[union-attr]


def test_a_registration_of_a_drained_worker_is_never_admitted() -> None:
    core = AdmissionCore()
    core.apply(drain(7))
    effects = core.apply(WorkerAdded(reg(7, "A")))
    assert one(effects, WorkerDrained).was_admitted is False
    assert of(effects, OpenReceiver) == []
    assert of(effects, WorkerPlaced) == []
    assert view(core).incumbent is None


def test_drain_of_a_rejected_member_shrinks_its_cohort_and_changes_nothing_served() -> None:
    core = AdmissionCore()
    ready(core, (1, "A"), (3, "B"), (4, "B"))
    effects = core.apply(drain(3))
    assert one(effects, WorkerDrained).was_admitted is False
    assert of(effects, PublishAdmissions) == []
    assert of(effects, StartBuild) == []
    assert [c.instance_ids for c in view(core).cohorts] == [(1,), (4,)]


def test_drain_of_a_whole_rejected_cohort_removes_it_and_its_return_is_reported_again() -> None:
    core = AdmissionCore()
    ready(core, (1, "A"), (3, "B"))
    core.apply(drain(3))
    assert [c.mdc_checksum for c in view(core).cohorts] == ["A"]
    effects = core.apply(lift(3))
    assert one(effects, RejectionReported).rejected_checksum == "B"
    assert [c.mdc_checksum for c in view(core).cohorts] == ["A", "B"]


def test_drain_of_the_last_incumbent_with_a_waiting_cohort_hands_over() -> None:
    core = AdmissionCore()
    ready(core, (1, "A"), (3, "B"))
    old = view(core)
    effects = core.apply(drain(1))
    succession = one(effects, Succession)
    assert (succession.old_checksum, succession.new_checksum, succession.drained) == (
        "A",
        "B",
        True,
    )
    # The old tenure still serves the drained worker: nothing withdrawn, nothing retired.
    assert of(effects, WithdrawGroup) == []
    assert of(effects, RetireReceiver) == []
    publications = {p.receiver: p.admitted for p in of(effects, PublishAdmissions)}
    assert publications[old.receiver] == frozenset({1})
    opened = one(effects, OpenReceiver)
    assert publications[opened.receiver] == frozenset({3})
    group = view(core)
    assert group.incumbent == "B"
    assert group.handover is not None
    assert (group.handover.mdc_checksum, group.handover.members) == ("A", (1,))
    assert group.handover.generation == old.committed_generation
    # The successor's commit names the tenure it takes over from, and the old one goes after.
    effects = finish(core, effects)
    kinds = [type(e) for e in effects]
    commit = one(effects, CommitGroup)
    assert commit.handover_from == old.committed_generation
    assert kinds.index(CommitGroup) < kinds.index(WithdrawGroup) < kinds.index(RetireReceiver)
    assert one(effects, WithdrawGroup).generation == old.committed_generation
    assert one(effects, RetireReceiver).receiver == old.receiver
    assert one(effects, HandoverEnded).reason == "committed"
    assert view(core).handover is None
    assert view(core).status is GroupStatus.READY


def test_drain_of_the_last_incumbent_with_no_waiting_cohort_ends_the_tenure_at_once() -> None:
    core = AdmissionCore()
    ready(core, (1, "A"))
    effects = core.apply(drain(1))
    assert one(effects, Succession).new_checksum is None
    assert one(effects, Succession).drained is False
    assert len(of(effects, WithdrawGroup)) == 1
    assert len(of(effects, RetireReceiver)) == 1
    assert view(core).status is GroupStatus.IDLE
    assert view(core).handover is None


def test_drain_during_a_build_succeeds_at_once_since_nothing_is_served() -> None:
    core = AdmissionCore()
    start = core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(3, "B"))])
    build = one(start, StartBuild)
    effects = core.apply(drain(1))
    assert one(effects, CancelBuild).generation == build.generation
    assert one(effects, Succession).drained is False
    assert one(effects, RetireReceiver).mdc_checksum == "A"
    assert of(effects, WithdrawGroup) == []
    # The cancelled build's late result is fenced.
    late = core.apply(BuildFinished(G, "A", build.generation, True))
    assert of(late, CommitGroup) == []


def test_the_handover_ends_when_the_drained_worker_really_leaves() -> None:
    core = AdmissionCore(CoreSettings(max_concurrent_builds=1))
    ready(core, (1, "A"), (3, "B"))
    old = view(core)
    core.apply(drain(1))
    effects = core.apply(WorkerRemoved(reg(1).key))
    assert one(effects, WorkerDeparted).was_admitted is False
    assert one(effects, HandoverEnded).reason == "departed"
    assert one(effects, WithdrawGroup).generation == old.committed_generation
    assert one(effects, RetireReceiver).receiver == old.receiver
    assert view(core).drained == ()
    # The successor's commit then has nothing to take over.
    start = core.apply(Tick(0.0))
    assert of(start, CommitGroup) == []


def test_undrain_during_a_handover_rejoins_behind_the_successor() -> None:
    core = AdmissionCore()
    ready(core, (1, "A"), (3, "B"))
    core.apply(drain(1))
    effects = core.apply(lift(1))
    assert one(effects, HandoverEnded).reason == "undrained"
    assert one(effects, DrainChanged).drain is None
    assert one(effects, RejectionReported).rejected_checksum == "A"
    group = view(core)
    assert [c.mdc_checksum for c in group.cohorts] == ["B", "A"]
    assert group.incumbent == "B"


def test_undrain_of_a_member_whose_cohort_still_serves_rejoins_it() -> None:
    core = AdmissionCore()
    ready(core, (1, "A"), (2, "A"), (3, "B"))
    core.apply(drain(1))
    effects = core.apply(lift(1))
    assert one(effects, WorkerPlaced).admitted is True
    assert one(effects, PublishAdmissions).admitted == frozenset({1, 2})
    assert view(core).drained == ()


def test_a_drained_workers_real_departure_forgets_it_and_a_lift_then_changes_nothing() -> None:
    core = AdmissionCore()
    ready(core, (1, "A"), (2, "A"))
    core.apply(drain(1))
    core.apply(WorkerRemoved(reg(1).key))
    assert view(core).drained == ()
    effects = core.apply(lift(1))
    assert of(effects, WorkerPlaced) == []
    assert core.drains() == []


def test_a_repeated_drain_changes_nothing() -> None:
    core = AdmissionCore()
    ready(core, (1, "A"), (2, "A"))
    core.apply(drain(1))
    assert core.apply(drain(1)) == []


def test_a_listing_applies_drains_before_registrations_and_lifts_unlisted_ones() -> None:
    core = AdmissionCore()
    effects = core.apply(
        Listing(
            [reg(1, "A"), reg(2, "A")],
            drains=[Drain(EP.namespace, 1, "ops", None)],
        )
    )
    assert one(effects, PublishAdmissions).admitted == frozenset({2})
    assert [w.key for w in of(effects, WorkerPlaced)] == [reg(2).key]
    # The next listing without the drain gives the worker back; one with a refused drain
    # record keeps it.
    kept = core.apply(Listing([reg(1, "A"), reg(2, "A")], retain_drains=[(EP.namespace, 1)]))
    assert of(kept, WorkerPlaced) == []
    effects = core.apply(Listing([reg(1, "A"), reg(2, "A")]))
    assert one(effects, PublishAdmissions).admitted == frozenset({1, 2})


def test_a_drained_registration_absent_from_a_listing_is_forgotten() -> None:
    core = AdmissionCore()
    core.apply(Listing([reg(1, "A"), reg(2, "A")], drains=[Drain(EP.namespace, 1)]))
    effects = core.apply(Listing([reg(2, "A")], drains=[Drain(EP.namespace, 1)]))
    assert one(effects, WorkerDeparted).key == reg(1).key
    assert view(core).drained == ()


def test_drain_during_a_hold_stops_serving_the_member_on_its_last_known_record() -> None:
    core = AdmissionCore()
    ready(core, (1, "A"), (2, "A"))
    core.apply(Tick(100.0))
    # An outage's resync lists nobody: the tenure is held, both served on last known good.
    core.apply(Listing([], reconnect=True))
    assert view(core).last_known == (1, 2)
    effects = core.apply(drain(1))
    assert one(effects, PublishAdmissions).admitted == frozenset({2})
    assert view(core).last_known == (2,)
    assert view(core).hold_members == (2,)
    # Its return does not end the hold: it is drained.
    effects = core.apply(WorkerAdded(reg(1, "A")))
    assert one(effects, WorkerDrained).was_admitted is False
    assert view(core).held_until is not None


def test_adapters_of_a_drained_worker_leave_the_projection() -> None:
    core = AdmissionCore()
    ready(core, (1, "A"), (2, "A"))
    core.apply_many([WorkerAdded(lora(1)), WorkerAdded(lora(2))])
    effects = core.apply(drain(1))
    projection = one(effects, LoraProjectionChanged)
    assert [w.instance_id for w in projection.workers] == [2]
    placement = core.placement(lora(1).key)
    assert placement is not None
    assert placement.admitted is False


def test_a_retained_receiver_of_the_drained_tenure_never_sees_the_successor() -> None:
    core = AdmissionCore()
    ready(core, (1, "A"), (3, "B"))
    old_receiver = view(core).receiver
    effects = core.apply(drain(1))
    effects += finish(core, effects)
    seen = {p.admitted for p in of(effects, PublishAdmissions) if p.receiver == old_receiver}
    assert seen == {frozenset({1})}


def test_a_drained_worker_gone_in_the_same_batch_is_not_handed_over() -> None:
    core = AdmissionCore()
    ready(core, (1, "A"), (2, "A"), (3, "B"))
    # In one batch (one publication): worker 1 is drained and leaves, then worker 2 is drained.
    effects = core.apply_many([drain(1), WorkerRemoved(reg(1).key), drain(2)])
    assert one(effects, Succession).drained is True
    handover = view(core).handover
    assert handover is not None
    assert handover.members == (2,)


def test_what_is_served_follows_the_handover_and_the_successors_commit() -> None:
    core = AdmissionCore()
    assert core.serving() == {}
    ready(core, (1, "A"), (3, "B"))
    old = view(core)
    assert core.serving() == {G: AttemptId(G, "A", old.committed_generation)}
    assert core.serves(G)
    # During the handover the drained tenure is what serves, not the successor being built.
    effects = core.apply(drain(1))
    assert core.serving() == {G: AttemptId(G, "A", old.committed_generation)}
    finish(core, effects)
    new = view(core)
    assert new.committed_generation != old.committed_generation
    assert core.serving() == {G: AttemptId(G, "B", new.committed_generation)}
    # The last member leaving ends the tenure: nothing serves.
    core.apply(WorkerRemoved(reg(3, "B").key))
    assert core.serving() == {}
    assert not core.serves(G)
