"""The step's delta for the read models: made from the core's effects and the inputs it accepted.

One :class:`~workerset_admission.ports.StepDelta` is made per step (a source event, a build
result, a timer tick) by :class:`DeltaMaker`, once, at the step's end: the step hands it what it
saw, in one call (:meth:`DeltaMaker.finish`): the raw event, ingestion's verdicts, and every
list of effects the core returned (a refused commit fed back is part of the same step). It puts
them together:

* the records: each record ingestion accepted, with its raw bytes, except a card whose
  in-place change the core refused (``MutationRefused``): that key keeps the bytes of the
  incarnation the core kept, as a refused value at the boundary keeps its last valid one
  (:func:`accepted_changes`);
* the groups: every group an effect named, and every committed group whose endpoint's liveness
  moved, each with its tenure's facts as they stand after the effects were carried out
  (:func:`tenure_facts`), worked out when a read model first reads them (:class:`TenuresAtStep`);
* the drains in force, when a ``DrainChanged`` came.

The step's carriers tell it of the two effects it reads (``refused``, ``drain_changed``): the
step is the one dispatch over effect types.

*The delta's one shortcut* (:class:`TenuresAtStep`). A tenure's facts hold its routable ids: its
admitted ids worked out and intersected with the live ones, work in proportion to the group, not
to the step. Most steps' facts are read by no one (the status fold reads only which groups a
step named; the view reads the latest ones per group, at its next pass), so the step keeps what
the facts are worked out from, all immutable values read at its end (the receiver's state, the
endpoint's live ids), and :func:`tenure_facts`'s own rule works them out on the first read, once.
A read at any later time therefore gives what the step's end gave; ``tests/test_delta.py`` holds
every delta's facts, read after later steps, to what the binding itself said at the step's end
(its ``routable()``, ``last_known()`` and ``lora()``: the plain path).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Literal, NamedTuple, Protocol

from workerset_admission.admission.admitted import routable_ids
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
from workerset_admission.service.bindings import AdmittedHopBinding, BindingId
from workerset_admission.service.ingest import Ingested, Verdict
from workerset_admission.service.liveness import LivenessIndex
from workerset_admission.service.receivers import AdmissionState

__all__ = [
    "DeltaMaker",
    "Tenures",
    "TenuresAtStep",
    "accepted_changes",
    "accepted_record",
    "tenure_facts",
]

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


class _TenureRead(NamedTuple):
    """A committed tenure as read at one moment: immutable values its facts are worked out from."""

    id: BindingId
    endpoint: EndpointId
    handover_from: int | None
    state: AdmissionState
    live: frozenset[int]


def _read(binding: AdmittedHopBinding | None) -> _TenureRead | None:
    """Read a committed binding's tenure now (``None``: none, or it ended in this very step)."""
    if binding is None:
        return None
    try:
        state = binding.receiver.current()
    except ReceiverRetired:
        return None  # the tenure ended in this very step; its withdrawal is on the way
    return _TenureRead(
        binding.id, binding.endpoint, binding.handover_from, state, binding.live_ids()
    )


def _facts(read: _TenureRead) -> TenureFacts:
    """Work a tenure's facts out from what was read (the binding's own routing rule)."""
    state = read.state
    return TenureFacts(
        read.id.group,
        read.id.generation,
        routable_ids(state.admitted, read.live, state.last_known),
        frozenset(state.last_known),
        read.handover_from,
        frozenset(
            (worker.instance_id, adapter.model_suffix)
            for worker in state.lora
            for adapter in worker.adapters
        ),
    )


def tenure_facts(binding: AdmittedHopBinding | None) -> TenureFacts | None:
    """Return a committed binding's tenure as the read models see it (``None``: none)."""
    read = _read(binding)
    return None if read is None else _facts(read)


