"""The discovery source's message translation, without a server."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from nats.aio.msg import Msg
from workerset_admission.adapters.nats.kv import removal_kind
from workerset_admission.adapters.nats.source import LISTING_QUIET, JetStreamDiscoverySource
from workerset_admission.adapters.nats.watch import StreamSummary, Watch, parse_delivery
from workerset_admission.errors import UsageError
from workerset_admission.ports import SourceDelete, SourcePut

PREFIX = "$KV.disc."


def message(
    key: str, seq: int, pending: int, data: bytes = b"{}", headers: dict[str, str] | None = None
) -> Msg:
    reply = f"$JS.ACK.KV_disc.consumer.1.{seq}.{seq}.1700000000000000000.{pending}"
    return Msg(_client=None, subject=PREFIX + key, reply=reply, data=data, headers=headers)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("headers", "kind"),
    [
        (None, None),
        ({}, None),
        ({"traceparent": "00-x"}, None),
        ({"KV-Operation": "DEL"}, "delete"),
        ({"KV-Operation": "PURGE"}, "purge"),
        ({"Nats-Marker-Reason": "MaxAge"}, "expired"),
        ({"Nats-Marker-Reason": "Purge"}, "purge"),
        ({"Nats-Marker-Reason": "Remove"}, "delete"),
        ({"Nats-Marker-Reason": "SomethingNew"}, "purge"),
    ],
)
def test_headers_tell_a_put_from_each_kind_of_removal(
    headers: dict[str, str] | None, kind: str | None
) -> None:
    assert removal_kind(headers) == kind


def test_both_ack_subject_forms_give_sequence_pending_and_time() -> None:
    short = parse_delivery("$JS.ACK.KV_disc.c.1.42.7.1700000000000000000.3")
    assert short is not None
    assert (short.stream_seq, short.pending, short.timestamp_ns) == (42, 3, 1700000000000000000)
    long = parse_delivery("$JS.ACK.domain.acchash.KV_disc.c.1.42.7.1700000000000000000.3.rnd")
    assert long is not None
    assert (long.stream_seq, long.pending) == (42, 3)


@pytest.mark.parametrize("reply", ["", "inbox.1", "$JS.ACK.a.b.c.x.y.z.w", "$JS.ACK.a.b.c.d"])
def test_an_unreadable_ack_subject_is_ignored(reply: str) -> None:
    assert parse_delivery(reply) is None


async def test_initial_values_collapse_to_the_latest_state_per_key_without_tombstones() -> None:
    watch = Watch(len(PREFIX), 16, last_seq_at_start=10)
    await watch.on_message(message("v1.mdc.a", 3, 3, b"A"))
    await watch.on_message(message("v1.mdc.b", 5, 2, b"B"))
    await watch.on_message(message("v1.mdc.c", 6, 1, b"", {"KV-Operation": "DEL"}))
    assert not watch.listing_done.is_set()
    await watch.on_message(message("v1.mdc.a", 9, 0, b"A2", {"traceparent": "t"}))
    assert watch.listing_done.is_set()
    assert {e.key: e.value for e in watch.listing_entries} == {"v1.mdc.a": b"A2", "v1.mdc.b": b"B"}
    newest = next(e for e in watch.listing_entries if e.key == "v1.mdc.a")
    assert newest.revision == 9
    assert newest.headers == {"traceparent": "t"}
    assert newest.published_at == pytest.approx(1_700_000_000.0)
    assert watch.queue.empty()


async def test_a_key_rewritten_while_the_listing_is_delivered_is_still_in_it() -> None:
    # At the start the bucket held a/3, b/5 and c/6. b's heartbeat rewrote it (seq 8) before
    # the consumer reached seq 5, so b/5 is never delivered: b/8 stands for it, in the listing,
    # even though the server's pending count had not caught up with it.
    keys = {"v1.mdc.a", "v1.mdc.b", "v1.mdc.c"}
    watch = Watch(len(PREFIX), 16, last_seq_at_start=6, expected_keys=keys)
    await watch.on_message(message("v1.mdc.a", 3, 1, b"A"))
    await watch.on_message(message("v1.mdc.c", 6, 0, b"C"))
    await watch.on_message(message("v1.mdc.a", 7, 1, b"A2"))
    assert not watch.listing_done.is_set()
    assert watch.listing_stalled()
    await watch.on_message(message("v1.mdc.b", 8, 0, b"B2"))
    assert watch.listing_done.is_set()
    assert {e.key: e.value for e in watch.listing_entries} == {
        "v1.mdc.a": b"A2",
        "v1.mdc.b": b"B2",
        "v1.mdc.c": b"C",
    }
    await watch.on_message(message("v1.mdc.c", 9, 0, b"C2"))
    live = watch.queue.get_nowait()
    assert isinstance(live, SourcePut)
    assert live.entry.value == b"C2"


async def test_a_finished_listing_leaves_the_watch_nothing_the_size_of_the_bucket() -> None:
    keys = [f"v1.mdc.k{i}" for i in range(2_000)]
    watch = Watch(len(PREFIX), 16, last_seq_at_start=len(keys), expected_keys=set(keys))
    for seq, key in enumerate(keys, 1):
        await watch.on_message(message(key, seq, len(keys) - seq))
    assert watch.listing_done.is_set()
    assert len(watch.take_listing()) == len(keys)
    held = sum(
        sys.getsizeof(value)
        for value in vars(watch).values()
        if isinstance(value, (set, frozenset, dict, list, tuple))
    )
    assert held < 1_000


async def test_without_the_keys_at_the_start_the_listing_ends_with_their_values() -> None:
    watch = Watch(len(PREFIX), 16, last_seq_at_start=4)
    await watch.on_message(message("v1.mdc.a", 4, 50, b"A"))
    # The first message newer than the start: the values at the start are all in.
    await watch.on_message(message("v1.mdc.b", 5, 49, b"B"))
    assert watch.listing_done.is_set()
    assert [e.key for e in watch.listing_entries] == ["v1.mdc.a", "v1.mdc.b"]
    await watch.on_message(message("v1.mdc.c", 6, 48, b"C"))
    live = watch.queue.get_nowait()
    assert isinstance(live, SourcePut)
    assert live.entry.key == "v1.mdc.c"


async def test_a_listing_waiting_for_a_key_ends_after_a_round_of_later_writes() -> None:
    # x was in the bucket at the start and went without a trace; writes never pause.
    watch = Watch(len(PREFIX), 16, last_seq_at_start=2, expected_keys={"v1.mdc.a", "v1.mdc.x"})
    await watch.on_message(message("v1.mdc.a", 2, 0, b"A"))
    # One value and one unseen key: two later messages at most.
    await watch.on_message(message("v1.mdc.a", 3, 5, b"A2"))
    assert not watch.listing_done.is_set()
    await watch.on_message(message("v1.mdc.b", 4, 5, b"B"))
    assert watch.listing_done.is_set()
    assert {e.key: e.value for e in watch.listing_entries} == {
        "v1.mdc.a": b"A2",
        "v1.mdc.b": b"B",
    }


async def test_live_messages_become_puts_and_removals_in_order() -> None:
    watch = Watch(len(PREFIX), 16, last_seq_at_start=0)
    watch.finish_initial()
    await watch.on_message(message("v1.instances.x", 1, 0, b"X"))
    await watch.on_message(message("v1.instances.x", 2, 0, b"", {"Nats-Marker-Reason": "MaxAge"}))
    await watch.on_message(message("v1.instances.y", 3, 0, b"", {"KV-Operation": "PURGE"}))
    put = watch.queue.get_nowait()
    expired = watch.queue.get_nowait()
    purged = watch.queue.get_nowait()
    assert isinstance(put, SourcePut)
    assert put.entry.value == b"X"
    assert isinstance(expired, SourceDelete)
    assert (expired.key, expired.operation, expired.revision) == ("v1.instances.x", "expired", 2)
    assert isinstance(purged, SourceDelete)
    assert purged.operation == "purge"


async def test_a_full_queue_holds_the_delivery_back_instead_of_dropping() -> None:
    watch = Watch(len(PREFIX), 1, last_seq_at_start=0)
    watch.finish_initial()
    await watch.on_message(message("v1.mdc.a", 1, 0))
    blocked = asyncio.create_task(watch.on_message(message("v1.mdc.b", 2, 0)))
    await asyncio.sleep(0)
    assert not blocked.done()
    first = watch.queue.get_nowait()
    await asyncio.wait_for(blocked, 5)
    second = watch.queue.get_nowait()
    assert [first.entry.key, second.entry.key] == ["v1.mdc.a", "v1.mdc.b"]  # type: ignore[union-attr]


async def test_a_stopped_watch_ignores_late_messages() -> None:
    watch = Watch(len(PREFIX), 4, last_seq_at_start=0)
    watch.finish_initial()
    watch.stopped = True
    await watch.on_message(message("v1.mdc.a", 1, 0))
    assert watch.queue.empty()


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"options": None, "connector": None},
        {"connector": object(), "key_prefixes": ()},
        {"connector": object(), "queue_size": 0},
        {"connector": object(), "health_interval": 0},
    ],
)
def test_misconfigured_sources_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        JetStreamDiscoverySource(**kwargs)


async def test_events_may_be_iterated_only_once() -> None:
    async def never(_callbacks: object) -> Any:
        await asyncio.Event().wait()

    source = JetStreamDiscoverySource(connector=never)
    first = source.events()
    task = asyncio.create_task(anext(first))
    await asyncio.sleep(0)
    with pytest.raises(UsageError):
        await anext(source.events())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await source.close()


async def test_with_client_side_filtering_foreign_keys_are_dropped_but_end_the_listing() -> None:
    watch = Watch(len(PREFIX), 8, last_seq_at_start=9, key_prefixes=("v1.mdc.", "v1.instances."))
    await watch.on_message(message("v1.mdc.a", 2, 1, b"A"))
    await watch.on_message(message("other.thing", 3, 0, b"O"))
    assert watch.listing_done.is_set()
    assert [e.key for e in watch.listing_entries] == ["v1.mdc.a"]
    await watch.on_message(message("v1.mdcX.b", 10, 0, b"B"))
    await watch.on_message(message("v1.instances.c", 11, 0, b"C"))
    live = watch.queue.get_nowait()
    assert isinstance(live, SourcePut)
    assert live.entry.key == "v1.instances.c"
    assert watch.queue.empty()


async def test_the_initial_values_are_handed_over_once_and_not_kept_by_the_watch() -> None:
    watch = Watch(len(PREFIX), 4, last_seq_at_start=2)
    await watch.on_message(message("v1.mdc.a", 1, 1, b"A"))
    await watch.on_message(message("v1.mdc.b", 2, 0, b"B"))
    entries = watch.take_listing()
    assert [e.value for e in entries] == [b"A", b"B"]
    assert watch.take_listing() == ()


class _State:
    def __init__(self, last_seq: int) -> None:
        self.last_seq = last_seq


class _Info:
    def __init__(self, created: str, last_seq: int) -> None:
        self.created = created
        self.state = _State(last_seq)


class _RacingJetStream:
    """Answers stream_info with the stream as it was when asked, while a newer message lands."""

    def __init__(self, watch: Watch, created: str, last_seq: int) -> None:
        self._watch = watch
        self._created = created
        self._last_seq = last_seq

    async def stream_info(self, name: str) -> _Info:
        answer = _Info(self._created, self._last_seq)
        # A heartbeat stored after the server answered is delivered before the answer is read.
        await self._watch.on_message(message("v1.mdc.a", self._last_seq + 1, 0, b"A"))
        return answer


class _RacingClient:
    is_connected = True

    def __init__(self, js: _RacingJetStream) -> None:
        self._js = js

    def jetstream(self, timeout: float) -> _RacingJetStream:
        return self._js


def _racing_source(watch: Watch, created: str, last_seq: int) -> JetStreamDiscoverySource:
    async def never(_: Any) -> Any:
        raise AssertionError("no connection is opened")

    source = JetStreamDiscoverySource(connector=never, bucket="disc")
    source._nc = _RacingClient(_RacingJetStream(watch, created, last_seq))  # type: ignore[assignment]
    source._stream_created = "T1"
    return source


async def test_a_delivery_during_the_stream_check_is_not_taken_for_a_new_stream() -> None:
    watch = Watch(len(PREFIX), 16, last_seq_at_start=0)
    watch.finish_initial()
    await watch.on_message(message("v1.mdc.a", 40, 0, b"A"))
    source = _racing_source(watch, "T1", last_seq=40)
    assert not await source._stream_changed(watch)
    assert watch.last_seen_seq == 41


async def test_a_stream_shorter_than_what_was_delivered_or_newly_created_is_a_change() -> None:
    watch = Watch(len(PREFIX), 16, last_seq_at_start=0)
    watch.finish_initial()
    await watch.on_message(message("v1.mdc.a", 40, 0, b"A"))
    assert await _racing_source(watch, "T1", last_seq=3)._stream_changed(watch)
    assert await _racing_source(watch, "T2", last_seq=50)._stream_changed(watch)


class _SubjectsState:
    def __init__(self, subjects: dict[str, int]) -> None:
        self.subjects = subjects


class _SubjectsInfo:
    def __init__(self, subjects: dict[str, int]) -> None:
        self.state = _SubjectsState(subjects)


class _HeldKeys:
    """A server that answers which keys the stream holds now (``stream_info`` with subjects)."""

    is_connected = True

    def __init__(self, held: set[str]) -> None:
        self.held = held
        self.asked = 0

    def jetstream(self, timeout: float) -> _HeldKeys:
        return self

    async def stream_info(self, name: str, subjects_filter: str | None = None) -> _SubjectsInfo:
        assert subjects_filter == PREFIX + ">"
        self.asked += 1
        return _SubjectsInfo({PREFIX + key: 1 for key in self.held})


def _asking_source(server: _HeldKeys | None) -> JetStreamDiscoverySource:
    async def never(_callbacks: object) -> Any:
        raise AssertionError("not connected in this test")

    source = JetStreamDiscoverySource(connector=never, bucket="disc")
    source._nc = server  # type: ignore[assignment]
    return source


async def test_a_listing_that_only_waits_for_keys_gone_without_a_trace_ends_when_quiet() -> None:
    server = _HeldKeys({"v1.mdc.a"})
    source = _asking_source(server)
    watch = Watch(len(PREFIX), 16, last_seq_at_start=1, expected_keys={"v1.mdc.a", "v1.mdc.x"})
    await watch.on_message(message("v1.mdc.a", 1, 0, b"A"))
    assert watch.listing_stalled()
    # x never comes and nothing else is delivered; the server no longer holds it: the source
    # ends the listing without it.
    await asyncio.wait_for(source._initial_values(watch), 5)
    assert watch.listing_done.is_set()
    assert [e.key for e in watch.listing_entries] == ["v1.mdc.a"]
    assert server.asked == 1


async def test_a_quiet_link_is_not_taken_for_keys_gone_while_the_server_holds_them() -> None:
    # The cluster soak's seed 4902: a writer restarted just before rewrote every key between
    # the source reading the bucket's keys (last sequence 3) and creating its consumer, so
    # every value at the start is newer than 3 and the first one reads as "all in"; then the
    # lossy link pauses for longer than the quiet time. The server still holds b and c: the
    # listing waits for them instead of ending without them (it used to end with a alone, and
    # the resync removed b's and c's workers, to add them back a moment later).
    keys = {"v1.mdc.a", "v1.mdc.b", "v1.mdc.c"}
    server = _HeldKeys(set(keys))
    source = _asking_source(server)
    watch = Watch(len(PREFIX), 16, last_seq_at_start=3, expected_keys=keys)
    await watch.on_message(message("v1.mdc.a", 4, 2, b"A"))
    assert watch.listing_stalled()
    listing = asyncio.create_task(source._initial_values(watch))
    await asyncio.sleep(LISTING_QUIET * 3)
    assert not watch.listing_done.is_set()
    assert server.asked >= 2
    await watch.on_message(message("v1.mdc.b", 5, 1, b"B"))
    await watch.on_message(message("v1.mdc.c", 6, 0, b"C"))
    await asyncio.wait_for(listing, 5)
    assert {e.key: e.value for e in watch.listing_entries} == {
        "v1.mdc.a": b"A",
        "v1.mdc.b": b"B",
        "v1.mdc.c": b"C",
    }


async def test_a_listing_whose_server_cannot_answer_keeps_waiting() -> None:
    # No answer (the link down, or no connection): nothing is given up on quiet alone.
    source = _asking_source(None)
    watch = Watch(len(PREFIX), 16, last_seq_at_start=1, expected_keys={"v1.mdc.a", "v1.mdc.x"})
    await watch.on_message(message("v1.mdc.a", 1, 0, b"A"))
    listing = asyncio.create_task(source._initial_values(watch))
    await asyncio.sleep(LISTING_QUIET * 3)
    assert not watch.listing_done.is_set()
    await watch.on_message(message("v1.mdc.x", 2, 0, b"X"))
    await asyncio.wait_for(listing, 5)
    assert sorted(e.key for e in watch.listing_entries) == ["v1.mdc.a", "v1.mdc.x"]


def test_the_watch_accounts_only_for_a_stream_unchanged_since_it_last_accounted_for_it() -> None:
    start = StreamSummary(created="c", last_seq=3, messages=3)
    watch = Watch(len(PREFIX), 16, 3, stream_at_start=start)
    assert watch.accounts_for(start)
    assert not watch.accounts_for(StreamSummary("c", 3, 2))  # removed without a marker
    assert not watch.accounts_for(StreamSummary("c", 4, 3))  # written
    assert not watch.accounts_for(StreamSummary("another stream", 3, 3))
    watch.rebase(StreamSummary("c", 4, 3))
    assert watch.accounts_for(StreamSummary("c", 4, 3))
    assert not Watch(len(PREFIX), 16, 3).accounts_for(start)  # nothing to compare with
