"""The file bridge heals a bucket that lost its records, and passes on store changes at once."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest
from support.aio import eventually
from support.fakebucket import FakeBucket
from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge, bucket_key_for
from workerset_admission.adapters.dynamo.notify import open_notifier

A1 = "ns/backend/generate/a1"
B2 = "ns/backend/generate/b2"
KEY_A1 = "v1.mdc.ns.backend.generate.a1"
KEY_B2 = "v1.mdc.ns.backend.generate.b2"


def _write(root: Path, path: str, value: bytes) -> Path:
    target = root / "v1" / "mdc" / quote(path, safe="")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(value)
    return target


def _bridge(root: Path, bucket: FakeBucket, **options: float) -> DiscoveryBridge:
    # Every pass reads the mark; the contents only when a test asks for it.
    settings = {"check_interval": 0.0, "reconcile_interval": 3600.0, **options}
    return DiscoveryBridge(root, bucket, key_of=bucket_key_for, notify=False, **settings)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    _write(root, A1, b"card a1")
    _write(root, B2, b"card b2")
    return root


@pytest.mark.parametrize("recreate", [True, False], ids=["re-created empty", "gone"])
async def test_a_bucket_wiped_under_the_bridge_gets_every_record_back_at_the_next_pass(
    store: Path, recreate: bool
) -> None:
    bucket = FakeBucket()
    bridge = _bridge(store, bucket)
    await bridge.sync_once()

    bucket.wipe(recreate=recreate)
    await bridge.sync_once()

    assert bucket.data == {KEY_A1: b"card a1", KEY_B2: b"card b2"}
    assert bridge.stats.heals == 1
    assert bucket.readings == 1


async def test_a_heal_whose_reading_failed_is_tried_again_at_the_next_pass(store: Path) -> None:
    bucket = FakeBucket()
    bridge = _bridge(store, bucket)
    await bridge.sync_once()
    bucket.wipe()
    bucket.unreadable = True

    await bridge.sync_once()
    assert bucket.data == {}
    bucket.unreadable = False
    await bridge.sync_once()

    assert bucket.data == {KEY_A1: b"card a1", KEY_B2: b"card b2"}
    assert bridge.stats.heals == 1


async def test_a_key_deleted_behind_the_bridges_back_is_written_again_by_the_periodic_read(
    store: Path,
) -> None:
    bucket = FakeBucket()
    bridge = _bridge(store, bucket, reconcile_interval=0.0)
    await bridge.sync_once()

    bucket.lose(KEY_A1)
    await bridge.sync_once()

    assert bucket.data == {KEY_A1: b"card a1", KEY_B2: b"card b2"}
    assert bridge.stats.restored == 1
    assert bridge.stats.heals == 0


async def test_a_reconnect_to_a_bucket_that_kept_everything_writes_nothing(store: Path) -> None:
    bucket = FakeBucket()
    bridge = _bridge(store, bucket, check_interval=3600.0)
    await bridge.sync_once()
    written = len(bucket.writes)

    bucket.reconnect()
    bridge.wake()
    await bridge.sync_once()

    assert bridge.stats.heals == 1
    assert bucket.readings == 1
    assert len(bucket.writes) == written


async def test_a_failed_write_makes_the_next_pass_check_the_bucket_first(store: Path) -> None:
    bucket = FakeBucket()
    bridge = _bridge(store, bucket, check_interval=3600.0)
    await bridge.sync_once()
    bucket.wipe(recreate=False)
    _write(store, "ns/backend/generate/c3", b"card c3")

    await bridge.sync_once()  # the put fails: no stream answers
    assert bridge.stats.write_errors == 1
    await bridge.sync_once()

    assert set(bucket.data) == {KEY_A1, KEY_B2, "v1.mdc.ns.backend.generate.c3"}
    assert bridge.stats.heals == 1


async def test_healing_deletes_only_keys_this_bridge_owns(store: Path) -> None:
    foreign = "v1.mdc.other.backend.generate.ff"
    bucket = FakeBucket({foreign: b"theirs"}, owned=())
    bridge = _bridge(store, bucket, reconcile_interval=0.0)
    await bridge.sync_once()
    (store / "v1" / "mdc" / quote(B2, safe="")).unlink()

    bucket.reconnect()
    await bridge.sync_once()

    assert bucket.data == {KEY_A1: b"card a1", foreign: b"theirs"}


async def test_an_unreadable_bucket_is_warned_about_once_and_changes_nothing(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = FakeBucket()
    bridge = _bridge(store, bucket)
    await bridge.sync_once()
    bucket.broken = True

    with caplog.at_level(logging.DEBUG, logger="workerset_admission.adapters.dynamo.bridge"):
        for _ in range(3):
            await bridge.sync_once()

    cannot = [r for r in caplog.records if "cannot read the bucket" in r.getMessage()]
    assert [r.levelno for r in cannot] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert bridge.stats.check_errors == 3
    bucket.broken = False
    await bridge.sync_once()
    assert bucket.data == {KEY_A1: b"card a1", KEY_B2: b"card b2"}


async def test_a_removed_record_reaches_the_bucket_without_waiting_for_the_interval(
    store: Path,
) -> None:
    bucket = FakeBucket()
    # An interval far longer than the test: only a notification can start the second pass.
    bridge = DiscoveryBridge(store, bucket, interval=600.0, check_interval=600.0)
    stop = asyncio.Event()
    running = asyncio.create_task(bridge.run(stop))
    try:
        await eventually(lambda: KEY_B2 in bucket.data, "the first pass", 5)
        assert bridge.notifying
        (store / "v1" / "mdc" / quote(B2, safe="")).unlink()
        await eventually(lambda: KEY_B2 not in bucket.data, "the removal", 5)
        _write(store, "ns/backend/generate/c3", b"card c3")
        await eventually(
            lambda: "v1.mdc.ns.backend.generate.c3" in bucket.data, "the new record", 5
        )
    finally:
        stop.set()
        await asyncio.wait_for(running, 5)
    assert bridge.stats.notified_passes >= 2


async def test_the_notifier_watches_bucket_folders_created_after_it_started(
    tmp_path: Path,
) -> None:
    changed = asyncio.Event()
    notifier = open_notifier(tmp_path, changed)
    assert notifier is not None
    try:
        (tmp_path / "v1").mkdir()
        await asyncio.wait_for(changed.wait(), 5)
        changed.clear()
        (tmp_path / "v1" / "mdc").mkdir()
        await asyncio.wait_for(changed.wait(), 5)
        changed.clear()
        assert {tmp_path, tmp_path / "v1", tmp_path / "v1" / "mdc"} == notifier.watched
        _write(tmp_path, A1, b"card")
        await asyncio.wait_for(changed.wait(), 5)
        changed.clear()
        # Dynamo's staging files are not records; the link it makes from one is.
        (tmp_path / "v1" / "mdc" / ".tmp_0123456789abcdef").write_bytes(b"staged")
        await asyncio.sleep(0.2)
        assert not changed.is_set()
    finally:
        notifier.close()
        notifier.close()


async def test_a_store_root_that_comes_back_is_watched_again_once_rearmed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _write(root, A1, b"card")
    changed = asyncio.Event()
    notifier = open_notifier(root, changed)
    assert notifier is not None
    try:
        # Gone and made again (a volume remounted): the old watches went with the old folders.
        shutil.rmtree(root)
        await asyncio.wait_for(changed.wait(), 5)
        _write(root, A1, b"card")
        notifier.rearm()
        changed.clear()
        (root / "v1" / "mdc" / quote(A1, safe="")).unlink()
        await asyncio.wait_for(changed.wait(), 5)
    finally:
        notifier.close()
