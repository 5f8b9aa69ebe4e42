"""The boundary's verdicts handed on: each accepted record's raw bytes, for a sink beside the core.

Ingestion judges every discovery record once. A consumer that publishes records (the admitted
view) must publish exactly what that judgement accepted, not judge the bytes again:
:class:`AcceptedRecordsFeed` is a step observer that pairs each source event's raw values with
the verdicts ingestion gave them and tells an :class:`~workerset_admission.ports.AcceptedRecords`
sink, before the core steps:

* a put the boundary accepted is passed on with its kind (a model card, an endpoint instance,
  an event record) and, for an event source, the worker it names; an ignored put is passed as
  ``None``; a refused put is not passed on, so the sink keeps the key's last valid record;
* a removal is passed on as it is;
* a listing replaces what the sink holds, except the keys whose value was refused and the keys
  live updates touched while it was read: those are retained as they are.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Literal

from workerset_admission.admission.ordering import GroupId
from workerset_admission.card.entry import EntryKind
from workerset_admission.ports import (
    AcceptedRecord,
    AcceptedRecords,
    SourceDelete,
    SourceEvent,
    SourceListing,
    SourcePut,
)
from workerset_admission.service.ingest import Ingested, Verdict
from workerset_admission.service.step import StepObserver

__all__ = ["AcceptedRecordsFeed", "accepted_record"]


# What each kind of accepted entry is called where it crosses to the sink; a drain crosses as
# an ignored record (the view files no drain).
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


class AcceptedRecordsFeed(StepObserver):
    """Tell ``sink`` what the boundary accepted of each source event (see the module doc)."""

    def __init__(self, sink: AcceptedRecords) -> None:
        self._sink = sink
        self._event: SourceEvent | None = None
        self._keep: Collection[str] = ()

    def source_event(
        self,
        event: SourceEvent,
        now: float,
        keep: Collection[str],
        recorded: Mapping[GroupId, Sequence[str]] | None,
    ) -> None:
        self._event, self._keep = event, keep
        if isinstance(event, SourceDelete):
            # A removal is a removal whatever ingestion makes of its key.
            self._sink.remove(event.key)

    def ingested(self, result: Ingested) -> None:
        event = self._event
        if isinstance(event, SourcePut):
            for verdict in result.verdicts:
                if verdict.refusal is None and verdict.key == event.entry.key:
                    self._sink.put(verdict.key, accepted_record(verdict, event.entry.value))
        elif isinstance(event, SourceListing):
            values = {entry.key: entry.value for entry in event.entries}
            records: list[AcceptedRecord] = []
            retained = set(self._keep)
            for verdict in result.verdicts:
                if verdict.refusal is not None:
                    retained.add(verdict.key)  # a refused value keeps the last valid one
                    continue
                value = values.get(verdict.key)
                record = None if value is None else accepted_record(verdict, value)
                if record is not None:
                    records.append(record)
            self._sink.listing(records, retained)

    def step_ended(self) -> None:
        self._event, self._keep = None, ()
