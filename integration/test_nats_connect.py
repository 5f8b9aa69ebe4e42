"""Connecting from settings: refused attempts leave nothing open; reconnects back off."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest
from natsfixture import NatsServer
from workerset_admission.adapters.nats.connect import (
    ConnectionCallbacks,
    NatsConnectOptions,
    connect,
)
from workerset_admission.adapters.nats.embedded import free_loopback_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]


async def test_a_refused_connection_leaves_no_socket_behind() -> None:
    options = NatsConnectOptions(
        servers=(f"nats://127.0.0.1:{free_loopback_port()}",), connect_timeout=1.0
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(Exception):  # noqa: B017 - nats-py's error type varies
            await connect(options, allow_reconnect=False)
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


async def test_a_client_survives_a_server_restart_and_keeps_working(
    nats_server_fn: NatsServer,
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    reconnected = asyncio.Event()

    async def on_reconnected() -> None:
        reconnected.set()

    options = NatsConnectOptions(
        servers=(nats_server_fn.url,), reconnect_wait=0.05, max_reconnect_wait=0.2
    )
    nc = await connect(options, ConnectionCallbacks(reconnected=on_reconnected))
    try:
        await asyncio.to_thread(handle.restart, kill=True, downtime=0.5)
        await asyncio.wait_for(reconnected.wait(), 10)
        sub = await nc.subscribe("probe")
        await nc.publish("probe", b"after restart")
        assert (await sub.next_msg(timeout=5)).data == b"after restart"
    finally:
        await nc.close()
