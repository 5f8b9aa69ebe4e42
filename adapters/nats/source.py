"""Discovery records from a JetStream KV bucket: one listing, then live puts and removals.

The watch is an ordered push consumer (deliver ``last_per_subject``) on the bucket's stream,
filtered to the discovery keys (model cards, endpoint instances, event sources and channels,
drains).
It skips nats-py's ``KeyWatcher`` layer, which costs more than half of the client's CPU for the
same messages (see the NATS reference notes). On the client :func:`.connect.connect` makes
(a :class:`.raw_delivery.RawDeliveryClient`) it also skips nats-py's per-message subscription
machinery: the messages go from the protocol parser straight to the watch, which then plays the
ordered consumer itself (``watch.py``): flow control, heartbeats, gap detection. On any other
client (a custom ``connector``) it subscribes through nats-py's own ordered consumer. The end of
the initial values is detected from the delivery metadata: the first message with nothing
pending, or the first one newer than the stream's last sequence when the consumer was created
(so a busy bucket cannot postpone the listing forever).

When the connection drops, the watch stops at once and delivers nothing more; once the client
is back (and on a closed connection, and when the stream behind the bucket disappears or is
re-created, a wiped store; when the server announces that the watch's consumer was deleted; and
on the raw path, when deliveries skip a consumer sequence or the consumer falls silent for two
heartbeat periods), the watch is re-created and a new listing with reason ``"reconnect"`` is
emitted. A consumer that vanishes is said at WARNING: the server sends nothing on a deleted push
consumer's own subject, so the source listens for the deletion advisory of its consumer
(``$JS.EVENT.ADVISORY.CONSUMER.DELETED.<stream>.<consumer>``) and re-creates it at once; the
silent-consumer check (two heartbeat periods) covers a user not allowed that advisory.

Without the re-created watch, a server restart with a fresh store would leave nats-py's ordered
consumer silently waiting at the old sequence, and with the same store nats-py's own consumer
reset would deliver the outage's expiries as live removals ahead of the resync.

The first listing says ``after_outage`` when the server could not be reached before it: the
source was made for a frontend that started during an outage (``started_in_outage``), its own
first connection failed, or the connection was lost before the first listing came. That is a
report, as the reason is; the core decides what it means.

A periodic reconciliation need not read the bucket again when the watch missed nothing and the
stream changed in nothing since the watch last accounted for it:
:meth:`JetStreamDiscoverySource.missed_nothing` answers from two things. The consumer's idle
heartbeat, which the server sends only with nothing pending and which names the last consumer
sequence it sent: the same as the last one that arrived means nothing is pending and nothing
was lost on the way (a message lost in transit shows as a skipped consumer sequence or as a
heartbeat naming one that never arrived; either re-creates the watch). And the stream's own
state, one stream info answer of constant size (creation, last sequence, message count),
compared with the one the watch last accounted for (read just before its consumer was created,
then at each check): any write since raises the last sequence, and any removal lowers the count,
so a record removed without a marker, which no watch hears of (a subject purged, a message
deleted by sequence, a key aged out under a max age, a marker's own lapse), is listed at the
next check. A change the watch did hear is listed once too (a constant-size state cannot tell
the two apart), and the check after it is spared again. A consumer that vanished or fell
silent, a stream deleted or re-created and a lost connection re-create the watch with a
listing of their own. Whatever the checks say, the bucket is listed at least every
``full_relist_interval`` (10 minutes).

With ``key_prefixes`` from :func:`namespace_key_prefixes` the consumer's subject filters hold
only one worker namespace's records, so a frontend serving one namespace receives no other's.

Oversized values are passed through unchanged. The card boundary refuses them with a typed
error carrying the key, so they are reported and counted in one place with every other invalid
record; the source only translates and never decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Final, Literal

from nats.aio.client import Client as NatsClient
from nats.errors import AuthorizationError, ConnectionClosedError, NoRespondersError
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamInfo
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError
from nats.js.errors import Error as JetStreamError
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.connect import (
    ConnectionCallbacks,
    NatsConnectOptions,
    connect,
    permission_refusal,
    refusal_mark,
)
from workerset_admission.adapters.nats.kv import stream_name, subject_prefix
from workerset_admission.adapters.nats.raw_delivery import RawDeliveryClient
from workerset_admission.adapters.nats.watch import WAKE, StreamSummary, Wake, Watch
from workerset_admission.errors import UsageError
from workerset_admission.keys import DISCOVERY_BUCKET, escape_token
from workerset_admission.ports import SourceEvent, SourceListing

__all__ = [
    "DEFAULT_BUCKET",
    "DEFAULT_KEY_PREFIXES",
    "Connector",
    "JetStreamDiscoverySource",
    "namespace_key_prefixes",
]

_log = logging.getLogger(__name__)

DEFAULT_BUCKET: Final = DISCOVERY_BUCKET
DEFAULT_KEY_PREFIXES: Final = (
    "v1.mdc",
    "v1.instances",
    "v1.event_sources",
    "v1.event_channels",
    "v1.drain",
)

Connector = Callable[[ConnectionCallbacks], Awaitable[NatsClient]]


def namespace_key_prefixes(namespace: str) -> tuple[str, ...]:
    """Return the discovery key prefixes of one worker namespace, for the watch's filters."""
    token = escape_token(namespace)
    return (
        f"v1.mdc.{token}",
        f"v1.instances.{token}",
        f"v1.event_sources.namespace.{token}",
        f"v1.event_channels.namespace.{token}",
        f"v1.drain.{token}",
    )


