"""The etcd bridge's list-then-watch logic, against a hand-written etcd and bucket."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from support.fakebucket import FakeBucket
from workerset_admission.adapters.etcd import bridge as bridge_module
from workerset_admission.adapters.etcd.bridge import (
    EtcdDiscoveryBridge,
    StoreChange,
    StoreEntry,
    StoreListing,
    bucket_key_for_etcd,
)
from workerset_admission.errors import InvalidRecordError, StoreCompacted, StoreUnavailable

MDC_A = "v1/mdc/ns/backend/generate/a"
MDC_B = "v1/mdc/ns/backend/generate/b"
INST_A = "v1/instances/ns/backend/generate/a"
KEY_A = "v1.mdc.ns.backend.generate.a"
KEY_B = "v1.mdc.ns.backend.generate.b"
KEY_INST_A = "v1.instances.ns.backend.generate.a"


class FakeEtcd:
    """An in-memory etcd: revisions, a change log, compaction and outages."""

    def __init__(self) -> None:
        self.revision = 1
        self.data: dict[str, tuple[bytes, int]] = {}
        self.log: list[StoreChange] = []
        self.compacted = 0
        self.down = False
        # Frozen: connections stay open, nothing answers, watches go silent.
        self.frozen = False
        self.resets = 0
        self._wakeup = asyncio.Event()

    def put(self, key: str, value: bytes) -> None:
        self.revision += 1
        created = self.data[key][1] if key in self.data else self.revision
        self.data[key] = (value, created)
        self.log.append(StoreChange(key, value, self.revision))
        self._wakeup.set()

    def delete(self, key: str) -> None:
        self.revision += 1
        del self.data[key]
        self.log.append(StoreChange(key, None, self.revision))
        self._wakeup.set()

    def revoke(self, *keys: str) -> None:
        """A lease ending: every one of its keys deleted in one revision."""
        self.revision += 1
        for key in keys:
            del self.data[key]
            self.log.append(StoreChange(key, None, self.revision))
        self._wakeup.set()

    def compact(self) -> None:
        self.compacted = self.revision

    def fail(self) -> None:
        self.down = True
        self._wakeup.set()

    async def list_prefix(self, prefix: str) -> StoreListing:
        if self.down or self.frozen:
            raise StoreUnavailable("etcd is down")
        entries = tuple(
            StoreEntry(key, value, created)
            for key, (value, created) in sorted(self.data.items())
            if key.startswith(prefix)
        )
        return StoreListing(self.revision, entries)

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[StoreChange]:
        if self.down:
            raise StoreUnavailable("etcd is down")
        if start_revision <= self.compacted:
            raise StoreCompacted(self.compacted)
        # By place in the log, not by revision: one revision may carry several events.
        position = 0
        while True:
            while position < len(self.log):
                change = self.log[position]
                position += 1
                if change.revision >= start_revision and change.key.startswith(prefix):
                    yield change
            self._wakeup.clear()
            await self._wakeup.wait()
            if self.down:
                raise StoreUnavailable("connection lost")

    async def probe(self) -> None:
        if self.down or self.frozen:
            raise StoreUnavailable("no answer")

    async def reset(self) -> None:
        self.resets += 1


async def _until(condition: object, seconds: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def _running(
    bridge: EtcdDiscoveryBridge,
) -> tuple[asyncio.Event, asyncio.Task[None]]:
    stop = asyncio.Event()
    task = asyncio.create_task(bridge.run(stop))
    await asyncio.wait_for(bridge.synced.wait(), 5)
    return stop, task


def test_etcd_keys_translate_to_the_bucket_keys_of_the_file_bridge() -> None:
    assert bucket_key_for_etcd(MDC_A) == KEY_A
    assert bucket_key_for_etcd("v1/mdc/n.s/b/g/1f/my-lora") == "v1.mdc.n=2Es.b.g.1f.my-lora"
    assert bucket_key_for_etcd(INST_A) == KEY_INST_A
    assert bucket_key_for_etcd("v1/kv_routers/x") is None
    source = "v1/event_sources/namespace/ns/component/backend/endpoint/generate/topic/kv-events/1f"
    assert bucket_key_for_etcd(source) == (
        "v1.event_sources.namespace.ns.component.backend.endpoint.generate.topic.kv-events.1f"
    )
    assert bucket_key_for_etcd("v1/event_channels/namespace/n%2Es/topic/kv_metrics/2a") == (
        "v1.event_channels.namespace.n=2Es.topic.kv_metrics.2a"
    )
    with pytest.raises(InvalidRecordError) as refused:
        bucket_key_for_etcd("v1/mdc/ns/backend/generate/NOT-HEX")
    assert refused.value.reason == "bad_instance_id"


async def test_a_listing_is_written_in_creation_order_and_the_watch_follows_it() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put(MDC_B, b"b")
    etcd.put(MDC_A, b"a")
    bridge = EtcdDiscoveryBridge(etcd, bucket)
    stop, task = await _running(bridge)

    assert [key for key, _ in bucket.writes] == [KEY_B, KEY_A]
    etcd.put(INST_A, b"inst")
    etcd.delete(MDC_B)
    await _until(lambda: bucket.data == {KEY_A: b"a", KEY_INST_A: b"inst"})
    assert bridge.revision == etcd.revision

    stop.set()
    await task


async def test_a_lease_ending_reaches_the_bucket_in_one_write_instance_records_first() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    for key in (MDC_A, INST_A, MDC_B):
        etcd.put(key, b"record")
    bridge = EtcdDiscoveryBridge(etcd, bucket)
    stop, task = await _running(bridge)
    writes_before = len(bucket.batches)

    # Etcd deletes every key of the lease in one revision, delivered in one watch response.
    etcd.revoke(MDC_A, INST_A)
    await _until(lambda: bucket.data == {KEY_B: b"record"})

    assert bucket.batches[writes_before:] == [2]
    assert bucket.log[-2:] == [("delete", KEY_INST_A), ("delete", KEY_A)]
    assert bridge.stats.deletes == 2
    assert bridge.revision == etcd.revision
    stop.set()
    await task


async def test_watch_events_applied_together_put_first_and_a_failed_one_alone_is_retried() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put(MDC_A, b"a")
    bridge = EtcdDiscoveryBridge(etcd, bucket, retry_interval=0.05)
    await bridge.resync()
    bucket.failing.add(KEY_INST_A)
    etcd.delete(MDC_A)
    etcd.put(MDC_B, b"b")
    etcd.put(INST_A, b"inst")

    await bridge.apply_all(etcd.log[-3:])

    assert bucket.batches[-1] == 3
    assert bucket.log[-2:] == [("put", KEY_B), ("delete", KEY_A)]
    assert bucket.data == {KEY_B: b"b"}
    assert bridge.stats.write_errors == 1
    bucket.failing.clear()
    stop = asyncio.Event()
    task = asyncio.create_task(bridge.run(stop))
    await _until(lambda: bucket.data.get(KEY_INST_A) == b"inst")
    stop.set()
    await task


async def test_a_restart_prunes_owned_keys_etcd_lost_and_never_another_writers_key() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put(MDC_A, b"a")
    bucket.data[KEY_B] = b"left by the previous run"
    bucket.owned.add(KEY_B)
    bucket.data["v1.mdc.other.backend.generate.c"] = b"another writer's"

    bridge = EtcdDiscoveryBridge(etcd, bucket)
    await bridge.resync()

    assert bucket.data == {KEY_A: b"a", "v1.mdc.other.backend.generate.c": b"another writer's"}
    assert bridge.stats.pruned == 1


async def test_without_pruning_a_restart_leaves_keys_it_did_not_write_this_run() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    bucket.data[KEY_B] = b"old"
    bucket.owned.add(KEY_B)

    await EtcdDiscoveryBridge(etcd, bucket, prune=False).resync()

    assert bucket.data == {KEY_B: b"old"}


async def test_a_watch_behind_a_compaction_lists_again_and_converges() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put(MDC_A, b"a")
    bridge = EtcdDiscoveryBridge(etcd, bucket)
    listing = await bridge.resync()
    # Changes the bridge never watched, then their history compacted away.
    etcd.put(MDC_B, b"b")
    etcd.delete(MDC_A)
    etcd.compact()
    watch = etcd.watch_prefix("v1/", listing.revision + 1)

    with pytest.raises(StoreCompacted):
        await watch.__anext__()
    bridge.synced.clear()
    stop, task = await _running(bridge)

    await _until(lambda: bucket.data == {KEY_B: b"b"})
    stop.set()
    await task


async def test_the_run_loop_relists_after_a_compaction_without_waiting() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put(MDC_A, b"a")
    etcd.put(MDC_A, b"a2")
    etcd.compact()
    real_list = etcd.list_prefix
    stale = StoreListing(2, (StoreEntry(MDC_A, b"a", 2),))
    calls = 0

    async def first_listing_is_stale(prefix: str) -> StoreListing:
        nonlocal calls
        calls += 1
        return stale if calls == 1 else await real_list(prefix)

    etcd.list_prefix = first_listing_is_stale  # type: ignore[method-assign]
    bridge = EtcdDiscoveryBridge(etcd, bucket, backoff=(30.0,))
    stop, task = await _running(bridge)

    await _until(lambda: bucket.data == {KEY_A: b"a2"}, seconds=2)
    assert bridge.stats.relists_after_compaction == 1
    stop.set()
    await task


async def test_nothing_is_deleted_while_etcd_cannot_be_read_and_a_resync_catches_up() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put(MDC_A, b"a")
    etcd.put(MDC_B, b"b")
    bridge = EtcdDiscoveryBridge(etcd, bucket, backoff=(0.05,))
    stop, task = await _running(bridge)

    etcd.fail()
    await _until(lambda: bridge.stats.store_errors >= 3)
    assert bucket.data == {KEY_A: b"a", KEY_B: b"b"}
    # While it was down, A's lease expired and B changed.
    etcd.down = False
    etcd.delete(MDC_A)
    etcd.put(MDC_B, b"b2")
    await _until(lambda: bucket.data == {KEY_B: b"b2"})
    assert etcd.resets >= 1

    stop.set()
    await task


async def test_a_failed_bucket_write_is_retried_until_it_lands() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    bridge = EtcdDiscoveryBridge(etcd, bucket, retry_interval=0.02)
    stop, task = await _running(bridge)

    bucket.broken = True
    etcd.put(MDC_A, b"a")
    await _until(lambda: bridge.stats.write_errors >= 1)
    bucket.broken = False
    await _until(lambda: bucket.data == {KEY_A: b"a"})

    stop.set()
    await task


async def test_a_key_that_is_not_a_record_is_reported_once_and_skipped() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put("v1/mdc/ns/only-two", b"x")
    etcd.put("v1/other_bucket/k", b"y")
    bridge = EtcdDiscoveryBridge(etcd, bucket)

    await bridge.resync()
    await bridge.resync()

    assert bucket.data == {}
    assert bridge.stats.skipped_keys == {"v1/mdc/ns/only-two": "bad_path_shape"}
    assert bridge.stats.ignored_keys == 2


async def test_an_unchanged_value_after_a_resync_is_not_written_again() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put(MDC_A, b"a")
    bridge = EtcdDiscoveryBridge(etcd, bucket)

    await bridge.resync()
    await bridge.resync()

    assert bucket.writes == [(KEY_A, b"a")]


async def test_a_store_that_hangs_without_closing_the_watch_is_noticed_by_the_probe() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put(MDC_A, b"a")
    bridge = EtcdDiscoveryBridge(etcd, bucket, probe_interval=0.05, backoff=(0.05,))
    stop, task = await _running(bridge)

    etcd.frozen = True
    await _until(lambda: bridge.stats.store_errors >= 1)
    assert bucket.data == {KEY_A: b"a"}
    # Thawed, with a change it never delivered on the old watch.
    etcd.frozen = False
    etcd.data.pop(MDC_A)
    etcd.put(MDC_B, b"b")
    await _until(lambda: bucket.data == {KEY_B: b"b"})

    stop.set()
    await task


async def test_a_wiped_bucket_gets_every_record_back_in_the_order_etcd_created_them() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put(MDC_B, b"b")
    etcd.put(MDC_A, b"a")
    bridge = EtcdDiscoveryBridge(etcd, bucket)
    await bridge.resync()
    etcd.put(INST_A, b"inst")
    await bridge.apply(etcd.log[-1])

    bucket.wipe()
    del bucket.writes[:]
    assert await bridge.heal_once() is not None

    assert [key for key, _ in bucket.writes] == [KEY_B, KEY_A, KEY_INST_A]
    assert bucket.data == {KEY_A: b"a", KEY_B: b"b", KEY_INST_A: b"inst"}
    assert bridge.stats.heals == 1


async def test_a_key_deleted_behind_the_etcd_bridges_back_is_written_again_when_read() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put(MDC_A, b"a")
    etcd.put(MDC_B, b"b")
    bridge = EtcdDiscoveryBridge(etcd, bucket)
    await bridge.resync()

    bucket.lose(KEY_A)
    assert await bridge.heal_once() is None
    assert KEY_A not in bucket.data  # the mark alone cannot tell one lost key
    await bridge.heal_once(reconcile=True)

    assert bucket.data == {KEY_A: b"a", KEY_B: b"b"}
    assert bridge.stats.restored == 1


async def test_a_running_etcd_bridge_heals_a_gone_bucket_when_woken() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put(MDC_A, b"a")
    bridge = EtcdDiscoveryBridge(etcd, bucket, check_interval=600.0)
    stop, task = await _running(bridge)

    bucket.wipe(recreate=False)
    bucket.reconnect()
    bridge.wake()
    await _until(lambda: bucket.data == {KEY_A: b"a"})

    stop.set()
    await task
    assert bridge.stats.heals == 1


async def test_an_etcd_bridge_heal_whose_reading_failed_is_tried_again() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put(MDC_A, b"a")
    bridge = EtcdDiscoveryBridge(etcd, bucket)
    await bridge.resync()
    bucket.wipe()
    bucket.unreadable = True

    assert await bridge.heal_once() is not None
    assert bucket.data == {}
    bucket.unreadable = False
    assert await bridge.heal_once() is None

    assert bucket.data == {KEY_A: b"a"}


async def test_the_lag_grows_while_etcd_cannot_be_read_and_the_loop_keeps_beating() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    etcd.put(MDC_A, b"a")
    bridge = EtcdDiscoveryBridge(etcd, bucket, backoff=(0.05,), probe_interval=0.05)
    stop, task = await _running(bridge)
    progress = bridge.progress
    await asyncio.sleep(0.3)
    # Each answered probe, with nothing left to write, keeps the bucket in sync.
    assert progress.synced
    assert progress.lag() < 0.2

    etcd.fail()
    await asyncio.sleep(0.5)
    assert progress.lag() >= 0.4
    assert progress.silent_for() < 0.3  # retrying: alive, not stuck
    etcd.down = False
    await _until(lambda: progress.lag() < 0.2)

    stop.set()
    await task


async def test_a_change_etcd_sent_counts_as_unwritten_until_the_bucket_takes_it() -> None:
    etcd, bucket = FakeEtcd(), FakeBucket()
    bridge = EtcdDiscoveryBridge(etcd, bucket, retry_interval=0.02, probe_interval=0.05)
    stop, task = await _running(bridge)
    progress = bridge.progress

    bucket.failing.add(KEY_A)
    etcd.put(MDC_A, b"a")
    await _until(lambda: bridge.stats.write_errors >= 1)
    await asyncio.sleep(0.3)
    assert progress.unwritten_for() >= 0.3
    assert progress.lag() >= 0.3
    bucket.failing.clear()
    await _until(lambda: bucket.data == {KEY_A: b"a"})
    await _until(lambda: progress.unwritten_for() == 0.0)
    assert progress.lag() < 0.2
    assert progress.last_write_age() is not None

    stop.set()
    await task


class DroppedDuringProbe(FakeEtcd):
    """An etcd whose connection drops while a probe is in flight: the watch fails first."""

    async def probe(self) -> None:
        self.fail()  # the watch hears it at once
        await asyncio.sleep(0.05)
        raise StoreUnavailable("no answer")


async def test_a_watch_that_failed_while_the_probe_failed_is_said_and_nothing_stays_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    etcd, bucket = DroppedDuringProbe(), FakeBucket()
    etcd.put(MDC_A, b"a")
    bridge = EtcdDiscoveryBridge(etcd, bucket, probe_interval=0.02)
    before = asyncio.all_tasks()
    with (
        caplog.at_level(logging.WARNING, logger=bridge_module.__name__),
        pytest.raises(StoreUnavailable, match="no answer"),
    ):
        await bridge.follow_once()
    said = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in said] == [
        "the etcd watch had failed as well: StoreUnavailable('connection lost')"
    ]
    assert [t for t in asyncio.all_tasks() - before if not t.done()] == []
    assert bucket.data == {KEY_A: b"a"}  # what was written stays
