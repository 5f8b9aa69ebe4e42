"""Read the serving-admission bucket once, for ``rollout``: the current value of every key.

The bucket is read through the discovery source's own reader of initial values (one ordered
consumer at the latest value per key, ended by the message that has nothing left pending), so
the gate and the service agree on what "the bucket now" means.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import datetime

from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError
from workerset_admission.adapters.nats.connect import (
    ConnectionCallbacks,
    NatsConnectOptions,
    connect,
    permission_refusal,
    refusal_mark,
    servers_for_display,
)
from workerset_admission.adapters.nats.kv import stream_name
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.card.serving_record import BucketRead, RawEntry
from workerset_admission.keys import ADMISSION_BUCKET

DEFAULT_ADMISSION_BUCKET = ADMISSION_BUCKET

__all__ = ["DEFAULT_ADMISSION_BUCKET", "NatsRecordSource"]


class NatsRecordSource:
    """A rollout ``RecordSource`` over the serving-admission KV bucket."""

    def __init__(
        self,
        options: NatsConnectOptions,
        bucket: str = DEFAULT_ADMISSION_BUCKET,
        *,
        timeout: float = 10.0,
    ) -> None:
        self._options = options
        self._bucket = bucket
        self._timeout = timeout

    async def read(self) -> BucketRead:
        """Read the bucket; raise ``PermissionRefused`` when the server refused this user."""
        mark = refusal_mark()
        try:
            # A gate must answer: the first connection is bounded and never retried forever.
            client = await asyncio.wait_for(
                connect(self._options, allow_reconnect=False), timeout=self._timeout
            )
        except asyncio.TimeoutError:
            servers = servers_for_display(self._options.servers)
            wait = f"{self._timeout:g} s"
            return BucketRead(problem=f"no NATS server answered within {wait}: {servers}")
        except (OSError, NatsError) as error:
            servers = servers_for_display(self._options.servers)
            return BucketRead(problem=f"cannot connect to {servers}: {error!r}")

        async def reuse(_callbacks: ConnectionCallbacks) -> NatsClient:
            return client

        source = JetStreamDiscoverySource(bucket=self._bucket, key_prefixes=None, connector=reuse)
        try:
            # Asked first: the listing closes the connection it was handed once it is read.
            server_time = await _server_time(client, self._bucket, self._timeout)
            listing = await asyncio.wait_for(source.list_all(), timeout=self._timeout)
        except NotFoundError:
            # No frontend has published yet: an empty bucket, and a closed gate.
            return BucketRead()
        except (OSError, NatsError, asyncio.TimeoutError) as error:
            # A refusal is no passing problem: waiting and reading again cannot help.
            refusal = permission_refusal(mark)
            if refusal is not None:
                raise refusal from None
            return BucketRead(problem=f"cannot read bucket {self._bucket}: {error!r}")
        finally:
            await client.close()
        return BucketRead(
            entries=tuple(RawEntry(e.key, e.value, e.published_at) for e in listing.entries),
            server_time=server_time,
        )


async def _server_time(client: NatsClient, bucket: str, timeout: float) -> float | None:
    """Return the server's time now (Unix seconds) from a stream info answer, if it says it."""
    with contextlib.suppress(NatsError, asyncio.TimeoutError, ValueError, TypeError):
        reply = await client.request(
            f"$JS.API.STREAM.INFO.{stream_name(bucket)}", b"", timeout=timeout
        )
        stamp = json.loads(reply.data).get("ts")
        if isinstance(stamp, str):
            return parse_server_time(stamp)
    return None


def parse_server_time(stamp: str) -> float:
    """Read an RFC 3339 time as the server writes it (nanoseconds, ``Z``) as Unix seconds."""
    head, _, fraction = stamp.rstrip("Z").partition(".")
    whole = datetime.fromisoformat(head + "+00:00").timestamp()
    return whole + (float(f"0.{fraction}") if fraction else 0.0)
