"""Read Dynamo 1.6.1's file discovery store (``--discovery-backend file``, ``DYN_FILE_KV``).

The store is a directory per bucket (``v1/instances``, ``v1/mdc``, ``v1/event_sources``,
``v1/event_channels``); each record is one file whose name is the discovery path percent-encoded
(every byte outside ``[A-Za-z0-9]`` becomes ``%XX``): ``<ns>/<component>/<endpoint>/<id hex>``
(plus ``/<suffix>`` for a LoRA card) for endpoints and models, and
``namespace/<ns>[/component/<c>[/endpoint/<e>]]/topic/<topic>/<publisher id hex>`` for events.
Its owner refreshes the file's mtime about every third of the TTL, and a file older than the
TTL counts as gone. This module only reads:
it turns a directory listing into (kind, path, bytes, mtime) rows and never writes the store.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from workerset_admission.card.events import (
    EVENT_BUCKETS,
    EventBucket,
    EventKey,
    parse_dynamo_event_path,
)
from workerset_admission.discovery_paths import RECORD_KINDS, RecordKind, parse_record_path
from workerset_admission.errors import InvalidRecordError

__all__ = [
    "DEFAULT_FILE_TTL",
    "DEFAULT_MAX_FILE_SIZE",
    "FileRecord",
    "FileStoreReader",
    "FileStoreScan",
    "RecordKind",
    "SkippedFile",
    "default_store_root",
    "parse_record_path",
    "scan_file_store",
]

# Dynamo's FileStore lease: owners refresh every max(ttl/3, 1 s); readers treat older files as dead.
DEFAULT_FILE_TTL = 10.0

# The bucket's default value limit; Dynamo's records are a few kilobytes.
DEFAULT_MAX_FILE_SIZE = 1 << 20
# Dynamo stages a revision-0 insert as ``.tmp_<16 hex>`` and hard-links it into place.
_TEMP_PREFIX = ".tmp_"


def default_store_root(environ: Mapping[str, str] | None = None) -> Path:
    """Where Dynamo keeps the store: ``$DYN_FILE_KV``, else ``$TMPDIR/dynamo_store_kv``."""
    env = os.environ if environ is None else environ
    configured = env.get("DYN_FILE_KV")
    if configured:
        return Path(configured)
    return Path(env.get("TMPDIR") or tempfile.gettempdir()) / "dynamo_store_kv"


@dataclass(frozen=True, slots=True)
class FileRecord:
    """One live-looking record file: its decoded discovery path, raw value and last refresh.

    An event record's scope and publisher id are in ``event`` (and, flattened, in the endpoint
    fields, with an empty string for a level the scope does not have).
    """

    kind: RecordKind
    path: str
    namespace: str
    component: str
    endpoint: str
    instance_id: int
    model_suffix: str | None
    value: bytes
    mtime: float
    event: EventKey | None = None


@dataclass(frozen=True, slots=True)
class SkippedFile:
    """A file in a bucket directory that is not a record we can name (kept for reporting)."""

    kind: RecordKind
    file_name: str
    reason: str


@dataclass(frozen=True, slots=True)
class FileStoreScan:
    """Everything one pass over the store saw."""

    records: tuple[FileRecord, ...]
    skipped: tuple[SkippedFile, ...]


def _describe(
    kind: RecordKind, name: str, file_path: str, stat: os.stat_result, max_size: int
) -> FileRecord | SkippedFile:
    if stat.st_size > max_size:
        # Never read it: a value the bucket cannot hold is refused before it costs memory.
        return SkippedFile(kind, name, "value_too_large")
    try:
        path = unquote(name, errors="strict")
    except UnicodeDecodeError:
        return SkippedFile(kind, name, "bad_file_name")
    if kind in EVENT_BUCKETS:
        return _describe_event(kind, name, path, file_path, stat)
    parsed = parse_record_path(kind, path)
    if isinstance(parsed, str):
        return SkippedFile(kind, name, parsed)
    namespace, component, endpoint, instance_id, suffix = parsed
    return FileRecord(
        kind=kind,
        path=path,
        namespace=namespace,
        component=component,
        endpoint=endpoint,
        instance_id=instance_id,
        model_suffix=suffix,
        value=Path(file_path).read_bytes(),
        mtime=stat.st_mtime,
    )


def _describe_event(
    kind: RecordKind, name: str, path: str, file_path: str, stat: os.stat_result
) -> FileRecord | SkippedFile:
    bucket: EventBucket = "event_sources" if kind == "event_sources" else "event_channels"
    try:
        event = parse_dynamo_event_path(bucket, path)
    except InvalidRecordError:
        return SkippedFile(kind, name, "bad_path_shape")
    return FileRecord(
        kind=kind,
        path=path,
        namespace=event.namespace,
        component=event.component or "",
        endpoint=event.endpoint or "",
        instance_id=event.publisher_id,
        model_suffix=None,
        value=Path(file_path).read_bytes(),
        mtime=stat.st_mtime,
        event=event,
    )


_Signature = tuple[int, int, int]


class FileStoreReader:
    """Scan a store repeatedly, reading a file again only when its stat changed.

    Every write changes a file's mtime, so (inode, size, mtime) unchanged means the bytes are
    too; an owner's refresh changes the mtime and costs one read every few seconds. (Two
    same-size writes inside one timestamp tick look alike; the owner's next refresh, a third
    of the TTL later, makes the file read again.)
    """

    def __init__(self, max_size: int = DEFAULT_MAX_FILE_SIZE) -> None:
        self._max_size = max_size
        self._seen: dict[tuple[RecordKind, str], tuple[_Signature, FileRecord | SkippedFile]] = {}

    def known(self, kind: RecordKind, name: str) -> FileRecord | None:
        """Return the record the last scan read from file ``name`` of bucket ``kind``, if any."""
        seen = self._seen.get((kind, name))
        return seen[1] if seen is not None and isinstance(seen[1], FileRecord) else None

    def scan(self, root: Path) -> FileStoreScan:
        """List every record file under ``root`` (blocking; run it off the event loop)."""
        seen: dict[tuple[RecordKind, str], tuple[_Signature, FileRecord | SkippedFile]] = {}
        for kind in RECORD_KINDS:
            try:
                listing = list(os.scandir(root / "v1" / kind))
            except FileNotFoundError:
                continue
            for item in listing:
                if item.name.startswith(_TEMP_PREFIX):
                    continue
                try:
                    if not item.is_file():
                        continue
                    # Stat before reading: a write in between leaves a stale signature, and the
                    # next pass reads the file again.
                    stat = item.stat()
                    signature = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
                    cached = self._seen.get((kind, item.name))
                    if cached is not None and cached[0] == signature:
                        found = cached[1]
                    else:
                        found = _describe(kind, item.name, item.path, stat, self._max_size)
                except (FileNotFoundError, IsADirectoryError):
                    # Removed or replaced between the listing and the read: the next pass sees
                    # the truth.
                    continue
                seen[(kind, item.name)] = (signature, found)
        self._seen = seen
        found_all = [entry for _signature, entry in seen.values()]
        records = sorted(
            (e for e in found_all if isinstance(e, FileRecord)), key=lambda r: (r.kind, r.path)
        )
        skipped = [e for e in found_all if isinstance(e, SkippedFile)]
        return FileStoreScan(tuple(records), tuple(skipped))


def scan_file_store(root: Path) -> FileStoreScan:
    """List every record file under ``root`` once (blocking; run it off the event loop)."""
    return FileStoreReader().scan(root)
