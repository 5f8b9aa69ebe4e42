"""Mirror Dynamo's file discovery store into the JetStream discovery bucket.

Dynamo 1.6.1 workers on ``--discovery-backend file`` write one file per record; the plugin reads
a NATS KV bucket. The bridge scans the store whenever inotify says it changed (and every
interval regardless), and for each record file puts its bytes, unchanged, under the bucket key
of DESIGN.md. A file that disappears, or whose owner stopped refreshing it for longer than the
TTL, becomes a delete. The bridge translates and never judges a value: a record the plugin
would refuse is forwarded and refused there, where the refusal is reported.

A pass sends all its changes to the bucket together, a departed worker's instance records
first. Removals are the latency that costs requests (a frontend on the admitted view keeps
routing to a worker until its withdrawal arrives), so a record file inotify reports removed is
deleted from the bucket at once, before the pass that confirms it
(:meth:`DiscoveryBridge.withdraw_removed`, the one shortcut, held to the pass by a test).

It mirrors all four discovery buckets: model cards, endpoint instances, and the event-plane
sources and channels a KV-aware router needs, under the ``v1.mdc.>``, ``v1.instances.>``,
``v1.event_sources.>`` and ``v1.event_channels.>`` keys of its bucket. Every record it puts
carries its writer identity (:mod:`workerset_admission.ownership`). On start it deletes the keys
*it wrote* that the store no longer holds (``prune``), so a restart after missed removals
converges; a key another writer put (a ``register`` process, a worker, another bridge) is never
its to delete. A store root that is missing or unreadable is refused before anything is written
or deleted, and a pass that finds it gone later changes nothing.

The bucket is not trusted to keep what was written to it. A NATS server restarted with an empty
store, a stream deleted and created again, or a key deleted by someone else would otherwise
leave the bucket without the bridge's records until the store changed again; the bridge reads
the bucket's mark and, periodically, its contents, and writes again at once everything it owns
that the bucket lost (:mod:`workerset_admission.mirror`).

How far behind the store the bucket is, is kept in :attr:`DiscoveryBridge.progress`
(:mod:`workerset_admission.adapters.bridge_progress`): a pass that wrote everything it found
puts the bucket in sync as of the moment its scan began; an inotify event is a change seen
and not yet written until a pass that began after it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from workerset_admission.adapters.bridge_progress import BridgeProgress
from workerset_admission.adapters.bucket_mirror import BucketMirror, MirrorStats
from workerset_admission.adapters.dynamo.filestore import (
    DEFAULT_FILE_TTL,
    FileRecord,
    FileStoreReader,
    FileStoreScan,
    SkippedFile,
)
from workerset_admission.adapters.dynamo.notify import StoreNotifier, open_notifier
from workerset_admission.adapters.owned_task import say_unread_failure
from workerset_admission.aio import cancel_and_wait
from workerset_admission.card import event_kv_key
from workerset_admission.discovery_paths import RecordKind, bucket_key_for_parts
from workerset_admission.errors import ConfigError
from workerset_admission.mirror import BucketWriter, Change, removal_order

__all__ = [
    "BridgeStats",
    "DiscoveryBridge",
    "SyncPlan",
    "bucket_key_for",
    "check_store_root",
    "live_records",
    "plan_sync",
]

_log = logging.getLogger(__name__)

RemovalReason = Literal["removed", "expired"]


def bucket_key_for(record: FileRecord) -> str:
    """Return the bucket key DESIGN.md gives a file record."""
    if record.event is not None:
        return event_kv_key(record.event)
    return bucket_key_for_parts(
        record.kind,
        record.namespace,
        record.component,
        record.endpoint,
        record.instance_id,
        record.model_suffix,
    )


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


def live_records(
    scan: FileStoreScan, *, now: float, ttl: float, key_of: Callable[[FileRecord], str]
) -> tuple[dict[str, bytes], dict[str, float], set[str]]:
    """Split one scan into the live records (key to value, key to last write) and stale keys.

    A record older than ``ttl`` counts as expired even though its file is still there: Dynamo's
    own readers treat it the same way, and only a live FileStore ever deletes such a file.
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
    return live, written, stale


