"""The step's delta for the read models: made from the core's effects and the inputs it accepted.

One :class:`~workerset_admission.ports.StepDelta` is made per step (a source event, a build
result, a timer tick) by :class:`DeltaMaker`, which the step tells what it saw: the raw event,
ingestion's verdicts, and every list of effects the core returned (a refused commit fed back is
part of the same step). At the step's end it puts them together:

* the records: each record ingestion accepted, with its raw bytes, except a card whose
  in-place change the core refused (``MutationRefused``): that key keeps the bytes of the
  incarnation the core kept, as a refused value at the boundary keeps its last valid one
  (:func:`accepted_changes`);
* the groups: every group an effect named, and every committed group whose endpoint's liveness
  moved, each with its tenure's facts read from its hop binding after the effects were carried
  out (:func:`tenure_facts`);
* the drains in force, when a ``DrainChanged`` came.

The step's carriers tell it of the two effects it reads (``refused``, ``drain_changed``): the
step is the one dispatch over effect types.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Literal, Protocol

from workerset_admission.admission.effects import DrainChanged, MutationRefused, groups_named
from workerset_admission.card.entry import EntryKind
from workerset_admission.errors import ReceiverRetired
from workerset_admission.identity import EndpointId, GroupKey
from workerset_admission.ports import (
    AcceptedRecord,
    SourceDelete,
    SourceEvent,
    SourceListing,
    SourcePut,
    StepDelta,
    TenureFacts,
)
from workerset_admission.service.bindings import AdmittedHopBinding
from workerset_admission.service.ingest import Ingested, Verdict
from workerset_admission.service.liveness import LivenessIndex

__all__ = ["DeltaMaker", "Tenures", "accepted_changes", "accepted_record", "tenure_facts"]

# What each kind of accepted entry is called in a delta; a drain crosses as nothing held (the
# read models file no drain record).
_CROSSES_AS: dict[EntryKind, Literal["model", "instance", "event"]] = {
    EntryKind.CARD: "model",
    EntryKind.ENDPOINT: "instance",
    EntryKind.EVENT: "event",
}


def accepted_record(verdict: Verdict, value: bytes) -> AcceptedRecord | None:
    """Return the record a verdict accepted, with its raw ``value`` (``None``: not accepted)."""
    kind = None if verdict.kind is None else _CROSSES_AS.get(verdict.kind)
    if kind is None:
        return None
    return AcceptedRecord(verdict.key, bytes(value), kind, verdict.worker_id)


def accepted_changes(
    event: SourceEvent,
    keep: Collection[str],
    ingested: Ingested | None,
    refused: Collection[str],
) -> tuple[dict[str, AcceptedRecord | None], frozenset[str]]:
    """Return the records a source event changed as the core accepted them, and the kept keys.

    ``refused`` are the registration keys whose in-place change the core refused in the step.
    A put the boundary refused, or whose card the core refused, changes nothing; a removal
    is a removal; a listing gives every accepted record, and keeps (second item) the keys it
    must not touch: those a live update touched while it was read (``keep``), and those whose
    listed value the boundary or the core refused.
    """
    if isinstance(event, SourceDelete):
        return {event.key: None}, frozenset()
    verdicts = () if ingested is None else ingested.verdicts

    def core_refused(verdict: Verdict) -> bool:
        reg = verdict.registration
        return reg is not None and reg.key in refused

    if isinstance(event, SourcePut):
        entry = event.entry
        for verdict in verdicts:
            if verdict.key == entry.key and verdict.refusal is None:
                if core_refused(verdict):
                    return {}, frozenset()
                return {entry.key: accepted_record(verdict, entry.value)}, frozenset()
        return {}, frozenset()
    if isinstance(event, SourceListing):
        values = {entry.key: entry.value for entry in event.entries}
        records: dict[str, AcceptedRecord | None] = {}
        kept = set(keep)
        for verdict in verdicts:
            if verdict.refusal is not None or core_refused(verdict):
                kept.add(verdict.key)
                continue
            value = values.get(verdict.key)
            record = None if value is None else accepted_record(verdict, value)
            if record is not None:
                records[verdict.key] = record
        return records, frozenset(kept)
    raise TypeError(f"not a discovery event: {type(event).__name__}")


def tenure_facts(binding: AdmittedHopBinding | None) -> TenureFacts | None:
    """Return a committed binding's tenure as the read models see it (``None``: none)."""
    if binding is None:
        return None
    try:
        routable = binding.routable()
        last_known = binding.last_known()
        lora = binding.lora()
    except ReceiverRetired:
        return None  # the tenure ended in this very step; its withdrawal is on the way
    return TenureFacts(
        binding.id.group,
        binding.id.generation,
        frozenset(routable),
        frozenset(last_known),
        binding.handover_from,
        frozenset(
            (worker.instance_id, adapter.model_suffix)
            for worker in lora
            for adapter in worker.adapters
        ),
    )


