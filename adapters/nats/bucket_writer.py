"""The Dynamo discovery bridge's writer: a KV bucket as a ``BucketWriter`` that stamps its writes.

Every put carries the writer's identity in a ``Workerset-Writer`` header
(:mod:`workerset_admission.ownership`), and ``keys()`` lists only keys whose latest record carries
that same stamp, so a bridge's prune never deletes what a worker, a ``register`` process or
another bridge wrote. nats-py's KV API neither writes nor reads headers: puts go through the
JetStream publish the KV API is built on, and stamps are read from each key's last message.
"""

from __future__ import annotations

import asyncio

from nats.js.client import JetStreamContext
from nats.js.errors import NoKeysError, NotFoundError
from nats.js.kv import KeyValue
from workerset_admission.errors import ConfigError
from workerset_admission.ownership import WriterId

from .kv import stream_name

__all__ = ["JetStreamBucketWriter"]


class JetStreamBucketWriter:
    """:class:`BucketWriter` over a JetStream KV bucket, stamping each put with ``owner``.

    Without an owner nothing is stamped and ``keys()`` lists every discovery key, as a bridge that
    is the bucket's only writer expects.
    """

    # nats-py's ``keys(filters=...)`` matches substrings, not subject wildcards: filter here.
    _DISCOVERY = ("v1.mdc.", "v1.instances.", "v1.event_sources.", "v1.event_channels.")

    def __init__(
        self,
        kv: KeyValue,
        *,
        owner: WriterId | None = None,
        js: JetStreamContext | None = None,
        bucket: str | None = None,
    ) -> None:
        if owner is not None and (js is None or bucket is None):
            raise ConfigError("stamping records with their writer needs JetStream and the bucket")
        self._kv = kv
        self._owner = owner
        self._js = js
        self._bucket = bucket

    async def put(self, key: str, value: bytes) -> None:
        if self._owner is None or self._js is None:
            await self._kv.put(key, value)
            return
        await self._js.publish(f"$KV.{self._bucket}.{key}", value, headers=self._owner.headers())

    async def delete(self, key: str) -> None:
        await self._kv.delete(key)

    async def keys(self) -> list[str]:
        owner = self._owner
        try:
            keys = await self._kv.keys()
        except NoKeysError:
            return []
        candidates = [key for key in keys if key.startswith(self._DISCOVERY)]
        if owner is None:
            return candidates
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
