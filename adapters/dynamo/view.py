"""The admitted discovery view: a Dynamo file store holding only the workers admission admits.

Theory of operation
-------------------

Dynamo 1.6.1's frontend takes every hop's workers (decode or aggregated, prefill, encoder) from
its discovery backend. Run with ``--discovery-backend file`` and ``DYN_FILE_KV=<view dir>``, its
discovery is whatever files that directory holds, so the plugin makes itself the frontend's
discovery source: workers keep registering in their own store (mirrored into the NATS bucket),
and this module writes into the view directory the Dynamo records of admitted workers only.

It is an effect consumer, never a second admission. The service's committed hop bindings say,
through their admission receivers, which instances each WorkerSet's tenure admits; the bucket
says which are live and holds their raw records. The view is, per binding:

* every ``v1/instances`` record of an admitted, live instance in the binding's namespace and
  component (its generate endpoint and its auxiliary endpoints, such as the KV query one);
* its ``v1/mdc`` records at the binding's endpoint (with any LoRA adapter cards);
* its ``v1/event_sources`` records (``metadata.worker.worker_id`` names the worker) and the
  ``v1/event_channels`` records published under the same publisher id, so KV-aware routing
  hears the admitted workers' KV events.

Event channels that name no worker (load metrics, forward-pass metrics) cannot be attributed to
an admitted worker and are left out, rather than let a rejected worker's channel in.

Publishing follows the file store's rules and the contract's order. A file is written as a
``.tmp_`` file (which the file store ignores) and renamed into place. Records of a tenure that
ended are withdrawn first; then new records are added (event and instance records before the
model card that makes the frontend build the model); only then are records that left a tenure
removed (add before remove). Files are touched every ``refresh_interval`` seconds, well inside
the store's 10 s expiry; when the writer stops its files are deleted, and when its process dies
the frontend's own file store expires them within 10 s. Either way the frontend fails closed.
While NATS is unreachable nothing changes the admitted state, and the last view is kept alive.

The writer owns its directory: a lock file held for the process's life refuses a second live
writer, and a manifest of the files it wrote lets the next writer remove what a crashed one left
behind. It never deletes a file it did not write.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from workerset_admission.card import (
    BoundarySettings,
    decode_endpoint_record,
    decode_event_record,
    decode_model_record,
    is_event_key,
    parse_event_key,
    parse_key,
)
from workerset_admission.errors import ReceiverRetired, RemoteDataError, ViewDirectoryError
from workerset_admission.identity import EndpointId, GroupKey
from workerset_admission.ports import (
    DiscoverySource,
    SourceDelete,
    SourceEvent,
    SourcePut,
    SourceSnapshot,
)

__all__ = [
    "BUCKETS",
    "LOCK_NAME",
    "MANIFEST_NAME",
    "AdmittedView",
    "DirectoryFiles",
    "HeldRecord",
    "RecordTable",
    "SyncReport",
    "TappedSource",
    "Tenure",
    "ViewFile",
    "ViewFiles",
    "ViewHook",
    "ViewService",
    "ViewWriter",
    "check_frontend_store",
    "file_name_for",
    "plan_view",
    "tenures_of",
]

_log = logging.getLogger(__name__)

# Publication order inside one pass: the model card last, so the frontend finds the instance
# and event records already there when the card makes it build the model; removal is reversed.
BUCKETS: tuple[str, ...] = ("event_sources", "event_channels", "instances", "mdc")
_ADD_ORDER = {bucket: index for index, bucket in enumerate(BUCKETS)}
LOCK_NAME = ".workerset-admission.lock"
MANIFEST_NAME = ".workerset-admission.files"
# The file store ignores names starting with ``.tmp_``; ours carry a mark so a restart can
# tell its own leftovers from a worker's.
_TEMP_PREFIX = ".tmp_wsa-"
_ALNUM = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")

ViewFile = tuple[str, str]
"""A file of the view: (bucket, file name)."""


def file_name_for(path: str) -> str:
    """Dynamo's file name for a discovery path: every byte outside ``[A-Za-z0-9]`` as ``%XX``."""
    return "".join(chr(b) if b in _ALNUM else f"%{b:02X}" for b in path.encode("utf-8"))


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class HeldRecord:
    """One valid discovery record the view may publish, with what ties it to a worker.

    ``instance_id`` is the instance for endpoint and model records and the publisher id for
    event records; ``worker_id`` is the worker an event source names.
    """

    bucket: str
    file_name: str
    value: bytes
    namespace: str
    component: str | None
    endpoint: str | None
    instance_id: int
    worker_id: int | None = None


