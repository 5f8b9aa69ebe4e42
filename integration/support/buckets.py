"""A KV bucket created for one test on the test's own nats-server, by a client of its own."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import nats
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

__all__ = ["kv_bucket"]


@contextlib.asynccontextmanager
async def kv_bucket(url: str, bucket: str, **config: object) -> AsyncIterator[KeyValue]:
    """Create ``bucket`` (with ``config``) and hand out its KeyValue while the client is open."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        yield await js.create_key_value(KeyValueConfig(bucket=bucket, **config))  # type: ignore[arg-type]
    finally:
        await nc.close()
