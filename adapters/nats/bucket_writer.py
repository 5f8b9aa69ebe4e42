"""The bridges' writer: a KV bucket as a ``BucketWriter`` that stamps its writes and heals.

Every put carries the writer's identity in a ``Workerset-Writer`` header
(:mod:`workerset_admission.ownership`), and ``keys()`` lists only keys whose latest record carries
that same stamp, so a bridge's prune never deletes what a worker, a ``register`` process or
another bridge wrote. nats-py's KV API neither writes nor reads headers: puts go through the
JetStream publish the KV API is built on, and stamps are read from each key's last message.
A bridge's pass goes out through :meth:`JetStreamBucketWriter.write`: its changes sent back to
back, in order, and acknowledged together.

For healing (:mod:`workerset_admission.mirror`) the writer also reads the bucket's mark (its
stream's creation time and sequences, and the connection count the owner keeps with
:meth:`JetStreamBucketWriter.note_reconnect`), creating the bucket again with its configured
settings when the stream is gone, and the bucket's whole contents through one ordered consumer
at the last message of each key. A mark or a reading that fails raises ``Unreachable`` (the
NATS error as its cause), or the socket's ``OSError``: what a bridge tries again later.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.api import DeliverPolicy, Header, StreamInfo
from nats.js.errors import (
    APIError,
    KeyNotFoundError,
    NoKeysError,
    NoStreamResponseError,
    NotFoundError,
)
from nats.js.kv import KeyValue
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.kv import (
    delete_headers,
    removal_kind,
    stream_name,
    subject_prefix,
)
from workerset_admission.errors import ConfigError, Unreachable, error_in_words
from workerset_admission.mirror import BucketMark, BucketValue, Change, write_in_turn
from workerset_admission.ownership import WriterId

__all__ = ["JetStreamBucketWriter"]

# nats-py's ``keys(filters=...)`` matches substrings, not subject wildcards: filter here.
_DISCOVERY = ("v1.mdc.", "v1.instances.", "v1.event_sources.", "v1.event_channels.")
# A listing that has not ended by then is reported as a failure and tried again later.
_CONTENTS_TIMEOUT = 30.0
# How long a write waits for the server's acknowledgement (nats-py's own default).
_ACK_TIMEOUT = 5.0
# At most this many writes in flight; each window has the acknowledgement timeout to itself.
_WINDOW = 1000
# The status of a reply that says no stream listens on the subject.
_NO_RESPONDERS = "503"


class _Acks:
    """Publishes sent back to back, each acknowledged on a reply subscription of our own.

    nats-py's ``publish_async`` does the same, but when the server refuses a message its reply
    handler raises inside the callback instead of failing that publish (2.9 to 2.16), so a
    refused write would hang until the timeout. Here a refusal fails its own future at once.
    A future that is never answered is cancelled by the caller, which also forgets it.
    """

    def __init__(self, client: Client) -> None:
        self._client = client
        self._prefix: str | None = None
        self._tokens = itertools.count()
        self._waiting: dict[str, asyncio.Future[int]] = {}

    async def send(
        self, subject: str, payload: bytes, headers: dict[str, str] | None
    ) -> asyncio.Future[int]:
        """Publish now; the future gets the stream sequence, or the server's refusal."""
        if self._prefix is None:
            prefix = f"{self._client.new_inbox()}."
            await self._client.subscribe(f"{prefix}*", cb=self._answer)
            self._prefix = prefix
        token = str(next(self._tokens))
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting[token] = future
        future.add_done_callback(lambda _: self._waiting.pop(token, None))
        reply = self._prefix + token
        sent = False
        try:
            await self._client.publish(subject, payload, reply=reply, headers=headers)
            sent = True
        finally:
            if not sent:  # failed or cancelled: no answer is waited for
                future.cancel()
        return future

    async def _answer(self, msg: Msg) -> None:
        assert self._prefix is not None
        future = self._waiting.get(msg.subject[len(self._prefix) :])
        if future is None or future.done():
            return
        if msg.headers and msg.headers.get(Header.STATUS) == _NO_RESPONDERS:
            future.set_exception(NoStreamResponseError())
            return
        try:
            answer = json.loads(msg.data)
        except ValueError:
            future.set_exception(APIError(description=f"unreadable acknowledgement {msg.data!r}"))
            return
        error = answer.get("error") if isinstance(answer, dict) else None
        if error:
            future.set_exception(
                APIError(
                    code=error.get("code"),
                    err_code=error.get("err_code"),
                    description=error.get("description"),
                )
            )
        elif isinstance(answer, dict) and isinstance(answer.get("seq"), int):
            future.set_result(answer["seq"])
        else:
            future.set_exception(APIError(description=f"unexpected acknowledgement {answer!r}"))


