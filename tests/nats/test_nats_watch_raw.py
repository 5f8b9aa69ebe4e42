"""The watch's raw path: messages straight from the parser, the watch as the ordered consumer."""

from __future__ import annotations

import asyncio
import time
from importlib.metadata import version

import pytest
from nats.js.api import Header
from workerset_admission.adapters.nats.raw_delivery import RAW_DELIVERY, RawDeliveryClient
from workerset_admission.adapters.nats.watch import SILENT_HEARTBEATS, Watch
from workerset_admission.ports import SourceDelete, SourcePut

PREFIX = b"$KV.disc."


class Recorder:
    """What the watch asked for: flow-control answers sent, and why it said it was broken."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.broken: list[str] = []

    async def publish(self, subject: str) -> None:
        self.sent.append(subject)


def raw_watch(queue_size: int = 16, last_seq_at_start: int = 0) -> tuple[Watch, Recorder]:
    watch = Watch(len(PREFIX), queue_size, last_seq_at_start)
    recorder = Recorder()
    watch.use_raw(recorder.publish, recorder.broken.append)
    return watch, recorder


def reply(stream_seq: int, consumer_seq: int, pending: int) -> bytes:
    return f"$JS.ACK.KV_disc.c.1.{stream_seq}.{consumer_seq}.1700000000000000000.{pending}".encode()


def control(description: str, **extra: str) -> dict[str, str]:
    return {Header.STATUS: "100", Header.DESCRIPTION: description, **extra}


async def settle(follow_up: object) -> None:
    if follow_up is not None:
        await follow_up  # type: ignore[misc]


# The nats-py releases whose private _process_msg and _process_headers were read and found in
# the shape the raw path relies on (2.9.0, 2.12.0 and 2.16.0 among them; unchanged in between).
_CHECKED_UP_TO = (2, 16, 0)


def test_the_installed_nats_py_has_the_parser_hooks_the_raw_path_relies_on() -> None:
    installed = tuple(int(part) for part in version("nats-py").split(".")[:3] if part.isdigit())
    if installed <= _CHECKED_UP_TO:
        assert RAW_DELIVERY
    else:
        # A release newer than those checked: whatever its shape, the client must not claim
        # the raw path unless the shape is there (the source then keeps the callback path).
        class Sub:
            _id = 1

        assert RawDeliveryClient().deliver_raw(Sub(), lambda *_: None) is RAW_DELIVERY  # type: ignore[arg-type]


async def test_a_subscription_without_a_numeric_id_is_refused_and_keeps_nats_pys_path() -> None:
    class Odd:
        _id = "not a sid"

    client = RawDeliveryClient()
    assert not client.deliver_raw(Odd(), lambda *_: None)  # type: ignore[arg-type]
    assert client._raw_handlers == {}


async def test_initial_values_arrive_as_entries_and_nothing_pending_ends_them() -> None:
    watch, recorder = raw_watch(last_seq_at_start=9)
    assert watch.on_raw(PREFIX + b"v1.mdc.a", reply(3, 1, 1), b"A", None) is None
    assert not watch.listing_done.is_set()
    watch.on_raw(PREFIX + b"v1.mdc.b", reply(5, 2, 0), b"B", {"traceparent": "t"})
    assert watch.listing_done.is_set()
    entries = {e.key: e for e in watch.take_listing()}
    assert {k: e.value for k, e in entries.items()} == {"v1.mdc.a": b"A", "v1.mdc.b": b"B"}
    assert entries["v1.mdc.b"].revision == 5
    assert entries["v1.mdc.b"].headers == {"traceparent": "t"}
    assert recorder.sent == recorder.broken == []


async def test_live_puts_and_removals_are_queued_in_order_without_waiting() -> None:
    watch, _ = raw_watch(queue_size=1)
    watch.finish_initial()
    watch.on_raw(PREFIX + b"v1.instances.x", reply(1, 1, 0), b"X", None)
    watch.on_raw(PREFIX + b"v1.instances.x", reply(2, 2, 0), b"", {"Nats-Marker-Reason": "MaxAge"})
    # The queue is past its size: the raw path still takes the message (it must never wait
    # inside the parser) and holds the server back through flow control instead.
    watch.on_raw(PREFIX + b"v1.mdc.y", reply(3, 3, 0), b"", {"KV-Operation": "DEL"})
    put, expired, deleted = (watch.queue.get_nowait() for _ in range(3))
    assert isinstance(put, SourcePut)
    assert put.entry.key == "v1.instances.x"
    assert isinstance(expired, SourceDelete)
    assert (expired.key, expired.operation, expired.revision) == ("v1.instances.x", "expired", 2)
    assert isinstance(deleted, SourceDelete)
    assert deleted.operation == "delete"


async def test_a_flow_control_request_is_answered_at_once_while_the_reader_keeps_up() -> None:
    watch, recorder = raw_watch()
    watch.finish_initial()
    await settle(
        watch.on_raw(b"_INBOX.x", b"$JS.FC.KV_disc.c.1", b"", control("FlowControl Request"))
    )
    assert recorder.sent == ["$JS.FC.KV_disc.c.1"]


async def test_flow_control_is_held_while_the_reader_is_behind_and_released_after() -> None:
    watch, recorder = raw_watch(queue_size=4)
    watch.finish_initial()
    for seq in range(1, 6):
        watch.on_raw(PREFIX + f"v1.mdc.k{seq}".encode(), reply(seq, seq, 0), b"v", None)
    request = control("FlowControl Request")
    assert watch.on_raw(b"_INBOX.x", b"$JS.FC.one", b"", request) is None
    stalled = control(
        "Idle Heartbeat", **{Header.LAST_CONSUMER: "5", Header.CONSUMER_STALLED: "$JS.FC.one"}
    )
    assert watch.on_raw(b"_INBOX.x", b"", b"", stalled) is None
    assert recorder.sent == []
    assert watch.held_replies == ["$JS.FC.one"]
    await watch.release_held()
    assert recorder.sent == []  # five queued, more than half of four: still behind
    for _ in range(4):
        watch.queue.get_nowait()
    await watch.release_held()
    assert recorder.sent == ["$JS.FC.one"]
    assert watch.held_replies == []


async def test_a_stalled_heartbeat_is_answered_like_a_flow_control_request() -> None:
    watch, recorder = raw_watch()
    watch.finish_initial()
    heartbeat = control(
        "Idle Heartbeat", **{Header.LAST_CONSUMER: "0", Header.CONSUMER_STALLED: "$JS.FC.two"}
    )
    await settle(watch.on_raw(b"_INBOX.x", b"", b"", heartbeat))
    assert recorder.sent == ["$JS.FC.two"]
    assert recorder.broken == []


async def test_a_skipped_consumer_sequence_stops_the_watch_and_reports_it() -> None:
    watch, recorder = raw_watch(last_seq_at_start=10)
    watch.on_raw(PREFIX + b"v1.mdc.a", reply(3, 1, 5), b"A", None)
    watch.on_raw(PREFIX + b"v1.mdc.b", reply(4, 3, 4), b"B", None)
    assert watch.stopped
    assert watch.listing_done.is_set()  # whoever waits for the initial values wakes
    assert recorder.broken == ["delivery gap: consumer sequence 3, expected 2"]
    assert watch.initial is not None  # the initial values were never declared complete
    watch.on_raw(PREFIX + b"v1.mdc.c", reply(5, 2, 3), b"C", None)
    assert watch.initial == {"v1.mdc.a": watch.initial["v1.mdc.a"]}


async def test_a_heartbeat_naming_a_sequence_that_never_arrived_reports_a_gap() -> None:
    watch, recorder = raw_watch()
    watch.finish_initial()
    watch.on_raw(PREFIX + b"v1.mdc.a", reply(1, 1, 0), b"A", None)
    watch.on_raw(b"_INBOX.x", b"", b"", control("Idle Heartbeat", **{Header.LAST_CONSUMER: "1"}))
    assert recorder.broken == []
    watch.on_raw(b"_INBOX.x", b"", b"", control("Idle Heartbeat", **{Header.LAST_CONSUMER: "3"}))
    assert recorder.broken == ["heartbeat says consumer sequence 3 was sent, 1 arrived"]
    assert watch.stopped


@pytest.mark.parametrize(
    ("data", "headers"),
    [
        (b"", None),
        (b"", {Header.STATUS: "404", Header.DESCRIPTION: "No Messages"}),
        (b"payload", {Header.STATUS: "100", Header.DESCRIPTION: "FlowControl Request"}),
        (
            b"",
            {Header.STATUS: "100", Header.DESCRIPTION: "Idle Heartbeat", Header.LAST_CONSUMER: "x"},
        ),
    ],
)
async def test_messages_that_are_neither_deliveries_nor_control_change_nothing(
    data: bytes, headers: dict[str, str] | None
) -> None:
    watch, recorder = raw_watch()
    assert watch.on_raw(b"_INBOX.x", b"$JS.FC.x" if data else b"", data, headers) is None
    assert watch.initial == {}
    assert recorder.sent == recorder.broken == []
    assert not watch.stopped


@pytest.mark.parametrize("bad", [b"$JS.ACK.a.b.c.x.y.z.w", b"$JS.ACK.a.b.c.d"])
async def test_an_unreadable_ack_subject_is_ignored_on_the_raw_path(bad: bytes) -> None:
    watch, recorder = raw_watch()
    assert watch.on_raw(PREFIX + b"v1.mdc.a", bad, b"A", None) is None
    assert watch.initial == {}
    assert watch.next_consumer_seq == 1
    assert recorder.broken == []


async def test_a_key_that_is_not_utf8_is_kept_for_the_key_parser_to_refuse() -> None:
    watch, _ = raw_watch()
    watch.finish_initial()
    watch.on_raw(PREFIX + b"v1.mdc.\xff", reply(1, 1, 0), b"A", None)
    event = watch.queue.get_nowait()
    assert isinstance(event, SourcePut)
    assert event.entry.key == "v1.mdc.\udcff"


async def test_a_raw_consumer_is_silent_after_two_heartbeat_periods_without_a_sign_of_life() -> (
    None
):
    watch, _ = raw_watch()
    start = watch.last_activity
    assert not watch.silent_for(start + SILENT_HEARTBEATS * 1.0 - 0.01, 1.0)
    assert watch.silent_for(start + SILENT_HEARTBEATS * 1.0 + 0.01, 1.0)
    watch.last_activity = 0.0
    assert watch.silent_for(time.monotonic(), 1.0)
    watch.on_raw(b"_INBOX.x", b"", b"", control("Idle Heartbeat"))
    assert not watch.silent_for(time.monotonic(), 1.0)  # a heartbeat is a sign of life
    # The callback path leaves liveness to nats-py's own ordered consumer.
    plain = Watch(len(PREFIX), 4, 0)
    assert not plain.silent_for(plain.last_activity + 3600, 1.0)


async def test_a_consumer_looks_dead_only_when_two_checks_in_a_row_find_it_silent() -> None:
    watch, _ = raw_watch()
    late = watch.last_activity + 10.0
    assert not watch.looks_dead(late, 1.0)  # the first silent check only raises suspicion
    # The heartbeats that waited on the socket while the loop was held up are read...
    watch.on_raw(b"_INBOX.x", b"", b"", control("Idle Heartbeat"))
    assert not watch.looks_dead(time.monotonic(), 1.0)
    # ...and the suspicion is cleared: one more silent check is again only a suspicion.
    assert not watch.looks_dead(watch.last_activity + 10.0, 1.0)
    assert watch.looks_dead(watch.last_activity + 11.0, 1.0)


async def test_a_stopped_raw_watch_ignores_late_messages() -> None:
    watch, recorder = raw_watch()
    watch.finish_initial()
    watch.stopped = True
    assert watch.on_raw(PREFIX + b"v1.mdc.a", reply(1, 1, 0), b"A", None) is None
    assert watch.on_raw(b"_INBOX.x", b"$JS.FC.x", b"", control("FlowControl Request")) is None
    assert watch.queue.empty()
    await asyncio.sleep(0)
    assert recorder.sent == []
