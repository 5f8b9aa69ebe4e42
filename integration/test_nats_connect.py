"""Connecting from settings: refused or stopped attempts leave nothing open; reconnects back off."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from natsfixture import NatsServer
from secfixture import SecurityMaterial, configured_server, tls_config
from support.proxy import TcpProxy
from workerset_admission.adapters.nats.connect import (
    ConnectionCallbacks,
    NatsConnectOptions,
    connect,
)
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer, free_loopback_port

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


# -- a connection attempt stopped part-way ------------------------------------------------------


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> SecurityMaterial:
    return SecurityMaterial.generate(
        tmp_path_factory.mktemp("connect-tls"),
        discovery_bucket="discovery",
        admission_bucket="admission",
        status_subject="status",
    )


@pytest.fixture(params=["plain", "tls"])
def reachable(
    request: pytest.FixtureRequest, material: SecurityMaterial, tmp_path: Path
) -> Iterator[tuple[EmbeddedNatsServer, NatsConnectOptions]]:
    """A private server, plain or with mutual TLS, and the options that reach it."""
    tls = request.param == "tls"
    with configured_server(tmp_path, tls_config(material) if tls else {}) as server:
        if not tls:
            yield server, NatsConnectOptions(servers=(server.url,))
            return
        yield (
            server,
            NatsConnectOptions(
                servers=(server.url.replace("nats://", "tls://"),),
                tls_ca_file=material.tls.ca_file,
                tls_cert_file=material.tls.client_cert,
                tls_key_file=material.tls.client_key,
                tls_hostname="localhost",
            ),
        )


def through(options: NatsConnectOptions, port: int) -> NatsConnectOptions:
    scheme = options.servers[0].split("://", 1)[0]
    return replace(options, servers=(f"{scheme}://127.0.0.1:{port}",))


def sockets_to(port: int) -> list[Any]:
    """This process's open TCP sockets connected to ``port``."""
    connections = psutil.Process().net_connections(kind="tcp")
    return [c for c in connections if c.raddr and c.raddr.port == port]


# How the attempt is awaited: by itself, or inside a timeout as probes and gates do.
WAYS = {
    "awaited": lambda options: connect(options),
    "inside wait_for": lambda options: asyncio.wait_for(connect(options), 30),
}


# Hundreds of connection attempts each: on a loaded machine that takes a while.
@pytest.mark.timeout(120)
@pytest.mark.parametrize("way", list(WAYS))
async def test_a_connection_attempt_stopped_at_each_step_of_its_handshake_closes_its_sockets(
    reachable: tuple[EmbeddedNatsServer, NatsConnectOptions], way: str
) -> None:
    """The relay lets the server's first n reads through and keeps the rest back, so the client
    waits at step n (the INFO line, each flight of the TLS handshake, the reply to CONNECT and
    PING) when it is stopped; n grows until the handshake needs nothing more."""
    server, options = reachable
    proxy = TcpProxy(server.port)
    await proxy.start()
    steps = 0
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for held in range(50):
                proxy.hold(held)
                attempt = asyncio.ensure_future(WAYS[way](through(options, proxy.port)))
                holding = asyncio.ensure_future(proxy.holding.wait())
                await asyncio.wait({attempt, holding}, return_when=asyncio.FIRST_COMPLETED)
                holding.cancel()
                if attempt.done():
                    # The server's goodbye may be among what is kept back.
                    proxy.release()
                    await (await attempt).close()
                    break
                steps += 1
                attempt.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await attempt
                assert sockets_to(proxy.port) == [], f"a socket left open at step {held}"
            gc.collect()
    finally:
        await proxy.close()
    # At least the INFO line and the reply to PING; TLS adds its handshake in between.
    assert steps >= (3 if options.uses_tls else 2)
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def cancel_after(
    loop: asyncio.AbstractEventLoop, turns: int, task: asyncio.Future[Any], hit: list[bool]
) -> None:
    """Cancel ``task`` once the event loop has gone round ``turns`` more times."""
    if turns == 0:
        hit.append(task.cancel())
    else:
        loop.call_soon(cancel_after, loop, turns - 1, task, hit)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("way", list(WAYS))
async def test_a_connection_attempt_stopped_at_any_turn_of_the_loop_closes_its_sockets(
    reachable: tuple[EmbeddedNatsServer, NatsConnectOptions], way: str
) -> None:
    """Stopped after 1, 2, 3 ... turns of the event loop (every turn at first, then farther
    apart, since a loaded machine takes thousands of turns per handshake), until the handshake
    is over first: a stop may land as a handshake step completes, where nats-py's own timeouts
    lose it on Python 3.11, and the attempt must still end without a connection."""
    server, options = reachable
    loop = asyncio.get_running_loop()
    stopped = finished_first = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        turns = 0
        while finished_first < 5:
            turns += 1 + turns // 16
            attempt = asyncio.ensure_future(WAYS[way](options))
            hit: list[bool] = []
            cancel_after(loop, turns, attempt, hit)
            try:
                client = await attempt
            except asyncio.CancelledError:
                stopped += 1
                finished_first = 0
            else:
                await client.close()
                # Inside wait_for a stop that comes as the attempt is done is wait_for's to
                # drop: the caller then owns the live connection, as it would without the stop.
                assert way == "inside wait_for" or hit != [True], (
                    f"connected though stopped: {turns}"
                )
                finished_first += 1
            assert sockets_to(server.port) == [], f"a socket left open after {turns} turns"
        gc.collect()
    assert stopped >= 5
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