class RecordTable:
    """The last valid raw record per bucket key, judged by the same boundary as admission.

    A refused value leaves the key's last valid record in place, as the service keeps the last
    valid registration; a key the namespace filter drops is not held.
    """

    def __init__(
        self, settings: BoundarySettings | None = None, on_change: Callable[[], None] | None = None
    ) -> None:
        self._settings = settings or BoundarySettings()
        self._records: dict[str, HeldRecord] = {}
        # Keys by what ties a record to a worker, so planning a view costs per admitted worker,
        # not per record held.
        self._index: dict[tuple[str, str, str | None, int], set[str]] = {}
        self._on_change = on_change

    def __len__(self) -> int:
        return len(self._records)

    def set_listener(self, on_change: Callable[[], None] | None) -> None:
        self._on_change = on_change

    def get(self, key: str) -> HeldRecord | None:
        return self._records.get(key)

    def records(self) -> Iterable[HeldRecord]:
        return self._records.values()

    def lookup(
        self, kind: str, namespace: str, component: str | None, number: int
    ) -> list[HeldRecord]:
        """Return the records tied to a worker or publisher.

        ``worker``: endpoint and model records of an instance in a component; ``source``:
        event sources naming a worker; ``channel``: event channels of a publisher (these two
        in any component; pass ``None``).
        """
        keys = self._index.get((kind, namespace, component, number), ())
        return [self._records[key] for key in sorted(keys)]

    @staticmethod
    def _tie(record: HeldRecord) -> tuple[str, str, str | None, int] | None:
        if record.bucket in ("instances", "mdc"):
            return ("worker", record.namespace, record.component, record.instance_id)
        if record.bucket == "event_sources":
            if record.worker_id is None:
                return None
            return ("source", record.namespace, None, record.worker_id)
        return ("channel", record.namespace, None, record.instance_id)

    def _unindex(self, key: str, record: HeldRecord) -> None:
        tie = self._tie(record)
        if tie is None:
            return
        keys = self._index.get(tie)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._index[tie]

    def _reindex(self, key: str, record: HeldRecord) -> None:
        tie = self._tie(record)
        if tie is not None:
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
        elif isinstance(event, SourceDelete):
            old = self._records.pop(event.key, None)
            changed = old is not None
            if old is not None:
                self._unindex(event.key, old)
        else:
            fresh: dict[str, HeldRecord] = {}
            for entry in event.entries:
                old = self._records.get(entry.key)
                if not self._put(entry.key, entry.value, fresh) and old is not None:
                    fresh[entry.key] = old  # a refused value keeps the last valid one
            changed = fresh != self._records
            if changed:
                self._records = fresh
                self._index = {}
                for key, record in fresh.items():
                    self._reindex(key, record)
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


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True, slots=True)
class Tenure:
    """One committed binding as the view sees it: group, build generation, routable ids."""

    group: GroupKey
    generation: int
    routable: frozenset[int]


