"""The Dynamo discovery bridge's writer: a KV bucket handle as a ``BucketWriter``."""

from __future__ import annotations

from nats.js.errors import NoKeysError
from nats.js.kv import KeyValue

__all__ = ["JetStreamBucketWriter"]


class JetStreamBucketWriter:
    """:class:`BucketWriter` over a nats-py KeyValue handle."""

    # nats-py's ``keys(filters=...)`` matches substrings, not subject wildcards: filter here.
    _OWNED = ("v1.mdc.", "v1.instances.", "v1.event_sources.", "v1.event_channels.")

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def put(self, key: str, value: bytes) -> None:
        await self._kv.put(key, value)

    async def delete(self, key: str) -> None:
        await self._kv.delete(key)

    async def keys(self) -> list[str]:
        try:
            keys = await self._kv.keys()
        except NoKeysError:
            return []
        return [key for key in keys if key.startswith(self._OWNED)]
