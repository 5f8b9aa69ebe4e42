"""One incarnation of the discovery watch: the initial values, then live events, from a consumer.

A :class:`Watch` turns the messages of one ordered push consumer into discovery entries. It
takes them by one of two paths:

* ``on_message``: nats-py's ordinary callback, with nats-py's ordered-consumer machinery
  (flow control, heartbeats, sequence checks) in front of it;
* ``on_raw``: straight from the protocol parser through
  :class:`~.raw_delivery.RawDeliveryClient`, with no ``Msg`` object, no per-subscription queue and
  no coroutine per message. On this path the watch is the ordered consumer itself: it answers
  flow-control requests and stalled heartbeats, checks that consumer sequences follow each
  other without a gap, and notes when the consumer last showed signs of life. A gap or a
  silent consumer is reported through ``broken`` and the source re-creates the watch (a new
  listing), where nats-py would quietly re-create the consumer mid-stream.

Back-pressure on the raw path: live events go into an unbounded queue, and while it holds
``queue_size`` events or more, flow-control answers are held back, so the server stops
delivering after its flow-control window; the reader releases them once it has caught up.
The raw path never waits inside the parser (a wait there would stop every reply on the
connection, the listing the reader may be waiting for included).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Final, NamedTuple

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js.api import Header
from workerset_admission.adapters.nats.kv import removal_kind
from workerset_admission.ports import DiscoveryEntry, SourceDelete, SourceEvent, SourcePut

__all__ = ["WAKE", "StreamSummary", "Wake", "Watch", "parse_delivery"]

# A consumer is given up after this many heartbeat periods without a message or heartbeat, as
# nats-py's ordered consumer does.
SILENT_HEARTBEATS: Final = 2


class Wake:
    """Queue item that only wakes the reader so it looks at the restart flag."""


WAKE: Final = Wake()

_ACK_PREFIX: Final = b"$JS.ACK."
_CONTROL_STATUS: Final = "100"


class StreamSummary(NamedTuple):
    """What one stream info answer says of the stream, in constant size (no subjects)."""

    created: object
    last_seq: int
    messages: int


class _Delivery(NamedTuple):
    # A named tuple: one is made for every message, and a tuple is built in one step.
    stream_seq: int
    pending: int
    timestamp_ns: int


def parse_delivery(reply: str) -> _Delivery | None:
    """Read stream sequence, pending count and timestamp from a JetStream ack subject."""
    tokens = reply.split(".")
    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>, or the newer form
    # with domain and account hash after ACK and a random token at the end.
    n = len(tokens)
    try:
        if n == 9:
            return _Delivery(int(tokens[5]), int(tokens[8]), int(tokens[7]))
        if n >= 11:
            return _Delivery(int(tokens[7]), int(tokens[10]), int(tokens[9]))
    except ValueError:
        return None
    return None


class Watch:
    """One consumer incarnation: collects the initial values, then queues live events."""

    def __init__(
        self,
        key_offset: int,
        queue_size: int,
        last_seq_at_start: int,
        key_prefixes: tuple[str, ...] | None = None,
        expected_keys: Collection[str] | None = None,
        stream_at_start: StreamSummary | None = None,
    ) -> None:
        self.key_offset = key_offset
        self.key_prefixes = key_prefixes
        self.queue_size = queue_size
        self.queue: asyncio.Queue[SourceEvent | Wake] = asyncio.Queue(queue_size)
        self.initial: dict[str, DiscoveryEntry | None] | None = {}
        self.last_seq_at_start = last_seq_at_start
        # The keys the bucket held just before the consumer was created, not yet delivered.
        self._unseen: set[str] | None = None if expected_keys is None else set(expected_keys)
        # Newer messages the listing may still take in once the values at the start are in.
        self._listing_rest: int | None = None
        self.listing_done = asyncio.Event()
        self.last_seen_seq = 0
        self.stopped = False
        self.subscription: Subscription | None = None
        # How many disconnections the source had seen when this watch was created.
        self.epoch = 0
        # The raw path's own ordered-consumer state (unused on the callback path).
        self.raw = False
        self.next_consumer_seq = 1
        self.last_activity = time.monotonic()
        self.held_replies: list[str] = []
        self._suspect = False
        self._publish: Callable[[str], Awaitable[None]] | None = None
        self._broken: Callable[[str], None] | None = None
        # Takes the raw handler off the client once the watch is stopped.
        self.detach: Callable[[], None] | None = None
        # The consumer's name, and the subscription to the server's notice of its deletion.
        self.consumer = ""
        self.deletion: Subscription | None = None
        # The consumer sequence the last idle heartbeat confirmed as all sent, and when.
        self.confirmed_seq = -1
        self.confirmed_at = float("-inf")
        # The stream's state when the watch last accounted for all of it: read just before the
        # consumer was created (the listing stands for it), then at each quiet check.
        self.stream_base = stream_at_start

    def confirmed_idle(self, now: float, idle_heartbeat: float) -> bool:
        """Whether a recent idle heartbeat said the consumer sent exactly what arrived since."""
        return (
            self.raw
            and self.confirmed_seq == self.next_consumer_seq - 1
            and now - self.confirmed_at <= SILENT_HEARTBEATS * idle_heartbeat
        )

    def use_raw(
        self, publish: Callable[[str], Awaitable[None]], broken: Callable[[str], None]
    ) -> None:
        """Take messages through ``on_raw``: answer flow control with ``publish``, report gaps."""
        self.raw = True
        self._publish = publish
        self._broken = broken
        # Unbounded: the raw path cannot wait for room; held flow-control answers bound it.
        self.queue = asyncio.Queue()

    def finish_initial(self) -> None:
        if self.initial is not None:
            self.listing_entries = [e for e in self.initial.values() if e is not None]
            self.initial = None
            # Emptied key by key, the set still has the table the whole bucket's keys needed.
            self._unseen = None
            self.listing_done.set()

    listing_entries: list[DiscoveryEntry]

    def take_listing(self) -> tuple[DiscoveryEntry, ...]:
        """Hand the initial values over once; the watch keeps no reference to the raw values."""
        entries = tuple(self.listing_entries)
        self.listing_entries = []
        return entries

    def accounts_for(self, now: StreamSummary) -> bool:
        """Whether the stream's state ``now`` holds nothing the watch has not taken in.

        The stream state it last accounted for must be the same: any message stored since
        raises the last sequence, and any message removed since lowers the count with the last
        sequence unchanged, a removal that left no marker (a subject purged, a message deleted
        by sequence, a key aged out under a max age, a marker's own lapse) as much as any other.
        A change the watch did hear is not told apart from one it could not: both are listed
        once (a stream's constant-size state cannot say which subjects a count came from), and
        the state after it is accounted for from then on (:meth:`rebase`).
        """
        return self.stream_base is not None and self.stream_base == now

    def rebase(self, now: StreamSummary) -> None:
        """Take ``now`` as accounted for: the reconciliation this check answered lists it."""
        self.stream_base = now

    def silent_for(self, now: float, idle_heartbeat: float) -> bool:
        """Tell whether a raw consumer has shown no sign of life for too long."""
        return self.raw and now - self.last_activity > SILENT_HEARTBEATS * idle_heartbeat

    def looks_dead(self, now: float, idle_heartbeat: float) -> bool:
        """Silent at this check and at the one before it (about a heartbeat period apart).

        One silent check is not enough: after the event loop was held up (a large listing
        applied, a loaded machine), the check may run before the parser has read the heartbeats
        waiting on the socket. By the next check they have been read.
        """
        if not self.silent_for(now, idle_heartbeat):
            self._suspect = False
            return False
        if self._suspect:
            return True
        self._suspect = True
        return False

    # -- the callback path -------------------------------------------------------------------

    async def on_message(self, msg: Msg) -> None:
        if self.stopped:
            return
        delivery = parse_delivery(msg.reply) if msg.reply else None
        if delivery is None:
            return
        event = self._take(
            msg.subject[self.key_offset :],
            msg.data,
            delivery.stream_seq,
            delivery.pending,
            delivery.timestamp_ns,
            msg.headers,
        )
        if event is not None:
            # A full queue blocks nats-py's delivery task; flow control then holds the server
            # back, so memory stays bounded and nothing is lost.
            await self.queue.put(event)

    # -- the raw path ------------------------------------------------------------------------

    def on_raw(
        self, subject: bytes, reply: bytes, data: bytes, headers: dict[str, str] | None
    ) -> Awaitable[None] | None:
        """Take one message from the parser; return what must be awaited, if anything."""
        if self.stopped:
            return None
        if not reply.startswith(_ACK_PREFIX):
            return self._on_control(reply, data, headers)
        tokens = reply.split(b".")
        n = len(tokens)
        try:
            if n == 9:
                stream_seq, consumer_seq = int(tokens[5]), int(tokens[6])
                timestamp_ns, pending = int(tokens[7]), int(tokens[8])
            elif n >= 11:
                stream_seq, consumer_seq = int(tokens[7]), int(tokens[8])
                timestamp_ns, pending = int(tokens[9]), int(tokens[10])
            else:
                return None
        except ValueError:
            return None
        if consumer_seq != self.next_consumer_seq:
            self._report_broken(
                f"delivery gap: consumer sequence {consumer_seq}, expected {self.next_consumer_seq}"
            )
            return None
        self.next_consumer_seq = consumer_seq + 1
        key = subject[self.key_offset :].decode("utf-8", "surrogateescape")
        event = self._take(key, data, stream_seq, pending, timestamp_ns, headers)
        if event is not None:
            self.queue.put_nowait(event)
        return None

    def _on_control(
        self, reply: bytes, data: bytes, headers: dict[str, str] | None
    ) -> Awaitable[None] | None:
        # A status message: "100 FlowControl Request" (answer to its reply subject) or
        # "100 Idle Heartbeat" (it names the last consumer sequence sent, and when the
        # consumer waits for a flow-control answer, the subject to send it to).
        if data or not headers or headers.get(Header.STATUS) != _CONTROL_STATUS:
            return None
        self.last_activity = time.monotonic()
        description = headers.get(Header.DESCRIPTION, "")
        if description.startswith("Flow") and reply:
            return self._answer(reply.decode())
        if description.startswith("Idle"):
            last = headers.get(Header.LAST_CONSUMER)
            if last is not None and last.isdigit() and int(last) != self.next_consumer_seq - 1:
                self._report_broken(
                    f"heartbeat says consumer sequence {last} was sent, "
                    f"{self.next_consumer_seq - 1} arrived"
                )
                return None
            stalled = headers.get(Header.CONSUMER_STALLED)
            if stalled:
                return self._answer(stalled)
            # An idle consumer that has sent exactly what arrived: nothing is pending or lost.
            self.confirmed_seq = self.next_consumer_seq - 1
            self.confirmed_at = self.last_activity
        return None

    def _answer(self, subject: str) -> Awaitable[None] | None:
        if self.queue.qsize() >= self.queue_size:
            # The reader is behind: the server waits for this answer before sending more.
            if subject not in self.held_replies:
                self.held_replies.append(subject)
            return None
        assert self._publish is not None
        return self._publish(subject)

    async def release_held(self) -> None:
        """Send the flow-control answers held back, once the reader has caught up."""
        if not self.held_replies or self.queue.qsize() > self.queue_size // 2:
            return
        held, self.held_replies = self.held_replies, []
        assert self._publish is not None
        for subject in held:
            # On a connection that is gone: the watch is re-created with the connection, and
            # a consumer left waiting for its answer falls silent, which re-creates it too.
            with contextlib.suppress(NatsError, OSError):
                await self._publish(subject)

    def _report_broken(self, why: str) -> None:
        # Nothing after a gap can be trusted: stop, and wake whoever waits on this watch.
        self.stopped = True
        self.listing_done.set()
        self.wake()
        if self._broken is not None:
            self._broken(why)

    # -- shared ------------------------------------------------------------------------------

    def _take(
        self,
        key: str,
        value: bytes,
        stream_seq: int,
        pending: int,
        timestamp_ns: int,
        headers: Mapping[str, str] | None,
    ) -> SourceEvent | None:
        """Record one message; return the live event to queue, if it is one."""
        self.last_seen_seq = stream_seq
        now = time.monotonic()
        self.last_activity = now
        if self.key_prefixes is not None and not key.startswith(self.key_prefixes):
            # A key outside the filters (only with the single-filter fallback): it still counts
            # for the end of the initial values.
            if self.initial is not None and self._ends_listing(key, stream_seq, pending):
                self.finish_initial()
            return None
        kind = removal_kind(headers)
        made = None
        if kind is None:
            made = DiscoveryEntry(key, value, stream_seq, headers, now, timestamp_ns / 1e9)
        initial = self.initial
        if initial is not None:
            # A removal among the initial values leaves the key out of the listing.
            initial[key] = made
            if self._ends_listing(key, stream_seq, pending):
                self.finish_initial()
            return None
        if made is not None:
            return SourcePut(made)
        assert kind is not None
        return SourceDelete(
            key=key, revision=stream_seq, operation=kind, headers=headers, received_at=now
        )

    def _ends_listing(self, key: str, stream_seq: int, pending: int) -> bool:
        """Whether the initial values are complete with this message (one of them).

        The consumer delivers the last value of every key as of its creation, then what came
        later. A key rewritten meanwhile (a registration's heartbeat) loses its older value,
        which the bucket keeps no longer, so it is never delivered among the values at the
        start: it lives on only in a later message. A listing that ended with the values at the
        start would leave such a key out, to arrive a moment later as a live put: this frontend
        would then observe that worker after the others, not in key order as a frontend whose
        listing was quiet does, and a reconnect listing would drop a live worker and add it back.
        The consumer's pending count cannot close that gap: the server counts messages stored
        during the delivery a little late.

        So the source reads which keys the bucket holds just before creating the consumer
        (``expected_keys``), and the listing goes on, taking later messages in, until every one
        of them has been delivered: it then stands for the bucket a moment after the start, with
        every key. It is bounded all the same: after the values at the start, it takes in at most
        as many later messages as it holds keys (a whole round of rewrites, far more than
        heartbeats write while a listing is read), and when the consumer goes quiet with keys
        still unseen the source asks the server which of them the stream still holds and gives
        up only the others (removed without a trace, as an age limit does: :meth:`give_up`).
        "All in" is judged by the first message with nothing pending or newer than the stream's
        last sequence when the keys were read; a writer that rewrote the bucket in between makes
        every value at the start newer than that, so "all in" can come while values at the start
        are still on their way: a quiet moment then is a slow link, not a removal, and the
        server's answer tells the two apart. Without ``expected_keys`` it ends with the values
        at the start.
        """
        unseen = self._unseen
        if unseen is not None:
            unseen.discard(key)
        if self._listing_rest is None:
            if pending != 0 and not stream_seq > self.last_seq_at_start > 0:
                return False
            # The values at the start are all in (this one may be the first later message).
            if not unseen:
                return True
            self._listing_rest = len(self.initial or ()) + len(unseen)
            return False
        self._listing_rest -= 1
        return not unseen or self._listing_rest <= 0

    def unseen_keys(self) -> frozenset[str]:
        """Return the keys the bucket held at the start that the listing has not had yet."""
        return frozenset(self._unseen or ())

    def give_up(self, keys: Collection[str]) -> None:
        """Stop waiting for ``keys`` (gone from the stream without a trace); end when none is left.

        Only the source decides this, having asked the server: quiet alone never does.
        """
        unseen = self._unseen
        if unseen is None or self.initial is None:
            return
        unseen.difference_update(keys)
        if not unseen:
            self.finish_initial()

    def listing_stalled(self) -> bool:
        """Whether the values at the start are in and the listing only waits for unseen keys."""
        return self.initial is not None and self._listing_rest is not None

    def wake(self) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(WAKE)