def _records_of(endpoint: EndpointId, instance_id: int, table: RecordTable) -> list[HeldRecord]:
    ns, comp = endpoint.namespace, endpoint.component
    mine = [
        record
        for record in table.lookup("worker", ns, comp, instance_id)
        # Every endpoint record of the instance in the component (the KV query endpoint
        # too), and its cards at the binding's own endpoint.
        if record.bucket == "instances" or record.endpoint == endpoint.endpoint
    ]
    sources = [
        s for s in table.lookup("source", ns, None, instance_id) if s.component in (None, comp)
    ]
    mine += sources
    for source in sources:
        # A channel is the worker's when it shares scope and publisher id with its source.
        mine += [
            channel
            for channel in table.lookup("channel", ns, None, source.instance_id)
            if (channel.component, channel.endpoint) == (source.component, source.endpoint)
        ]
    return mine


def plan_view(
    tenures: Iterable[Tenure], table: RecordTable
) -> dict[ViewFile, tuple[bytes, frozenset[tuple[GroupKey, int]]]]:
    """Every file the view must hold: its bytes, and the tenures that want it."""
    wanted: dict[ViewFile, tuple[bytes, set[tuple[GroupKey, int]]]] = {}
    for tenure in tenures:
        endpoint = tenure.group.endpoint
        for instance_id in sorted(tenure.routable):
            for record in _records_of(endpoint, instance_id, table):
                file = (record.bucket, record.file_name)
                entry = wanted.setdefault(file, (record.value, set()))
                entry[1].add((tenure.group, tenure.generation))
    return {file: (value, frozenset(owners)) for file, (value, owners) in wanted.items()}


# --------------------------------------------------------------------------- the files


class ViewFiles(Protocol):
    """The view directory as the writer needs it (real files, or a test's fake)."""

    def publish(self, file: ViewFile, value: bytes) -> None:
        """Replace the file's content atomically."""
        ...

    def touch(self, file: ViewFile) -> bool:
        """Refresh the file's mtime; ``False`` when it is gone."""
        ...

    def remove(self, file: ViewFile) -> None:
        """Delete the file (a missing file is fine)."""
        ...

    def save_manifest(self, files: Iterable[ViewFile]) -> None: ...

    def load_manifest(self) -> list[ViewFile]: ...


