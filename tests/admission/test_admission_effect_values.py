"""The effects made on nearly every input are values: equal by type and fields, card aside."""

from __future__ import annotations

from admission_support import G, reg
from workerset_admission.admission import (
    AdmissionCore,
    PublishAdmissions,
    WorkerAdded,
    WorkerDeparted,
    WorkerPlaced,
    WorkerRemoved,
)
from workerset_admission.admission.admitted import AdmittedIds


def test_equal_fields_make_equal_effects_and_another_type_never_is() -> None:
    placed = WorkerPlaced("k", G, "A", True)
    assert placed == WorkerPlaced("k", G, "A", True)
    assert hash(placed) == hash(WorkerPlaced("k", G, "A", True))
    assert placed != WorkerPlaced("k", G, "A", False)
    assert placed != WorkerDeparted("k", G, "A", True)
    assert repr(placed) == f"WorkerPlaced(key='k', group={G!r}, mdc_checksum='A', admitted=True)"


def test_a_publication_compares_by_its_ids_and_not_by_its_card() -> None:
    one = PublishAdmissions(G, 1, "A", 2, {1, 2}, card={"a": 1})
    assert type(one.ids) is AdmittedIds
    assert one.admitted == frozenset({1, 2})
    assert one == PublishAdmissions(G, 1, "A", 2, AdmittedIds.of({2, 1}), card={"b": 2})
    assert one != PublishAdmissions(G, 1, "A", 2, {1, 2}, last_known=frozenset({1}))
    assert "card" not in repr(one)


def test_the_core_emits_the_same_values_a_constructor_makes() -> None:
    core = AdmissionCore()
    added = core.apply(WorkerAdded(reg(1, "A")))
    assert WorkerPlaced(reg(1).key, G, "A", True) in added
    gone = core.apply(WorkerRemoved(reg(1).key))
    assert WorkerDeparted(reg(1).key, G, "A", True) in gone
