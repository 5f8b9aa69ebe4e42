"""The file-discovery bridge: puts, removals, expiry, pruning and retries, against a fake bucket."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import quote

import pytest
from support.fakebucket import FakeBucket
from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge, bucket_key_for, plan_sync
from workerset_admission.adapters.dynamo.filestore import FileRecord, FileStoreScan
from workerset_admission.errors import ConfigError
from workerset_admission.ownership import WRITER_HEADER, WriterId, bridge_writer, register_writer

NOW = 1_000_000.0


def _key(record: FileRecord) -> str:
    return f"{record.kind}:{record.path}"


class _Store:
    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, kind: str, path: str, value: bytes, *, age: float = 0.0) -> None:
        target = self.root / "v1" / kind / quote(path, safe="")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(value)
        os.utime(target, (NOW - age, NOW - age))

    def remove(self, kind: str, path: str) -> None:
        (self.root / "v1" / kind / quote(path, safe="")).unlink()


@pytest.fixture
def store(tmp_path: Path) -> _Store:
    return _Store(tmp_path)


def _bridge(store: _Store, bucket: FakeBucket, *, prune: bool = True) -> DiscoveryBridge:
    return DiscoveryBridge(store.root, bucket, clock=lambda: NOW, key_of=_key, prune=prune)


async def test_new_records_are_put_once_and_refreshes_write_nothing(store: _Store) -> None:
    bucket = FakeBucket()
    bridge = _bridge(store, bucket)
    store.write("mdc", "ns/backend/generate/a1", b"card")
    store.write("instances", "ns/backend/generate/a1", b"endpoint")

    await bridge.sync_once()
    store.write("mdc", "ns/backend/generate/a1", b"card", age=1.0)  # the owner's mtime refresh
    await bridge.sync_once()

    assert bucket.data == {
        "instances:ns/backend/generate/a1": b"endpoint",
        "mdc:ns/backend/generate/a1": b"card",
    }
    assert len(bucket.log) == 2
    assert bridge.stats.puts == 2


async def test_records_new_in_one_pass_are_put_in_the_order_they_were_written(
    store: _Store,
) -> None:
    bucket = FakeBucket()
    bridge = _bridge(store, bucket)
    store.write("mdc", "ns/backend/generate/ff", b"first card", age=0.5)
    store.write("mdc", "ns/backend/generate/11", b"second card", age=0.2)
    store.write("mdc", "ns/backend/generate/aa", b"third card", age=0.2)

    await bridge.sync_once()

    assert bucket.log == [
        ("put", "mdc:ns/backend/generate/ff"),
        ("put", "mdc:ns/backend/generate/11"),
        ("put", "mdc:ns/backend/generate/aa"),
    ]


async def test_a_changed_value_is_put_again(store: _Store) -> None:
    bucket = FakeBucket()
    bridge = _bridge(store, bucket)
    store.write("mdc", "ns/backend/generate/a1", b"card")
    await bridge.sync_once()

    store.write("mdc", "ns/backend/generate/a1", b"tainted card")
    await bridge.sync_once()

    assert bucket.data == {"mdc:ns/backend/generate/a1": b"tainted card"}
    assert bucket.log == [("put", "mdc:ns/backend/generate/a1")] * 2


async def test_a_removed_file_is_deleted_from_the_bucket(store: _Store) -> None:
    bucket = FakeBucket()
    bridge = _bridge(store, bucket)
    store.write("mdc", "ns/backend/generate/a1", b"card")
    store.write("mdc", "ns/backend/generate/a1/my-lora", b"lora")
    await bridge.sync_once()

    store.remove("mdc", "ns/backend/generate/a1/my-lora")
    await bridge.sync_once()

    assert bucket.data == {"mdc:ns/backend/generate/a1": b"card"}
    assert bridge.stats.removed == 1


async def test_a_record_its_owner_stopped_refreshing_expires_and_returns_when_refreshed(
    store: _Store,
) -> None:
    bucket = FakeBucket()
    bridge = _bridge(store, bucket)
    store.write("mdc", "ns/backend/generate/a1", b"card")
    await bridge.sync_once()

    store.write("mdc", "ns/backend/generate/a1", b"card", age=10.5)
    await bridge.sync_once()
    assert bucket.data == {}
    assert bridge.stats.expired == 1

    store.write("mdc", "ns/backend/generate/a1", b"card")
    await bridge.sync_once()
    assert bucket.data == {"mdc:ns/backend/generate/a1": b"card"}


async def test_an_already_stale_record_is_never_put(store: _Store) -> None:
    bucket = FakeBucket()
    store.write("mdc", "ns/backend/generate/a1", b"card", age=60)

    await _bridge(store, bucket).sync_once()

    assert bucket.log == []


async def test_start_prunes_keys_the_store_no_longer_holds(store: _Store) -> None:
    bucket = FakeBucket(
        {"mdc:ns/backend/generate/gone": b"old", "mdc:ns/backend/generate/a1": b"x"}
    )
    store.write("mdc", "ns/backend/generate/a1", b"card")
    bridge = _bridge(store, bucket)

    await bridge.sync_once()

    assert bucket.data == {"mdc:ns/backend/generate/a1": b"card"}
    assert bridge.stats.pruned == 1


async def test_without_pruning_foreign_keys_are_left_alone(store: _Store) -> None:
    bucket = FakeBucket({"mdc:other/writer/generate/b2": b"theirs"}, owned=())
    store.write("mdc", "ns/backend/generate/a1", b"card")

    await _bridge(store, bucket, prune=False).sync_once()

    assert bucket.data["mdc:other/writer/generate/b2"] == b"theirs"


def test_a_departed_workers_instance_records_go_first_then_its_card_then_the_rest() -> None:
    # What a frontend routes by goes first; the card (its membership) next; events last.
    gone = [
        "v1.event_channels.ns.backend.generate.kv-events.1f",
        "v1.mdc.ns.backend.generate.ab12",
        "v1.event_sources.ns.backend.generate.kv-events.1f",
        "v1.instances.ns.backend.worker_kv_query_source_1f.ab12",
        "v1.instances.ns.backend.generate.ab12",
    ]

    plan = plan_sync(
        dict.fromkeys(gone, b"x"),
        FileStoreScan(records=(), skipped=()),
        now=NOW,
        ttl=10.0,
        key_of=bucket_key_for,
    )

    assert [key for key, _ in plan.deletes] == [
        "v1.instances.ns.backend.generate.ab12",
        "v1.instances.ns.backend.worker_kv_query_source_1f.ab12",
        "v1.mdc.ns.backend.generate.ab12",
        "v1.event_sources.ns.backend.generate.kv-events.1f",
        "v1.event_channels.ns.backend.generate.kv-events.1f",
    ]


async def test_one_pass_hands_all_its_changes_to_the_bucket_in_one_write(store: _Store) -> None:
    # Sent together, a departed worker's records all reach the bucket within one round trip.
    bucket = FakeBucket()
    bridge = DiscoveryBridge(store.root, bucket, clock=lambda: NOW)
    for kind in ("mdc", "instances"):
        store.write(kind, "ns/backend/generate/a1", b"leaving")
    await bridge.sync_once()

    store.write("mdc", "ns/backend/generate/b2", b"arriving")
    for kind in ("mdc", "instances"):
        store.remove(kind, "ns/backend/generate/a1")
    await bridge.sync_once()

    assert bucket.batches == [2, 3]
    # Puts first (a replacement joins before its predecessor leaves), then the deletes,
    # the instance record (what a frontend routes by) before the card.
    assert bucket.log[2:] == [
        ("put", "v1.mdc.ns.backend.generate.b2"),
        ("delete", "v1.instances.ns.backend.generate.a1"),
        ("delete", "v1.mdc.ns.backend.generate.a1"),
    ]


async def test_a_failed_write_in_a_pass_leaves_the_others_written_and_is_retried_alone(
    store: _Store,
) -> None:
    bucket = FakeBucket(failing={"mdc:ns/backend/generate/a1"})
    bridge = _bridge(store, bucket)
    store.write("mdc", "ns/backend/generate/a1", b"card")
    store.write("instances", "ns/backend/generate/a1", b"endpoint")

    await bridge.sync_once()
    assert bucket.data == {"instances:ns/backend/generate/a1": b"endpoint"}

    bucket.failing.clear()
    await bridge.sync_once()
    assert bucket.batches == [2, 1]
    assert bucket.data["mdc:ns/backend/generate/a1"] == b"card"
    assert bridge.stats.write_errors == 1


async def test_a_failed_write_is_retried_on_the_next_pass(store: _Store) -> None:
    bucket = FakeBucket(failing={"mdc:ns/backend/generate/a1"})
    bridge = _bridge(store, bucket)
    store.write("mdc", "ns/backend/generate/a1", b"card")

    await bridge.sync_once()
    assert bucket.data == {}
    assert bridge.stats.write_errors == 1

    bucket.failing.clear()
    await bridge.sync_once()
    assert bucket.data == {"mdc:ns/backend/generate/a1": b"card"}


async def test_files_that_name_no_record_are_reported_once_and_skipped(store: _Store) -> None:
    bucket = FakeBucket()
    bridge = _bridge(store, bucket)
    store.write("mdc", "ns/backend/generate", b"three parts")

    await bridge.sync_once()
    await bridge.sync_once()

    assert bucket.log == []
    assert bridge.stats.skipped_files == {"v1/mdc/ns%2Fbackend%2Fgenerate": "bad_path_shape"}


def test_bucket_keys_follow_the_design_wire_format() -> None:
    def record(kind: str, ns: str, suffix: str | None) -> FileRecord:
        return FileRecord(kind, "", ns, "backend", "generate", 0xAB12, suffix, b"", 0.0)  # type: ignore[arg-type]

    assert bucket_key_for(record("mdc", "ns-1", None)) == "v1.mdc.ns-1.backend.generate.ab12"
    assert bucket_key_for(record("instances", "a.b", None)) == (
        "v1.instances.a=2Eb.backend.generate.ab12"
    )
    assert bucket_key_for(record("mdc", "ns", "my lora/ü")) == (
        "v1.mdc.ns.backend.generate.ab12.my=20lora=2F=C3=BC"
    )


async def test_a_key_that_keeps_failing_is_warned_about_once(
    store: _Store, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = FakeBucket(failing={"mdc:ns/backend/generate/a1"})
    bridge = _bridge(store, bucket)
    store.write("mdc", "ns/backend/generate/a1", b"card")

    with caplog.at_level(logging.DEBUG, logger="workerset_admission.adapters.dynamo.bridge"):
        for _ in range(3):
            await bridge.sync_once()

    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert bridge.stats.write_errors == 3


@pytest.mark.parametrize("shape", ["missing", "a file"])
async def test_a_store_root_that_is_not_a_readable_directory_is_refused_before_any_write(
    tmp_path: Path, shape: str
) -> None:
    root = tmp_path / "store"
    if shape == "a file":
        root.write_text("not a directory")
    bucket = FakeBucket({"mdc:ns/backend/generate/a1": b"mine"})
    with pytest.raises(ConfigError, match="file store"):
        await DiscoveryBridge(root, bucket, clock=lambda: NOW, key_of=_key).sync_once()
    assert bucket.log == []
    assert bucket.data == {"mdc:ns/backend/generate/a1": b"mine"}


async def test_a_store_root_that_vanishes_while_running_pauses_the_bridge(
    store: _Store, caplog: pytest.LogCaptureFixture
) -> None:
    store.write("mdc", "ns/backend/generate/a1", b"card")
    bucket = FakeBucket()
    bridge = _bridge(store, bucket)
    await bridge.sync_once()
    moved = store.root.with_name("moved")
    store.root.rename(moved)
    for _ in range(3):
        plan = await bridge.sync_once()
        assert (plan.puts, plan.deletes) == ((), ())
    assert bucket.data == {"mdc:ns/backend/generate/a1": b"card"}
    assert caplog.text.count("pauses") == 1
    moved.rename(store.root)
    store.remove("mdc", "ns/backend/generate/a1")
    await bridge.sync_once()
    assert bucket.data == {}


def test_a_writer_owns_exactly_the_records_stamped_with_its_token() -> None:
    bridge = bridge_writer(Path("/srv/dynamo"), "edge-1")
    assert bridge.token == "bridge:edge-1"
    assert bridge.owns(bridge.headers())
    assert not bridge.owns({WRITER_HEADER: "bridge:edge-2"})
    assert not bridge.owns({WRITER_HEADER: register_writer("ns/c/e/1").token})
    assert not bridge.owns(None)
    assert WriterId.parse(bridge.token) == bridge
    assert WriterId.parse("no separator") is None
    assert bridge_writer(Path("/srv/dynamo")) == bridge_writer(Path("/srv/dynamo"))
    with pytest.raises(ConfigError):
        WriterId("bridge", "line\nbreak")
