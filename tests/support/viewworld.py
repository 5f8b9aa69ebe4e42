"""A small world for the admitted view's tests: one endpoint's workers, a fed table, fake files."""

from __future__ import annotations

import json
from collections.abc import Iterable

from support.cards import base_card as demo_card
from workerset_admission.adapters.dynamo.view import RecordTable, ViewFile, file_name_for
from workerset_admission.admission import AdmissionCore, MutationRefused
from workerset_admission.card import (
    BoundarySettings,
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.ports import (
    DiscoveryEntry,
    SourceDelete,
    SourceEvent,
    SourceListing,
    SourcePut,
)
from workerset_admission.service.delta import accepted_changes
from workerset_admission.service.ingest import CardRecordDecoder, Ingestor
from workerset_admission.view.records import Tie

EP = EndpointId("pns", "backend", "generate")
GROUP = GroupKey.build("Qwen/Qwen3-0.6B", EP, "chat|completions", WorkerType.AGGREGATED)


def mdc_file(instance_id: int) -> ViewFile:
    """The view file of a worker's card at :data:`EP`."""
    return ("mdc", file_name_for(f"pns/backend/generate/{instance_id:x}"))


def entry_of(key: str, value: bytes) -> DiscoveryEntry:
    return DiscoveryEntry(key, value, 1)


def _event_records(
    worker: int, publisher: int, channels: tuple[str, ...] = ()
) -> list[DiscoveryEntry]:
    """A worker's KV event source and channel, and its ``channels`` of other topics.

    Shaped as the 1.6.1 mocker registers them; a channel of another topic has a publisher id
    of its own and names no worker.
    """
    scope = {
        "kind": "endpoint",
        "endpoint": {"namespace": "pns", "component": "backend", "name": "generate"},
    }
    tail = "namespace.pns.component.backend.endpoint.generate.topic"
    source = {
        "type": "EventSource",
        "scope": scope,
        "topic": "kv-events",
        "publisher_id": publisher,
        "metadata": {"worker": {"worker_id": worker, "dp_rank": 0}, "publisher_id": publisher},
    }
    transport = {"kind": "Nats", "config": {"subject_prefix": "namespace.pns"}}
    channel = {"type": "EventChannel", "scope": scope, "topic": "kv-events"}
    records = [
        entry_of(f"v1.event_sources.{tail}.kv-events.{publisher:x}", json.dumps(source).encode()),
        entry_of(
            f"v1.event_channels.{tail}.kv-events.{publisher:x}",
            json.dumps({**channel, "instance_id": publisher, "transport": transport}).encode(),
        ),
    ]
    for number, topic in enumerate(channels, start=1):
        other = {**channel, "topic": topic, "instance_id": publisher + number}
        records.append(
            entry_of(
                f"v1.event_channels.{tail}.{topic}.{publisher + number:x}",
                json.dumps({**other, "transport": transport}).encode(),
            )
        )
    return records


def worker_records(
    instance_id: int, block_size: int = 16, channels: tuple[str, ...] = ()
) -> list[DiscoveryEntry]:
    """Everything one worker registers: endpoint records, its card, its event records."""
    query = EndpointId("pns", "backend", f"worker_kv_query_source_{instance_id:x}")
    return [
        entry_of(endpoint_kv_key(EP, instance_id), encode_endpoint_record(EP, instance_id)),
        entry_of(endpoint_kv_key(query, instance_id), encode_endpoint_record(query, instance_id)),
        entry_of(
            model_kv_key(EP, instance_id),
            encode_model_record(EP, instance_id, demo_card(block_size)),
        ),
        *_event_records(instance_id, instance_id % 1000 + 5000, channels),
    ]


class FedTable(RecordTable):
    """A record table fed as the writer feeds it: the records of each step's delta.

    Ingestion judges each event once and a real core decides on it, so a card re-put under its
    key with another checksum, model or worker type is refused as the service refuses it.
    """

    def __init__(self, settings: BoundarySettings | None = None) -> None:
        super().__init__()
        self._ingest = Ingestor(CardRecordDecoder(settings))
        self.core = AdmissionCore()
        self.refused: list[str] = []

    def apply(self, event: SourceEvent) -> set[Tie]:
        """Take one source event in as a step; return the ties of the records it changed."""
        if isinstance(event, SourcePut):
            result = self._ingest.put(event.entry.key, event.entry.value)
        elif isinstance(event, SourceDelete):
            result = self._ingest.removal(event, now=0.0)
        else:
            result = self._ingest.listing(event, now=0.0)
        effects = self.core.apply_many(result.inputs)
        refused = {e.key for e in effects if isinstance(e, MutationRefused)}
        self.refused += sorted(refused)
        records, kept = accepted_changes(event, (), result, refused)
        if isinstance(event, SourceListing):
            return self.listing([r for r in records.values() if r is not None], kept)
        ties: set[Tie] = set()
        for key, record in records.items():
            ties |= self.put(key, record)
        return ties


def table_of(*workers: list[DiscoveryEntry]) -> FedTable:
    table = FedTable()
    table.apply(SourceListing([entry for worker in workers for entry in worker]))
    return table


class FakeFiles:
    """An in-memory view directory that records every operation in order.

    ``registry`` is the set of names registered: a publish of a name not in it registers it
    first, as the real directory does, and fails when registration does.
    """

    def __init__(self) -> None:
        self.content: dict[ViewFile, bytes] = {}
        self.ops: list[tuple[str, ViewFile]] = []
        self.registry: set[ViewFile] = set()
        self.fail_publish = False
        self.fail_remove = False
        self.fail_register = False
        self.staged: list[list[ViewFile]] = []
        self.inodes: dict[ViewFile, int] = {}
        self.writes = 0

    def stage(self, files: Iterable[tuple[ViewFile, bytes]]) -> None:
        self.staged.append([file for file, _value in files])

    def _register(self, file: ViewFile) -> None:
        if file not in self.registry:
            if self.fail_register:
                raise OSError(28, "No space left on device")
            self.registry.add(file)

    def registered(self) -> list[ViewFile]:
        return sorted(self.registry)

    def publish(self, file: ViewFile, value: bytes) -> None:
        if self.fail_publish:
            raise OSError("disk full")
        self._register(file)
        self.content[file] = value
        self.writes += 1
        self.inodes[file] = self.writes
        self.ops.append(("publish", file))

    def touch(self, file: ViewFile) -> bool:
        self.ops.append(("touch", file))
        return file in self.content

    def identity(self, file: ViewFile) -> tuple[int, int] | None:
        value = self.content.get(file)
        # The write's number stands for the inode a write by rename makes.
        return None if value is None else (len(value), self.inodes.get(file, 0))

    def remove(self, file: ViewFile) -> None:
        if self.fail_remove:
            raise PermissionError(1, "Operation not permitted")
        self.content.pop(file, None)
        self.registry.discard(file)
        self.ops.append(("remove", file))
