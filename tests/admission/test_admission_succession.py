"""Succession: only a fully drained incumbent hands over, with a clean break."""

from __future__ import annotations

from admission_support import G, finish, group_key, of, one, reg
from workerset_admission.admission import (
    AdmissionCore,
    BuildDiscarded,
    BuildFinished,
    CancelBuild,
    CommitGroup,
    GroupStatus,
    Listing,
    OpenReceiver,
    PublishAdmissions,
    RetireReceiver,
    StartBuild,
    Succession,
    WithdrawGroup,
    WorkerAdded,
    WorkerRemoved,
)


def _ready_a_with_b_waiting() -> AdmissionCore:
    core = AdmissionCore()
    finish(core, core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "A"))]))
    core.apply_many([WorkerAdded(reg(3, "B")), WorkerAdded(reg(4, "B"))])
    return core


def test_succession_waits_until_the_last_incumbent_worker_is_gone() -> None:
    core = _ready_a_with_b_waiting()
    effects = core.apply(WorkerRemoved(reg(1, "A").key))
    assert of(effects, Succession) == []
    assert one(effects, PublishAdmissions).admitted == frozenset({2})
    assert core.group(G).incumbent == "A"  # type: ignore[union-attr]
    effects = core.apply(WorkerRemoved(reg(2, "A").key))
    succession = one(effects, Succession)
    assert (succession.old_checksum, succession.new_checksum) == ("A", "B")


def test_succession_withdraws_the_commit_retires_the_receiver_and_opens_a_fresh_one() -> None:
    core = _ready_a_with_b_waiting()
    old = core.group(G)
    assert old is not None
    core.apply(WorkerRemoved(reg(1, "A").key))
    effects = core.apply(WorkerRemoved(reg(2, "A").key))
    withdraw = one(effects, WithdrawGroup)
    assert (withdraw.mdc_checksum, withdraw.generation) == ("A", old.committed_generation)
    assert one(effects, RetireReceiver).receiver == old.receiver
    opened = one(effects, OpenReceiver)
    assert opened.receiver != old.receiver
    assert old.generation is not None
    assert opened.generation > old.generation
    publish = one(effects, PublishAdmissions)
    assert (publish.receiver, publish.admitted) == (opened.receiver, frozenset({3, 4}))
    kinds = [type(e) for e in effects]
    assert kinds.index(WithdrawGroup) < kinds.index(RetireReceiver) < kinds.index(OpenReceiver)


def test_succession_cancels_the_build_in_flight() -> None:
    core = AdmissionCore()
    start = one(core.apply(WorkerAdded(reg(1, "A"))), StartBuild)
    core.apply(WorkerAdded(reg(2, "B")))
    effects = core.apply(WorkerRemoved(reg(1, "A").key))
    cancel = one(effects, CancelBuild)
    assert (cancel.mdc_checksum, cancel.generation) == ("A", start.generation)
    assert of(effects, WithdrawGroup) == []
    assert one(effects, StartBuild).mdc_checksum == "B"


def test_the_oldest_remaining_cohort_succeeds() -> None:
    core = AdmissionCore()
    core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "B")), WorkerAdded(reg(3, "C"))])
    core.apply(WorkerAdded(reg(4, "C")))
    core.apply(WorkerRemoved(reg(1, "A").key))
    assert core.group(G).incumbent == "B"  # type: ignore[union-attr]


def test_a_late_result_from_the_old_tenure_is_fenced_out() -> None:
    core = AdmissionCore()
    old = one(core.apply(WorkerAdded(reg(1, "A"))), StartBuild)
    core.apply(WorkerAdded(reg(2, "B")))
    core.apply(WorkerRemoved(reg(1, "A").key))
    effects = core.apply(BuildFinished(G, old.mdc_checksum, old.generation, True))
    assert one(effects, BuildDiscarded).generation == old.generation
    assert of(effects, CommitGroup) == []
    assert core.group(G).status is GroupStatus.BUILDING  # type: ignore[union-attr]


def test_a_result_is_fenced_on_checksum_as_well_as_generation() -> None:
    core = AdmissionCore()
    start = one(core.apply(WorkerAdded(reg(1, "A"))), StartBuild)
    effects = core.apply(BuildFinished(G, "B", start.generation, True))
    assert of(effects, CommitGroup) == []
    assert one(effects, BuildDiscarded).reason
    assert core.group(G).status is GroupStatus.BUILDING  # type: ignore[union-attr]


def test_when_the_same_checksum_returns_it_gets_a_new_receiver_and_generation() -> None:
    core = AdmissionCore()
    first = core.apply(WorkerAdded(reg(1, "A")))
    finish(core, first)
    core.apply(WorkerRemoved(reg(1, "A").key))
    again = core.apply(WorkerAdded(reg(1, "A")))
    old, new = one(first, OpenReceiver), one(again, OpenReceiver)
    assert new.receiver != old.receiver
    assert new.generation > old.generation


def test_the_last_cohort_leaving_idles_the_group_with_nothing_admitted() -> None:
    core = AdmissionCore()
    finish(core, core.apply(WorkerAdded(reg(1, "A"))))
    effects = core.apply(WorkerRemoved(reg(1, "A").key))
    succession = one(effects, Succession)
    assert succession.new_checksum is None
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.status, view.receiver, view.admitted) == (
        None,
        GroupStatus.IDLE,
        None,
        (),
    )


def test_a_listing_that_keeps_one_incumbent_worker_causes_no_succession() -> None:
    core = _ready_a_with_b_waiting()
    effects = core.apply(Listing([reg(5, "A"), reg(3, "B"), reg(4, "B")]))
    assert of(effects, Succession) == []
    assert core.group(G).admitted == (5,)  # type: ignore[union-attr]


def test_generations_strictly_increase_across_groups_and_tenures() -> None:
    core = AdmissionCore()
    seen: list[int] = []
    for round_ in range(3):
        for n in range(3):
            key = group_key(model=f"m{n}")
            effects = core.apply(WorkerAdded(reg(10 * round_ + n, f"C{round_}", group=key)))
            seen += [e.generation for e in of(effects, OpenReceiver)]
            core.apply(WorkerRemoved(reg(10 * round_ + n, f"C{round_}", group=key).key))
    assert seen == sorted(set(seen))
    assert len(seen) == 9
