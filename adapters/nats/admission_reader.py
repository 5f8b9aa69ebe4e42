"""Read the serving-admission bucket once, for ``rollout`` and ``drain``: every key, or some.

The whole bucket is read through the discovery source's own reader of initial values (one
ordered consumer at the latest value per key, ended by the message that has nothing left
pending), so the gate and the service agree on what "the bucket now" means.

A poll that asks about some records only (``drain --wait`` about the drained workers'
namespaces, ``rollout --wait`` about the new generation's) reads those alone: one consumer whose
subject filters name them (``v1.*.members.<namespace>`` and what says a frontend is live), at
the latest value per key, so a poll costs what it asks about, not the whole bucket. A server
that takes one filter per consumer only (before 2.10) is read whole, and the keys sorted out
here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from datetime import datetime

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, Header
from nats.js.errors import BadRequestError, NotFoundError
from workerset_admission.adapters.nats.connect import (
    ConnectionCallbacks,
    NatsConnectOptions,
    connect,
    permission_refusal,
    refusal_mark,
    servers_for_display,
    unless_refused,
)
from workerset_admission.adapters.nats.kv import removal_kind, stream_name
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.card.serving_record import BucketRead, RawEntry
from workerset_admission.errors import error_in_words
from workerset_admission.keys import ADMISSION_BUCKET, key_matches

DEFAULT_ADMISSION_BUCKET = ADMISSION_BUCKET

__all__ = [
    "DEFAULT_ADMISSION_BUCKET",
    "NatsRecordSource",
    "parse_server_time",
    "read_keys",
    "read_server_time",
]


async def read_keys(
    client: NatsClient, bucket: str, filters: Sequence[str], timeout: float
) -> list[RawEntry]:
    """Read the latest value of the keys ``filters`` name, through one filtered consumer.

    It reads until the consumer has delivered what it counted at its creation, or says in an idle
    heartbeat that it has sent everything: a record counted then that expires before it is sent
    (a bucket's max age removes it without a marker) never comes, and waiting for it would cost
    the whole timeout. Raises ``BadRequestError`` when the server takes one filter per consumer
    only.
    """
    prefix = f"$KV.{bucket}."
    inbox = client.new_inbox()
    delivered: asyncio.Queue[Msg] = asyncio.Queue()
    subscription = await client.subscribe(inbox, cb=delivered.put)
    try:
        config = ConsumerConfig(
            deliver_subject=inbox,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=1.0,
            mem_storage=True,
            num_replicas=1,
            filter_subjects=[f"{prefix}{f}" for f in filters],
        )
        created = await client.jsm(timeout=timeout).add_consumer(f"KV_{bucket}", config=config)
        found: dict[str, RawEntry] = {}
        pending, sent = created.num_pending, 0
        while pending:
            msg = await asyncio.wait_for(delivered.get(), timeout=timeout)
            if not msg.subject.startswith(prefix):
                # Flow control asks for an answer; an idle heartbeat asks for none, unless the
                # consumer waits for one, and says how many messages it has sent.
                headers = msg.headers or {}
                answer = msg.reply or headers.get(Header.CONSUMER_STALLED)
                if answer:
                    await client.publish(answer, b"")
                elif headers.get(Header.LAST_CONSUMER) == str(sent):
                    break  # idle, and all it sent has come: nothing more will
                continue
            meta = msg.metadata
            pending, sent = meta.num_pending, meta.sequence.consumer
            key = msg.subject[len(prefix) :]
            if removal_kind(msg.headers) is not None:
                found.pop(key, None)
                continue
            found[key] = RawEntry(key, msg.data, meta.timestamp.timestamp())
        return [found[key] for key in sorted(found)]
    finally:
        with contextlib.suppress(NatsError, OSError):  # gone with a lost connection
            await subscription.unsubscribe()


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

    async def read(self, filters: Sequence[str] | None = None) -> BucketRead:
        """Read the bucket (only the keys ``filters`` name, when given).

        Raises ``PermissionRefused`` when the server refused this user.
        """
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
            problem = error_in_words(error)
            return BucketRead(problem=f"cannot connect to {servers}: {problem}")

        async def reuse(_callbacks: ConnectionCallbacks) -> NatsClient:
            return client

        if filters is not None:
            whole = False
            try:
                reading = read_keys(client, self._bucket, filters, self._timeout)
                entries = await unless_refused(reading, mark)
                return BucketRead(entries=tuple(entries))
            except NotFoundError:
                return BucketRead()
            except BadRequestError:
                whole = True  # one filter per consumer only (before 2.10): read it whole, below
            except (OSError, NatsError, asyncio.TimeoutError) as error:
                refusal = permission_refusal(mark)
                if refusal is not None:
                    raise refusal from None
                problem = error_in_words(error, timeout=self._timeout)
                return BucketRead(problem=f"cannot read bucket {self._bucket}: {problem}")
            finally:
                if not whole:
                    await client.close()
        source = JetStreamDiscoverySource(bucket=self._bucket, key_prefixes=None, connector=reuse)
        try:
            # Asked first: the listing closes the connection it was handed once it is read.
            server_time = await unless_refused(
                read_server_time(client, self._bucket, self._timeout), mark
            )
            listing = await unless_refused(
                asyncio.wait_for(source.list_all(), timeout=self._timeout), mark
            )
        except NotFoundError:
            # No frontend has published yet: an empty bucket, and a closed gate.
            return BucketRead()
        except (OSError, NatsError, asyncio.TimeoutError) as error:
            # A refusal is no passing problem: waiting and reading again cannot help.
            refusal = permission_refusal(mark)
            if refusal is not None:
                raise refusal from None
            problem = error_in_words(error, timeout=self._timeout)
            return BucketRead(problem=f"cannot read bucket {self._bucket}: {problem}")
        finally:
            await client.close()
        return BucketRead(
            entries=tuple(
                RawEntry(e.key, e.value, e.published_at)
                for e in listing.entries
                if filters is None or key_matches(e.key, filters)
            ),
            server_time=server_time,
        )


async def read_server_time(client: NatsClient, bucket: str, timeout: float) -> float | None:
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