def plan_sync(
    mirrored: Mapping[str, bytes | None],
    scan: FileStoreScan,
    *,
    now: float,
    ttl: float,
    key_of: Callable[[FileRecord], str],
) -> SyncPlan:
    """Diff the bucket as last written (``None`` = value unknown) against one store scan.

    Puts come oldest write first (ties by key). Deletes come in the order that stops routing
    to a departed worker soonest: its instance records (what a frontend routes by), then its
    model cards (its membership; the last one gone lets a successor in), then its event
    records; by key within each.
    """
    live, written, stale = live_records(scan, now=now, ttl=ttl, key_of=key_of)
    # Oldest write first: two configurations registered within one pass must reach the bucket
    # in the order they registered, because the first one observed becomes the incumbent.
    puts = tuple(
        (key, live[key])
        for key in sorted(live, key=lambda k: (written[k], k))
        if key not in mirrored or mirrored[key] != live[key]
    )

    def reason(key: str) -> RemovalReason:
        return "expired" if key in stale else "removed"

    gone = sorted((key for key in mirrored if key not in live), key=removal_order)
    deletes = tuple((key, reason(key)) for key in gone)
    return SyncPlan(puts=puts, deletes=deletes)


@dataclass(slots=True)
class BridgeStats(MirrorStats):
    """Counters an operator can read (``workerset-admission bridge`` prints them on exit).

    The bucket's counters (puts, heals, write errors...) are every bridge's (``MirrorStats``).
    """

    passes: int = 0
    removed: int = 0
    expired: int = 0
    # Passes woken before the interval was up: by inotify, or by a reconnect.
    notified_passes: int = 0
    # Removals deleted from the bucket as soon as inotify reported them, before any pass.
    removed_at_once: int = 0
    skipped_files: dict[str, str] = field(default_factory=dict)


class _SourceChanged(asyncio.Event):
    """The notifier's event: a change seen in the store, then the bridge's wake-up."""

    def __init__(self, progress: BridgeProgress, wake: asyncio.Event) -> None:
        super().__init__()
        self._progress = progress
        self._wake = wake

    def set(self) -> None:
        self._progress.change_seen()
        self._wake.set()


