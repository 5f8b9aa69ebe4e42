"""The view's records: per key, the last raw record the core accepted, as the deltas carried it."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from workerset_admission.card import ParsedKey, is_event_key, parse_event_key, parse_key
from workerset_admission.card.events import dynamo_event_path
from workerset_admission.identity import store_file_name
from workerset_admission.ports import AcceptedRecord

__all__ = ["KV_EVENTS", "PublishableRecord", "RecordTable", "Tie", "ViewFile"]

ViewFile = tuple[str, str]
"""A file of the view: (bucket, file name, as Dynamo's file store names it)."""

# The one event topic whose source names its worker; every other channel is tied by scope.
KV_EVENTS = "kv-events"

# What ties a record to a worker, a publisher or an endpoint: (kind, namespace, component, number).
Tie = tuple[str, str, str | None, int | str | None]


@dataclass(frozen=True, slots=True)
class PublishableRecord:
    """One valid discovery record the view may publish, with what ties it to a worker.

    ``file`` is the view's file for it (bucket, file name): the view keys its state by this
    one tuple. ``instance_id`` is the instance for endpoint and model records and the publisher
    id for event records; ``worker_id`` is the worker an event source names; ``topic`` is an
    event record's topic.
    """

    file: ViewFile
    value: bytes
    namespace: str
    component: str | None
    endpoint: str | None
    instance_id: int
    worker_id: int | None = None
    topic: str | None = None
    # A LoRA adapter card's suffix: served only while its tenure's projection names it.
    suffix: str | None = None

    @property
    def bucket(self) -> str:
        return self.file[0]

    @property
    def file_name(self) -> str:
        return self.file[1]


class RecordTable:
    """The last accepted raw record per bucket key, as the steps' deltas carried it.

    The view's writer fills it from each :class:`~workerset_admission.ports.StepDelta` alone:
    it never reads a value, it only files the bytes the core accepted under their key (the key
    names the bucket, the file and the worker). A value the boundary or the core refused never
    reaches it, so the key's last accepted record stays, as the core keeps the first
    incarnation; a record the boundary ignores is not held. Each change returns the ties it
    touched (see :meth:`lookup`), so the writer re-plans those workers alone.

    A record that leaves the bucket (a removal, or a listing without it) is set aside for
    :meth:`lookup_last_known` alone: a held tenure's last known members are served on those
    records for as long as the core still names them. Which are still wanted is the view's
    pass to say: :meth:`forget_unused_removals` drops every set-aside record no last-known
    lookup asked for since the previous call, so the core's window, not a clock of the
    view's, bounds what is kept.
    """

    def __init__(self) -> None:
        self._records: dict[str, PublishableRecord] = {}
        # Keys by the number a record is tied by (its instance, publisher or worker id), or by
        # its (namespace, component, endpoint) for a scope tie, so planning a view costs per
        # admitted worker, not per record held. A worker's records share one slot: a lookup
        # keeps those of the whole tie (:func:`_tied`), a comparison or two per key. A slot
        # changes as seldom as its records: a tuple of keys, made again on a change, is the
        # smallest holder, kept sorted.
        self._index: dict[_Slot, tuple[str, ...]] = {}
        # Records that left the bucket, by key and by slot, and the ones a last-known lookup
        # asked for since the last forgetting.
        self._removed: dict[str, PublishableRecord] = {}
        self._removed_index: dict[_Slot, tuple[str, ...]] = {}
        self._wanted: set[str] = set()
        # The ties of the records the current change put, changed or removed.
        self._touched: set[Tie] = set()

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: str) -> PublishableRecord | None:
        return self._records.get(key)

    def records(self) -> Iterable[PublishableRecord]:
        return self._records.values()

    def lookup(
        self, kind: str, namespace: str, component: str | None, number: int | str | None
    ) -> list[PublishableRecord]:
        """Return the records tied to a worker, a publisher or an endpoint.

        ``worker``: endpoint and model records of an instance in a component; ``instance``:
        endpoint records of an instance in any component; ``source``: event sources naming a
        worker; ``publisher``: event sources of a publisher id; ``channel``: event channels of
        a publisher (these four in any component; pass ``None``); ``scope``: event channels
        other than KV events published at an endpoint (pass its component and endpoint name).
        """
        keys = self._index.get(_slot(kind, namespace, component, number), ())
        records = self._records
        # (The keys under a slot are kept in order.)
        return [
            record
            for key in keys
            if _tied(record := records[key], kind, namespace, component, number)
        ]

    def lookup_last_known(
        self, kind: str, namespace: str, component: str | None, number: int | str | None
    ) -> list[PublishableRecord]:
        """Like :meth:`lookup`, with the records that left the bucket and are still kept."""
        slot = _slot(kind, namespace, component, number)
        records = {
            key: record
            for key in self._index.get(slot, ())
            if _tied(record := self._records[key], kind, namespace, component, number)
        }
        gone = {
            key: record
            for key in self._removed_index.get(slot, ())
            if key not in records
            and _tied(record := self._removed[key], kind, namespace, component, number)
        }
        self._wanted.update(gone)
        records.update(gone)
        return [records[key] for key in sorted(records)]

    def worker_records(
        self, namespace: str, component: str, instance_id: int, last_known: bool = False
    ) -> tuple[list[PublishableRecord], list[PublishableRecord]]:
        """Return what ties to one worker of a component: its own records, its event records.

        Its own are its endpoint records (in any endpoint of the component) and its model
        records; its event records are the event sources naming it in the component (or in
        none), then the channels each of their publishers published in the same scope. With
        ``last_known``, as :meth:`lookup_last_known`.
        """
        lookup = self.lookup_last_known if last_known else self.lookup
        own = lookup("worker", namespace, component, instance_id)
        sources = [
            s
            for s in lookup("source", namespace, None, instance_id)
            if s.component in (None, component)
        ]
        events = list(sources)
        for source in sources:
            # A channel is the worker's when it shares scope and publisher id with its source.
            events += [
                channel
                for channel in lookup("channel", namespace, None, source.instance_id)
                if (channel.component, channel.endpoint) == (source.component, source.endpoint)
            ]
        return own, events

    def forget_unused_removals(self) -> int:
        """Drop the set-aside records no last-known lookup asked for since the last call."""
        unused = [key for key in self._removed if key not in self._wanted]
        for key in unused:
            self._drop_removed_tie(key, self._removed.pop(key))
        self._wanted = set()
        return len(unused)

    # -- the boundary's verdicts ---------------------------------------------------------------

    def put(self, key: str, record: AcceptedRecord | None) -> set[Tie]:
        """File an accepted put (``record``), or drop the key (``None``); return the ties touched.

        A tie is ``(kind, namespace, component, number)`` as :meth:`lookup` takes it.
        """
        old = self._records.get(key)
        new = None if record is None else self._held(record, self._records)
        if new == old:
            return set()
        self._touch(old, new)
        if old is not None:
            self._unindex(key, old)
        if new is not None:
            self._records[key] = new
            self._reindex(key, new)
            self._back(key)
        else:
            del self._records[key]
            assert old is not None
            self._set_aside(key, old)
        return self._changed()

    def remove(self, key: str) -> set[Tie]:
        """Set the key's record aside for last-known lookups: it left the bucket."""
        return self.put(key, None)

    def listing(self, records: Iterable[AcceptedRecord], retained: Collection[str]) -> set[Tie]:
        """Replace the table with a listing's accepted records; ``retained`` keys keep theirs.

        A listing holds the whole bucket, and it comes every reconciliation: a record whose
        bytes did not change keeps what the table made of it, and only the keys that changed
        are filed anew, so a quiet listing costs a comparison per key.
        """
        held_now = self._records
        fresh: dict[str, PublishableRecord] = {}
        made: dict[str, tuple[str, int]] = {}
        for record in records:
            old = held_now.get(record.key)
            if old is not None and old.value == record.value and old.worker_id == record.worker_id:
                fresh[record.key] = old
                continue
            held = self._held(record, held_now, made)
            if held is not None:
                fresh[record.key] = held
        for key in retained:
            fresh.pop(key, None)
            old = held_now.get(key)
            if old is not None:
                fresh[key] = old
        if fresh == held_now:
            return set()
        for key, old in held_now.items():
            new = fresh.get(key)
            if new is not old:
                self._touch(old, new)
                self._unindex(key, old)
                if new is None:
                    self._set_aside(key, old)
        for key, new in fresh.items():
            old = held_now.get(key)
            if new is not old:
                if old is None:
                    self._touch(None, new)
                self._back(key)
                self._reindex(key, new)
        self._records = fresh
        return self._changed()

    def _changed(self) -> set[Tie]:
        touched, self._touched = self._touched, set()
        return touched

    def _touch(self, old: PublishableRecord | None, new: PublishableRecord | None) -> None:
        for record in (old, new):
            if record is not None:
                self._touched.update(self._ties(record))

    # -- the indexes ---------------------------------------------------------------------------

    def _set_aside(self, key: str, record: PublishableRecord) -> None:
        self._back(key)
        self._removed[key] = record
        for tie in self._ties(record):
            _index_key(self._removed_index, _slot(*tie), key)

    def _back(self, key: str) -> None:
        record = self._removed.pop(key, None)
        if record is not None:
            self._drop_removed_tie(key, record)

    def _drop_removed_tie(self, key: str, record: PublishableRecord) -> None:
        self._discard(self._removed_index, key, record)

    @staticmethod
    def _ties(record: PublishableRecord) -> tuple[Tie, ...]:
        """Every tie of a record: what :meth:`lookup` finds it by (and :func:`_tied` says)."""
        if record.bucket == "instances":
            return (
                ("worker", record.namespace, record.component, record.instance_id),
                ("instance", record.namespace, None, record.instance_id),
            )
        if record.bucket == "mdc":
            return (("worker", record.namespace, record.component, record.instance_id),)
        if record.bucket == "event_sources":
            # By the worker it names, and by its publisher id (which its channels share).
            by_publisher = ("publisher", record.namespace, None, record.instance_id)
            if record.worker_id is None:
                return (by_publisher,)
            return ("source", record.namespace, None, record.worker_id), by_publisher
        by_publisher = ("channel", record.namespace, None, record.instance_id)
        if record.topic == KV_EVENTS or record.endpoint is None:
            return (by_publisher,)
        return by_publisher, ("scope", record.namespace, record.component, record.endpoint)

    def _unindex(self, key: str, record: PublishableRecord) -> None:
        self._discard(self._index, key, record)

    @classmethod
    def _discard(
        cls, index: dict[_Slot, tuple[str, ...]], key: str, record: PublishableRecord
    ) -> None:
        for tie in cls._ties(record):
            slot = _slot(*tie)
            keys = index.get(slot)
            if keys is not None and key in keys:
                rest = tuple(k for k in keys if k != key)
                if rest:
                    index[slot] = rest
                else:
                    del index[slot]

    def _reindex(self, key: str, record: PublishableRecord) -> None:
        for tie in self._ties(record):
            _index_key(self._index, _slot(*tie), key)

    def _worker_name(
        self,
        parsed: ParsedKey,
        records: Mapping[str, PublishableRecord],
        made: dict[str, tuple[str, int]] | None = None,
    ) -> tuple[str, int]:
        """Return the file name and instance id a worker's record is filed with.

        A worker's card and endpoint record have one file name in two buckets, and one
        instance id: a record whose sibling is filed (in ``records``, as indexed, or ``made``
        in this listing) takes the sibling's objects, and its name is not made again.
        """
        instance_key = parsed.instance_key
        known = made.get(instance_key) if made is not None else None
        if known is None:
            endpoint, number = parsed.endpoint, parsed.instance_id
            for key in self._index.get(number, ()):
                other = records.get(key)
                if (
                    other is not None
                    and other.bucket in ("instances", "mdc")
                    and other.instance_id == number
                    and other.suffix == parsed.model_suffix
                    and other.namespace == endpoint.namespace
                    and other.component == endpoint.component
                    and other.endpoint == endpoint.endpoint
                ):
                    known = other.file[1], other.instance_id
                    break
            else:
                known = store_file_name(instance_key), number
            if made is not None:
                made[instance_key] = known
        return known

    def _held(
        self,
        record: AcceptedRecord,
        records: Mapping[str, PublishableRecord],
        made: dict[str, tuple[str, int]] | None = None,
    ) -> PublishableRecord | None:
        """File an accepted record by its key: the bucket, the file name and the worker it names.

        Only the key is read (naming, not judging); the value is the boundary's to judge, and
        is kept as the bytes it accepted. An event source's worker comes with the verdict. A
        worker's record shares its sibling's name (:meth:`_worker_name`).
        """
        key = record.key
        if is_event_key(key):
            event = parse_event_key(key)
            return PublishableRecord(
                (event.bucket, store_file_name(dynamo_event_path(event))),
                record.value,
                event.namespace,
                event.component,
                event.endpoint,
                event.publisher_id,
                record.worker_id,
                event.topic,
            )
        if record.kind == "event":
            return None  # not an event key: nothing the view files as an event
        parsed = parse_key(key)
        endpoint = parsed.endpoint
        kind = "endpoint" if record.kind == "instance" else "model"
        if parsed.kind != kind:
            return None  # a verdict that does not fit its key is not filed
        name, instance_id = self._worker_name(parsed, records, made)
        return PublishableRecord(
            ("instances" if kind == "endpoint" else "mdc", name),
            record.value,
            endpoint.namespace,
            endpoint.component,
            endpoint.endpoint,
            instance_id,
            suffix=parsed.model_suffix,
        )


