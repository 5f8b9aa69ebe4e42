"""Mirror Dynamo's etcd discovery records into the JetStream discovery bucket, list then watch.

Theory of operation. The bridge holds two maps keyed by bucket key: ``desired``, what etcd holds
(translated), and ``mirrored``, what this bridge has written to the bucket. A *resync* lists
Dynamo's ``v1/`` prefix at one revision R, replaces ``desired`` with that listing, and writes the
difference; the watch then starts at R + 1, so no change between the list and the watch is lost
and none is applied twice. Every watch event updates ``desired`` for one key. The events that
arrived together (a worker's lease ending deletes all its records in one revision), or while
the last batch was being written, are written to the bucket in one go: the puts in revision
order, then the deletes, a departed worker's instance records first.

- A lease that expires (a killed worker) is a delete event like any other.
- A watch that starts below etcd's compaction revision raises :class:`StoreCompacted`: the
  bridge lists again at once; the listing's difference carries every change it missed.
- An unreachable store raises :class:`StoreUnavailable`: the bridge waits (backoff) and
  resyncs. A store that hangs without closing the connection (frozen, or cut off by a network
  partition) leaves a watch silent, not failed; a probe every ``probe_interval`` seconds, a
  request with a deadline, turns that silence into the same failure. ``desired`` changes only
  from a successful listing or a delivered event, so nothing is deleted from the bucket while
  etcd cannot be read.
- A failed bucket write leaves ``mirrored`` as it was and marks the key dirty; dirty keys are
  retried every ``retry_interval`` seconds and by the next change of the same key.
- The bucket itself may lose what was written to it (a NATS server restarted on an empty
  store, a stream deleted and created again, a key deleted behind the bridge's back). Every
  ``check_interval`` seconds, and at once after a failed write or a :meth:`wake` (a reconnect),
  the bridge reads the bucket's mark; every ``reconcile_interval`` seconds, and at once when
  the mark says the bucket was lost or replaced, it reads the bucket's contents, corrects
  ``mirrored`` to them and writes every key again that differs from ``desired``, in the order
  etcd created them (:mod:`workerset_admission.mirror`).
- Deletes touch only keys this bridge owns: the ones it wrote, and (when pruning) the ones the
  bucket writer reports as owned at start. A key another writer put there is never in
  ``mirrored``, so no path deletes it.

- How far behind etcd the bucket is, is kept in :attr:`EtcdDiscoveryBridge.progress`
  (:mod:`workerset_admission.adapters.bridge_progress`): a listing written whole, a batch of
  events written with nothing left dirty, or a probe answered with nothing pending puts the
  bucket in sync as of the moment it began; a watch event is a change seen and not yet
  written until then. Every listing, probe or failure is a beat of its loop.

The bridge translates and never judges a value: a record the plugin would refuse is forwarded
and refused there, where the refusal is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from workerset_admission.adapters.bridge_progress import BridgeProgress
from workerset_admission.adapters.bucket_mirror import READ_FAILURES, BucketMirror, MirrorStats
from workerset_admission.adapters.owned_task import say_unread_failure
from workerset_admission.aio import cancel_and_wait
from workerset_admission.discovery_paths import RECORD_KINDS, bucket_key_for_path
from workerset_admission.errors import (
    InvalidRecordError,
    StoreCompacted,
    StoreUnavailable,
    error_in_words,
    wire_text,
)
from workerset_admission.mirror import BucketWriter, Change, removal_order

if sys.version_info >= (3, 11):
    from asyncio import TaskGroup
else:  # pragma: no cover - exercised on Python 3.10 only
    from taskgroup import TaskGroup  # type: ignore[import-not-found,unused-ignore]

__all__ = [
    "DEFAULT_BACKOFF",
    "DISCOVERY_PREFIX",
    "EtcdBridgeStats",
    "EtcdDiscoveryBridge",
    "StoreChange",
    "StoreEntry",
    "StoreListing",
    "StoreReader",
    "bucket_key_for_etcd",
]

_log = logging.getLogger(__name__)

DISCOVERY_PREFIX = "v1/"
# Seconds between attempts while etcd cannot be read; the last one repeats.
DEFAULT_BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)


@dataclass(frozen=True, slots=True)
class StoreEntry:
    """One key as a listing returns it."""

    key: str
    value: bytes
    create_revision: int


@dataclass(frozen=True, slots=True)
class StoreListing:
    """Every key under a prefix, read at one revision."""

    revision: int
    entries: tuple[StoreEntry, ...]


@dataclass(frozen=True, slots=True)
class StoreChange:
    """One watch event: a put (``value`` set) or a delete, lease expiry included (``None``)."""

    key: str
    value: bytes | None
    revision: int


class StoreReader(Protocol):
    """The read side of Dynamo's etcd store, as the bridge needs it."""

    async def list_prefix(self, prefix: str) -> StoreListing:
        """List at one revision; raise :class:`StoreUnavailable` when etcd cannot answer."""
        ...

    def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[StoreChange]:
        """Yield changes from ``start_revision`` on, in revision order, until closed.

        Raises :class:`StoreCompacted` when that revision is gone and :class:`StoreUnavailable`
        when the connection is lost.
        """
        ...

    async def probe(self) -> None:
        """Ask the store something small; raise :class:`StoreUnavailable` if it does not answer."""
        ...

    async def reset(self) -> None:
        """Drop the connection after a failure; the next call connects afresh."""
        ...