class DiscoveryBridge:
    """Keep a bucket equal to a Dynamo file store's live records, and heal it when it is lost.

    A pass runs when the store changes (inotify, unless ``notify`` is false) and every
    ``interval`` seconds whatever happens (the safety net, and what notices expiry). Every
    ``check_interval`` seconds, and at once after a failed write or a :meth:`wake`, a pass
    first reads the bucket's mark; every ``reconcile_interval`` seconds, and at once when the
    mark says the bucket was lost or replaced, it reads the bucket's contents and re-writes what
    the bucket lacks (:mod:`workerset_admission.mirror`).
    """

    def __init__(
        self,
        root: Path,
        writer: BucketWriter,
        *,
        interval: float = 0.5,
        ttl: float = DEFAULT_FILE_TTL,
        prune: bool = True,
        notify: bool = True,
        check_interval: float = 1.0,
        reconcile_interval: float = 5.0,
        clock: Callable[[], float] = time.time,
        scan: Callable[[Path], FileStoreScan] | None = None,
        key_of: Callable[[FileRecord], str] | None = None,
        reader: FileStoreReader | None = None,
        progress: BridgeProgress | None = None,
    ) -> None:
        self._root = root
        self._writer = writer
        self._interval = interval
        self._ttl = ttl
        self._notify = notify
        self._check_interval = check_interval
        self._reconcile_interval = reconcile_interval
        # mtimes are wall-clock, so expiry compares against wall-clock time too.
        self._clock = clock
        # The reader's memory of the last scan serves the removal shortcut; a bare scan given
        # from outside has none, and then every change waits for a pass. A reader given (one
        # with the settings' size limit) keeps the shortcut.
        if scan is not None and reader is not None:
            raise ValueError("give a bridge either a scan or a reader, not both")
        self._reader: FileStoreReader | None = reader
        if scan is None:
            self._reader = reader or FileStoreReader()
            scan = self._reader.scan
        self._scan = scan
        self._key_of = key_of or bucket_key_for
        self.stats = BridgeStats()
        self.progress = progress if progress is not None else BridgeProgress()
        self._mirror = BucketMirror(writer, self.stats, prune=prune, log=_log)
        self._started = False
        self._root_missing = False
        self._check_soon = False
        self._last_check = float("-inf")
        self._last_reconcile = float("-inf")
        self._wake = asyncio.Event()
        self._notifier: StoreNotifier | None = None
        self.notifying = False

    @property
    def beat_interval(self) -> float:
        """The longest its loop goes between two passes while it works."""
        return self._interval

    def wake(self, *, check: bool = True) -> None:
        """Run a pass now; with ``check``, one that reads the bucket's mark first."""
        self._check_soon = self._check_soon or check
        self._wake.set()

    async def _start(self) -> None:
        # Before anything is deleted: an empty scan of a wrong path would read as "every
        # record is gone".
        check_store_root(self._root)
        await self._mirror.start()
        self._last_check = self._last_reconcile = time.monotonic()
        self._started = True

    async def sync_once(self) -> SyncPlan:
        """Run one pass: scan the store, write the difference, return what was planned."""
        if not self._started:
            await self._start()
        began = self.progress.now()
        try:
            check_store_root(self._root)
        except ConfigError as exc:
            # Gone while running (an unmounted volume): change nothing until it is back.
            if not self._root_missing:
                _log.warning("discovery bridge pauses: %s", exc)
            self._root_missing = True
            self.progress.tried()  # the lag grows: the store cannot be read
            return SyncPlan(puts=(), deletes=())
        if self._root_missing:
            _log.info("discovery bridge resumes: %s is back", self._root)
            self._root_missing = False
            if self._notifier is not None:
                # The watches went with the old folders.
                self._notifier.rearm()
        reconcile = await self._check_bucket()
        scan = await asyncio.to_thread(self._scan, self._root)
        self._note_skipped(scan.skipped)
        now = self._clock()
        if reconcile:
            await self._reconcile(scan, now)
        mirror = self._mirror
        plan = plan_sync(mirror.mirrored, scan, now=now, ttl=self._ttl, key_of=self._key_of)
        changes: list[Change] = [*plan.puts, *((key, None) for key, _ in plan.deletes)]
        outcomes = await self._writer.write(changes) if changes else []
        if any(outcome is None for outcome in outcomes):
            self.progress.wrote()
        put_outcomes, delete_outcomes = outcomes[: len(plan.puts)], outcomes[len(plan.puts) :]
        for (key, value), outcome in zip(plan.puts, put_outcomes, strict=True):
            if self._settle(key, outcome):
                mirror.wrote(key, value)
        for (key, reason), outcome in zip(plan.deletes, delete_outcomes, strict=True):
            if self._settle(key, outcome) and mirror.wrote(key, None):
                if reason == "expired":
                    self.stats.expired += 1
                else:
                    self.stats.removed += 1
        self.stats.passes += 1
        if self._check_soon or mirror.heal_pending:
            # A write failed, or the bucket's mark could not be read or says it was lost: the
            # bucket may lack what the store holds.
            self.progress.tried()
        else:
            self.progress.in_sync(began)
        return plan

    async def withdraw_removed(self, files: Iterable[tuple[RecordKind, str]]) -> int:
        """Delete at once the keys of record files seen removed; return how many were deleted.

        This is the bridge's one shortcut. A departed worker's records are what a frontend on
        the bucket must stop routing to soonest, and a pass first lists and stats the whole
        store, a millisecond or several on a busy machine. This deletes exactly what that pass
        would: the key of each record the last scan read whose file is gone now and that the
        bucket holds from this bridge. The pass that follows stays the source of truth (a file
        written again in between is put back by it). ``tests/dynamo/test_dynamo_bridge_fast.py``
        holds the two to the same bucket.
        """
        gone = self._keys_removed(files)
        if not gone:
            return 0
        outcomes = await self._writer.write([(key, None) for key in gone])
        if any(outcome is None for outcome in outcomes):
            self.progress.wrote()
        deleted = 0
        for key, outcome in zip(gone, outcomes, strict=True):
            if self._settle(key, outcome):
                self._mirror.mirrored.pop(key, None)
                self.stats.removed += 1
                deleted += 1
        self.stats.removed_at_once += deleted
        return deleted

    def _keys_removed(self, files: Iterable[tuple[RecordKind, str]]) -> list[str]:
        """List the keys the next pass would delete for ``files``, in the order it would."""
        reader = self._reader
        if reader is None or not self._started or self._root_missing:
            return []
        gone: set[str] = set()
        for kind, name in files:
            record = reader.known(kind, name)
            if record is None or os.path.lexists(self._root / "v1" / kind / name):
                continue  # not a record it read, or written again since
            key = self._key_of(record)
            if key in self._mirror.mirrored:
                gone.add(key)
        return sorted(gone, key=removal_order)

    async def _check_bucket(self) -> bool:
        """Read the bucket's mark when due; return whether its contents must be read now."""
        moment = time.monotonic()
        mirror = self._mirror
        reconcile = mirror.heal_pending or moment - self._last_reconcile >= self._reconcile_interval
        if not (self._check_soon or moment - self._last_check >= self._check_interval):
            return reconcile
        self._last_check = moment
        read, _reason = await mirror.read_mark()
        # An unreadable bucket is read again on the next pass.
        self._check_soon = not read
        return read and (reconcile or mirror.heal_pending)

    async def _reconcile(self, scan: FileStoreScan, now: float) -> None:
        live, _written, _stale = live_records(scan, now=now, ttl=self._ttl, key_of=self._key_of)
        if await self._mirror.reconcile(live):
            self._last_reconcile = time.monotonic()
        else:
            self._check_soon = True  # tried again on the next pass

    async def run(self, stop: asyncio.Event) -> None:
        """Sync on every store change and every ``interval`` seconds until ``stop`` is set."""
        changed = _SourceChanged(self.progress, self._wake)
        notifier = open_notifier(self._root, changed) if self._notify else None
        self._notifier = notifier
        self.notifying = notifier is not None
        relay = asyncio.ensure_future(self._relay(stop))
        try:
            notified = False
            while not stop.is_set():
                self._wake.clear()
                if notifier is not None:
                    await self.withdraw_removed(notifier.take_removed())
                await self.sync_once()
                if notified:
                    self.stats.notified_passes += 1
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self._interval)
                    notified = True
                except asyncio.TimeoutError:
                    notified = False
        finally:
            await cancel_and_wait([relay])
            say_unread_failure(relay, log=_log, what="the discovery bridge's stop relay")
            self._notifier = None
            if notifier is not None:
                notifier.close()

    async def _relay(self, stop: asyncio.Event) -> None:
        # One event to wait on: a stop wakes the loop like a change does.
        await stop.wait()
        self._wake.set()

    def _settle(self, key: str, failure: Exception | None) -> bool:
        """Account for one write of a pass; a failed one is written again by the next pass."""
        if self._mirror.settle(key, failure):
            return True
        # The bucket may be gone: the next pass reads its mark first.
        self._check_soon = True
        return False

    def _note_skipped(self, skipped: tuple[SkippedFile, ...]) -> None:
        for item in skipped:
            name = f"v1/{item.kind}/{item.file_name}"
            if self.stats.skipped_files.get(name) != item.reason:
                _log.warning("discovery bridge skips %s: %s", name, item.reason)
                self.stats.skipped_files[name] = item.reason
