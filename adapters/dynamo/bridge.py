"""Mirror Dynamo's file discovery store into the JetStream discovery bucket.

Dynamo 1.6.1 workers on ``--discovery-backend file`` write one file per record; the plugin reads
a NATS KV bucket. The bridge polls the store, and for each record file puts its bytes, unchanged,
under the bucket key of DESIGN.md. A file that disappears, or whose owner stopped refreshing it
for longer than the TTL, becomes a delete. The bridge translates and never judges a value: a
record the plugin would refuse is forwarded and refused there, where the refusal is reported.

It mirrors all four discovery buckets: model cards, endpoint instances, and the event-plane
sources and channels a KV-aware router needs, under the ``v1.mdc.>``, ``v1.instances.>``,
``v1.event_sources.>`` and ``v1.event_channels.>`` keys of its bucket. Every record it puts
carries its writer identity (:mod:`workerset_admission.ownership`). On start it deletes the keys
*it wrote* that the store no longer holds (``prune``), so a restart after missed removals
converges; a key another writer put (a ``register`` process, a worker, another bridge) is never
its to delete. A store root that is missing or unreadable is refused before anything is written
or deleted, and a pass that finds it gone later changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from workerset_admission.adapters.dynamo.filestore import (
    DEFAULT_FILE_TTL,
    FileRecord,
    FileStoreReader,
    FileStoreScan,
    RecordKind,
    SkippedFile,
    parse_record_path,
)
from workerset_admission.card import event_kv_key
from workerset_admission.card.events import parse_dynamo_event_path
from workerset_admission.errors import ConfigError, InvalidRecordError
from workerset_admission.identity import EndpointId
from workerset_admission.keys import endpoint_kv_key, model_kv_key

__all__ = [
    "BridgeStats",
    "BucketWriter",
    "DiscoveryBridge",
    "SyncPlan",
    "bucket_key_for",
    "bucket_key_for_path",
    "check_store_root",
    "plan_sync",
]

_log = logging.getLogger(__name__)

RemovalReason = Literal["removed", "expired"]


class BucketWriter(Protocol):
    """The write side of the discovery bucket, as the bridge needs it."""

    async def put(self, key: str, value: bytes) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def keys(self) -> list[str]:
        """Every live key under the four discovery prefixes that this writer wrote."""
        ...


def _bucket_key(
    kind: RecordKind,
    namespace: str,
    component: str,
    endpoint_name: str,
    instance_id: int,
    suffix: str | None,
) -> str:
    endpoint = EndpointId(namespace, component, endpoint_name)
    if kind == "instances":
        return endpoint_kv_key(endpoint, instance_id)
    return model_kv_key(endpoint, instance_id, suffix)


def bucket_key_for(record: FileRecord) -> str:
    """Return the bucket key DESIGN.md gives a file record."""
    if record.event is not None:
        return event_kv_key(record.event)
    return _bucket_key(
        record.kind,
        record.namespace,
        record.component,
        record.endpoint,
        record.instance_id,
        record.model_suffix,
    )


def bucket_key_for_path(kind: RecordKind, path: str) -> str:
    """Return the bucket key of the record any Dynamo store keeps at ``v1/<kind>/<path>``.

    ``path`` is the discovery path as Dynamo writes it, the same for etcd keys and decoded file
    names: ``<ns>/<component>/<endpoint>/<id hex>`` (and a LoRA suffix for an adapter card), or
    ``namespace/<ns>[/component/<c>[/endpoint/<e>]]/topic/<topic>/<publisher id hex>`` for the
    event buckets. Raises :class:`InvalidRecordError` (with a reason token) otherwise.
    """
    if kind == "event_sources" or kind == "event_channels":
        return event_kv_key(parse_dynamo_event_path(kind, path))
    parsed = parse_record_path(kind, path)
    if isinstance(parsed, str):
        raise InvalidRecordError(parsed, f"not a {kind} record path", key=f"v1/{kind}/{path}")
    return _bucket_key(kind, *parsed)


def check_store_root(root: Path) -> None:
    """Refuse a store root that is not a readable directory (a mistyped path mirrors nothing)."""
    if not root.is_dir():
        raise ConfigError(f"the file store {root} is not a directory (missing or mistyped?)")
    if not os.access(root, os.R_OK | os.X_OK):
        raise ConfigError(f"the file store {root} is not readable")


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """What one pass must write so the bucket equals the live part of the store."""

    puts: tuple[tuple[str, bytes], ...]
    deletes: tuple[tuple[str, RemovalReason], ...]


def plan_sync(
    mirrored: Mapping[str, bytes | None],
    scan: FileStoreScan,
    *,
    now: float,
    ttl: float,
    key_of: Callable[[FileRecord], str],
) -> SyncPlan:
    """Diff the bucket as last written (``None`` = value unknown) against one store scan.

    A record older than ``ttl`` counts as expired even though its file is still there: Dynamo's
    own readers treat it the same way, and only a live FileStore ever deletes such a file.
    Puts come oldest write first (ties by key); deletes come sorted by key.
    """
    live: dict[str, bytes] = {}
    written: dict[str, float] = {}
    stale: set[str] = set()
    for record in scan.records:
        key = key_of(record)
        if now - record.mtime > ttl:
            stale.add(key)
        else:
            live[key] = record.value
            written[key] = record.mtime
    # Oldest write first: two configurations registered within one pass must reach the bucket
    # in the order they registered, because the first one observed becomes the incumbent.
    puts = tuple(
        (key, live[key])
        for key in sorted(live, key=lambda k: (written[k], k))
        if key not in mirrored or mirrored[key] != live[key]
    )

    def reason(key: str) -> RemovalReason:
        return "expired" if key in stale else "removed"

    deletes = tuple((key, reason(key)) for key in sorted(mirrored) if key not in live)
    return SyncPlan(puts=puts, deletes=deletes)


@dataclass(slots=True)
class BridgeStats:
    """Counters an operator can read (``workerset-admission bridge`` prints them on exit)."""

    passes: int = 0
    puts: int = 0
    removed: int = 0
    expired: int = 0
    pruned: int = 0
    write_errors: int = 0
    skipped_files: dict[str, str] = field(default_factory=dict)


class DiscoveryBridge:
    """Poll a Dynamo file store and keep a bucket equal to its live records."""

    def __init__(
        self,
        root: Path,
        writer: BucketWriter,
        *,
        interval: float = 0.5,
        ttl: float = DEFAULT_FILE_TTL,
        prune: bool = True,
        clock: Callable[[], float] = time.time,
        scan: Callable[[Path], FileStoreScan] | None = None,
        key_of: Callable[[FileRecord], str] | None = None,
    ) -> None:
        self._root = root
        self._writer = writer
        self._interval = interval
        self._ttl = ttl
        self._prune = prune
        # mtimes are wall-clock, so expiry compares against wall-clock time too.
        self._clock = clock
        self._scan = scan or FileStoreReader().scan
        self._key_of = key_of or bucket_key_for
        self._mirrored: dict[str, bytes | None] = {}
        self._failing: set[str] = set()
        self._started = False
        self._root_missing = False
        self.stats = BridgeStats()

    async def _start(self) -> None:
        # Before anything is deleted: an empty scan of a wrong path would read as "every
        # record is gone".
        check_store_root(self._root)
        if self._prune:
            # Values unknown: every live record is written once, every other key deleted.
            self._mirrored = dict.fromkeys(await self._writer.keys())
        self._started = True

    async def sync_once(self) -> SyncPlan:
        """Run one pass: scan the store, write the difference, return what was planned."""
        if not self._started:
            await self._start()
        try:
            check_store_root(self._root)
        except ConfigError as exc:
            # Gone while running (an unmounted volume): change nothing until it is back.
            if not self._root_missing:
                _log.warning("discovery bridge pauses: %s", exc)
            self._root_missing = True
            return SyncPlan(puts=(), deletes=())
        if self._root_missing:
            _log.info("discovery bridge resumes: %s is back", self._root)
            self._root_missing = False
        scan = await asyncio.to_thread(self._scan, self._root)
        self._note_skipped(scan.skipped)
        plan = plan_sync(
            self._mirrored, scan, now=self._clock(), ttl=self._ttl, key_of=self._key_of
        )
        for key, value in plan.puts:
            if await self._write(self._writer.put(key, value), key):
                self._mirrored[key] = value
                self.stats.puts += 1
        for key, reason in plan.deletes:
            if await self._write(self._writer.delete(key), key):
                known = self._mirrored.pop(key)
                if known is None:
                    self.stats.pruned += 1
                elif reason == "expired":
                    self.stats.expired += 1
                else:
                    self.stats.removed += 1
        self.stats.passes += 1
        return plan

    async def run(self, stop: asyncio.Event) -> None:
        """Sync every ``interval`` seconds until ``stop`` is set."""
        while not stop.is_set():
            await self.sync_once()
            try:
                await asyncio.wait_for(stop.wait(), timeout=self._interval)
            except asyncio.TimeoutError:
                continue

    async def _write(self, operation: Awaitable[None], key: str) -> bool:
        # A failed write leaves the mirror as it was, so the next pass retries the same change.
        try:
            await operation
        except Exception as exc:  # the bucket being unreachable must not stop the bridge
            self.stats.write_errors += 1
            # Once per failing key, not once per pass.
            level = logging.DEBUG if key in self._failing else logging.WARNING
            _log.log(level, "discovery bridge could not write %s: %s", key, exc)
            self._failing.add(key)
            return False
        self._failing.discard(key)
        return True

    def _note_skipped(self, skipped: tuple[SkippedFile, ...]) -> None:
        for item in skipped:
            name = f"v1/{item.kind}/{item.file_name}"
            if self.stats.skipped_files.get(name) != item.reason:
                _log.warning("discovery bridge skips %s: %s", name, item.reason)
                self.stats.skipped_files[name] = item.reason
