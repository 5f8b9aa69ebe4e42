"""The admission service against hand-written fake ports: no network, real core and boundary."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.cards import (
    EP,
    base_card,
    endpoint_entry,
    model_delete,
    model_entry,
    model_put,
)
from support.fakes import (
    FakeBuilder,
    FakeClock,
    FakePublisher,
    FakeSource,
    GroupsPublisher,
    settle,
)
from workerset_admission.card import (
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.errors import ReceiverRetired
from workerset_admission.identity import GroupKey
from workerset_admission.ports import (
    DiscoveryEntry,
    SourceDelete,
    SourceEvent,
    SourceListing,
    SourcePut,
)
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.settings import Settings

CARD: dict[str, Any] = base_card(16)
OLD = CARD
NEW = base_card(32)


def group_key() -> GroupKey:
    return GroupKey.build(CARD["display_name"], EP, "chat|completions", _aggregated())


def _aggregated() -> Any:
    from workerset_admission.identity import WorkerType

    return WorkerType.AGGREGATED


@pytest.fixture
def source() -> FakeSource:
    return FakeSource()


async def serve_listing(
    svc: AdmissionService, source: FakeSource, listing: tuple[DiscoveryEntry, ...]
) -> None:
    """Feed a snapshot and wait until its group is committed and bound."""
    source.queue.put_nowait(SourceListing(listing))
    await settle(lambda: svc.binding(group_key()) is not None)


async def started(source: FakeSource, **kwargs: Any) -> AdmissionService:
    svc = AdmissionService(source, **kwargs)
    await svc.start()
    return svc


async def test_first_registration_is_admitted_and_committed_with_a_receiver(
    source: FakeSource,
) -> None:
    svc = await started(source)
    try:
        source.queue.put_nowait(SourceListing((model_entry(0x1A), endpoint_entry(0x1A))))
        await svc.wait_synced(5)
        await settle(lambda: svc.binding(group_key()) is not None)
        receiver = svc.receiver_for(group_key())
        assert receiver is not None
        assert receiver.current().admitted == {0x1A}
        binding = svc.binding(group_key())
        assert binding is not None
        assert binding.routable() == {0x1A}
        assert binding.settings.kv_cache_block_size == 16
        group = svc.status().group(group_key())
        assert group is not None
        assert group.status == "ready"
        assert group.admitted == (0x1A,)
    finally:
        await svc.stop()


async def test_a_conflicting_cohort_is_rejected_and_logged_once_at_error(
    source: FakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    svc = await started(source)
    try:
        caplog.set_level(logging.ERROR)
        source.queue.put_nowait(SourceListing((model_entry(1),)))
        for instance_id in (2, 3, 4):
            source.queue.put_nowait(model_put(instance_id, NEW))
        source.queue.put_nowait(model_put(2, NEW))  # a duplicate changes nothing
        await settle(lambda: svc.counters.puts == 4)
        errors = [r for r in caplog.records if "rejected cohort" in r.getMessage()]
        assert len(errors) == 1
        assert errors[0].levelno == logging.ERROR
        group = svc.status().group(group_key())
        assert group is not None
        assert group.admitted == (1,)
        assert [c.members for c in group.rejected] == [(2, 3, 4)]
        status = svc.status().to_json()["groups"][0]
        assert status["rejected"] == [group.rejected[0].mdc_checksum]
    finally:
        await svc.stop()


async def test_an_invalid_record_is_counted_and_remembered_and_changes_nothing(
    source: FakeSource,
) -> None:
    svc = await started(source)
    try:
        source.queue.put_nowait(SourceListing((model_entry(1),)))
        await svc.wait_synced(5)
        before = svc.status().groups
        bad_value = SourcePut(DiscoveryEntry(model_kv_key(EP, 2), b"{not json", 3))
        bad_key = SourcePut(DiscoveryEntry("v1.mdc.only", b"{}", 4))
        source.queue.put_nowait(bad_value)
        source.queue.put_nowait(bad_key)
        await settle(lambda: svc.counters.invalid == 2)
        assert [r.key for r in svc.recent_invalid] == [model_kv_key(EP, 2), "v1.mdc.only"]
        assert all(r.reason for r in svc.recent_invalid)
        assert svc.status().groups == before
        assert svc.running
    finally:
        await svc.stop()


async def test_the_recent_invalid_list_is_bounded(source: FakeSource) -> None:
    svc = await started(source, settings=Settings(invalid_history=3))
    try:
        for n in range(10):
            source.queue.put_nowait(SourcePut(DiscoveryEntry(f"v1.mdc.bad{n}", b"", n)))
        await settle(lambda: svc.counters.invalid == 10)
        assert [r.key for r in svc.recent_invalid] == ["v1.mdc.bad7", "v1.mdc.bad8", "v1.mdc.bad9"]
        assert svc.status().invalid_total == 10
    finally:
        await svc.stop()


async def test_a_listing_notifies_each_receiver_once(source: FakeSource) -> None:
    svc = await started(source)
    try:
        await serve_listing(svc, source, (model_entry(1),))
        receiver = svc.receiver_for(group_key())
        assert receiver is not None
        version = receiver.current().version
        listing = tuple(model_entry(i) for i in range(1, 200))
        source.queue.put_nowait(SourceListing(listing, reason="reconnect"))
        await settle(lambda: svc.counters.listings == 2)
        state = receiver.current()
        assert state.admitted == frozenset(range(1, 200))
        assert state.version == version + 1
    finally:
        await svc.stop()


async def test_an_unchanged_reconnect_listing_notifies_no_receiver(source: FakeSource) -> None:
    svc = await started(source)
    try:
        listing = tuple(model_entry(i) for i in range(1, 20))
        await serve_listing(svc, source, listing)
        receiver = svc.receiver_for(group_key())
        assert receiver is not None
        version = receiver.current().version
        notifications = svc.counters.notifications
        source.queue.put_nowait(SourceListing(listing, reason="reconnect"))
        await settle(lambda: svc.counters.listings == 2)
        assert receiver.current().version == version
        assert svc.counters.notifications == notifications
    finally:
        await svc.stop()


async def test_a_failed_build_is_retried_when_the_clock_reaches_its_deadline(
    source: FakeSource,
) -> None:
    clock = FakeClock()
    builder = FakeBuilder()
    builder.fail_next = 1
    svc = await started(source, builder=builder, clock=clock)
    try:
        source.queue.put_nowait(SourceListing((model_entry(1),)))
        await settle(lambda: svc.status().groups and svc.status().groups[0].status == "retrying")
        assert len(builder.requests) == 1
        clock.now += 0.5
        svc.wake_timers()
        await asyncio.sleep(0.05)
        assert len(builder.requests) == 1  # not yet due: the first delay is 1 s
        clock.now += 0.6
        svc.wake_timers()
        await settle(lambda: svc.binding(group_key()) is not None)
        assert [r.attempt for r in builder.requests] == [1, 2]
        assert builder.requests[1].generation > builder.requests[0].generation
    finally:
        await svc.stop()


async def test_drain_and_succession_give_a_new_receiver_and_generation_and_the_old_one_never_sees_new_ids(  # noqa: E501
    source: FakeSource,
) -> None:
    svc = await started(source)
    try:
        source.queue.put_nowait(SourceListing((model_entry(1), model_entry(2))))
        source.queue.put_nowait(model_put(3, NEW))
        await settle(lambda: svc.binding(group_key()) is not None and svc.counters.puts == 1)
        old_receiver = svc.receiver_for(group_key())
        old_binding = svc.binding(group_key())
        assert old_receiver is not None
        assert old_binding is not None
        source.queue.put_nowait(model_delete(1))
        source.queue.put_nowait(model_delete(2))
        await settle(lambda: (b := svc.binding(group_key())) is not None and b.id != old_binding.id)
        new_binding = svc.binding(group_key())
        assert new_binding is not None
        assert new_binding.id.generation > old_binding.id.generation
        assert new_binding.admitted() == {3}
        assert new_binding.settings.kv_cache_block_size == 32
        with pytest.raises(ReceiverRetired):
            old_receiver.current()
        with pytest.raises(ReceiverRetired):
            old_binding.admitted()
        # The same instance id coming back under the old configuration joins the new tenure's
        # rejected cohort; the retired receiver still shows nothing.
        source.queue.put_nowait(model_put(1, OLD))
        await settle(lambda: svc.counters.puts == 2)
        with pytest.raises(ReceiverRetired):
            old_receiver.current()
        assert new_binding.admitted() == {3}
    finally:
        await svc.stop()


async def test_endpoint_liveness_is_intersected_with_admissions(source: FakeSource) -> None:
    svc = await started(source)
    try:
        source.queue.put_nowait(
            SourceListing((model_entry(1), model_entry(2), endpoint_entry(1), endpoint_entry(9)))
        )
        await settle(lambda: svc.binding(group_key()) is not None)
        binding = svc.binding(group_key())
        assert binding is not None
        assert binding.routable() == {1}
        source.queue.put_nowait(SourcePut(endpoint_entry(2)))
        await settle(lambda: binding.routable() == {1, 2})
        source.queue.put_nowait(SourceDelete(endpoint_kv_key(EP, 1), 9, "expired"))
        await settle(lambda: binding.routable() == {2})
        group = svc.status().group(group_key())
        assert group is not None
        assert group.routable == (2,)
        assert group.admitted == (1, 2)
    finally:
        await svc.stop()


async def test_serving_admissions_are_published_and_withdrawn_on_stop(source: FakeSource) -> None:
    publisher = FakePublisher()
    svc = await started(source, publisher=publisher, settings=Settings(publish_interval=0))
    source.queue.put_nowait(SourceListing((model_entry(0x1A), model_entry(0x2B))))
    source.queue.put_nowait(model_put(0x3C, NEW))
    expected = ("dgd-v1/backend/generate/1a", "dgd-v1/backend/generate/2b")
    await settle(lambda: publisher.records.get("dgd-v1") == expected)
    assert publisher.capability
    await svc.stop()
    assert publisher.withdrawn
    assert publisher.records == {}


async def test_stop_cancels_builds_in_flight_and_retires_receivers(source: FakeSource) -> None:
    builder = FakeBuilder(hold=True)
    svc = await started(source, builder=builder)
    source.queue.put_nowait(SourceListing((model_entry(1),)))
    await settle(lambda: len(builder.requests) == 1)
    receiver = svc.receiver_for(group_key())
    assert receiver is not None
    await svc.stop()
    assert builder.cancelled == 1
    assert source.closed
    with pytest.raises(ReceiverRetired):
        receiver.current()
    assert svc.status().health == "shutting_down"


async def test_a_build_still_running_when_its_tenure_ends_is_cancelled(source: FakeSource) -> None:
    builder = FakeBuilder(hold=True)
    svc = await started(source, builder=builder)
    try:
        source.queue.put_nowait(SourceListing((model_entry(1),)))
        await settle(lambda: len(builder.requests) == 1)
        source.queue.put_nowait(model_delete(1))
        await settle(lambda: builder.cancelled == 1)
        group = svc.status().group(group_key())
        assert group is not None
        assert group.status == "idle"
    finally:
        await svc.stop()


async def test_periodic_reconciliation_removes_keys_missing_from_the_listing(
    source: FakeSource,
) -> None:
    svc = await started(source, settings=Settings(reconcile_interval=0.05))
    try:
        source.queue.put_nowait(SourceListing((model_entry(1), model_entry(2))))
        source.listing = [model_entry(2)]
        await settle(lambda: source.list_calls >= 1 and svc.counters.listings >= 2)
        group = svc.status().group(group_key())
        assert group is not None
        assert group.admitted == (2,)
    finally:
        await svc.stop()


async def test_status_json_lists_groups_with_incumbent_generation_and_readiness(
    source: FakeSource,
) -> None:
    svc = await started(source)
    try:
        source.queue.put_nowait(SourceListing((model_entry(1), endpoint_entry(1))))
        source.queue.put_nowait(model_put(2, NEW))
        await settle(lambda: svc.binding(group_key()) is not None and svc.counters.puts == 1)
        import json

        status = json.loads(svc.render_status())
        (group,) = status["groups"]
        assert group["model"] == "Qwen/Qwen3-0.6B"
        assert group["status"] == "ready"
        assert group["admitted"] == [1]
        assert group["incumbent"] == group["cohorts"][0]["checksum"]
        assert group["cohorts"][1]["members"] == [2]
        assert status["readiness"] == [
            {
                "model": "Qwen/Qwen3-0.6B",
                "namespace": "dgd-v1",
                "ready": True,
                "present": ["aggregated"],
                "missing": [],
            }
        ]
        assert group["namespace"] == "dgd-v1"
        assert group["group_id"] == group_key().id
        (rejection,) = status["rejections"]
        assert rejection["rejected_checksum"] == group["cohorts"][1]["checksum"]
        assert rejection["instance"] == "dgd-v1/backend/generate/2"
        assert rejection["differences"] == [
            {"field": "kv_cache_block_size", "incumbent": "16", "rejected": "32"}
        ]
        brief = json.loads(svc.render_status(brief=True))
        assert brief["groups"][0]["admitted"] == 1
    finally:
        await svc.stop()


async def test_the_status_answer_counts_the_processs_open_tasks(source: FakeSource) -> None:
    import json

    svc = await started(source)
    try:
        extra = [asyncio.create_task(asyncio.sleep(30)) for _ in range(3)]
        counted = json.loads(svc.render_status())["process"]["asyncio_tasks"]
        assert counted == len(asyncio.all_tasks())
        for task in extra:
            task.cancel()
        await asyncio.gather(*extra, return_exceptions=True)
        assert json.loads(svc.render_status())["process"]["asyncio_tasks"] == counted - 3
    finally:
        await svc.stop()


async def test_the_status_can_be_read_from_another_thread(source: FakeSource) -> None:
    svc = await started(source)
    try:
        await serve_listing(svc, source, (model_entry(1),))
        source.queue.put_nowait(model_put(2))
        await settle(lambda: svc.counters.puts == 1)
        seen: list[Any] = []

        def read_until_shown() -> None:
            # A thread sees the latest snapshot: the change shows after the next status round.
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                seen[:] = [svc.status()]
                if seen[0].groups and seen[0].groups[0].admitted == (1, 2):
                    return
                time.sleep(0.005)

        thread = threading.Thread(target=read_until_shown)
        thread.start()
        await settle(lambda: not thread.is_alive(), timeout=10)
        thread.join()
        (group,) = seen[-1].groups
        assert group.admitted == (1, 2)
    finally:
        await svc.stop()


async def test_starting_twice_is_refused(source: FakeSource) -> None:
    from workerset_admission.errors import UsageError

    svc = await started(source)
    try:
        with pytest.raises(UsageError):
            await svc.start()
    finally:
        await svc.stop()


async def test_a_listing_older_than_live_updates_keeps_what_they_changed(
    source: FakeSource,
) -> None:
    svc = await started(source)
    try:
        await serve_listing(svc, source, (model_entry(1), model_entry(2)))
        source.listing = [model_entry(1), model_entry(2)]
        source.listing_gate.clear()
        reconciling = asyncio.create_task(svc.reconcile())
        await settle(lambda: source.list_calls == 1)
        source.queue.put_nowait(model_put(3))
        source.queue.put_nowait(model_delete(1))
        await settle(lambda: svc.counters.deletes == 1)
        source.listing_gate.set()
        assert await reconciling is True
        group = svc.status().group(group_key())
        assert group is not None
        assert group.admitted == (2, 3)
    finally:
        await svc.stop()


async def test_a_listing_overtaken_by_a_resync_is_discarded(source: FakeSource) -> None:
    svc = await started(source)
    try:
        await serve_listing(svc, source, (model_entry(1),))
        source.listing = [model_entry(1)]
        source.listing_gate.clear()
        reconciling = asyncio.create_task(svc.reconcile())
        await settle(lambda: source.list_calls == 1)
        source.queue.put_nowait(SourceListing((model_entry(1), model_entry(2)), "reconnect"))
        await settle(lambda: svc.counters.listings == 2)
        source.listing_gate.set()
        assert await reconciling is False
        group = svc.status().group(group_key())
        assert group is not None
        assert group.admitted == (1, 2)
    finally:
        await svc.stop()


async def test_a_refused_value_in_a_listing_keeps_the_last_valid_registration(
    source: FakeSource,
) -> None:
    svc = await started(source)
    try:
        await serve_listing(svc, source, (model_entry(1), model_entry(2)))
        garbled = DiscoveryEntry(model_kv_key(EP, 2), b"{garbled", 7)
        source.queue.put_nowait(SourceListing((model_entry(1), garbled), "reconnect"))
        await settle(lambda: svc.counters.listings == 2)
        group = svc.status().group(group_key())
        assert group is not None
        assert group.admitted == (1, 2)
        assert svc.recent_invalid[-1].key == model_kv_key(EP, 2)
    finally:
        await svc.stop()


class FlakyStatus:
    """Fails on its first start, then answers one request by rendering once."""

    def __init__(self) -> None:
        self.starts = 0
        self.rendered: list[bytes] = []

    async def serve(self, render: Any, settle: Any) -> None:
        self.starts += 1
        if self.starts == 1:
            raise ConnectionError("NATS is away")
        await settle()
        self.rendered.append(render(False))
        await asyncio.Event().wait()


async def test_a_failing_status_responder_is_restarted_and_admission_goes_on(
    source: FakeSource,
) -> None:
    status = FlakyStatus()
    svc = await started(source, status=status, settings=Settings(publish_retry=0.01))
    try:
        source.queue.put_nowait(SourceListing((model_entry(1),)))
        await settle(lambda: bool(status.rendered) and svc.binding(group_key()) is not None)
        assert svc.running
        assert status.starts == 2
        assert b'"groups"' in status.rendered[0]
    finally:
        await svc.stop()


async def test_the_service_stops_when_its_source_ends(source: FakeSource) -> None:
    svc = await started(source)
    await serve_listing(svc, source, (model_entry(1),))
    receiver = svc.receiver_for(group_key())
    assert receiver is not None
    source.queue.put_nowait(None)
    await settle(lambda: not svc.running)
    with pytest.raises(ReceiverRetired):
        receiver.current()
    await svc.stop()


def test_the_liveness_index_keeps_an_instance_live_while_any_record_names_it() -> None:
    from workerset_admission.service.liveness import LivenessIndex

    index = LivenessIndex()
    assert index.put("a", EP, 1)
    assert index.put("b", EP, 1)
    assert not index.put("b", EP, 1)  # the same record again changes nothing
    assert index.put("c", EP, 2)
    assert index.live_ids(EP) == {1, 2}
    assert index.remove("a")
    assert index.live_ids(EP) == {1, 2}
    assert index.remove("b")
    assert index.live_ids(EP) == {2}
    assert not index.remove("b")
    assert index.routable(EP, [1, 2, 3]) == {2}
    assert index.replace({"d": (EP, 7)})
    assert index.live_ids(EP) == {7}
    assert not index.replace({"d": (EP, 7)})


class CountingDecoder:
    """The real card boundary, counting how often it is asked to decode."""

    def __init__(self) -> None:
        from workerset_admission.service.ingest import CardRecordDecoder

        self._inner = CardRecordDecoder()
        self.decoded: list[str] = []

    def decode(self, key: str, value: bytes) -> Any:
        self.decoded.append(key)
        return self._inner.decode(key, value)

    def removal(self, key: str) -> Any:
        return self._inner.removal(key)


async def test_a_value_seen_before_under_the_same_key_is_not_decoded_again(
    source: FakeSource,
) -> None:
    decoder = CountingDecoder()
    svc = await started(source, decoder=decoder)
    try:
        listing = (model_entry(1), model_entry(2), endpoint_entry(1))
        source.queue.put_nowait(SourceListing(listing))
        await svc.wait_synced(5)
        assert len(decoder.decoded) == 3
        source.queue.put_nowait(SourceListing(listing, "reconnect"))
        source.queue.put_nowait(model_put(2))  # re-sent unchanged
        source.queue.put_nowait(model_put(1, NEW))  # changed in place: decoded, then refused
        await settle(lambda: svc.counters.puts == 2)
        assert decoder.decoded[3:] == [model_kv_key(EP, 1)]
        source.queue.put_nowait(model_delete(2))
        source.queue.put_nowait(model_put(2))
        await settle(lambda: svc.counters.puts == 3)
        assert decoder.decoded[4:] == [model_kv_key(EP, 2)]
        group = svc.status().group(group_key())
        assert group is not None
        assert group.admitted == (1, 2)
    finally:
        await svc.stop()


class BrokenSource(FakeSource):
    async def events(self) -> AsyncIterator[SourceEvent]:
        raise ConnectionRefusedError("no NATS here")
        yield  # pragma: no cover - makes this an async generator


async def test_waiting_for_sync_reports_a_service_that_failed_before_its_first_listing() -> None:
    svc = AdmissionService(BrokenSource())
    await svc.start()
    with pytest.raises(ConnectionRefusedError, match="no NATS here"):
        await svc.wait_synced(5)
    assert not svc.running
    await svc.stop()


async def test_waiting_for_sync_times_out_while_no_listing_arrives(source: FakeSource) -> None:
    svc = await started(source)
    try:
        with pytest.raises(asyncio.TimeoutError):
            await svc.wait_synced(0.05)
        assert svc.status().health == "starting"
    finally:
        await svc.stop()


async def test_serving_records_name_each_groups_checksum_and_generation_when_asked(
    source: FakeSource,
) -> None:
    publisher = GroupsPublisher()
    svc = await started(source, publisher=publisher, settings=Settings(publish_interval=0))
    try:
        await serve_listing(svc, source, (model_entry(0x1A), model_entry(0x2B, NEW)))
        await settle(lambda: publisher.groups.get("dgd-v1") is not None)
        group = svc.status().group(group_key())
        assert group is not None
        (served,) = publisher.groups["dgd-v1"]
        assert served == {
            "model": "Qwen/Qwen3-0.6B",
            "worker_set": group_key().worker_set,
            "checksum": group.incumbent,
            "generation": group.committed_generation,
            "members": ["dgd-v1/backend/generate/1a"],
        }
    finally:
        await svc.stop()


async def test_a_reconnect_that_lists_no_incumbent_worker_holds_the_tenure_until_its_deadline(
    source: FakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    svc = await started(source, clock=clock, settings=Settings(tenure_hold=30.0))
    try:
        source.queue.put_nowait(SourceListing((model_entry(1), model_entry(2, NEW))))
        await settle(lambda: svc.binding(group_key()) is not None)
        receiver = svc.receiver_for(group_key())
        assert receiver is not None
        clock.now += 20.0  # the outage
        source.queue.put_nowait(SourceListing((model_entry(2, NEW),), reason="reconnect"))
        await settle(lambda: svc.status().groups[0].held_until is not None)
        (group,) = svc.status().groups
        # Worker 1 is served on its last known record for one registration TTL (10 s), though
        # no instance record of it is listed either.
        assert (group.admitted, group.incumbent) == ((1,), receiver.current().mdc_checksum)
        assert (group.routable, group.last_known) == ((1,), (1,))
        assert group.to_json()["held"] is True
        assert group.last_known_until is not None
        assert group.held_until is not None
        assert group.held_until - group.last_known_until == pytest.approx(20.0, abs=0.01)
        assert receiver.current().last_known == frozenset({1})
        assert "holding the tenure" in caplog.text
        clock.now += 10.0
        svc.wake_timers()
        await settle(lambda: svc.status().groups[0].admitted == ())
        assert svc.status().groups[0].held_until is not None
        assert receiver.current().last_known == frozenset()
        clock.now += 19.0
        svc.wake_timers()
        await asyncio.sleep(0.05)
        assert svc.status().groups[0].held_until is not None
        clock.now += 1.0
        svc.wake_timers()
        await settle(lambda: svc.status().groups[0].admitted == (2,))
        assert receiver.retired
        assert "the succession follows" in caplog.text
        assert "succession in" in caplog.text
    finally:
        await svc.stop()


async def test_an_incumbent_worker_registering_during_the_hold_rejoins_the_same_receiver(
    source: FakeSource,
) -> None:
    clock = FakeClock()
    svc = await started(source, clock=clock, settings=Settings(tenure_hold=30.0))
    try:
        source.queue.put_nowait(SourceListing((model_entry(1), model_entry(2, NEW))))
        await settle(lambda: svc.binding(group_key()) is not None)
        receiver = svc.receiver_for(group_key())
        assert receiver is not None
        source.queue.put_nowait(SourceListing((model_entry(2, NEW),), reason="reconnect"))
        await settle(lambda: svc.status().groups[0].held_until is not None)
        source.queue.put_nowait(model_put(1, revision=5))
        await settle(lambda: svc.status().groups[0].admitted == (1,))
        clock.now += 100.0
        svc.wake_timers()
        await asyncio.sleep(0.05)
        assert receiver.current().admitted == frozenset({1})
        assert svc.status().groups[0].held_until is None
    finally:
        await svc.stop()


async def test_a_resync_after_a_lost_connection_writes_every_serving_record_again(
    source: FakeSource,
) -> None:
    publisher = FakePublisher()
    svc = await started(source, publisher=publisher)
    try:
        source.queue.put_nowait(SourceListing((model_entry(1),)))
        await settle(lambda: svc.binding(group_key()) is not None)
        source.queue.put_nowait(SourceListing((model_entry(1),), reason="periodic"))
        await asyncio.sleep(0.05)
        assert publisher.republished == 0
        source.queue.put_nowait(SourceListing((model_entry(1),), reason="reconnect"))
        await settle(lambda: publisher.republished == 1)
    finally:
        await svc.stop()


async def test_a_stop_whose_withdrawal_fails_logs_one_line_without_a_traceback(
    source: FakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    class Unreachable(FakePublisher):
        async def withdraw_all(self) -> None:
            raise ConnectionError("nats is away")

    svc = await started(source, publisher=Unreachable())
    source.queue.put_nowait(SourceListing((model_entry(1),)))
    await svc.wait_synced(5)
    await svc.stop()
    (record,) = [r for r in caplog.records if "withdraw" in r.getMessage()]
    assert record.levelname == "WARNING"
    assert record.exc_info is None
    assert "ConnectionError: nats is away" in record.getMessage()


class _WatchedObjects:
    """A store with a watch of its own (custom resources through an informer, say).

    It keeps objects, not KV entries: each object names its record by its discovery key and
    carries no revision, and removals are plain deletes. Nothing here is a bucket.
    """

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = dict(objects)
        self.changes: asyncio.Queue[tuple[str, bytes | None] | None] = asyncio.Queue()

    def _listing(self, reason: Any) -> SourceListing:
        entries = tuple(DiscoveryEntry(key, value) for key, value in sorted(self.objects.items()))
        return SourceListing(entries, reason=reason)

    async def events(self) -> AsyncIterator[SourceEvent]:
        yield self._listing("initial")
        while (change := await self.changes.get()) is not None:
            key, value = change
            if value is None:
                self.objects.pop(key, None)
                yield SourceDelete(key)
            else:
                self.objects[key] = value
                yield SourcePut(DiscoveryEntry(key, value))

    async def list_all(self) -> SourceListing:
        return self._listing("periodic")  # the informer's cache is current

    async def close(self) -> None:
        self.changes.put_nowait(None)


async def test_a_store_with_its_own_watch_plugs_in_as_a_source_without_a_bucket() -> None:
    first, second = model_entry(1), endpoint_entry(1)
    store = _WatchedObjects({first.key: first.value, second.key: second.value})
    svc = AdmissionService(store)
    await svc.start()
    try:
        await svc.wait_synced(5)
        await settle(lambda: svc.binding(group_key()) is not None)
        binding = svc.binding(group_key())
        assert binding is not None
        assert binding.routable() == {1}
        joining, live = model_entry(2), endpoint_entry(2)
        store.changes.put_nowait((joining.key, joining.value))
        store.changes.put_nowait((live.key, live.value))
        await settle(lambda: binding.routable() == {1, 2})
        store.changes.put_nowait((first.key, None))
        await settle(lambda: binding.routable() == {2})
        assert await svc.reconcile()
        assert binding.routable() == {2}
    finally:
        await svc.stop()


async def test_a_withdrawn_drain_is_logged_by_the_frontend(
    source: FakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    from workerset_admission.card import encode_drain_record
    from workerset_admission.identity import Drain
    from workerset_admission.keys import drain_kv_key

    key = drain_kv_key(EP.namespace, 0x1A)
    drain = DiscoveryEntry(key, encode_drain_record(Drain(EP.namespace, 0x1A, "ops", 1.0)), 3)
    svc = await started(source)
    try:
        source.queue.put_nowait(SourceListing((model_entry(0x1A), endpoint_entry(0x1A))))
        await svc.wait_synced(5)
        source.queue.put_nowait(SourcePut(drain))
        await settle(lambda: svc.status().groups[0].drained != ())
        with caplog.at_level(logging.INFO):
            source.queue.put_nowait(SourceDelete(key, 4))
            await settle(lambda: svc.status().groups[0].drained == ())
        lines = [r.getMessage() for r in caplog.records if "withdrawn" in r.getMessage()]
        assert lines == [f"drain of {EP.namespace}/1a withdrawn (delete): the worker may be "
                         "routed to again"]  # fmt: skip
    finally:
        await svc.stop()


async def test_the_publisher_settles_once_after_the_first_listing_is_published(
    source: FakeSource,
) -> None:
    publisher = FakePublisher()
    svc = await started(source, publisher=publisher)
    await asyncio.sleep(0.2)
    # Before the first listing nothing is settled: a predecessor's records still say the view.
    assert publisher.settled == 0
    # An empty first listing changes no group: the publisher settles all the same.
    source.queue.put_nowait(SourceListing(()))
    await svc.wait_synced(5)
    for _ in range(100):
        if publisher.settled:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    assert publisher.settled == 1
    await svc.stop()


async def test_a_tenure_held_with_nobody_served_names_whom_it_waits_for_and_serves_no_one(
    source: FakeSource,
) -> None:
    clock = FakeClock()
    publisher = GroupsPublisher()
    svc = await started(
        source,
        clock=clock,
        publisher=publisher,
        settings=Settings(tenure_hold=30.0, publish_interval=0),
    )
    try:
        source.queue.put_nowait(SourceListing((model_entry(0x1A), model_entry(0x2B, NEW))))
        await settle(lambda: publisher.groups.get("dgd-v1") is not None)
        incumbent = svc.status().groups[0].incumbent
        source.queue.put_nowait(SourceListing((model_entry(0x2B, NEW),), reason="reconnect"))
        await settle(lambda: svc.status().groups[0].held_until is not None)
        clock.now += 10.0  # one registration TTL: worker 1a is no longer served
        svc.wake_timers()
        await settle(lambda: svc.status().groups[0].admitted == ())
        await settle(lambda: publisher.groups["dgd-v1"][0]["members"] == [])
        (held,) = publisher.groups["dgd-v1"]
        assert held["checksum"] == incumbent
        assert held["held"] == ["dgd-v1/backend/generate/1a"]
        assert svc.serving_members()["dgd-v1"] == ()
        # The hold runs out: nothing is held, and no entry names held workers any more.
        clock.now += 30.0
        svc.wake_timers()
        await settle(lambda: svc.status().groups[0].held_until is None)
        await settle(lambda: not any("held" in g for g in publisher.groups.get("dgd-v1") or ()))
    finally:
        await svc.stop()
