"""One record per step, heard through one method by every subscriber, in order.

The service hands each subscriber the same immutable :class:`StepRecord` at every step's end:
what came in, the clock reading, the effects of each core step, and the step's delta. A
subscriber that raises is logged at WARNING, naming it and the step, and the others still hear.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

import pytest
from support.cards import base_card, group_of, model_delete, model_entry, model_put
from support.fakes import FakeSource
from workerset_admission.admission import AdmissionCore, BuildFinished, Effect, StartBuild, Tick
from workerset_admission.ports import SourceListing, StepDelta
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.service.step import CoreStep, DeltaReader, StepRecord

CARD = base_card(16)


class Heard:
    """A subscriber that keeps every record it hears."""

    def __init__(self) -> None:
        self.records: list[StepRecord] = []

    def heard(self, record: StepRecord) -> None:
        self.records.append(record)


class Deltas:
    """A read model that keeps every delta it is handed."""

    def __init__(self) -> None:
        self.deltas: list[StepDelta] = []

    def step(self, delta: StepDelta) -> None:
        self.deltas.append(delta)


class Failing:
    def heard(self, record: StepRecord) -> None:
        raise RuntimeError("a subscriber that cannot hear")

    def __repr__(self) -> str:
        return "the failing subscriber"


@pytest.fixture
def core_steps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Effect, ...]]:
    """Every core step's effects, as the core returned them, in order."""
    seen: list[tuple[Effect, ...]] = []
    apply_many = AdmissionCore.apply_many

    def watched(self: AdmissionCore, events: Iterable[Any]) -> list[Effect]:
        effects = apply_many(self, events)
        seen.append(tuple(effects))
        return effects

    monkeypatch.setattr(AdmissionCore, "apply_many", watched)
    return seen


def _started_build(record: StepRecord) -> StartBuild:
    [start] = [e for e in record.effects if isinstance(e, StartBuild)]
    return start


def test_every_subscriber_hears_one_record_per_step_in_order_with_its_effects_and_delta(
    core_steps: list[tuple[Effect, ...]],
) -> None:
    now = [10.0]
    service = AdmissionService(FakeSource(), clock=lambda: now[0])
    first, second, deltas = Heard(), Heard(), Deltas()
    service.subscribe(first)
    service.subscribe(DeltaReader(deltas))
    service.subscribe(second)
    listing = SourceListing((model_entry(1, CARD), model_entry(2, CARD)))
    steps: list[tuple[object, float, list[tuple[Effect, ...]]]] = []

    def run(came_in: object, act: Any) -> None:
        start = len(core_steps)
        act()
        steps.append((came_in, now[0], core_steps[start:]))
        now[0] += 1.0

    run(listing, lambda: service.handle_event(listing))
    start = _started_build(first.records[-1])
    result = BuildFinished(group_of(CARD), start.mdc_checksum, start.generation, True)
    run(result, lambda: service.step.build_finished(result))
    put = model_put(3, CARD)
    run(put, lambda: service.handle_event(put))
    delete = model_delete(1)
    run(delete, lambda: service.handle_event(delete))
    run(None, lambda: service.step.tick())

    assert len(first.records) == len(steps) == 5
    assert second.records == first.records
    assert all(a is b for a, b in zip(first.records, second.records, strict=True))
    for record, (came_in, at, effects) in zip(first.records, steps, strict=True):
        if came_in is None:
            assert record.came_in == Tick(at)
        else:
            assert record.came_in is came_in
        assert record.now == at
        assert [step.effects for step in record.steps] == effects
        assert record.effects == tuple(e for step in effects for e in step)
    # The builds and the commit happened in the steps they were heard in.
    assert any(isinstance(e, StartBuild) for e in first.records[0].effects)
    assert first.records[0].ingested is not None
    assert first.records[1].ingested is None
    assert first.records[0].delta is not None
    assert first.records[0].delta.relisted
    # The read model was handed exactly the deltas of the records, in order.
    assert deltas.deltas == [r.delta for r in first.records if r.delta is not None]
    handed = [r.delta for r in first.records if r.delta is not None]
    assert all(a is b for a, b in zip(deltas.deltas, handed, strict=True))
    assert len(deltas.deltas) >= 3


def test_a_failing_subscriber_is_logged_at_warning_and_the_others_still_hear(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = AdmissionService(FakeSource())
    before, after = Heard(), Heard()
    service.subscribe(before)
    service.subscribe(Failing())
    service.subscribe(after)
    listing = SourceListing((model_entry(1, CARD),))
    with caplog.at_level(logging.WARNING):
        service.handle_event(listing)
        service.handle_event(model_put(2, CARD))
    assert len(before.records) == len(after.records) == 2
    assert after.records == before.records
    failures = [r for r in caplog.records if "the failing subscriber" in r.getMessage()]
    assert len(failures) == 2
    assert all(r.levelno == logging.WARNING and r.exc_info for r in failures)
    assert "SourceListing" in failures[0].getMessage()
    assert "SourcePut" in failures[1].getMessage()
    # The service went on: the put was admitted into the group's cohort.
    assert sum(len(c.members) for g in service.core.groups() for c in g.cohorts) == 2


def test_the_record_is_immutable() -> None:
    service = AdmissionService(FakeSource())
    heard = Heard()
    service.subscribe(heard)
    service.handle_event(SourceListing((model_entry(1, CARD),)), keep=["a"])
    [record] = heard.records
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.now = 0.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.steps[0].effects = ()  # type: ignore[misc]
    with pytest.raises((AttributeError, TypeError)):
        record.extra = 1  # type: ignore[attr-defined]
    assert not hasattr(record, "__dict__")
    assert isinstance(record.steps, tuple)
    assert all(isinstance(step, CoreStep) for step in record.steps)
    assert isinstance(record.steps[0].effects, tuple)
    assert record.keep == ("a",)


def test_a_step_that_changed_nothing_a_read_model_keeps_has_no_delta() -> None:
    service = AdmissionService(FakeSource())
    heard = Heard()
    service.subscribe(heard)
    service.handle_event(SourceListing((model_entry(1, CARD),)))
    service.step.tick()  # nothing due
    listing, tick = heard.records
    assert listing.delta is not None
    assert set(listing.delta.records) == {model_entry(1, CARD).key}
    assert tick.steps
    assert not tick.effects
    assert tick.delta is None
