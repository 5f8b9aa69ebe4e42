"""Cohort order: first observation, stable under duplicates and snapshots; re-entry at the end."""

from __future__ import annotations

from admission_support import G, of, one, reg
from workerset_admission.admission import (
    AdmissionCore,
    Listing,
    MutationRefused,
    OpenReceiver,
    PublishAdmissions,
    TaintsUpdated,
    WorkerAdded,
    WorkerRemoved,
)


def _order(core: AdmissionCore) -> list[str]:
    view = core.group(G)
    assert view is not None
    return [c.mdc_checksum for c in view.cohorts]


def test_cohorts_keep_first_observation_order() -> None:
    core = AdmissionCore()
    for i, checksum in enumerate("ACBDB"):
        core.apply(WorkerAdded(reg(i, checksum)))
    assert _order(core) == ["A", "C", "B", "D"]


def test_duplicate_events_change_neither_order_nor_admissions() -> None:
    core = AdmissionCore()
    core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "B")), WorkerAdded(reg(3, "C"))])
    before = core.groups()
    effects = core.apply_many([WorkerAdded(reg(3, "C")), WorkerAdded(reg(2, "B"))] * 3)
    assert effects == []
    assert core.groups() == before


def test_a_listing_keeps_survivor_order_whatever_order_it_lists_them_in() -> None:
    core = AdmissionCore()
    core.apply_many([WorkerAdded(reg(i, c)) for i, c in enumerate("ABCD")])
    core.apply(Listing([reg(3, "D"), reg(9, "E"), reg(1, "B"), reg(0, "A")]))
    assert _order(core) == ["A", "B", "D", "E"]


def test_a_listing_removes_every_absent_key() -> None:
    core = AdmissionCore()
    core.apply_many([WorkerAdded(reg(i, "A")) for i in range(5)])
    effects = core.apply(Listing([reg(2, "A")]))
    assert one(effects, PublishAdmissions).admitted == frozenset({2})


def test_an_emptied_cohort_leaves_and_rejoins_at_the_end() -> None:
    core = AdmissionCore()
    core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "B")), WorkerAdded(reg(3, "C"))])
    core.apply(WorkerRemoved(reg(2, "B").key))
    assert _order(core) == ["A", "C"]
    core.apply(WorkerAdded(reg(4, "B")))
    assert _order(core) == ["A", "C", "B"]


def test_an_emptied_incumbent_that_returns_does_not_regain_the_workerset() -> None:
    core = AdmissionCore()
    core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "B"))])
    core.apply(WorkerRemoved(reg(1, "A").key))
    core.apply(WorkerAdded(reg(1, "A")))
    assert _order(core) == ["B", "A"]


def test_an_in_place_change_of_checksum_keeps_the_first_incarnation_and_is_reported() -> None:
    core = AdmissionCore()
    core.apply(WorkerAdded(reg(1, "A")))
    effects = core.apply(WorkerAdded(reg(1, "B")))
    refused = one(effects, MutationRefused)
    assert (refused.kept_checksum, refused.offered_checksum) == ("A", "B")
    assert [type(e) for e in effects] == [MutationRefused]
    assert _order(core) == ["A"]
    registration = core.registration(reg(1, "A").key)
    assert registration is not None
    assert registration.mdc_checksum == "A"


def test_an_in_place_change_of_group_keeps_the_first_incarnation_and_is_reported() -> None:
    from admission_support import group_key

    core = AdmissionCore()
    core.apply(WorkerAdded(reg(1, "A")))
    moved = reg(1, "A", group=group_key("renamed"))
    refused = one(core.apply(WorkerAdded(moved)), MutationRefused)
    assert (refused.kept_group, refused.offered_group) == (G, moved.group)
    assert core.group(moved.group) is None


def test_a_listing_with_a_mutated_key_keeps_the_first_incarnation() -> None:
    core = AdmissionCore()
    core.apply(WorkerAdded(reg(1, "A")))
    effects = core.apply(Listing([reg(1, "B")]))
    assert len(of(effects, MutationRefused)) == 1
    assert _order(core) == ["A"]


def test_taints_may_change_in_place_without_any_rebuild() -> None:
    core = AdmissionCore()
    core.apply(WorkerAdded(reg(1, "A")))
    effects = core.apply(WorkerAdded(reg(1, "A", taints=("maintenance",))))
    assert [type(e) for e in effects] == [TaintsUpdated]
    registration = core.registration(reg(1, "A").key)
    assert registration is not None
    assert registration.taints == ("maintenance",)


def test_removing_an_unknown_key_changes_nothing() -> None:
    core = AdmissionCore()
    core.apply(WorkerAdded(reg(1, "A")))
    before = core.groups()
    assert core.apply(WorkerRemoved("ns1/workers/generate/ff")) == []
    assert core.groups() == before


def test_the_first_worker_of_a_returning_group_opens_exactly_one_receiver() -> None:
    core = AdmissionCore()
    effects = core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")]))
    assert len(of(effects, OpenReceiver)) == 1
    assert one(effects, PublishAdmissions).admitted == frozenset({1, 2})


def test_a_listing_keeps_retained_keys_whose_listed_values_were_refused() -> None:
    core = AdmissionCore()
    core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "A"))])
    effects = core.apply(Listing([reg(2, "A")], retain=[reg(1, "A").key]))
    assert of(effects, PublishAdmissions) == []
    assert core.group(G).admitted == (1, 2)  # type: ignore[union-attr]
