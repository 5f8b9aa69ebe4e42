"""The bridge's one shortcut: removals inotify reports are deleted before the pass confirms them.

:meth:`DiscoveryBridge.withdraw_removed` must delete exactly what the next pass would, and
nothing it would keep. The differential test drives two bridges over one store through the same
random changes: one only runs passes, the other withdraws the removed files first, then runs
its pass. After every step both buckets hold the same records, and nothing the shortcut
deleted is in the plain bridge's bucket.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from urllib.parse import quote

import pytest
from support.aio import eventually
from support.fakebucket import FakeBucket
from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge
from workerset_admission.adapters.dynamo.notify import open_notifier
from workerset_admission.discovery_paths import RecordKind

KINDS: tuple[RecordKind, ...] = ("instances", "mdc")


def _name(path: str) -> str:
    return quote(path, safe="")


def _file(root: Path, kind: RecordKind, path: str) -> Path:
    return root / "v1" / kind / _name(path)


def _bridge(root: Path, bucket: FakeBucket) -> DiscoveryBridge:
    return DiscoveryBridge(root, bucket, notify=False, check_interval=3600.0)


def _step(rng: random.Random, root: Path) -> set[tuple[RecordKind, str]]:
    """Change the store a little; return the files removed (as inotify would name them)."""
    removed: set[tuple[RecordKind, str]] = set()
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(KINDS)
        path = f"ns/backend/generate/{rng.randint(1, 6):x}"
        target = _file(root, kind, path)
        action = rng.random()
        if action < 0.45:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f"record {rng.random()}".encode())
        elif target.exists():
            target.unlink()
            removed.add((kind, _name(path)))
            if action > 0.85:  # removed and written again before anyone looked
                target.write_bytes(b"back again")
        else:
            # Inotify reports what is gone; a name it never read must change nothing.
            removed.add((kind, _name(path)))
    return removed


@pytest.mark.parametrize("seed", range(12))
async def test_withdrawing_removed_files_first_leaves_the_bucket_a_plain_pass_leaves(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    root = tmp_path / "store"
    (root / "v1").mkdir(parents=True)
    plain, fast = FakeBucket(), FakeBucket()
    plain_bridge, fast_bridge = _bridge(root, plain), _bridge(root, fast)
    await plain_bridge.sync_once()
    await fast_bridge.sync_once()
    deleted_early = 0

    for _ in range(40):
        removed = _step(rng, root)
        before = dict(fast.data)
        deleted_early += await fast_bridge.withdraw_removed(removed)
        taken = set(before) - set(fast.data)
        await plain_bridge.sync_once()
        # Whatever the shortcut took, the plain pass took too.
        assert not taken & set(plain.data), taken & set(plain.data)
        await fast_bridge.sync_once()
        assert fast.data == plain.data

    assert deleted_early > 0, "the random changes never exercised the shortcut"
    assert fast_bridge.stats.removed_at_once == deleted_early


async def test_a_removed_file_is_withdrawn_before_any_pass_runs(tmp_path: Path) -> None:
    root = tmp_path / "store"
    for kind in KINDS:
        _file(root, kind, "ns/backend/generate/a1").parent.mkdir(parents=True, exist_ok=True)
        _file(root, kind, "ns/backend/generate/a1").write_bytes(b"leaving")
    bucket = FakeBucket()
    bridge = _bridge(root, bucket)
    await bridge.sync_once()
    for kind in KINDS:
        _file(root, kind, "ns/backend/generate/a1").unlink()

    deleted = await bridge.withdraw_removed(
        {(kind, _name("ns/backend/generate/a1")) for kind in KINDS}
    )

    assert deleted == 2
    assert bucket.data == {}
    # One write, the instance record (what a frontend routes by) before the card.
    assert bucket.batches[-1] == 2
    assert bucket.log[-2:] == [
        ("delete", "v1.instances.ns.backend.generate.a1"),
        ("delete", "v1.mdc.ns.backend.generate.a1"),
    ]


async def test_the_notifier_names_the_record_files_removed_and_only_those(tmp_path: Path) -> None:
    root = tmp_path / "store"
    for kind in KINDS:
        (root / "v1" / kind).mkdir(parents=True)
    kept = _file(root, "mdc", "ns/backend/generate/b2")
    kept.write_bytes(b"stays")
    leaving = _file(root, "instances", "ns/backend/generate/a1")
    leaving.write_bytes(b"goes")
    changed = asyncio.Event()
    notifier = open_notifier(root, changed)
    assert notifier is not None, "inotify is available on Linux"
    try:
        leaving.unlink()
        # Dynamo's staging files are not records, removed or not.
        staged = root / "v1" / "mdc" / ".tmp_staged"
        staged.write_bytes(b"x")
        os.replace(staged, kept)
        await eventually(changed.is_set, "the notification", 5)
        await asyncio.sleep(0.05)  # every event of the burst is read
        assert notifier.take_removed() == {("instances", _name("ns/backend/generate/a1"))}
        assert notifier.take_removed() == set()
    finally:
        notifier.close()


async def test_a_running_bridge_withdraws_a_removed_record_through_the_shortcut(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    target = _file(root, "mdc", "ns/backend/generate/a1")
    target.parent.mkdir(parents=True)
    target.write_bytes(b"card")
    bucket = FakeBucket()
    # Passes far apart: only the notification can act in time.
    bridge = DiscoveryBridge(root, bucket, interval=600.0, check_interval=600.0)
    stop = asyncio.Event()
    running = asyncio.create_task(bridge.run(stop))
    try:
        await eventually(lambda: bool(bucket.data), "the first pass", 5)
        target.unlink()
        await eventually(lambda: not bucket.data, "the removal", 5)
    finally:
        stop.set()
        await asyncio.wait_for(running, 5)
    assert bridge.stats.removed_at_once == 1
