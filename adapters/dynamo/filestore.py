"""Read Dynamo 1.6.1's file discovery store (``--discovery-backend file``, ``DYN_FILE_KV``).

The store is a directory per bucket (``v1/instances``, ``v1/mdc``); each record is one file whose
name is the discovery path ``<ns>/<component>/<endpoint>/<id hex>[/<suffix>]`` percent-encoded
(every byte outside ``[A-Za-z0-9]`` becomes ``%XX``). Its owner refreshes the file's mtime about
every third of the TTL, and a file older than the TTL counts as gone. This module only reads:
it turns a directory listing into (kind, path, bytes, mtime) rows and never writes the store.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote

__all__ = [
    "DEFAULT_FILE_TTL",
    "FileRecord",
    "FileStoreScan",
    "RecordKind",
    "SkippedFile",
    "default_store_root",
    "scan_file_store",
]

RecordKind = Literal["mdc", "instances"]

# Dynamo's FileStore lease: owners refresh every max(ttl/3, 1 s); readers treat older files as dead.
DEFAULT_FILE_TTL = 10.0

_KINDS: tuple[RecordKind, ...] = ("instances", "mdc")
_HEX_ID = re.compile(r"0|[1-9a-f][0-9a-f]{0,15}")
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
    """One live-looking record file: its decoded discovery path, raw value and last refresh."""

    kind: RecordKind
    path: str
    namespace: str
    component: str
    endpoint: str
    instance_id: int
    model_suffix: str | None
    value: bytes
    mtime: float


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


def _parse_path(kind: RecordKind, path: str) -> tuple[str, str, str, int, str | None] | str:
    """Split a discovery path; return the parts, or a reason token when it is not one."""
    parts = path.split("/")
    allowed = (4,) if kind == "instances" else (4, 5)
    if len(parts) not in allowed:
        return "bad_path_shape"
    if any(part == "" for part in parts):
        return "empty_path_segment"
    namespace, component, endpoint, id_hex = parts[:4]
    # Dynamo prints ids as lowercase hex without padding and parses them back the same way.
    if not _HEX_ID.fullmatch(id_hex):
        return "bad_instance_id"
    suffix = parts[4] if len(parts) == 5 else None
    return namespace, component, endpoint, int(id_hex, 16), suffix


def _scan_bucket(root: Path, kind: RecordKind) -> tuple[list[FileRecord], list[SkippedFile]]:
    records: list[FileRecord] = []
    skipped: list[SkippedFile] = []
    directory = root / "v1" / kind
    try:
        listing = list(os.scandir(directory))
    except FileNotFoundError:
        return records, skipped
    for item in listing:
        if item.name.startswith(_TEMP_PREFIX):
            continue
        try:
            if not item.is_file():
                continue
            stat = item.stat()
            value = Path(item.path).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            # Removed or replaced between the listing and the read: the next pass sees the truth.
            continue
        try:
            path = unquote(item.name, errors="strict")
        except UnicodeDecodeError:
            skipped.append(SkippedFile(kind, item.name, "bad_file_name"))
            continue
        parsed = _parse_path(kind, path)
        if isinstance(parsed, str):
            skipped.append(SkippedFile(kind, item.name, parsed))
            continue
        namespace, component, endpoint, instance_id, suffix = parsed
        records.append(
            FileRecord(
                kind=kind,
                path=path,
                namespace=namespace,
                component=component,
                endpoint=endpoint,
                instance_id=instance_id,
                model_suffix=suffix,
                value=value,
                mtime=stat.st_mtime,
            )
        )
    return records, skipped


def scan_file_store(root: Path) -> FileStoreScan:
    """List every record file under ``root`` (blocking; run it off the event loop)."""
    records: list[FileRecord] = []
    skipped: list[SkippedFile] = []
    for kind in _KINDS:
        found, refused = _scan_bucket(root, kind)
        records.extend(found)
        skipped.extend(refused)
    records.sort(key=lambda record: (record.kind, record.path))
    return FileStoreScan(tuple(records), tuple(skipped))