_Slot = int | str | tuple[str, str | None, str] | None
"""Where the index files a key: a tie's number, or a scope tie's whole endpoint."""


def _slot(kind: str, namespace: str, component: str | None, number: int | str | None) -> _Slot:
    if kind == "scope":
        assert isinstance(number, str)
        return (namespace, component, number)
    return number


def _tied(
    record: PublishableRecord,
    kind: str,
    namespace: str,
    component: str | None,
    number: int | str | None,
) -> bool:
    """Whether ``(kind, namespace, component, number)`` is one of the record's ties."""
    if record.namespace != namespace:
        return False
    bucket = record.file[0]
    if kind == "worker":
        return (
            bucket in ("instances", "mdc")
            and record.instance_id == number
            and record.component == component
        )
    if component is not None and kind != "scope":
        return False
    if kind == "instance":
        return bucket == "instances" and record.instance_id == number
    if kind == "source":
        return (
            bucket == "event_sources"
            and record.worker_id is not None
            and record.worker_id == number
        )
    if kind == "publisher":
        return bucket == "event_sources" and record.instance_id == number
    if kind == "channel":
        return bucket == "event_channels" and record.instance_id == number
    return (
        kind == "scope"
        and bucket == "event_channels"
        and record.topic != KV_EVENTS
        and record.endpoint is not None
        and record.component == component
        and record.endpoint == number
    )


def _index_key(index: dict[_Slot, tuple[str, ...]], slot: _Slot, key: str) -> None:
    keys = index.get(slot, ())
    if key not in keys:
        index[slot] = tuple(sorted((*keys, key)))
