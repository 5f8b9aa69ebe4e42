"""The integration fixture gives a working JetStream server on loopback."""

from __future__ import annotations

import nats
import pytest
from natsfixture import NatsServer

pytestmark = pytest.mark.integration


async def test_the_session_server_speaks_jetstream_on_loopback(nats_server: NatsServer) -> None:
    assert "127.0.0.1" in nats_server.url or nats_server.kind == "container"
    nc = await nats.connect(nats_server.url)
    try:
        info = await nc.jetstream().account_info()
        assert info.limits is not None
    finally:
        await nc.close()


async def test_a_restartable_server_comes_back_on_the_same_port_with_its_store(
    nats_server_fn: NatsServer,
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    nc = await nats.connect(nats_server_fn.url)
    kv = await nc.jetstream().create_key_value(bucket="keep")
    await kv.put("a", b"1")
    await nc.close()

    handle.restart(kill=True)
    nc = await nats.connect(nats_server_fn.url)
    try:
        kv = await nc.jetstream().key_value("keep")
        assert (await kv.get("a")).value == b"1"
    finally:
        await nc.close()

    handle.restart(wipe=True)
    nc = await nats.connect(nats_server_fn.url)
    try:
        with pytest.raises(nats.js.errors.BucketNotFoundError):
            await nc.jetstream().key_value("keep")
    finally:
        await nc.close()
