"""The records the admitted view may publish: the last valid one per key, fed from discovery."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

from workerset_admission.adapters.dynamo.view_directory import file_name_for
from workerset_admission.card import (
    BoundarySettings,
    decode_endpoint_record,
    decode_event_record,
    decode_model_record,
    is_event_key,
    parse_event_key,
    parse_key,
)
from workerset_admission.errors import RemoteDataError
from workerset_admission.keys import DRAIN_PREFIX
from workerset_admission.ports import (
    DiscoverySource,
    SourceDelete,
    SourceEvent,
    SourcePut,
    SourceSnapshot,
)

__all__ = ["KV_EVENTS", "HeldRecord", "RecordTable", "TappedSource"]

# The one event topic whose source names its worker; every other channel is tied by scope.
KV_EVENTS = "kv-events"

_Tie = tuple[str, str, str | None, int | str | None]


@dataclass(frozen=True, slots=True)
class HeldRecord:
    """One valid discovery record the view may publish, with what ties it to a worker.

    ``instance_id`` is the instance for endpoint and model records and the publisher id for
    event records; ``worker_id`` is the worker an event source names; ``topic`` is an event
    record's topic.
    """

    bucket: str
    file_name: str
    value: bytes
    namespace: str
    component: str | None
    endpoint: str | None
    instance_id: int
    worker_id: int | None = None
    topic: str | None = None


class RecordTable:
    """The last valid raw record per bucket key, judged by the same boundary as admission.

    A refused value leaves the key's last valid record in place, as the service keeps the last
    valid registration; a key the namespace filter drops is not held. A record that leaves the
    bucket (a removal, or a listing without it) is kept aside for ``keep_removed_for`` seconds
    (one registration TTL), for :meth:`lookup_last_known` alone: a held tenure's members are
    served on those records while the core still admits them.
    """

    def __init__(
        self,
        settings: BoundarySettings | None = None,
        on_change: Callable[[], None] | None = None,
        *,
        keep_removed_for: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings or BoundarySettings()
        self._records: dict[str, HeldRecord] = {}
        # Keys by what ties a record to a worker, so planning a view costs per admitted worker,
        # not per record held.
        self._index: dict[_Tie, set[str]] = {}
        self._on_change = on_change
        self._keep_removed_for = keep_removed_for
        self._clock = clock
        # Records that left the bucket: key -> (record, when), in removal order, and by tie.
        self._removed: dict[str, tuple[HeldRecord, float]] = {}
        self._removed_index: dict[_Tie, set[str]] = {}

    def __len__(self) -> int:
        return len(self._records)

    def set_listener(self, on_change: Callable[[], None] | None) -> None:
        self._on_change = on_change

    def get(self, key: str) -> HeldRecord | None:
        return self._records.get(key)

    def records(self) -> Iterable[HeldRecord]:
        return self._records.values()

    def lookup(
        self, kind: str, namespace: str, component: str | None, number: int | str | None
    ) -> list[HeldRecord]:
        """Return the records tied to a worker, a publisher or an endpoint.

        ``worker``: endpoint and model records of an instance in a component; ``source``:
        event sources naming a worker; ``channel``: event channels of a publisher (these two
        in any component; pass ``None``); ``scope``: event channels other than KV events
        published at an endpoint (pass its component and endpoint name).
        """
        keys = self._index.get((kind, namespace, component, number), ())
        return [self._records[key] for key in sorted(keys)]

    def lookup_last_known(
        self, kind: str, namespace: str, component: str | None, number: int | str | None
    ) -> list[HeldRecord]:
        """Like :meth:`lookup`, with the records that left the bucket within the keep time."""
        self._forget_old_removals()
        tie = (kind, namespace, component, number)
        held = self._index.get(tie, set())
        gone = self._removed_index.get(tie, set()) - held
        records = {key: self._records[key] for key in held}
        records.update((key, self._removed[key][0]) for key in gone)
        return [records[key] for key in sorted(records)]

    def _set_aside(self, key: str, record: HeldRecord) -> None:
        self._removed.pop(key, None)
        self._removed[key] = (record, self._clock())
        for tie in self._ties(record):
            self._removed_index.setdefault(tie, set()).add(key)

    def _back(self, key: str) -> None:
        entry = self._removed.pop(key, None)
        if entry is not None:
            self._drop_removed_tie(key, entry[0])

    def _drop_removed_tie(self, key: str, record: HeldRecord) -> None:
        self._discard(self._removed_index, key, record)

    def _forget_old_removals(self) -> None:
        oldest = self._clock() - self._keep_removed_for
        removed = self._removed
        # Oldest first (insertion order): stop at the first one still young enough.
        while removed:
            key, (record, when) = next(iter(removed.items()))
            if when > oldest:
                break
            del removed[key]
            self._drop_removed_tie(key, record)

    @staticmethod
    def _ties(record: HeldRecord) -> tuple[_Tie, ...]:
        if record.bucket in ("instances", "mdc"):
            return (("worker", record.namespace, record.component, record.instance_id),)
        if record.bucket == "event_sources":
            if record.worker_id is None:
                return ()
            return (("source", record.namespace, None, record.worker_id),)
        by_publisher = ("channel", record.namespace, None, record.instance_id)
        if record.topic == KV_EVENTS or record.endpoint is None:
            return (by_publisher,)
        return by_publisher, ("scope", record.namespace, record.component, record.endpoint)

    def _unindex(self, key: str, record: HeldRecord) -> None:
        self._discard(self._index, key, record)

    @classmethod
    def _discard(cls, index: dict[_Tie, set[str]], key: str, record: HeldRecord) -> None:
        for tie in cls._ties(record):
            keys = index.get(tie)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del index[tie]

    def _reindex(self, key: str, record: HeldRecord) -> None:
        for tie in self._ties(record):
            self._index.setdefault(tie, set()).add(key)

    def apply(self, event: SourceEvent) -> None:
        """Apply one discovery event (a put, a removal, or a full listing)."""
        if isinstance(event, SourcePut):
            key = event.entry.key
            old = self._records.get(key)
            changed = self._put(key, event.entry.value, self._records)
            if changed:
                if old is not None:
                    self._unindex(key, old)
                new = self._records.get(key)
                if new is not None:
                    self._reindex(key, new)
                    self._back(key)
                elif old is not None:
                    self._set_aside(key, old)
        elif isinstance(event, SourceDelete):
            old = self._records.pop(event.key, None)
            changed = old is not None
            if old is not None:
                self._unindex(event.key, old)
                self._set_aside(event.key, old)
        else:
            fresh: dict[str, HeldRecord] = {}
            for entry in event.entries:
                old = self._records.get(entry.key)
                if not self._put(entry.key, entry.value, fresh) and old is not None:
                    fresh[entry.key] = old  # a refused value keeps the last valid one
            changed = fresh != self._records
            if changed:
                for key, record in self._records.items():
                    if key not in fresh:
                        self._set_aside(key, record)
                for key in fresh:
                    self._back(key)
                self._records = fresh
                self._index = {}
                for key, record in fresh.items():
                    self._reindex(key, record)
        # Each record is set aside once and forgotten once: the table stays bounded.
        self._forget_old_removals()
        if changed and self._on_change is not None:
            self._on_change()

    def _put(self, key: str, value: bytes, into: dict[str, HeldRecord]) -> bool:
        try:
            held = self._judge(key, value)
        except RemoteDataError:
            return False  # the service reports it; the last valid record stays
        if held is None:
            return into.pop(key, None) is not None
        if into.get(key) == held:
            return False
        into[key] = held
        return True

    def _judge(self, key: str, value: bytes) -> HeldRecord | None:
        settings = self._settings
        if key.startswith(DRAIN_PREFIX):
            return None  # a drain is admission's input, never a file of the view
        if is_event_key(key):
            parsed_event = parse_event_key(key)
            if not settings.namespace_matches(parsed_event.namespace):
                return None
            record = decode_event_record(
                parsed_event, value, max_value_size=settings.max_value_size
            )
            from workerset_admission.card.events import dynamo_event_path

            return HeldRecord(
                parsed_event.bucket,
                file_name_for(dynamo_event_path(parsed_event)),
                bytes(value),
                parsed_event.namespace,
                parsed_event.component,
                parsed_event.endpoint,
                parsed_event.publisher_id,
                record.worker_id,
                parsed_event.topic,
            )
        parsed = parse_key(key)
        endpoint = parsed.endpoint
        if parsed.kind == "endpoint":
            if not settings.namespace_matches(endpoint.namespace):
                return None
            decode_endpoint_record(parsed, value, settings)
            bucket = "instances"
        else:
            if decode_model_record(parsed, value, settings) is None:
                return None
            bucket = "mdc"
        return HeldRecord(
            bucket,
            file_name_for(parsed.instance_key),
            bytes(value),
            endpoint.namespace,
            endpoint.component,
            endpoint.endpoint,
            parsed.instance_id,
        )


class TappedSource:
    """A discovery source that also feeds a :class:`RecordTable`, unchanged for the service.

    The table sees each event just before the service applies it. Periodic full listings are
    left to the service: the watch and its resync snapshots keep the table exact.
    """

    def __init__(self, source: DiscoverySource, table: RecordTable) -> None:
        self._source = source
        self._table = table

    async def events(self) -> AsyncIterator[SourceEvent]:
        async for event in self._source.events():
            self._table.apply(event)
            yield event

    async def list_all(self) -> SourceSnapshot:
        return await self._source.list_all()

    async def close(self) -> None:
        await self._source.close()
