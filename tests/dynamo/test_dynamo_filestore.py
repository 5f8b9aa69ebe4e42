"""Reading Dynamo's file discovery store: names, kinds, refusals."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from workerset_admission.adapters.dynamo.filestore import (
    FileStoreReader,
    default_store_root,
    scan_file_store,
)


def _write(root: Path, kind: str, path: str, value: bytes, *, mtime: float | None = None) -> Path:
    # Dynamo percent-encodes every byte outside [A-Za-z0-9], '-' and '_' included.
    name = quote(path, safe="").replace("-", "%2D").replace("_", "%5F")
    target = root / "v1" / kind / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(value)
    if mtime is not None:
        os.utime(target, (mtime, mtime))
    return target


def test_model_and_endpoint_files_decode_to_discovery_paths(tmp_path: Path) -> None:
    _write(tmp_path, "mdc", "ns-1/backend/generate/56a1c7c4a5635d4c", b'{"type":"Model"}')
    _write(tmp_path, "mdc", "ns-1/backend/generate/56a1c7c4a5635d4c/my-lora", b"lora")
    _write(tmp_path, "instances", "ns-1/backend/generate/56a1c7c4a5635d4c", b"ep")

    scan = scan_file_store(tmp_path)

    assert [(r.kind, r.path) for r in scan.records] == [
        ("instances", "ns-1/backend/generate/56a1c7c4a5635d4c"),
        ("mdc", "ns-1/backend/generate/56a1c7c4a5635d4c"),
        ("mdc", "ns-1/backend/generate/56a1c7c4a5635d4c/my-lora"),
    ]
    base = scan.records[1]
    assert (base.namespace, base.component, base.endpoint) == ("ns-1", "backend", "generate")
    assert base.instance_id == 0x56A1C7C4A5635D4C
    assert base.model_suffix is None
    assert base.value == b'{"type":"Model"}'
    assert scan.records[2].model_suffix == "my-lora"
    assert scan.skipped == ()


def test_staging_files_are_ignored_and_bad_names_are_reported_not_raised(tmp_path: Path) -> None:
    _write(tmp_path, "mdc", "ns/backend/generate/abc", b"ok")
    (tmp_path / "v1" / "mdc" / ".tmp_0123456789abcdef").write_bytes(b"half written")
    _write(tmp_path, "mdc", "ns/backend/generate", b"three parts")
    _write(tmp_path, "mdc", "ns/backend/generate/XYZ", b"not hex")
    _write(tmp_path, "mdc", "ns/backend/generate/00ab", b"padded hex")
    _write(tmp_path, "instances", "ns/backend/generate/abc/lora", b"suffix on an endpoint")
    _write(tmp_path, "mdc", "ns//generate/abc", b"empty segment")
    (tmp_path / "v1" / "mdc" / "%FF%FE").write_bytes(b"not utf-8")

    scan = scan_file_store(tmp_path)

    assert [r.path for r in scan.records] == ["ns/backend/generate/abc"]
    assert sorted((s.kind, s.reason) for s in scan.skipped) == [
        ("instances", "bad_path_shape"),
        ("mdc", "bad_file_name"),
        ("mdc", "bad_instance_id"),
        ("mdc", "bad_instance_id"),
        ("mdc", "bad_path_shape"),
        ("mdc", "empty_path_segment"),
    ]


def test_a_missing_store_is_an_empty_scan(tmp_path: Path) -> None:
    scan = scan_file_store(tmp_path / "absent")
    assert scan.records == ()
    assert scan.skipped == ()


def test_store_root_follows_dynamo_environment() -> None:
    assert default_store_root({"DYN_FILE_KV": "/srv/kv"}) == Path("/srv/kv")
    assert default_store_root({"TMPDIR": "/scratch"}) == Path("/scratch/dynamo_store_kv")


def test_a_reader_sees_a_rewrite_of_the_same_size_once_the_mtime_moves(tmp_path: Path) -> None:
    target = _write(tmp_path, "mdc", "ns/backend/generate/abc", b"aaaa", mtime=1000.0)
    reader = FileStoreReader()
    assert [r.value for r in reader.scan(tmp_path).records] == [b"aaaa"]
    assert [r.value for r in reader.scan(tmp_path).records] == [b"aaaa"]

    target.write_bytes(b"bbbb")
    os.utime(target, (1001.0, 1001.0))

    assert [r.value for r in reader.scan(tmp_path).records] == [b"bbbb"]
    target.unlink()
    assert reader.scan(tmp_path).records == ()


def test_a_file_larger_than_the_limit_is_reported_without_being_read(tmp_path: Path) -> None:
    _write(tmp_path, "mdc", "ns/backend/generate/abc", b"x" * 65)
    _write(tmp_path, "mdc", "ns/backend/generate/abd", b"x" * 64)

    scan = FileStoreReader(max_size=64).scan(tmp_path)

    assert [r.path for r in scan.records] == ["ns/backend/generate/abd"]
    assert [s.reason for s in scan.skipped] == ["value_too_large"]
