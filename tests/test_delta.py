"""The delta's tenure facts, worked out when first read, against the plain facts at the step's end.

A step's delta keeps what each named tenure's facts are worked out from (``TenuresAtStep``) and
works them out on the first read. Here a read model records, at every step's end, the facts the
plain path gives then (the binding's own ``routable()``, ``last_known()`` and ``lora()``), and
the delta's facts are read only once the whole history has run: each must still be the step's.
"""

from __future__ import annotations

from typing import Any

from support.cards import EP, base_card, endpoint_entry, group_of, lora_card, model_entry, model_put
from support.fakes import FakeSource, settle
from workerset_admission.card import endpoint_kv_key, model_kv_key
from workerset_admission.errors import ReceiverRetired
from workerset_admission.identity import GroupKey
from workerset_admission.ports import (
    SourceDelete,
    SourceEvent,
    SourceListing,
    SourcePut,
    StepDelta,
    TenureFacts,
)
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.service.step import DeltaReader

OLD = base_card(16)
NEW = base_card(32)
GROUP = group_of(OLD)
ADAPTER = "sql"


def plain_facts(service: AdmissionService, group: GroupKey) -> TenureFacts | None:
    """Return a tenure's facts as the delta gave them before it kept them unworked."""
    binding = service.binding(group)
    if binding is None:
        return None
    try:
        routable = binding.routable()
        last_known = binding.last_known()
        lora = binding.lora()
    except ReceiverRetired:
        return None
    return TenureFacts(
        binding.id.group,
        binding.id.generation,
        frozenset(routable),
        frozenset(last_known),
        binding.handover_from,
        frozenset((w.instance_id, a.model_suffix) for w in lora for a in w.adapters),
    )


class _AtStepEnd:
    """A read model that keeps each delta, unread, and the plain facts of its groups then."""

    def __init__(self, service: AdmissionService) -> None:
        self.service = service
        self.steps: list[tuple[StepDelta, dict[GroupKey, TenureFacts | None]]] = []

    def step(self, delta: StepDelta) -> None:
        # Only the group keys are read here: the delta's facts stay unworked until the end.
        plain = {group: plain_facts(self.service, group) for group in delta.groups}
        self.steps.append((delta, plain))


def endpoint_delete(instance_id: int) -> SourceDelete:
    return SourceDelete(endpoint_kv_key(EP, instance_id), 2)


def model_delete(instance_id: int, suffix: str | None = None) -> SourceDelete:
    return SourceDelete(model_kv_key(EP, instance_id, suffix), 2)


# Members joining before and after they are live, liveness moving alone, an adapter served and
# withdrawn, a rejected cohort, and a succession once the incumbent's members have all left.
HISTORY: list[tuple[SourceEvent, Any]] = [
    (
        SourceListing(
            (model_entry(1, OLD), endpoint_entry(1), model_entry(2, OLD), endpoint_entry(2))
        ),
        lambda s: s.binding(GROUP) is not None,
    ),
    (model_put(3, OLD), None),
    (SourcePut(endpoint_entry(3)), None),
    (model_put(2, lora_card(ADAPTER), suffix=ADAPTER), None),
    (endpoint_delete(1), None),
    (model_put(4, NEW), None),
    (SourcePut(endpoint_entry(4)), None),
    (model_delete(2, ADAPTER), None),
    (model_delete(1), None),
    (model_delete(2), None),
    (model_delete(3), lambda s: s.binding(GROUP) is not None),
    (model_put(5, NEW), None),
    (SourcePut(endpoint_entry(5)), None),
]


async def test_every_delta_read_after_the_history_gives_the_facts_of_its_step() -> None:
    source = FakeSource()
    service = AdmissionService(source)
    recorder = _AtStepEnd(service)
    service.subscribe(DeltaReader(recorder))
    await service.start()
    try:
        for event, until in HISTORY:
            count = len(recorder.steps)
            source.queue.put_nowait(event)
            await settle(lambda count=count: len(recorder.steps) > count)
            if until is not None:
                await settle(lambda until=until: until(service))
    finally:
        await service.stop()

    seen = [facts for _, plain in recorder.steps if (facts := plain.get(GROUP)) is not None]
    # Not a vacuous history: the group's routable ids moved, and its tenure changed.
    assert len({facts.routable for facts in seen}) >= 4
    assert len({facts.generation for facts in seen}) >= 2
    assert any(facts.adapters for facts in seen)
    for delta, plain in recorder.steps:
        assert dict(delta.groups.items()) == plain
        # Read again: the same values, worked out once.
        assert all(delta.groups[group] is facts for group, facts in delta.groups.items())
