"""The bridges' bucket writer on a real nats-server: one pass's changes, sent together.

A bridge pass hands every change it found to :meth:`JetStreamBucketWriter.write` at once; the
writer sends them back to back and then waits for the acknowledgements. These tests hold what
that must not cost: the changes land in the order given, each carries the writer's stamp, and
a change the server refuses fails alone while the rest land.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import APIError, KeyNotFoundError
from natsfixture import NatsServer
from workerset_admission.adapters.nats.bucket_writer import JetStreamBucketWriter
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.kv import stream_name
from workerset_admission.ownership import WRITER_HEADER, bridge_writer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

OWNER = bridge_writer(Path("/store"), "writer-under-test")


async def _writer(nc: Client, spec: BucketSpec) -> JetStreamBucketWriter:
    status = await ensure_bucket(nc.jetstream(), spec)
    return JetStreamBucketWriter(status.kv, owner=OWNER, client=nc, bucket=spec.name, spec=spec)


async def test_changes_sent_together_land_in_the_order_given_and_stamped(
    client: Client, bucket_name: str
) -> None:
    writer = await _writer(client, BucketSpec(name=bucket_name))
    keys = [f"v1.mdc.ns.backend.generate.{n:x}" for n in range(1, 21)]
    assert await writer.write([(key, b"card %d" % n) for n, key in enumerate(keys)]) == [None] * 20
    # Deletes and puts mixed in one call: the later change of a key wins.
    outcomes = await writer.write([(keys[0], None), (keys[1], b"again"), (keys[1], None)])
    assert outcomes == [None, None, None]

    js = client.jetstream()
    sequences = []
    for key in keys[2:]:
        last = await js.get_last_msg(stream_name(bucket_name), f"$KV.{bucket_name}.{key}")
        assert last.headers is not None
        assert last.headers[WRITER_HEADER] == OWNER.token
        sequences.append(last.seq)
    assert sequences == sorted(sequences)
    kv = await js.key_value(bucket_name)
    for gone in keys[:2]:
        with pytest.raises(KeyNotFoundError):
            await kv.get(gone)
    assert sorted(await writer.keys()) == sorted(keys[2:])
    # The acknowledged sequences count for the bucket's mark, as single writes do.
    assert (await writer.mark()).written_seq == 23


async def test_a_long_write_goes_out_a_window_at_a_time_and_keeps_its_order(
    client: Client, bucket_name: str
) -> None:
    writer = await _writer(client, BucketSpec(name=bucket_name))
    keys = [f"v1.instances.ns.backend.generate.{n:x}" for n in range(1, 2_501)]

    assert await writer.write([(key, b"{}") for key in keys]) == [None] * len(keys)

    js = client.jetstream()
    sequences = [
        (await js.get_last_msg(stream_name(bucket_name), f"$KV.{bucket_name}.{key}")).seq
        for key in keys[::250]
    ]
    assert sequences == sorted(sequences)
    assert (await writer.mark()).written_seq == len(keys)


async def test_a_change_the_server_refuses_fails_alone_and_the_rest_land(
    client: Client, bucket_name: str
) -> None:
    writer = await _writer(client, BucketSpec(name=bucket_name, max_value_size=64))

    outcomes = await writer.write(
        [("v1.mdc.ns.b.g.1", b"small"), ("v1.mdc.ns.b.g.2", b"x" * 1000), ("v1.mdc.ns.b.g.3", b"")]
    )

    assert outcomes[0] is None
    assert outcomes[2] is None
    assert isinstance(outcomes[1], APIError), outcomes[1]
    kv = await client.jetstream().key_value(bucket_name)
    assert (await kv.get("v1.mdc.ns.b.g.1")).value == b"small"
    with pytest.raises(KeyNotFoundError):
        await kv.get("v1.mdc.ns.b.g.2")


async def test_changes_on_a_closed_connection_each_fail_and_nothing_hangs(
    nats_server: NatsServer, bucket_name: str
) -> None:
    nc = await nats.connect(nats_server.url)
    writer = await _writer(nc, BucketSpec(name=bucket_name))
    await nc.close()

    outcomes = await writer.write([("v1.mdc.ns.b.g.1", b"card"), ("v1.mdc.ns.b.g.2", None)])

    assert len(outcomes) == 2
    assert all(isinstance(outcome, Exception) for outcome in outcomes), outcomes


async def test_the_contents_of_a_bucket_with_no_worker_record_are_read_at_once(
    client: Client, bucket_name: str
) -> None:
    """Nothing under the prefix: the listing ends at once, asking the stream, not a consumer."""
    writer = await _writer(client, BucketSpec(name=bucket_name))
    kv = await client.jetstream().key_value(bucket_name)
    await kv.put("elsewhere.key", b"not a worker's")
    assert await asyncio.wait_for(writer.contents(), 5) == {}
    await writer.write([("v1.mdc.ns.backend.generate.1", b"card")])
    assert list(await asyncio.wait_for(writer.contents(), 5)) == ["v1.mdc.ns.backend.generate.1"]
