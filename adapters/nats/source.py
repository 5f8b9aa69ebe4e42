"""Discovery records from a JetStream KV bucket: one snapshot, then live puts and removals.

The watch is a raw ordered push consumer (deliver ``last_per_subject``) on the bucket's stream,
filtered to the discovery keys (model cards, endpoint instances, event sources and channels).
It skips nats-py's ``KeyWatcher`` layer, which costs more than half of the client's CPU for the
same messages (see the NATS reference notes). The end of the initial values is detected from the
delivery metadata: the first message with nothing pending, or the first one newer than the
stream's last sequence when the consumer was created (so a busy bucket cannot postpone the
snapshot forever).

When the connection drops, the watch stops at once and delivers nothing more; once the client
is back (and on a closed connection, and when the stream behind the bucket disappears or is
re-created, a wiped store), the watch is re-created and a new snapshot with reason
``"reconnect"`` is emitted. A server restart with a fresh store would otherwise leave nats-py's
ordered consumer silently waiting at the old sequence, and with the same store nats-py's own
consumer reset would deliver the outage's expiries as live removals ahead of the resync.

Oversized values are passed through unchanged. The card boundary refuses them with a typed
error carrying the key, so they are reported and counted in one place with every other invalid
record; the source only translates and never decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Final, Literal, NamedTuple

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import AuthorizationError, ConnectionClosedError, NoRespondersError
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError
from nats.js.errors import Error as JetStreamError
from workerset_admission.errors import UsageError
from workerset_admission.ports import (
    DiscoveryEntry,
    SourceDelete,
    SourceEvent,
    SourcePut,
    SourceSnapshot,
)

from .buckets import BucketSpec, ensure_bucket
from .connect import ConnectionCallbacks, NatsConnectOptions, connect
from .kv import removal_kind, stream_name, subject_prefix

__all__ = [
    "DEFAULT_BUCKET",
    "DEFAULT_KEY_PREFIXES",
    "Connector",
    "JetStreamDiscoverySource",
]

_log = logging.getLogger(__name__)

DEFAULT_BUCKET: Final = "dynamo-discovery"
DEFAULT_KEY_PREFIXES: Final = (
    "v1.mdc",
    "v1.instances",
    "v1.event_sources",
    "v1.event_channels",
)

Connector = Callable[[ConnectionCallbacks], Awaitable[NatsClient]]


class _Wake:
    """Queue item that only wakes the reader so it looks at the restart flag."""


_WAKE: Final = _Wake()
_RETRYABLE = (
    NotFoundError,
    ServiceUnavailableError,
    NoRespondersError,
    NatsTimeoutError,
    asyncio.TimeoutError,
    ConnectionClosedError,
    JetStreamError,
    NatsError,
    OSError,
)


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


_ENTRY_SLOTS: Final = tuple(
    vars(DiscoveryEntry)[name].__set__
    for name in ("key", "value", "revision", "headers", "received_at", "published_at")
)


def _entry(
    key: str,
    value: bytes,
    revision: int,
    headers: Mapping[str, str] | None,
    received_at: float,
    published_at: float,
) -> DiscoveryEntry:
    # One entry per initial value: its slots are written directly instead of through the
    # frozen dataclass __init__, which sets each field through object.__setattr__.
    entry = object.__new__(DiscoveryEntry)
    set_key, set_value, set_revision, set_headers, set_received, set_published = _ENTRY_SLOTS
    set_key(entry, key)
    set_value(entry, value)
    set_revision(entry, revision)
    set_headers(entry, headers)
    set_received(entry, received_at)
    set_published(entry, published_at)
    return entry


class _Watch:
    """One consumer incarnation: collects the initial values, then queues live events."""

    def __init__(
        self,
        key_offset: int,
        queue_size: int,
        last_seq_at_start: int,
        key_prefixes: tuple[str, ...] | None = None,
    ) -> None:
        self.key_offset = key_offset
        self.key_prefixes = key_prefixes
        self.queue: asyncio.Queue[SourceEvent | _Wake] = asyncio.Queue(queue_size)
        self.initial: dict[str, DiscoveryEntry | None] | None = {}
        self.last_seq_at_start = last_seq_at_start
        self.snapshot_done = asyncio.Event()
        self.last_seen_seq = 0
        self.stopped = False
        self.subscription: JetStreamContext.PushSubscription | None = None
        # How many disconnections the source had seen when this watch was created.
        self.epoch = 0

    def finish_initial(self) -> None:
        if self.initial is not None:
            self.snapshot_entries = [e for e in self.initial.values() if e is not None]
            self.initial = None
            self.snapshot_done.set()

    snapshot_entries: list[DiscoveryEntry]

    def take_snapshot(self) -> tuple[DiscoveryEntry, ...]:
        """Hand the initial values over once; the watch keeps no reference to the raw values."""
        entries = tuple(self.snapshot_entries)
        self.snapshot_entries = []
        return entries

    async def on_message(self, msg: Msg) -> None:
        if self.stopped:
            return
        delivery = parse_delivery(msg.reply) if msg.reply else None
        if delivery is None:
            return
        self.last_seen_seq = delivery.stream_seq
        key = msg.subject[self.key_offset :]
        if self.key_prefixes is not None and not key.startswith(self.key_prefixes):
            # A key outside the filters (only with the single-filter fallback): it still counts
            # for the end of the initial values.
            if self.initial is not None and delivery.pending == 0:
                self.finish_initial()
            return
        headers = msg.headers
        kind = removal_kind(headers)
        now = time.monotonic()
        initial = self.initial
        if initial is not None and delivery.stream_seq > self.last_seq_at_start > 0:
            # Newer than anything that existed when the consumer was created: the initial
            # values are complete and this message is already a live change.
            self.finish_initial()
            initial = None
        entry = None
        if kind is None:
            entry = _entry(
                key, msg.data, delivery.stream_seq, headers, now, delivery.timestamp_ns / 1e9
            )
        if initial is not None:
            # A removal among the initial values leaves the key out of the snapshot.
            initial[key] = entry
            if delivery.pending == 0:
                self.finish_initial()
            return
        event: SourceEvent
        if kind is None:
            assert entry is not None
            event = SourcePut(entry)
        else:
            event = SourceDelete(
                key=key,
                revision=delivery.stream_seq,
                operation=kind,
                headers=headers,
                received_at=now,
            )
        # A full queue blocks nats-py's delivery task; flow control then holds the server back,
        # so memory stays bounded and nothing is lost.
        await self.queue.put(event)

    def wake(self) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(_WAKE)


class JetStreamDiscoverySource:
    """A :class:`~workerset_admission.ports.DiscoverySource` over a JetStream KV bucket.

    ``events()`` may be iterated once; it owns the connection it opens and closes it when the
    iteration ends. ``list_all()`` reads the bucket through the same connection when one is
    open, or through a short-lived one otherwise.
    """

    def __init__(
        self,
        options: NatsConnectOptions | None = None,
        *,
        bucket: str = DEFAULT_BUCKET,
        key_prefixes: Sequence[str] | None = DEFAULT_KEY_PREFIXES,
        connector: Connector | None = None,
        create_bucket: bool = False,
        bucket_spec: BucketSpec | None = None,
        queue_size: int = 8192,
        health_interval: float = 10.0,
        bind_retry_initial: float = 0.1,
        bind_retry_max: float = 5.0,
        request_timeout: float = 5.0,
    ) -> None:
        if options is None and connector is None:
            raise UsageError("JetStreamDiscoverySource needs connect options or a connector")
        if key_prefixes is not None and not key_prefixes:
            raise UsageError("at least one key prefix is required (None watches every key)")
        if queue_size < 1 or health_interval <= 0 or bind_retry_initial <= 0:
            raise UsageError("queue size and intervals must be positive")
        self._options = options
        self._connector = connector
        self.bucket = bucket
        self._subject_prefix = subject_prefix(bucket)
        if key_prefixes is None:
            self._filters = [f"{self._subject_prefix}>"]
            self._key_prefixes: tuple[str, ...] = ()
        else:
            self._filters = [f"{self._subject_prefix}{p}.>" for p in key_prefixes]
            self._key_prefixes = tuple(f"{p}." for p in key_prefixes)
        self._create_bucket = create_bucket
        self._bucket_spec = bucket_spec or BucketSpec(name=bucket)
        self._queue_size = queue_size
        self._health_interval = health_interval
        self._bind_retry_initial = bind_retry_initial
        self._bind_retry_max = bind_retry_max
        self._request_timeout = request_timeout
        self._nc: NatsClient | None = None
        self._watch: _Watch | None = None
        self._restart: str | None = None
        self._client_closed = False
        self._closed = False
        self._iterating = False
        self._ever_bound = False
        self._stream_created: object = None
        self.restarts = 0
        self._disconnects = 0
        self._rebind = asyncio.Event()
        # From a restart request until the new watch hands over its listing.
        self._resync_pending = False

    # -- connection --------------------------------------------------------------------------

    async def _on_error(self, exc: Exception) -> None:
        if isinstance(exc, NotFoundError) and self._watch is not None:
            # The ordered consumer could not be re-created: the stream is gone.
            self._request_restart("stream not found")

    async def _on_disconnected(self) -> None:
        # Stop the watch at once. After a lost connection only a fresh listing can be trusted:
        # nats-py re-creates an ordered consumer by itself once it is back, and what that
        # delivers (expiry markers of workers that could not refresh during the outage, say)
        # would otherwise reach the core as live changes before the resync listing does.
        self._disconnects += 1
        self._request_restart("disconnected")

    async def _on_reconnected(self) -> None:
        self._rebind.set()
        watch = self._watch
        if watch is not None and watch.epoch < self._disconnects:
            self._request_restart("reconnected")

    async def _on_closed(self) -> None:
        if not self._closed:
            self._client_closed = True
            self._request_restart("connection closed")

    def _request_restart(self, why: str) -> None:
        if self._closed:
            return
        self._restart = why
        self._resync_pending = True
        watch = self._watch
        if watch is not None:
            watch.wake()
            watch.snapshot_done.set()

    # Callbacks change these flags while a coroutine is suspended; reading them through a method
    # keeps the type checker from assuming they still hold the value seen before the await.
    def _is_closed(self) -> bool:
        return self._closed

    def _restart_reason(self) -> str | None:
        return self._restart

    def _callbacks(self) -> ConnectionCallbacks:
        return ConnectionCallbacks(
            error=self._on_error,
            disconnected=self._on_disconnected,
            reconnected=self._on_reconnected,
            closed=self._on_closed,
        )

    async def _open_client(self, callbacks: ConnectionCallbacks | None) -> NatsClient:
        callbacks = callbacks or ConnectionCallbacks()
        if self._connector is not None:
            return await self._connector(callbacks)
        assert self._options is not None
        return await connect(self._options, callbacks)

    async def _client(self) -> NatsClient:
        if self._nc is not None and (self._client_closed or self._nc.is_closed):
            old, self._nc = self._nc, None
            with contextlib.suppress(Exception):
                await old.close()
        self._client_closed = False
        if self._nc is None:
            self._nc = await self._open_client(self._callbacks())
        return self._nc

    # -- watch lifecycle ---------------------------------------------------------------------

    async def _start_watch(self, nc: NatsClient) -> _Watch:
        js = nc.jetstream(timeout=self._request_timeout)
        stream = stream_name(self.bucket)
        if self._create_bucket:
            await ensure_bucket(js, self._bucket_spec)
        info = await js.stream_info(stream)
        config, created, key_filter = await self._add_consumer(nc, stream)
        watch = _Watch(len(self._subject_prefix), self._queue_size, info.state.last_seq, key_filter)
        watch.epoch = self._disconnects
        self._stream_created = info.created
        self._watch = watch
        watch.subscription = await js.subscribe_bind(
            stream=stream,
            config=config,
            consumer=created.name,
            cb=watch.on_message,
            ordered_consumer=True,
        )
        if created.num_pending == 0:
            watch.finish_initial()
        return watch

    def _consumer_config(self, nc: NatsClient, filters: list[str]) -> ConsumerConfig:
        # What nats-py's KV watch asks for, minus the KeyWatcher layer: an ordered push consumer
        # starting at the latest value of every key.
        return ConsumerConfig(
            deliver_subject=nc.new_inbox(),
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=5.0,
            mem_storage=True,
            num_replicas=1,
            filter_subjects=filters,
        )

    async def _add_consumer(
        self, nc: NatsClient, stream: str
    ) -> tuple[ConsumerConfig, ConsumerInfo, tuple[str, ...] | None]:
        """Create the consumer; before server 2.10 (one filter only) filter keys client-side."""
        jsm = nc.jsm(timeout=self._request_timeout)
        config = self._consumer_config(nc, list(self._filters))
        try:
            return config, await jsm.add_consumer(stream, config=config), None
        except BadRequestError:
            if len(self._filters) == 1:
                raise
        config = self._consumer_config(nc, [f"{self._subject_prefix}>"])
        return config, await jsm.add_consumer(stream, config=config), self._key_prefixes

    async def _stop_watch(self, watch: _Watch) -> None:
        watch.stopped = True
        if self._watch is watch:
            self._watch = None
        subscription = watch.subscription
        watch.subscription = None
        if subscription is not None:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        # A delivery blocked on the full queue finishes once there is room; later ones see
        # ``stopped`` and return at once, so no delivery task stays parked.
        while not watch.queue.empty():
            watch.queue.get_nowait()

    async def _bind(self) -> _Watch | None:
        """Connect and create the watch, retrying with backoff until the bucket exists.

        Returns ``None`` once the source is closed.
        """
        delay = self._bind_retry_initial
        attempts = 0
        while not self._closed:
            self._restart = None
            self._rebind.clear()
            try:
                nc = await self._client()
                watch = await self._start_watch(nc)
            except AuthorizationError:
                if not self._ever_bound:
                    raise  # wrong credentials from the start: a configuration error
                if self._is_closed():
                    return None
                _log.warning("NATS refused the credentials; retrying")
            except _RETRYABLE as exc:
                if self._is_closed():
                    return None
                attempts += 1
                level = logging.WARNING if attempts % 10 == 0 else logging.DEBUG
                _log.log(level, "binding bucket %s failed, retrying: %r", self.bucket, exc)
            else:
                self._ever_bound = True
                return watch
            # A reconnection ends the wait early, so the resync follows the server's return.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._rebind.wait(), delay)
            delay = min(self._bind_retry_max, delay * 2)
        return None

    async def _stream_changed(self, watch: _Watch) -> bool:
        """Tell whether the stream behind the watch was deleted or re-created."""
        nc = self._nc
        if nc is None or not nc.is_connected:
            return False
        # Read the cursor before asking: deliveries keep advancing it while the request is in
        # flight, and a message stored after the server answered is newer than the answer's
        # last sequence without the stream having changed at all. Everything delivered before
        # the request left is in the stream, so only a new stream can report less than this.
        seen = watch.last_seen_seq
        try:
            info = await nc.jetstream(timeout=self._request_timeout).stream_info(
                stream_name(self.bucket)
            )
        except NotFoundError:
            return True
        except _RETRYABLE:
            return False
        return info.created != self._stream_created or info.state.last_seq < seen

    # -- the port ----------------------------------------------------------------------------

    async def events(self) -> AsyncGenerator[SourceEvent, None]:
        """Yield one snapshot, then live changes; a new snapshot after every re-created watch."""
        if self._iterating:
            raise UsageError("events() may be iterated only once per source")
        self._iterating = True
        reason: Literal["initial", "reconnect"] = "initial"
        try:
            while not self._closed:
                watch = await self._bind()
                if watch is None:
                    break
                try:
                    await watch.snapshot_done.wait()
                    if self._restart_reason() is not None or self._is_closed():
                        continue
                    self._resync_pending = False
                    yield SourceSnapshot(entries=watch.take_snapshot(), reason=reason)
                    reason = "reconnect"
                    async for event in self._live(watch):
                        yield event
                    if self._restart_reason() is not None:
                        self.restarts += 1
                        _log.info("re-creating the %s watch: %s", self.bucket, self._restart)
                finally:
                    await self._stop_watch(watch)
        finally:
            await self._close_client()

    async def _live(self, watch: _Watch) -> AsyncIterator[SourceEvent]:
        queue = watch.queue
        interval = self._health_interval
        next_check = time.monotonic() + interval
        while self._restart_reason() is None and not self._is_closed():
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout=interval)
                except asyncio.TimeoutError:
                    item = _WAKE
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + interval
                if await self._stream_changed(watch):
                    self._request_restart("stream deleted or re-created")
            if isinstance(item, _Wake):
                continue
            yield item

    async def list_all(self) -> SourceSnapshot:
        """Read the whole bucket now through a separate consumer, for reconciliation."""
        own: NatsClient | None = None
        nc = self._nc
        if nc is None or not nc.is_connected:
            own = nc = await self._open_client(None)
        watch: _Watch | None = None
        try:
            js = nc.jetstream(timeout=self._request_timeout)
            stream = stream_name(self.bucket)
            info = await js.stream_info(stream)
            config, created, key_filter = await self._add_consumer(nc, stream)
            watch = _Watch(len(self._subject_prefix), 1, info.state.last_seq, key_filter)
            if created.num_pending == 0:
                watch.finish_initial()
            else:
                watch.subscription = await js.subscribe_bind(
                    stream=stream,
                    config=config,
                    consumer=created.name,
                    cb=watch.on_message,
                    ordered_consumer=True,
                )
                await asyncio.wait_for(watch.snapshot_done.wait(), timeout=60.0)
            # A listing read while the watch is being re-created after a lost connection says
            # what the outage left, as the watch's own resync listing will: it is one too.
            reason: Literal["reconnect", "periodic"] = (
                "reconnect" if self._resync_pending and self._ever_bound else "periodic"
            )
            return SourceSnapshot(entries=tuple(watch.snapshot_entries), reason=reason)
        finally:
            if watch is not None:
                watch.stopped = True
                if watch.subscription is not None:
                    with contextlib.suppress(Exception):
                        await watch.subscription.unsubscribe()
            if own is not None:
                await own.close()

    async def close(self) -> None:
        """Stop watching and close the connection; a running ``events()`` loop then ends."""
        if self._closed:
            return
        self._closed = True
        watch = self._watch
        if watch is not None:
            watch.wake()
            watch.snapshot_done.set()
        await self._close_client()

    async def _close_client(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(Exception):
                await nc.close()
