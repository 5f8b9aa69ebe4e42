"""The core's direct builders for its most frequent effects make the same values __init__ makes."""

from __future__ import annotations

import dataclasses

import pytest
from workerset_admission.admission import builders
from workerset_admission.admission import effects as fx
from workerset_admission.identity import GroupKey

GROUP = GroupKey("m", '["ns","c","e","chat","aggregated"]')


@pytest.mark.parametrize(
    ("built", "made"),
    [
        (builders._placed("k", GROUP, "cs", True), fx.WorkerPlaced("k", GROUP, "cs", True)),
        (builders._departed("k", GROUP, "cs", False), fx.WorkerDeparted("k", GROUP, "cs", False)),
        (
            builders._publish(GROUP, 3, "cs", 7, frozenset({1, 2}), {"card": 1}),
            fx.PublishAdmissions(GROUP, 3, "cs", 7, frozenset({1, 2}), {"card": 1}),
        ),
    ],
)
def test_a_directly_built_effect_equals_and_reads_like_the_constructed_one(
    built: object, made: object
) -> None:
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


@pytest.mark.parametrize(
    ("cls", "setters"),
    [
        (fx.WorkerPlaced, builders._PLACED_SLOTS),
        (fx.WorkerDeparted, builders._DEPARTED_SLOTS),
        (fx.PublishAdmissions, builders._PUBLISH_SLOTS),
    ],
)
def test_the_builders_set_every_field_of_their_effect_in_order(
    cls: type, setters: tuple[object, ...]
) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    assert setters == tuple(getattr(cls, name).__set__ for name in names)