# Seconds between the server's heartbeats on an idle consumer, unless a source says otherwise.
IDLE_HEARTBEAT: Final = 5.0

# Seconds after which a reconciliation lists the bucket even when the watch accounts for all.
FULL_RELIST_INTERVAL: Final = 600.0

# Seconds without a delivery after which a listing stops waiting for keys it was told of.
LISTING_QUIET: Final = 0.5

# The most keys a stream info answer names (the server's limit on subject details).
KEYS_AT_START_LIMIT: Final = 100_000

# A refusal that is no configuration error: the bucket is the operator's to create, and the
# source waits for it.
_WAITS_FOR: Final = "$JS.API.STREAM.CREATE."

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
        idle_heartbeat: float = IDLE_HEARTBEAT,
        started_in_outage: bool = False,
        full_relist_interval: float = FULL_RELIST_INTERVAL,
    ) -> None:
        if options is None and connector is None:
            raise UsageError("JetStreamDiscoverySource needs connect options or a connector")
        if key_prefixes is not None and not key_prefixes:
            raise UsageError("at least one key prefix is required (None watches every key)")
        if (
            queue_size < 1
            or health_interval <= 0
            or bind_retry_initial <= 0
            or idle_heartbeat <= 0
            or full_relist_interval <= 0
        ):
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
        self._idle_heartbeat = idle_heartbeat
        self._nc: NatsClient | None = None
        self._watch: Watch | None = None
        self._restart: str | None = None
        self._client_closed = False
        self._closed = False
        self._iterating = False
        self._ever_bound = False
        self._stream_created: object = None
        self._full_relist_interval = full_relist_interval
        # When a reconciliation was last told to list the bucket (monotonic clock).
        self._listed_at = time.monotonic()
        self.restarts = 0
        self.relists_spared = 0
        self._disconnects = 0
        self._rebind = asyncio.Event()
        # From a restart request until the new watch hands over its listing.
        self._resync_pending = False
        # Whether the server could not be reached before the first listing (see the module).
        self._outage_before_listing = started_in_outage

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
            watch.listing_done.set()

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
            with contextlib.suppress(NatsError, OSError):  # closed or lost already: gone anyway
                await old.close()
        self._client_closed = False
        if self._nc is None:
            self._nc = await self._open_client(self._callbacks())
        return self._nc

    # -- watch lifecycle ---------------------------------------------------------------------

    async def _start_watch(self, nc: NatsClient) -> Watch:
        if self._create_bucket:
            await ensure_bucket(nc.jetstream(timeout=self._request_timeout), self._bucket_spec)
        watch, created = await self._open_watch(
            nc, self._queue_size, self._epoch_watch, self._request_restart
        )
        self._stream_created = created
        await self._hear_deletion(nc, watch)
        return watch

    async def _hear_deletion(self, nc: NatsClient, watch: Watch) -> None:
        """Re-create the watch as soon as the server announces its consumer's deletion."""
        subject = f"$JS.EVENT.ADVISORY.CONSUMER.DELETED.{stream_name(self.bucket)}.{watch.consumer}"

        async def deleted(_msg: object) -> None:
            if self._watch is watch and not watch.stopped:
                _log.warning(
                    "the %s watch consumer %s was deleted on the server; re-creating it",
                    self.bucket,
                    watch.consumer,
                )
                self._request_restart("consumer deleted")

        # A user not allowed the advisory is refused asynchronously (an error callback): the
        # silent-consumer check then notices the deletion, later.
        with contextlib.suppress(NatsError):
            watch.deletion = await nc.subscribe(subject, cb=deleted)

    def _epoch_watch(self, watch: Watch) -> None:
        # Runs before the consumer exists, so anything it delivers finds the watch in place.
        watch.epoch = self._disconnects
        self._watch = watch

    async def _open_watch(
        self,
        nc: NatsClient,
        queue_size: int,
        adopt: Callable[[Watch], None] | None,
        broken: Callable[[str], None],
    ) -> tuple[Watch, object]:
        """Create the consumer and its watch; return the watch and the stream's creation time.

        Before server 2.10 (one filter per consumer) the keys are filtered client-side. On a
        :class:`RawDeliveryClient` the deliver subject is subscribed and handed to the watch
        before the consumer exists, so no message can reach nats-py's ordinary path first.
        """
        js = nc.jetstream(timeout=self._request_timeout)
        jsm = nc.jsm(timeout=self._request_timeout)
        stream = stream_name(self.bucket)
        info = await js.stream_info(stream)
        # The bucket's keys, with the state the consumer starts from (see Watch._ends_listing).
        # A bucket too large for one answer, or a server that cannot give them, is listed
        # without them, as a listing always was before.
        expected = None
        if 0 < info.state.messages <= KEYS_AT_START_LIMIT:
            with contextlib.suppress(JetStreamError, NatsError):
                info = await js.stream_info(stream, subjects_filter=f"{self._subject_prefix}>")
                expected = _expected_keys(info, self._subject_prefix, self._key_prefixes)
        attempts: list[tuple[list[str], tuple[str, ...] | None]] = [(list(self._filters), None)]
        if len(self._filters) > 1:
            attempts.append(([f"{self._subject_prefix}>"], self._key_prefixes))
        for filters, key_filter in attempts:
            watch = Watch(
                len(self._subject_prefix),
                queue_size,
                info.state.last_seq,
                key_filter,
                expected,
                _summary(info),
            )
            if adopt is not None:
                adopt(watch)
            config = self._consumer_config(nc.new_inbox(), filters)
            assert config.deliver_subject is not None
            raw = await self._subscribe_raw(nc, watch, config.deliver_subject, broken)
            created = None
            try:
                created = await jsm.add_consumer(stream, config=config)
            except BadRequestError:
                if key_filter is not None or len(attempts) == 1:
                    raise
            finally:
                if created is None:  # refused, failed or cancelled: nothing delivers to it
                    await self._unsubscribe(watch)
            if created is None:
                continue
            if not raw:
                watch.subscription = await js.subscribe_bind(
                    stream=stream,
                    config=config,
                    consumer=created.name,
                    cb=watch.on_message,
                    ordered_consumer=True,
                )
            watch.consumer = created.name
            if created.num_pending == 0:
                watch.finish_initial()
            return watch, info.created
        raise AssertionError("unreachable: the last attempt raises or returns")

    @staticmethod
    async def _subscribe_raw(
        nc: NatsClient, watch: Watch, deliver_subject: str, broken: Callable[[str], None]
    ) -> bool:
        """Subscribe ``watch`` to its messages straight from the parser, where the client can."""
        if not isinstance(nc, RawDeliveryClient):
            return False
        subscription = await nc.subscribe(deliver_subject)
        if not nc.deliver_raw(subscription, watch.on_raw):
            await subscription.unsubscribe()
            return False

        async def publish(subject: str) -> None:
            await nc.publish(subject)

        watch.use_raw(publish, broken)
        watch.subscription = subscription
        watch.detach = lambda: nc.stop_raw(subscription)
        return True

    def _consumer_config(self, deliver_subject: str, filters: list[str]) -> ConsumerConfig:
        # What nats-py's KV watch asks for, minus the KeyWatcher layer: an ordered push consumer
        # starting at the latest value of every key.
        return ConsumerConfig(
            deliver_subject=deliver_subject,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=self._idle_heartbeat,
            mem_storage=True,
            num_replicas=1,
            filter_subjects=filters,
        )

    async def _unsubscribe(self, watch: Watch) -> None:
        watch.stopped = True
        if watch.detach is not None:
            watch.detach()
            watch.detach = None
        for subscription in (watch.subscription, watch.deletion):
            if subscription is not None:
                # Gone with a lost or closed connection, or unsubscribed already.
                with contextlib.suppress(NatsError, OSError):
                    await subscription.unsubscribe()
        watch.subscription = watch.deletion = None

    async def _stop_watch(self, watch: Watch) -> None:
        if self._watch is watch:
            self._watch = None
        await self._unsubscribe(watch)
        # A delivery blocked on the full queue finishes once there is room; later ones see
        # ``stopped`` and return at once, so no delivery task stays parked.
        while not watch.queue.empty():
            watch.queue.get_nowait()

    async def _bind(self) -> Watch | None:
        """Connect and create the watch, retrying with backoff until the bucket exists.

        Returns ``None`` once the source is closed.
        """
        delay = self._bind_retry_initial
        attempts = 0
        while not self._closed:
            self._restart = None
            self._rebind.clear()
            mark = refusal_mark()
            try:
                try:
                    nc = await self._client()
                except _RETRYABLE as exc:
                    # No server answered: until the first listing, that is an outage.
                    if not isinstance(exc, AuthorizationError):
                        self._outage_before_listing = True
                    raise
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
                # A refused publish or subscription is never answered: what failed here as a
                # timeout was the server refusing this user a right the watch needs.
                refusal = permission_refusal(mark)
                if refusal is not None and refusal.subject.startswith(_WAITS_FOR):
                    refusal = None  # a bucket it may not create: it waits for the operator's
                if refusal is not None and not self._ever_bound:
                    raise refusal from None  # permissions short from the start: configuration
                if refusal is not None:
                    _log.warning("binding bucket %s failed, retrying: %s", self.bucket, refusal)
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

    async def _stream_changed(self, watch: Watch) -> bool:
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
        """Yield one listing, then live changes; a new listing after every re-created watch."""
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
                    await self._initial_values(watch)
                    if self._restart_reason() is not None or self._is_closed():
                        continue
                    self._resync_pending = False
                    outage = reason == "initial" and (
                        self._outage_before_listing or self._disconnects > 0
                    )
                    yield SourceListing(
                        entries=watch.take_listing(), reason=reason, after_outage=outage
                    )
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

    async def _initial_values(self, watch: Watch) -> None:
        """Wait for the end of the initial values; a raw consumer that falls silent restarts."""
        await self._listing(watch, self._nc, dead=self._request_restart)

    async def _listing(
        self,
        watch: Watch,
        nc: NatsClient | None,
        dead: Callable[[str], None] | None = None,
    ) -> None:
        """Wait until ``watch`` has its listing; ``dead`` hears of a consumer gone silent.

        A listing that only waits for keys the bucket held at the start, once the consumer has
        delivered nothing for :data:`LISTING_QUIET` seconds, asks the server which of them the
        stream still holds (through ``nc``): those it no longer holds went without a trace and
        are given up; those it holds are on their way (a slow or lossy link, or values newer
        than the stream's last sequence when its keys were read, which a writer rewriting the
        bucket leaves) and the listing waits for them. Quiet alone is never taken for a removal:
        a listing that ended so left out keys the bucket held, and applied as a resync it
        removed their workers.
        """
        while not watch.listing_done.is_set():
            stalled, seen = watch.listing_stalled(), watch.last_seen_seq
            wait = LISTING_QUIET if stalled else self._idle_heartbeat
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(watch.listing_done.wait(), wait)
            if stalled and watch.listing_stalled() and watch.last_seen_seq == seen:
                gone = await self._gone_without_a_trace(watch, nc)
                if gone:
                    _log.debug(
                        "%s listing gives up %d key(s) removed silently", self.bucket, len(gone)
                    )
                    watch.give_up(gone)
                    if watch.listing_done.is_set():
                        break
            if dead is not None and watch.looks_dead(time.monotonic(), self._idle_heartbeat):
                dead("the consumer sent nothing, not even heartbeats")

    async def _gone_without_a_trace(self, watch: Watch, nc: NatsClient | None) -> frozenset[str]:
        """Return the keys the listing waits for that the stream no longer holds.

        Empty when the server cannot say (not connected, no answer): the listing goes on
        waiting, and a consumer that fell silent is noticed by the caller's own check.
        """
        unseen = watch.unseen_keys()
        if not unseen or nc is None or not nc.is_connected:
            return frozenset()
        try:
            info = await nc.jetstream(timeout=self._request_timeout).stream_info(
                stream_name(self.bucket), subjects_filter=f"{self._subject_prefix}>"
            )
        except _RETRYABLE:
            return frozenset()
        held = _expected_keys(info, self._subject_prefix, self._key_prefixes) or frozenset()
        return unseen - held

    async def _live(self, watch: Watch) -> AsyncIterator[SourceEvent]:
        queue = watch.queue
        interval, pulse = self._health_interval, self._idle_heartbeat
        now = time.monotonic()
        next_check, next_pulse = now + interval, now + pulse
        while self._restart_reason() is None and not self._is_closed():
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout=min(interval, pulse))
                except asyncio.TimeoutError:
                    item = WAKE
            if watch.held_replies:
                await watch.release_held()
            now = time.monotonic()
            if now >= next_pulse:
                next_pulse = now + pulse
                if watch.looks_dead(now, pulse):
                    _log.warning(
                        "the %s watch consumer %s sent nothing, not even heartbeats; "
                        "re-creating it",
                        self.bucket,
                        watch.consumer,
                    )
                    self._request_restart("the consumer sent nothing, not even heartbeats")
            if now >= next_check:
                next_check = now + interval
                if await self._stream_changed(watch):
                    self._request_restart("stream deleted or re-created")
            if isinstance(item, Wake):
                continue
            yield item

    async def missed_nothing(self) -> bool:
        """Tell whether a relist would find nothing the watch has not taken in (see the module).

        Two things must show it. The consumer's own idle heartbeat: sent while it has nothing
        pending, it names the last consumer sequence sent, and the watch compares it with what
        arrived. And the stream's own state, one stream info answer of constant size (creation,
        last sequence, message count), the same as the one the watch last accounted for
        (:meth:`.Watch.accounts_for`): a record removed without a marker, which no watch hears
        of, changes it. False whenever that cannot be shown: no watch, a watch being
        re-created, no such heartbeat within two heartbeat periods since the last delivery (a
        busy bucket), a stream changed since the last check, a client on which the watch is not
        the source's own, and once ``full_relist_interval`` has passed since the last listing
        this answered for. It asks the server nothing about the consumer (a frontend's user may
        not read consumers by name: ``docs/security.md``).
        """
        answer = await self._missed_nothing()
        if answer and time.monotonic() - self._listed_at >= self._full_relist_interval:
            answer = False
        if answer:
            self.relists_spared += 1
        else:
            self._listed_at = time.monotonic()
        return answer

    async def _missed_nothing(self) -> bool:
        watch, nc = self._watch, self._nc
        if (
            watch is None
            or nc is None
            or not nc.is_connected
            or not watch.listing_done.is_set()
            or self._resync_pending
            or self._restart_reason() is not None
            or not watch.confirmed_idle(time.monotonic(), self._idle_heartbeat)
        ):
            return False
        try:
            info = await nc.jetstream(timeout=self._request_timeout).stream_info(
                stream_name(self.bucket)
            )
        except _RETRYABLE:
            return False
        if self._watch is not watch or watch.stopped:
            return False
        now = _summary(info)
        accounted = watch.accounts_for(now)
        # A change is listed now: from here on, only what happens next needs accounting for.
        watch.rebase(now)
        return accounted

    async def list_all(self) -> SourceListing:
        """Read the whole bucket now through a separate consumer, for reconciliation."""
        own: NatsClient | None = None
        nc = self._nc
        if nc is None or not nc.is_connected:
            own = nc = await self._open_client(None)
        watch: Watch | None = None
        interrupted: list[str] = []
        try:
            watch, _ = await self._open_watch(nc, 1, None, interrupted.append)
            await asyncio.wait_for(self._listing(watch, nc), timeout=60.0)
            if interrupted:
                raise NatsError(f"the listing of {self.bucket} was interrupted: {interrupted[0]}")
            # A listing read while the watch is being re-created after a lost connection says
            # what the outage left, as the watch's own resync listing will: it is one too.
            reason: Literal["reconnect", "periodic"] = (
                "reconnect" if self._resync_pending and self._ever_bound else "periodic"
            )
            return SourceListing(entries=tuple(watch.listing_entries), reason=reason)
        finally:
            if watch is not None:
                await self._unsubscribe(watch)
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
            watch.listing_done.set()
        await self._close_client()

    async def _close_client(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(NatsError, OSError):  # a lost connection: gone anyway
                await nc.close()


def _summary(info: StreamInfo) -> StreamSummary:
    return StreamSummary(info.created, info.state.last_seq, info.state.messages)


def _expected_keys(
    info: StreamInfo, subject_prefix: str, key_prefixes: tuple[str, ...]
) -> frozenset[str] | None:
    """Return the discovery keys a stream info with subjects names; ``None`` when it names none."""
    subjects = info.state.subjects
    if not subjects:
        return None
    offset = len(subject_prefix)
    keys = (subject[offset:] for subject in subjects)
    return frozenset(key for key in keys if not key_prefixes or key.startswith(key_prefixes))
