"""KV buckets on the test's own nats-server: one created for a test, and what one holds now."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import nats
from nats.js.api import KeyValueConfig
from nats.js.errors import KeyNotFoundError, NoKeysError, NotFoundError
from nats.js.kv import KeyValue

__all__ = ["held_values", "kv_bucket"]


@contextlib.asynccontextmanager
async def kv_bucket(url: str, bucket: str, **config: object) -> AsyncIterator[KeyValue]:
    """Create ``bucket`` (with ``config``) and hand out its KeyValue while the client is open."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        yield await js.create_key_value(KeyValueConfig(bucket=bucket, **config))  # type: ignore[arg-type]
    finally:
        await nc.close()


async def held_values(url: str, bucket: str) -> dict[str, bytes]:
    """Every live key of ``bucket`` and its value, read now (empty when the bucket is gone)."""
    nc = await nats.connect(url)
    try:
        try:
            kv = await nc.jetstream().key_value(bucket)
            keys = await kv.keys()
        except (NotFoundError, NoKeysError):
            return {}
        held: dict[str, bytes] = {}
        for key in keys:
            try:
                entry = await kv.get(key)
            except KeyNotFoundError:
                continue
            if entry.value:
                held[key] = entry.value
        return held
    finally:
        await nc.close()