class JetStreamBucketWriter:
    """:class:`BucketWriter` over a JetStream KV bucket, stamping each put with ``owner``.

    Without an owner nothing is stamped and ``keys()`` owns nothing, so a prune deletes nothing.
    With the ``client`` and ``spec`` a bucket found gone is created again with ``spec``'s
    settings; without them :meth:`mark` raises for a bucket that is gone. Without the client
    (and the bucket's name) :meth:`write` writes one change after the other.
    """

    def __init__(
        self,
        kv: KeyValue,
        *,
        owner: WriterId | None = None,
        client: Client | None = None,
        bucket: str | None = None,
        spec: BucketSpec | None = None,
    ) -> None:
        if owner is not None and (client is None or bucket is None):
            raise ConfigError("stamping records with their writer needs JetStream and the bucket")
        if spec is not None and (client is None or spec.name != bucket):
            raise ConfigError("creating the bucket again needs JetStream and the same bucket name")
        self._kv = kv
        self._owner = owner
        self._js = client.jetstream() if client is not None else None
        self._acks = _Acks(client) if client is not None else None
        self._bucket = bucket
        self._spec = spec
        self._connections = 1
        self._written_seq = 0

    def note_reconnect(self) -> None:
        """Count one more connection: the next mark tells the bridge to check the bucket."""
        self._connections += 1

    async def put(self, key: str, value: bytes) -> None:
        if self._owner is None or self._js is None:
            self._note_written(await self._kv.put(key, value))
            return
        ack = await self._js.publish(
            f"$KV.{self._bucket}.{key}", value, headers=self._owner.headers()
        )
        self._note_written(ack.seq)

    async def delete(self, key: str) -> None:
        if self._js is None:
            await self._kv.delete(key)
            return
        ack = await self._js.publish(f"$KV.{self._bucket}.{key}", b"", headers=delete_headers())
        self._note_written(ack.seq)

    async def write(self, changes: Sequence[Change]) -> list[Exception | None]:
        """Send every change in order, then wait for all their acknowledgements at once.

        A pass that removes a departed worker deletes its instance, card and event records
        together; one after the other, each waiting for its acknowledgement, the last of them
        reached the bucket several round trips after the first. Sent back to back they all
        arrive within about one, in the same order.
        """
        acks, bucket = self._acks, self._bucket
        if acks is None or bucket is None:
            return await write_in_turn(self, changes)
        outcomes: list[Exception | None] = []
        # A window at a time, so a long resync waits for each window's acknowledgements.
        for start in range(0, len(changes), _WINDOW):
            outcomes += await self._window(acks, bucket, changes[start : start + _WINDOW])
        return outcomes

    async def _window(
        self, acks: _Acks, bucket: str, changes: Sequence[Change]
    ) -> list[Exception | None]:
        sent: list[asyncio.Future[int] | Exception] = []
        for key, value in changes:
            headers: dict[str, str] | None
            if value is None:
                payload, headers = b"", delete_headers()
            else:
                payload = value
                headers = self._owner.headers() if self._owner is not None else None
            try:
                sent.append(await acks.send(f"$KV.{bucket}.{key}", payload, headers))
            except (NatsError, OSError) as exc:  # not sent (no connection): reported, the rest go
                sent.append(exc)
        pending = [ack for ack in sent if isinstance(ack, asyncio.Future)]
        if pending:
            await asyncio.wait(pending, timeout=_ACK_TIMEOUT)
        return [self._outcome(item) for item in sent]

    def _outcome(self, sent: asyncio.Future[int] | Exception) -> Exception | None:
        if isinstance(sent, Exception):
            return sent
        if not sent.done():
            sent.cancel()
            return TimeoutError("no acknowledgement from the bucket's stream")
        error = sent.exception()
        if error is not None:
            return error if isinstance(error, Exception) else RuntimeError(str(error))
        self._note_written(sent.result())
        return None

    def _note_written(self, seq: int | None) -> None:
        if seq is not None and seq > self._written_seq:
            self._written_seq = seq

    async def keys(self) -> list[str]:
        # The keys of one listing of the bucket with its stamps (``contents``): nats-py's own
        # key listing can end before every key has come on a loaded machine, and a start would
        # then keep records it should prune.
        if self._owner is None:
            return []
        return sorted(key for key, record in (await self.contents()).items() if record.owned)

    # -- healing -----------------------------------------------------------------------------

    async def mark(self) -> BucketMark:
        try:
            return await self._mark()
        except (NatsError, asyncio.TimeoutError) as exc:
            raise Unreachable(f"cannot read the bucket's state: {error_in_words(exc)}") from exc

    async def _mark(self) -> BucketMark:
        existed = True
        try:
            info = await self._stream_info()
        except NotFoundError:
            if self._spec is None or self._js is None:
                raise
            status = await ensure_bucket(self._js, self._spec)
            self._kv = status.kv
            existed = False
            info = await self._stream_info()
        written, self._written_seq = self._written_seq, 0
        return BucketMark(
            existed=existed,
            created=str(info.created),
            last_seq=info.state.last_seq,
            written_seq=written,
            connections=self._connections,
        )

    async def _stream_info(self) -> StreamInfo:
        if self._js is not None and self._bucket is not None:
            return await self._js.stream_info(stream_name(self._bucket))
        status = await self._kv.status()
        return status.stream_info

    async def contents(self) -> dict[str, BucketValue]:
        try:
            return await self._contents()
        except (NatsError, asyncio.TimeoutError) as exc:
            raise Unreachable(f"cannot read the bucket: {error_in_words(exc)}") from exc

    async def _contents(self) -> dict[str, BucketValue]:
        if self._js is None or self._bucket is None:
            return await self._contents_by_key()
        prefix = subject_prefix(self._bucket)
        held: dict[str, BucketValue] = {}
        done = asyncio.Event()
        owner = self._owner

        async def on_message(msg: Msg) -> None:
            key = msg.subject[len(prefix) :]
            if key.startswith(_DISCOVERY) and removal_kind(msg.headers) is None:
                owned = owner is not None and owner.owns(msg.headers)
                held[key] = BucketValue(msg.data, owned)
            if msg.metadata.num_pending == 0:
                done.set()

        # One consumer at the last message of each key: the bucket as it is, stamps included.
        subscription = await self._js.subscribe(
            f"{prefix}v1.>",
            stream=stream_name(self._bucket),
            cb=on_message,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        )
        try:
            # Asked of the stream, not of the consumer: reading a consumer's information is a
            # right no user is given (it would let one read every other user's consumers).
            # One message under the prefix, or none: nothing for the consumer to deliver.
            try:
                await self._js.get_msg(
                    stream_name(self._bucket), seq=1, subject=f"{prefix}v1.>", next=True
                )
            except NotFoundError:
                done.set()
            await asyncio.wait_for(done.wait(), _CONTENTS_TIMEOUT)
        finally:
            with contextlib.suppress(NatsError, OSError):  # gone with a lost connection
                await subscription.unsubscribe()
        return held

    async def _contents_by_key(self) -> dict[str, BucketValue]:
        # Without JetStream at hand no stamp can be read: nothing counts as owned.
        try:
            keys = await self._kv.keys()
        except NoKeysError:
            return {}
        held: dict[str, BucketValue] = {}
        for key in keys:
            if not key.startswith(_DISCOVERY):
                continue
            try:
                entry = await self._kv.get(key)
            except KeyNotFoundError:
                continue
            if entry.value is not None:
                held[key] = BucketValue(entry.value, owned=False)
        return held
