"""The effects the core builds with its fast constructors are the ones __init__ makes."""

from __future__ import annotations

import dataclasses

import pytest
from admission_support import G, reg
from workerset_admission.admission import (
    AdmissionCore,
    PublishAdmissions,
    WorkerAdded,
    WorkerDeparted,
    WorkerPlaced,
    WorkerRemoved,
    builders,
)
from workerset_admission.admission import effects as fx
from workerset_admission.admission.admitted import AdmittedIds


def _core_effects() -> list[fx.Effect]:
    """An incumbent of two, a rejected worker, one departure: every directly built effect."""
    core = AdmissionCore()
    effects = core.apply(WorkerAdded(reg(1, "A")))
    effects += core.apply(WorkerAdded(reg(2, "A")))
    effects += core.apply(WorkerAdded(reg(3, "B")))
    effects += core.apply(WorkerRemoved(reg(1, "A").key))
    return effects


def _constructed(effect: object) -> object:
    """The same effect made through the dataclass's own __init__ (a plain frozenset of ids)."""
    if isinstance(effect, PublishAdmissions):
        return PublishAdmissions(
            effect.group,
            effect.receiver,
            effect.mdc_checksum,
            effect.generation,
            frozenset(effect.admitted),
            effect.card,
        )
    fields = dataclasses.fields(effect)  # type: ignore[arg-type]
    return type(effect)(*(getattr(effect, f.name) for f in fields))


def test_the_core_builds_each_frequent_effect_kind_directly() -> None:
    kinds = {type(e) for e in _core_effects()}
    assert {WorkerPlaced, WorkerDeparted, PublishAdmissions} <= kinds


@pytest.mark.parametrize("kind", [WorkerPlaced, WorkerDeparted, PublishAdmissions])
def test_a_directly_built_effect_equals_and_reads_like_the_constructed_one(kind: type) -> None:
    built_ones = [e for e in _core_effects() if type(e) is kind]
    assert built_ones
    for built in built_ones:
        made = _constructed(built)
        assert type(built) is type(made)
        assert built == made
        assert hash(built) == hash(made)
        assert repr(built) == repr(made)
        assert dataclasses.asdict(built) == dataclasses.asdict(made)  # type: ignore[call-overload]
        first = dataclasses.fields(built)[0].name  # type: ignore[arg-type]
        # Assigning fails the same way for both (slotted frozen classes raise TypeError on 3.11).
        for value in (built, made):
            with pytest.raises((dataclasses.FrozenInstanceError, TypeError)):
                setattr(value, first, "other")


def test_a_published_snapshot_reads_as_the_frozenset_of_the_admitted_ids() -> None:
    publications = [e for e in _core_effects() if isinstance(e, PublishAdmissions)]
    assert [p.admitted for p in publications] == [
        frozenset({1}),
        frozenset({1, 2}),
        frozenset({2}),
    ]
    assert all(type(p.admitted) is frozenset for p in publications)


@pytest.mark.parametrize(
    ("blank", "cls"),
    [
        (builders._BlankWorkerPlaced, WorkerPlaced),
        (builders._BlankWorkerDeparted, WorkerDeparted),
        (builders._BlankPublishAdmissions, PublishAdmissions),
    ],
)
def test_each_blank_class_has_exactly_the_slots_of_its_effect(blank: type, cls: type) -> None:
    assert blank.__slots__ == cls.__slots__ == tuple(f.name for f in dataclasses.fields(cls))
    # Nothing beside the slots but the effect's own bases (a __class__ assignment needs both).
    assert blank.__mro__[1:] == cls.__mro__[1:]


def test_publish_fills_every_field_of_a_publication_in_order() -> None:
    values = (G, 3, "A", 7, AdmittedIds.of({1, 2}), {"card": 1}, frozenset({2}))
    built = builders.publish(*values)
    assert type(built) is PublishAdmissions
    assert tuple(getattr(built, f.name) for f in dataclasses.fields(PublishAdmissions)) == values
    assert built == PublishAdmissions(*values)