class Tenures(Protocol):
    """The hop bindings, as the delta reads them after a step's effects were carried out."""

    def binding(self, group: GroupKey) -> AdmittedHopBinding | None: ...

    def drained(self) -> frozenset[tuple[str, int]]: ...


class DeltaMaker:
    """Gathers what one step saw and did, and makes its :class:`StepDelta` at its end."""

    def __init__(self, tenures: Tenures, liveness: LivenessIndex) -> None:
        self._tenures = tenures
        self._liveness = liveness
        self._events: list[tuple[SourceEvent, Collection[str], Ingested | None]] = []
        self._groups: set[GroupKey] = set()
        self._refused: set[str] = set()
        self._drains = False
        # The groups with a committed tenure, by endpoint, as the deltas named them: an
        # endpoint whose liveness moved names its groups without a walk over every binding.
        self._at: dict[EndpointId, set[GroupKey]] = {}

    def source_event(self, event: SourceEvent, keep: Collection[str]) -> None:
        self._events.append((event, keep, None))

    def ingested(self, result: Ingested) -> None:
        if self._events:
            event, keep, _ = self._events[-1]
            self._events[-1] = (event, keep, result)

    def effects(self, effects: Sequence[object]) -> None:
        """Hear one core step's effects: the groups they name may have changed."""
        self._groups |= groups_named(effects)

    def refused(self, effect: MutationRefused) -> None:
        """Hear that the core refused an in-place change: the key keeps its first bytes."""
        self._refused.add(effect.key)

    def drain_changed(self, effect: DrainChanged) -> None:
        self._drains = True

    def finish(self) -> StepDelta | None:
        """Return the step's delta (``None``: it changed nothing a read model keeps)."""
        events, self._events = self._events, []
        named, self._groups = self._groups, set()
        refused, self._refused = self._refused, set()
        drains, self._drains = self._drains, False
        records: dict[str, AcceptedRecord | None] = {}
        kept: frozenset[str] = frozenset()
        relisted = False
        for event, keep, ingested in events:
            changes, kept = accepted_changes(event, keep, ingested, refused)
            if isinstance(event, SourceListing):
                relisted, records = True, changes
            else:
                records.update(changes)
        endpoints = frozenset(self._liveness.take_touched())
        for endpoint in endpoints:
            named.update(self._at.get(endpoint, ()))
        groups = {group: tenure_facts(self._tenures.binding(group)) for group in named}
        self._index(groups)
        delta = StepDelta(
            groups=groups,
            records=records,
            relisted=relisted,
            kept=kept,
            endpoints=endpoints,
            drained=self._tenures.drained() if drains else None,
        )
        return None if delta.empty else delta

    def _index(self, groups: Mapping[GroupKey, TenureFacts | None]) -> None:
        for group, facts in groups.items():
            endpoint = group.endpoint
            if facts is not None:
                self._at.setdefault(endpoint, set()).add(group)
                continue
            held = self._at.get(endpoint)
            if held is not None:
                held.discard(group)
                if not held:
                    del self._at[endpoint]
