"""The bridges' writer: a KV bucket as a ``BucketWriter`` that stamps its writes and heals.

Every put carries the writer's identity in a ``Workerset-Writer`` header
(:mod:`workerset_admission.ownership`), and ``keys()`` lists only keys whose latest record carries
that same stamp, so a bridge's prune never deletes what a worker, a ``register`` process or
another bridge wrote. nats-py's KV API neither writes nor reads headers: puts go through the
JetStream publish the KV API is built on, and stamps are read from each key's last message.

For healing (:mod:`workerset_admission.mirror`) the writer also reads the bucket's mark (its
stream's creation time and sequences, and the connection count the owner keeps with
:meth:`JetStreamBucketWriter.note_reconnect`), creating the bucket again with its configured
settings when the stream is gone, and the bucket's whole contents through one ordered consumer
at the last message of each key.
"""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy, StreamInfo
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError, NoKeysError, NotFoundError
from nats.js.kv import KeyValue
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.kv import (
    delete_headers,
    removal_kind,
    stream_name,
    subject_prefix,
)
from workerset_admission.errors import ConfigError
from workerset_admission.mirror import BucketMark, HeldRecord
from workerset_admission.ownership import WriterId

__all__ = ["JetStreamBucketWriter"]

# nats-py's ``keys(filters=...)`` matches substrings, not subject wildcards: filter here.
_DISCOVERY = ("v1.mdc.", "v1.instances.", "v1.event_sources.", "v1.event_channels.")
# A listing that has not ended by then is reported as a failure and tried again later.
_CONTENTS_TIMEOUT = 30.0


class JetStreamBucketWriter:
    """:class:`BucketWriter` over a JetStream KV bucket, stamping each put with ``owner``.

    Without an owner nothing is stamped and ``keys()`` owns nothing, so a prune deletes nothing.
    With ``js`` and ``spec`` a bucket found gone is created again with ``spec``'s settings;
    without them :meth:`mark` raises for a bucket that is gone.
    """

    def __init__(
        self,
        kv: KeyValue,
        *,
        owner: WriterId | None = None,
        js: JetStreamContext | None = None,
        bucket: str | None = None,
        spec: BucketSpec | None = None,
    ) -> None:
        if owner is not None and (js is None or bucket is None):
            raise ConfigError("stamping records with their writer needs JetStream and the bucket")
        if spec is not None and (js is None or spec.name != bucket):
            raise ConfigError("creating the bucket again needs JetStream and the same bucket name")
        self._kv = kv
        self._owner = owner
        self._js = js
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

    def _note_written(self, seq: int | None) -> None:
        if seq is not None and seq > self._written_seq:
            self._written_seq = seq

    async def keys(self) -> list[str]:
        owner = self._owner
        if owner is None:
            return []
        try:
            keys = await self._kv.keys()
        except NoKeysError:
            return []
        candidates = [key for key in keys if key.startswith(_DISCOVERY)]
        owned: list[str] = []
        for start in range(0, len(candidates), 64):
            window = candidates[start : start + 64]
            stamps = await asyncio.gather(*(self._stamp(key) for key in window))
            owned += [k for k, headers in zip(window, stamps, strict=True) if owner.owns(headers)]
        return owned

    async def _stamp(self, key: str) -> dict[str, str] | None:
        assert self._js is not None
        assert self._bucket is not None
        try:
            last = await self._js.get_last_msg(
                stream_name(self._bucket), f"$KV.{self._bucket}.{key}"
            )
        except NotFoundError:
            return None
        return last.headers

    # -- healing -----------------------------------------------------------------------------

    async def mark(self) -> BucketMark:
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

    async def contents(self) -> dict[str, HeldRecord]:
        if self._js is None or self._bucket is None:
            return await self._contents_by_key()
        prefix = subject_prefix(self._bucket)
        held: dict[str, HeldRecord] = {}
        done = asyncio.Event()
        owner = self._owner

        async def on_message(msg: Msg) -> None:
            key = msg.subject[len(prefix) :]
            if key.startswith(_DISCOVERY) and removal_kind(msg.headers) is None:
                owned = owner is not None and owner.owns(msg.headers)
                held[key] = HeldRecord(msg.data, owned)
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
            info = await subscription.consumer_info()
            if info.num_pending == 0 and not (info.delivered and info.delivered.consumer_seq):
                done.set()  # nothing to deliver: no key under the prefix
            await asyncio.wait_for(done.wait(), _CONTENTS_TIMEOUT)
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        return held

    async def _contents_by_key(self) -> dict[str, HeldRecord]:
        # Without JetStream at hand no stamp can be read: nothing counts as owned.
        try:
            keys = await self._kv.keys()
        except NoKeysError:
            return {}
        held: dict[str, HeldRecord] = {}
        for key in keys:
            if not key.startswith(_DISCOVERY):
                continue
            try:
                entry = await self._kv.get(key)
            except KeyNotFoundError:
                continue
            if entry.value is not None:
                held[key] = HeldRecord(entry.value, owned=False)
        return held
