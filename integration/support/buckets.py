"""KV buckets on the test's own nats-server: one created for a test, and what one holds now.

What a bucket holds is read from its stream (:func:`live_keys`), never with nats-py's
``KeyValue.keys()``: that listing decides it has seen every key from the consumer's pending count
read while the first messages may still be on their way, and on a loaded machine it can end
before any key has come (it then raises ``NoKeysError`` for a bucket that holds keys).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import nats
from nats.js.api import KeyValueConfig
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from workerset_admission.adapters.nats.kv import removal_kind, stream_name, subject_prefix

__all__ = ["held_values", "kv_bucket", "live_keys"]


@contextlib.asynccontextmanager
async def kv_bucket(url: str, bucket: str, **config: object) -> AsyncIterator[KeyValue]:
    """Create ``bucket`` (with ``config``) and hand out its KeyValue while the client is open."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        yield await js.create_key_value(KeyValueConfig(bucket=bucket, **config))  # type: ignore[arg-type]
    finally:
        await nc.close()


async def live_keys(kv: KeyValue, under: str = ">") -> list[str]:
    """The keys of ``kv`` (those matching ``under``) that hold a value now, sorted.

    The bucket's stream names every subject it holds; the last message of each says whether its
    key was put, or deleted, purged or expired since. A bucket with no live key answers ``[]``.
    """
    bucket = (await kv.status()).bucket
    # nats-py hands a KeyValue its JetStream context but exposes no accessor for it.
    js: JetStreamContext = kv._js
    prefix = subject_prefix(bucket)
    info = await js.stream_info(stream_name(bucket), subjects_filter=prefix + under)
    keys = []
    for subject in info.state.subjects or {}:
        try:
            last = await js.get_last_msg(stream_name(bucket), subject)
        except NotFoundError:
            continue  # gone since the stream listed it
        if removal_kind(last.headers) is None:
            keys.append(subject[len(prefix) :])
    return sorted(keys)


async def held_values(url: str, bucket: str) -> dict[str, bytes]:
    """Every live key of ``bucket`` and its value, read now (empty when the bucket is gone)."""
    nc = await nats.connect(url)
    try:
        try:
            kv = await nc.jetstream().key_value(bucket)
            keys = await live_keys(kv)
        except NotFoundError:
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