class _Skip(Exception):
    """A key under the prefix that is not a record the bucket mirrors."""


def bucket_key_for_etcd(key: str) -> str | None:
    """Return the bucket key of Dynamo's etcd key, or ``None`` for a bucket not mirrored.

    Raises :class:`InvalidRecordError` for a key in a mirrored bucket that is not a record path.
    """
    if not key.startswith(DISCOVERY_PREFIX):
        return None
    bucket, sep, path = key[len(DISCOVERY_PREFIX) :].partition("/")
    if not sep:
        return None
    for kind in RECORD_KINDS:
        if bucket == kind:
            return bucket_key_for_path(kind, path)
    return None


@dataclass(slots=True)
class EtcdBridgeStats(MirrorStats):
    """Counters an operator can read (``workerset-admission bridge`` prints them on exit).

    The bucket's counters (puts, heals, write errors...) are every bridge's (``MirrorStats``).
    """

    listings: int = 0
    relists_after_compaction: int = 0
    store_errors: int = 0
    changes: int = 0
    deletes: int = 0
    ignored_keys: int = 0
    revision: int = 0
    skipped_keys: dict[str, str] = field(default_factory=dict)


class EtcdDiscoveryBridge:
    """Keep the owned part of a bucket equal to Dynamo's records in etcd."""

    def __init__(
        self,
        reader: StoreReader,
        writer: BucketWriter,
        *,
        prefix: str = DISCOVERY_PREFIX,
        prune: bool = True,
        backoff: Sequence[float] = DEFAULT_BACKOFF,
        retry_interval: float = 1.0,
        probe_interval: float = 10.0,
        check_interval: float = 1.0,
        reconcile_interval: float = 5.0,
        key_of: Callable[[str], str | None] = bucket_key_for_etcd,
        progress: BridgeProgress | None = None,
    ) -> None:
        if not backoff or any(delay <= 0 for delay in backoff):
            raise ValueError("backoff needs at least one positive delay")
        self._reader = reader
        self._prefix = prefix
        self._backoff = tuple(backoff)
        self._retry_interval = retry_interval
        self._probe_interval = probe_interval
        self._check_interval = check_interval
        self._reconcile_interval = reconcile_interval
        self._key_of = key_of
        self._desired: dict[str, bytes] = {}
        # The etcd revision that created each desired key: re-writes go oldest first.
        self._created: dict[str, int] = {}
        self._check_soon = asyncio.Event()
        self.stats = EtcdBridgeStats()
        self.progress = progress if progress is not None else BridgeProgress()
        self._mirror = BucketMirror(writer, self.stats, prune=prune, log=_log)
        self._dirty: set[str] = set()
        self._lock = asyncio.Lock()
        self._started = False
        self._revision = 0
        # Watch events received and not yet written (or failed and made dirty).
        self._in_flight = 0
        # Set after each listing has been written; tests and the CLI wait on it.
        self.synced = asyncio.Event()

    @property
    def revision(self) -> int:
        """The etcd revision the bucket reflects (0 before the first listing)."""
        return self._revision

    def mirrored_keys(self) -> frozenset[str]:
        """Return the bucket keys this bridge has written and not deleted."""
        return frozenset(key for key, value in self._mirror.mirrored.items() if value is not None)

    async def resync(self) -> StoreListing:
        """List the prefix at one revision and write the difference to the bucket."""
        began = self.progress.now()
        listing = await self._reader.list_prefix(self._prefix)
        self.stats.listings += 1
        if not self._started:
            try:
                await self._mirror.start()
            except READ_FAILURES as exc:  # retried like an unreadable store
                words = error_in_words(exc)
                raise StoreUnavailable(f"the bucket could not be read: {words}") from exc
            self._started = True
        desired: dict[str, bytes] = {}
        created: dict[str, int] = {}
        for entry in listing.entries:
            key = self._translate(entry.key)
            if key is not None:
                desired[key] = entry.value
                created[key] = entry.create_revision
        async with self._lock:
            self._desired = desired
            self._created = created
            # First registered first: the first configuration observed becomes the incumbent,
            # so registrations must reach the bucket in the order etcd created them.
            order = sorted(desired, key=lambda k: (created[k], k))
            await self._write_keys(order + sorted(set(self._mirror.mirrored) - set(desired)))
        self._revision = listing.revision
        self.stats.revision = listing.revision
        self.synced.set()
        self._note_progress(began)
        return listing

    async def apply(self, change: StoreChange) -> None:
        """Apply one watch event to the bucket."""
        await self.apply_all([change])

    async def apply_all(self, changes: Sequence[StoreChange]) -> None:
        """Apply watch events that arrived together, in revision order, in one bucket write.

        A worker's lease ending deletes all its records in one etcd revision; written one
        after the other, each waiting for its acknowledgement, the last of them would reach
        the bucket several round trips after the first.
        """
        if not changes:
            return
        began = self.progress.now()
        # Received by the watch, now the write's to account for (dirty if it fails).
        self._in_flight = max(0, self._in_flight - len(changes))
        self.stats.changes += len(changes)
        async with self._lock:
            keys: list[str] = []
            for change in changes:
                key = self._translate(change.key)
                if key is None:
                    continue
                if change.value is None:
                    self._desired.pop(key, None)
                    self._created.pop(key, None)
                else:
                    self._desired[key] = change.value
                    self._created.setdefault(key, change.revision)
                keys.append(key)
            await self._write_keys(keys)
        self._revision = max(self._revision, *(change.revision for change in changes))
        self.stats.revision = self._revision
        self._note_progress(began)

    async def follow_once(self) -> None:
        """Resync, then apply the watch until it fails; raise the failure."""
        listing = await self.resync()
        # Owned by this call: it ends with it, and its failure is raised or said, never lost.
        watching = asyncio.ensure_future(self._watch(listing.revision + 1))
        ended = False
        try:
            while True:
                done, _pending = await asyncio.wait({watching}, timeout=self._probe_interval)
                if done:
                    ended = True
                    break
                began = self.progress.now()
                await self._reader.probe()
                # etcd answers: with every change it sent written, in sync as of the ask.
                self._note_progress(began)
        finally:
            await cancel_and_wait([watching])
            if not ended:  # a probe's failure (or a stop) ends the call: it is the one raised
                say_unread_failure(watching, log=_log, what="the etcd watch")
        watching.result()
        # A watch that simply ends (the server closed it) is a failure too.
        raise StoreUnavailable("the watch ended")

    async def _watch(self, start_revision: int) -> None:
        """Apply the watch's events, each batch that arrived while the last one was written."""
        received: list[StoreChange] = []
        arrived = asyncio.Event()

        async def receive() -> None:
            async for change in self._reader.watch_prefix(self._prefix, start_revision):
                self.progress.change_seen()
                self._in_flight += 1
                received.append(change)
                arrived.set()

        # Owned by this call, as the watch is by ``follow_once``; its end wakes the loop too.
        receiving = asyncio.ensure_future(receive())
        receiving.add_done_callback(lambda _: arrived.set())
        ended = False
        try:
            while True:
                if received:
                    batch = received.copy()
                    received.clear()
                    await self.apply_all(batch)
                    continue
                if receiving.done():
                    ended = True
                    break
                arrived.clear()
                if not (received or receiving.done()):
                    await arrived.wait()
        finally:
            await cancel_and_wait([receiving])
            if not ended:
                say_unread_failure(receiving, log=_log, what="the etcd watch's receiver")
        receiving.result()  # the watch's failure, if it failed

    async def run(self, stop: asyncio.Event) -> None:
        """Follow etcd until ``stop`` is set, resyncing after every failure."""
        async with TaskGroup() as tg:
            tasks = [
                tg.create_task(self._follow(stop)),
                tg.create_task(self._retry_dirty(stop)),
                tg.create_task(self._keep_healed(stop)),
            ]
            await stop.wait()
            for task in tasks:
                task.cancel()

    def wake(self) -> None:
        """Read the bucket's mark now (after a reconnect, say) instead of at the next check."""
        self._check_soon.set()

    async def heal_once(self, *, reconcile: bool = False) -> str | None:
        """Read the bucket's mark, and its contents when due; return why it healed, if it did.

        With ``reconcile`` the contents are read whatever the mark says.
        """
        read, reason = await self._mirror.read_mark()
        if not read:
            # Tried again at the next check, not at once: an outage would make it a busy loop.
            return None
        if self._mirror.heal_pending or reconcile:
            await self._reconcile()
        return reason

    async def _reconcile(self) -> None:
        async with self._lock:
            if not await self._mirror.reconcile(self._desired):
                return  # tried again at the next check
            order = sorted(self._desired, key=lambda k: (self._created.get(k, 0), k))
            mirrored = self._mirror.mirrored
            await self._write_keys(order + sorted(set(mirrored) - set(self._desired)))

    async def _keep_healed(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        last_reconcile = loop.time()
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._check_soon.wait(), timeout=self._check_interval)
            self._check_soon.clear()
            if not self.synced.is_set():
                # No listing yet (or etcd unreadable): nothing known to write, so nothing to
                # heal; the next listing writes its difference anyway.
                continue
            due = loop.time() - last_reconcile >= self._reconcile_interval
            await self.heal_once(reconcile=due)
            if due:
                last_reconcile = loop.time()

    async def _follow(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            listings_before = self.stats.listings
            try:
                await self.follow_once()
            except StoreCompacted as exc:
                # Not a failure of etcd: the watch was behind. List again at once.
                self.stats.relists_after_compaction += 1
                _log.warning("discovery bridge: %s; listing again", exc)
                failures = 0
            except StoreUnavailable as exc:
                self.stats.store_errors += 1
                if self.stats.listings > listings_before:
                    # It had listed and watched since the last failure: start the schedule over.
                    failures = 0
                delay = self._backoff[min(failures, len(self._backoff) - 1)]
                level = logging.WARNING if failures == 0 else logging.DEBUG
                _log.log(level, "discovery bridge cannot read etcd (%s); retrying", exc)
                failures += 1
                self.synced.clear()
                self.progress.tried()  # the loop still turns; the lag grows
                await self._reader.reset()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)

    async def _retry_dirty(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._retry_interval)
            if self._dirty:
                began = self.progress.now()
                async with self._lock:
                    await self._write_keys(sorted(self._dirty))
                self._note_progress(began)

    def _translate(self, etcd_key: str) -> str | None:
        try:
            key = self._key_of(etcd_key)
        except InvalidRecordError as exc:
            if self.stats.skipped_keys.get(etcd_key) != exc.reason:
                _log.warning("discovery bridge skips %s: %s", wire_text(etcd_key), exc.reason)
                self.stats.skipped_keys[etcd_key] = exc.reason
            return None
        if key is None:
            self.stats.ignored_keys += 1
        return key

    async def _write_keys(self, keys: Sequence[str]) -> None:
        """Make the bucket hold ``desired[key]`` (or not hold the key) for each; the lock is held.

        One write for all of them: the puts in the order given (registrations oldest first),
        then the deletes in the order that stops routing to a departed worker soonest.
        """
        puts: list[Change] = []
        deletes: list[Change] = []
        mirrored = self._mirror.mirrored
        for key in dict.fromkeys(keys):
            want = self._desired.get(key)
            if want is not None:
                if key in mirrored and mirrored[key] == want:
                    self._dirty.discard(key)
                else:
                    puts.append((key, want))
            elif key in mirrored:
                deletes.append((key, None))
            else:
                self._dirty.discard(key)
        changes = puts + sorted(deletes, key=lambda change: removal_order(change[0]))
        if not changes:
            return
        outcomes = await self._mirror.writer.write(changes)
        if any(failure is None for failure in outcomes):
            self.progress.wrote()
        for (key, value), failure in zip(changes, outcomes, strict=True):
            if self._settle(key, failure) and self._mirror.wrote(key, value):
                self.stats.deletes += 1

    @property
    def beat_interval(self) -> float:
        """The longest its loop goes between two beats while it works: a probe, a backoff."""
        return max(self._probe_interval, *self._backoff)

    def _note_progress(self, began: float) -> None:
        """Say the bucket is in sync as of ``began``, unless a write failed or is owed."""
        # A write under way (the lock held) may yet fail.
        owed = self._dirty or self._in_flight or self._lock.locked()
        if owed or self._mirror.heal_pending:
            self.progress.tried()
        else:
            self.progress.in_sync(began)

    def _settle(self, key: str, failure: Exception | None) -> bool:
        """Account for one write; a failed one stays dirty and is retried.

        The bucket being unreachable must not stop the bridge: the failure is counted and
        logged (once per failing key), and the bucket's mark is read before the retry.
        """
        if not self._mirror.settle(key, failure):
            self._dirty.add(key)
            self._check_soon.set()
            return False
        self._dirty.discard(key)
        return True