class TenuresAtStep(Mapping[GroupKey, TenureFacts | None]):
    """A step's groups, each with its tenure's facts at the step's end, worked out when first read.

    The delta's one shortcut (see the module doc): it holds each group's tenure as read at the
    step's end, and a value is :func:`tenure_facts`'s, worked out from that read on the first
    lookup and kept. Which groups it names, and which have no tenure, cost nothing to ask.
    """

    __slots__ = ("_facts", "_read")

    def __init__(self, read: Mapping[GroupKey, _TenureRead | None]) -> None:
        self._read = read
        self._facts: dict[GroupKey, TenureFacts | None] = {}

    def __getitem__(self, group: GroupKey) -> TenureFacts | None:
        facts = self._facts.get(group)
        if facts is None and group not in self._facts:
            read = self._read[group]
            facts = self._facts[group] = None if read is None else _facts(read)
        return facts

    def __contains__(self, group: object) -> bool:
        return group in self._read

    def __iter__(self) -> Iterator[GroupKey]:
        return iter(self._read)

    def __len__(self) -> int:
        return len(self._read)

    def __repr__(self) -> str:
        return f"TenuresAtStep({dict(self.items())!r})"


class Tenures(Protocol):
    """The hop bindings, as the delta reads them after a step's effects were carried out."""

    def binding(self, group: GroupKey) -> AdmittedHopBinding | None: ...

    def drained(self) -> frozenset[tuple[str, int]]: ...


class DeltaMaker:
    """Makes each step's :class:`StepDelta` at its end, from what the step saw and did."""

    def __init__(self, tenures: Tenures, liveness: LivenessIndex) -> None:
        self._tenures = tenures
        self._liveness = liveness
        self._refused: set[str] = set()
        self._drains = False
        # The groups with a committed tenure, by endpoint, as the deltas named them: an
        # endpoint whose liveness moved names its groups without a walk over every binding.
        self._at: dict[EndpointId, set[GroupKey]] = {}

    def refused(self, effect: MutationRefused) -> None:
        """Hear that the core refused an in-place change: the key keeps its first bytes."""
        self._refused.add(effect.key)

    def drain_changed(self, effect: DrainChanged) -> None:
        self._drains = True

    def finish(
        self,
        came_in: object,
        keep: Collection[str],
        ingested: Ingested | None,
        effects: Iterable[Sequence[object]],
    ) -> StepDelta | None:
        """Return the step's delta (``None``: it changed nothing a read model keeps).

        ``came_in`` began the step (its records count when it is a source event), ``keep``
        and ``ingested`` are a listing's kept keys and ingestion's verdicts, ``effects`` the
        effects of each of its core steps: the groups they name may have changed.
        """
        named: set[GroupKey] = set()
        for step in effects:
            named |= groups_named(step)
        refused, self._refused = self._refused, set()
        drains, self._drains = self._drains, False
        records: dict[str, AcceptedRecord | None] = {}
        kept: frozenset[str] = frozenset()
        if isinstance(came_in, (SourcePut, SourceDelete, SourceListing)):
            records, kept = accepted_changes(came_in, keep, ingested, refused)
        relisted = isinstance(came_in, SourceListing)
        endpoints = frozenset(self._liveness.take_touched())
        for endpoint in endpoints:
            named.update(self._at.get(endpoint, ()))
        read = {group: _read(self._tenures.binding(group)) for group in named}
        self._index(read)
        drained = self._tenures.drained() if drains else None
        if not (read or records or relisted or endpoints) and drained is None:
            return None  # most ticks and repeated values: no delta is made at all
        return StepDelta(
            groups=TenuresAtStep(read),
            records=records,
            relisted=relisted,
            kept=kept,
            endpoints=endpoints,
            drained=drained,
        )

    def _index(self, groups: Mapping[GroupKey, _TenureRead | None]) -> None:
        for group, read in groups.items():
            if read is not None:
                # The binding's endpoint, kept since its commit (``group.endpoint`` parses JSON).
                self._at.setdefault(read.endpoint, set()).add(group)
                continue
            if not self._at:
                continue
            endpoint = group.endpoint
            held = self._at.get(endpoint)
            if held is not None:
                held.discard(group)
                if not held:
                    del self._at[endpoint]