def check_frontend_store(view_dir: Path, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a view directory that is not the frontend's own file store (``DYN_FILE_KV``)."""
    from workerset_admission.adapters.dynamo.filestore import default_store_root

    env = os.environ if environ is None else environ
    store = default_store_root(env)
    if os.path.realpath(view_dir) != os.path.realpath(store):
        where = f"DYN_FILE_KV={store}" if env.get("DYN_FILE_KV") else f"its default {store}"
        raise ViewDirectoryError(
            f"view directory {view_dir} is not this frontend's file store ({where}): the "
            "frontend would never read the admitted view; set both to the same directory"
        )


class DirectoryFiles:
    """:class:`ViewFiles` over a real directory, owned through a lock file.

    ``open`` refuses a directory that is missing, not writable, or locked by another live
    writer (the lock is an ``flock`` the kernel releases when the holder dies).
    """

    def __init__(self, root: Path, lock: IO[str]) -> None:
        self.root = root
        self._lock: IO[str] | None = lock
        self._token = secrets.token_hex(4)
        self._serial = 0

    @classmethod
    def open(cls, root: Path | str) -> DirectoryFiles:
        root = Path(root)
        if not root.is_dir():
            reason = "does not exist" if not root.exists() else "is not a directory"
            raise ViewDirectoryError(f"view directory {root} {reason}")
        lock_path = root / LOCK_NAME
        try:
            lock = lock_path.open("a+", encoding="utf-8")
        except OSError as exc:
            raise ViewDirectoryError(
                f"view directory {root} is not writable ({exc.strerror})"
            ) from None
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise ViewDirectoryError(
                    f"view directory {root} is owned by another live writer ({holder})"
                ) from None
            raise ViewDirectoryError(f"view directory {root}: cannot lock ({exc})") from None
        files = cls(root, lock)
        try:
            lock.seek(0)
            lock.truncate()
            lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            lock.flush()
            for bucket in BUCKETS:
                (root / "v1" / bucket).mkdir(parents=True, exist_ok=True)
                # Prove the bucket takes a publication, the way every later one is made.
                probe = (bucket, f"{_TEMP_PREFIX}probe")
                files._write_temp(probe, b"").unlink()
        except OSError as exc:
            files.release()
            raise ViewDirectoryError(
                f"view directory {root} is not writable ({exc.strerror or exc})"
            ) from None
        files._remove_own_temp_files()
        return files

    def release(self) -> None:
        """Give the directory up (the lock file stays; only the lock goes)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
            lock.close()

    def _path(self, file: ViewFile) -> Path:
        return self.root / "v1" / file[0] / file[1]

    def _write_temp(self, file: ViewFile, value: bytes) -> Path:
        self._serial += 1
        temp = self.root / "v1" / file[0] / f"{_TEMP_PREFIX}{self._token}-{self._serial}"
        temp.write_bytes(value)
        return temp

    def publish(self, file: ViewFile, value: bytes) -> None:
        temp = self._write_temp(file, value)
        try:
            os.replace(temp, self._path(file))
        except OSError:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise

    def touch(self, file: ViewFile) -> bool:
        try:
            os.utime(self._path(file))
        except FileNotFoundError:
            return False
        return True

    def remove(self, file: ViewFile) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(file).unlink()

    def save_manifest(self, files: Iterable[ViewFile]) -> None:
        body = json.dumps(sorted(f"{bucket}/{name}" for bucket, name in files))
        temp = self.root / f"{MANIFEST_NAME}.tmp"
        temp.write_text(body + "\n", encoding="utf-8")
        os.replace(temp, self.root / MANIFEST_NAME)

    def load_manifest(self) -> list[ViewFile]:
        try:
            listed = json.loads((self.root / MANIFEST_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        out: list[ViewFile] = []
        for item in listed if isinstance(listed, list) else []:
            bucket, _, name = str(item).partition("/")
            # Only names this writer could have made: a bucket of the view, a plain file name.
            if bucket in BUCKETS and name and "/" not in name and not name.startswith("."):
                out.append((bucket, name))
        return out

    def foreign_files(self, known: Iterable[ViewFile]) -> list[ViewFile]:
        """Record files in the view that this writer does not own (reported, never touched)."""
        mine = set(known)
        found: list[ViewFile] = []
        for bucket in BUCKETS:
            with contextlib.suppress(OSError):
                names = [entry.name for entry in os.scandir(self.root / "v1" / bucket)]
                found.extend(
                    (bucket, name)
                    for name in names
                    if not name.startswith(".") and (bucket, name) not in mine
                )
        return found

    def _remove_own_temp_files(self) -> None:
        for bucket in BUCKETS:
            with contextlib.suppress(OSError):
                for entry in os.scandir(self.root / "v1" / bucket):
                    if entry.name.startswith(_TEMP_PREFIX):
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)


# --------------------------------------------------------------------------- the view


@dataclass(frozen=True, slots=True)
class SyncReport:
    """What one pass did, in the order it did it."""

    withdrawn: tuple[ViewFile, ...] = ()
    written: tuple[ViewFile, ...] = ()
    removed: tuple[ViewFile, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.withdrawn or self.written or self.removed)


def _removal_order(files: Iterable[ViewFile]) -> list[ViewFile]:
    return sorted(files, key=lambda f: (-_ADD_ORDER.get(f[0], 0), f[1]))


def _add_order(files: Iterable[ViewFile]) -> list[ViewFile]:
    return sorted(files, key=lambda f: (_ADD_ORDER.get(f[0], 0), f[1]))


class AdmittedView:
    """The view's state and its publication rules, over any :class:`ViewFiles`.

    Synchronous and clock-injected, so every rule is reachable from a unit test; the
    :class:`ViewWriter` drives it from the service's loop.
    """

    def __init__(
        self,
        files: ViewFiles,
        *,
        refresh_interval: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._files = files
        self.refresh_interval = refresh_interval
        self._clock = clock
        self._written: dict[ViewFile, bytes | None] = {}
        self._owners: dict[ViewFile, frozenset[tuple[GroupKey, int]]] = {}
        self._last_touch = clock()
        self.publish_errors = 0

    @property
    def files(self) -> dict[ViewFile, bytes | None]:
        """What the view holds now (``None``: a previous writer's file, content unknown)."""
        return dict(self._written)

    def adopt_leftovers(self) -> int:
        """Take over a previous writer's files from its manifest; the first sync settles them.

        They are not touched meanwhile: if no sync comes, they expire as the dead writer's
        would have.
        """
        for file in self._files.load_manifest():
            self._written.setdefault(file, None)
            self._owners.setdefault(file, frozenset())
        return len(self._written)

    def sync(self, tenures: Sequence[Tenure], table: RecordTable) -> SyncReport:
        """Make the directory equal to the view the tenures and records call for."""
        wanted = plan_view(tenures, table)
        live = {(t.group, t.generation) for t in tenures}
        stale = [f for f in self._written if f not in wanted]
        # A file whose tenure ended goes first: a successor's records never share the view
        # with its predecessor's.
        ended = [f for f in stale if not (self._owners.get(f, frozenset()) & live)]
        rest = [f for f in stale if f not in set(ended)]
        withdrawn = self._remove_all(ended)
        written: list[ViewFile] = []
        for file in _add_order(wanted):
            value, owners = wanted[file]
            self._owners[file] = owners
            if self._written.get(file) == value:
                continue
            if self._publish(file, value):
                written.append(file)
        removed = self._remove_all(rest)
        report = SyncReport(tuple(withdrawn), tuple(written), tuple(removed))
        if report.changed:
            self._save_manifest()
        return report

    def _publish(self, file: ViewFile, value: bytes) -> bool:
        try:
            self._files.publish(file, value)
        except OSError as exc:
            # Kept out of the written set, so the next pass tries again.
            self.publish_errors += 1
            _log.warning("admitted view: could not write %s/%s: %s", file[0], file[1], exc)
            return False
        self._written[file] = value
        return True

    def _remove_all(self, files: Iterable[ViewFile]) -> list[ViewFile]:
        done = []
        for file in _removal_order(files):
            try:
                self._files.remove(file)
            except OSError as exc:
                self.publish_errors += 1
                _log.warning("admitted view: could not remove %s/%s: %s", file[0], file[1], exc)
                continue
            self._written.pop(file, None)
            self._owners.pop(file, None)
            done.append(file)
        return done

    def _save_manifest(self) -> None:
        try:
            self._files.save_manifest(self._written)
        except OSError as exc:
            _log.warning("admitted view: could not save its manifest: %s", exc)

    def keep_alive(self, *, force: bool = False) -> int:
        """Touch every published file when a refresh is due; return how many were touched.

        A file someone else deleted (an expiry sweep after a stall) is written again.
        """
        now = self._clock()
        if not force and now - self._last_touch < self.refresh_interval:
            return 0
        self._last_touch = now
        touched = 0
        for file, value in list(self._written.items()):
            if value is None:
                continue  # a previous writer's file: left to expire unless a sync wants it
            try:
                alive = self._files.touch(file)
            except OSError as exc:
                _log.debug("admitted view: could not touch %s/%s: %s", file[0], file[1], exc)
                continue
            if not alive:
                del self._written[file]
                self._publish(file, value)
            touched += 1
        return touched

    def clear(self) -> int:
        """Withdraw the whole view (the writer stops): the frontend routes nowhere."""
        removed = self._remove_all(list(self._written))
        self._save_manifest()
        return len(removed)


# --------------------------------------------------------------------------- the writer


class ViewService(Protocol):
    """The admission service as the writer reads it."""

    @property
    def synced(self) -> bool: ...

    def bindings(self) -> Sequence[Any]: ...

    def on_state_change(self, listener: Callable[[], None]) -> None: ...


def tenures_of(service: ViewService) -> list[Tenure]:
    """Each committed binding's tenure, its routable ids read through its admission receiver."""
    out = []
    for binding in service.bindings():
        try:
            routable = binding.routable()
        except ReceiverRetired:
            continue  # the tenure ended in this very step; its withdrawal is on the way
        out.append(Tenure(binding.id.group, binding.id.generation, frozenset(routable)))
    return out


class ViewWriter:
    """Drive an :class:`AdmittedView` from a running admission service.

    Every admission state change (and every change of a held record) wakes one coalesced sync;
    between changes the files are kept alive. Nothing is written before the service applied
    its first discovery snapshot: an empty view then would withdraw a restarted frontend's
    workers for no reason.
    """

    def __init__(self, view: AdmittedView, table: RecordTable) -> None:
        self.view = view
        self.table = table
        self._service: ViewService | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.syncs = 0
        self.last_sync_at: float | None = None

    def attach(self, service: ViewService) -> None:
        """Follow ``service`` (call on its loop); the writer starts at once."""
        self._service = service
        service.on_state_change(self.wake)
        self.table.set_listener(self.wake)
        self._task = asyncio.ensure_future(self._run())

    def wake(self) -> None:
        self._wake.set()

    def sync_now(self) -> SyncReport:
        service = self._service
        if service is None or not service.synced:
            return SyncReport()
        tenures = tenures_of(service)
        report = self.view.sync(tenures, self.table)
        self.syncs += 1
        self.last_sync_at = time.monotonic()
        if report.changed:
            serving = "; ".join(
                f"{t.group.model} {t.group.worker_set} generation {t.generation}: "
                f"{', '.join(f'{i:x}' for i in sorted(t.routable)) or 'none'}"
                for t in tenures
            )
            _log.info(
                "admitted view: %d withdrawn, %d written, %d removed; %d file(s) published; "
                "serving %s",
                len(report.withdrawn),
                len(report.written),
                len(report.removed),
                len(self.view.files),
                serving or "nothing",
            )
        return report

    async def _run(self) -> None:
        view = self.view
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=view.refresh_interval / 2)
            if self._wake.is_set():
                self._wake.clear()
                try:
                    self.sync_now()
                except Exception:  # a bad pass must not end the view; the next one retries
                    _log.warning("admitted view: a sync failed", exc_info=True)
                    self._wake.set()
            view.keep_alive()

    async def close(self) -> None:
        """Stop following the service and withdraw the view."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.table.set_listener(None)
        removed = self.view.clear()
        _log.info("admitted view withdrawn (%d file(s))", removed)


class ViewHook:
    """What a service factory needs to run the view: a source tap, the writer, its closer.

    ``files`` is the locked directory; with ``owns_files`` the hook releases it on close (the
    sidecar), otherwise its opener keeps it for the process's life (the route extension,
    whose service may be restarted).
    """

    def __init__(
        self,
        files: DirectoryFiles,
        boundary: BoundarySettings | None = None,
        *,
        owns_files: bool = True,
        refresh_interval: float = 2.0,
    ) -> None:
        self.files = files
        self._owns_files = owns_files
        self.table = RecordTable(boundary)
        self.view = AdmittedView(files, refresh_interval=refresh_interval)
        adopted = self.view.adopt_leftovers()
        if adopted:
            _log.info(
                "admitted view %s: %d file(s) from a previous writer, settled at the first sync",
                files.root,
                adopted,
            )
        foreign = files.foreign_files(self.view.files)
        if foreign:
            _log.warning(
                "admitted view %s holds %d record file(s) it did not write (e.g. %s/%s); they "
                "are left alone: is a worker registering into the view directory?",
                files.root,
                len(foreign),
                *foreign[0],
            )
        self.writer = ViewWriter(self.view, self.table)

    def tap(self, source: DiscoverySource) -> TappedSource:
        return TappedSource(source, self.table)

    def attach(self, service: ViewService) -> None:
        self.writer.attach(service)

    async def close(self) -> None:
        try:
            await self.writer.close()
        finally:
            if self._owns_files:
                self.files.release()
