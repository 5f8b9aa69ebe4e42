"""A three-node JetStream cluster on loopback for the ``cluster`` integration tests.

Each node is a real ``nats-server`` process started from a generated configuration file (the
same text ``docs/operations.md`` shows operators): client and route listeners on 127.0.0.1 only,
free ports picked at start, one JetStream store per node in a temporary directory, and routes to
the two other nodes. Nodes can be killed (SIGKILL, no goodbye) and started again on the same ports
and store, which is what the fail-over tests need.

Ports are picked by binding to port 0 and releasing the socket: the routes must name every
node's port before any node runs. Another process could take a port in between, so a start that
fails is retried with fresh ports a bounded number of times.

When a Docker-compatible API answers, the nodes are three containers on one container network
instead (:class:`ContainerCluster`): each has a fixed address on that network for the routes, its
client port published on 127.0.0.1 only, and its store in a mounted folder, so a killed node comes
back with the same ports and store.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from natscontainer import (
    client_options,
    container_image,
    publish_on_loopback,
    remove_container,
    track_container,
    wait_ready,
)
from natsfixture import announce, docker_answers
from workerset_admission.adapters.nats.embedded import (
    NatsServerNotFound,
    find_nats_server_binary,
)

__all__ = [
    "CLUSTER_NAME",
    "ClusterNode",
    "ContainerCluster",
    "NatsCluster",
    "nats_cluster",
    "node_config",
    "quiet_client",
    "read_bucket",
]

CLUSTER_NAME = "wsa-test"

# Bounded waits: a cold three-node cluster elects its meta leader in well under a second on
# two cores, so these only matter when something is broken.
_START_TIMEOUT = 20.0
_STOP_TIMEOUT = 10.0
_PORT_RETRIES = 3


def node_config(
    name: str,
    client_port: int,
    cluster_port: int,
    peer_cluster_ports: Sequence[int],
    store_dir: Path,
    cluster_name: str = CLUSTER_NAME,
    host: str = "127.0.0.1",
) -> str:
    """The configuration file of one node; loopback only, routes to every peer.

    ``host`` is where clients reach it: loopback, or an address of the test's own network
    namespaces (the soak's bridge); the routes stay on loopback.
    """
    routes = ",\n    ".join(f"nats-route://127.0.0.1:{port}" for port in peer_cluster_ports)
    return f"""\
server_name: {name}
listen: {host}:{client_port}

jetstream {{
  store_dir: "{store_dir}"
}}

cluster {{
  name: {cluster_name}
  listen: 127.0.0.1:{cluster_port}
  routes: [
    {routes}
  ]
}}
"""


# Every process this module started and has not stopped yet. A test run that dies before its
# fixture's teardown (an interrupted session, a crashed worker) must not leave servers behind.
_RUNNING: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_RUNNING):
        if process.poll() is None:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=_STOP_TIMEOUT)
        _RUNNING.discard(process)


def _free_ports(count: int) -> list[int]:
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass(slots=True)
class ClusterNode:
    """One cluster member; ``process`` is None while it is down."""

    name: str
    client_port: int
    cluster_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def config_path(self) -> Path:
        return self.directory / "node.conf"

    @property
    def store_dir(self) -> Path:
        return self.directory / "store"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


async def quiet_client(urls: Sequence[str], **options: object) -> NATS:
    """A nats-py client that reconnects forever and keeps error callbacks out of the output."""

    async def _ignore(_error: Exception) -> None:
        return None

    settings: dict[str, object] = {
        "servers": list(urls),
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.2,
        "connect_timeout": 2,
        "error_cb": _ignore,
        "allow_reconnect": True,
    }
    settings.update(options)
    client: NATS = await nats.connect(**settings)  # type: ignore[arg-type]
    return client


async def read_bucket(urls: Sequence[str], bucket: str) -> dict[str, bytes] | None:
    """Every key's current value, or None while the cluster cannot answer (an election)."""
    try:
        return await asyncio.wait_for(_read_bucket(urls, bucket), timeout=10)
    except Exception:
        return None


async def _read_bucket(urls: Sequence[str], bucket: str) -> dict[str, bytes]:
    client = await quiet_client(urls)
    try:
        kv = await client.jetstream(timeout=5).key_value(bucket)
        watcher = await kv.watchall(ignore_deletes=True)
        state: dict[str, bytes] = {}
        try:
            while (entry := await watcher.updates(timeout=5)) is not None:
                state[entry.key] = entry.value or b""
        finally:
            await watcher.stop()
        return state
    finally:
        await client.close()


@dataclass(slots=True)
class NatsCluster:
    """Three nats-server processes routed to each other; start, kill and restart by name."""

    binary: str
    root: Path
    size: int = 3
    nodes: list[ClusterNode] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return "binary"

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def node(self, name: str) -> ClusterNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def start(self) -> None:
        """Start every node, retrying with new ports when one was taken meanwhile."""
        last_error: Exception | None = None
        for attempt in range(_PORT_RETRIES):
            ports = _free_ports(2 * self.size)
            self.nodes = [
                ClusterNode(
                    name=f"n{index + 1}",
                    client_port=ports[2 * index],
                    cluster_port=ports[2 * index + 1],
                    directory=self.root / f"attempt{attempt}" / f"n{index + 1}",
                )
                for index in range(self.size)
            ]
            try:
                for node in self.nodes:
                    self._write_config(node)
                    self._spawn(node)
                for node in self.nodes:
                    self._wait_listening(node)
            except RuntimeError as error:
                last_error = error
                self.stop()
                continue
            return
        raise RuntimeError(f"could not start a {self.size}-node cluster: {last_error}")

    def _write_config(self, node: ClusterNode) -> None:
        node.store_dir.mkdir(parents=True, exist_ok=True)
        peers = [other.cluster_port for other in self.nodes if other is not node]
        node.config_path.write_text(
            node_config(node.name, node.client_port, node.cluster_port, peers, node.store_dir)
        )

    def _spawn(self, node: ClusterNode) -> None:
        log = node.log_path.open("ab")
        try:
            node.process = subprocess.Popen(
                [self.binary, "-c", str(node.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        finally:
            log.close()
        _RUNNING.add(node.process)
        node.starts += 1

    def _wait_listening(self, node: ClusterNode) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if not node.running:
                raise RuntimeError(f"{node.name} exited: {self.log_tail(node)}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", node.client_port), timeout=0.2),
            ):
                return
            time.sleep(0.02)
        raise RuntimeError(f"{node.name} did not listen in time: {self.log_tail(node)}")

    def log_tail(self, node: ClusterNode, lines: int = 15) -> str:
        try:
            text = node.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def kill(self, name: str) -> None:
        """Kill a node without a graceful shutdown, the way a crashed host disappears."""
        node = self.node(name)
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGKILL)
            node.process.wait(timeout=_STOP_TIMEOUT)
        if node.process is not None:
            _RUNNING.discard(node.process)
        node.process = None

    def restart(self, name: str) -> None:
        """Start a killed node again with the same ports, configuration and store."""
        node = self.node(name)
        if node.running:
            raise RuntimeError(f"{name} is still running")
        self._spawn(node)
        self._wait_listening(node)

    def stop(self) -> None:
        for node in self.nodes:
            if node.process is None:
                continue
            if node.process.poll() is None:
                node.process.terminate()
                try:
                    node.process.wait(timeout=_STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(timeout=_STOP_TIMEOUT)
            _RUNNING.discard(node.process)
            node.process = None

    async def wait_jetstream(self, timeout: float = _START_TIMEOUT) -> None:
        """Wait until a meta leader exists, a three-replica stream can be created, and every
        node answers JetStream requests.

        The probe stream goes through one node; a node that is still joining the meta group
        leaves requests sent through it unanswered, so each node is asked too.
        """
        deadline = time.monotonic() + timeout
        client = await quiet_client(self.urls)
        try:
            js = client.jetstream(timeout=2)
            probe = f"cluster-probe-{os.getpid()}"
            config = StreamConfig(name=probe, subjects=[f"{probe}.>"], num_replicas=self.size)
            while (error := await _attempt(js.add_stream(config))) is not None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"JetStream cluster not ready: {error!r}") from error
                await asyncio.sleep(0.2)
            for url in self.urls:
                await _until_answering(url, probe, deadline)
            await js.delete_stream(probe)
        finally:
            await client.close()

    async def wait_current(self, stream: str, timeout: float = _START_TIMEOUT) -> None:
        """Wait until every replica of ``stream`` is online and caught up with its leader."""
        deadline = time.monotonic() + timeout
        client = await quiet_client(self.urls)
        try:
            js = client.jetstream(timeout=2)
            while not await self._replicas_current(js, stream):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{stream} replicas not current within {timeout} s")
                await asyncio.sleep(0.2)
        finally:
            await client.close()

    async def _replicas_current(self, js: JetStreamContext, stream: str) -> bool:
        try:
            info = await js.stream_info(stream)
        except Exception:
            # No leader yet, or the request went to a node that is catching up: not current.
            return False
        cluster = info.cluster
        if cluster is None or not cluster.leader:
            return False
        replicas = cluster.replicas or []
        return len(replicas) == self.size - 1 and all(
            peer.current and not peer.offline for peer in replicas
        )

    async def leader_of(self, stream: str) -> str:
        """The name of the node leading ``stream``'s replica group."""
        client = await quiet_client(self.urls)
        try:
            info = await client.jetstream(timeout=2).stream_info(stream)
        finally:
            await client.close()
        if info.cluster is None or not info.cluster.leader:
            raise RuntimeError(f"{stream} has no leader")
        return info.cluster.leader


async def _until_answering(url: str, stream: str, deadline: float) -> None:
    """Wait until the node at ``url`` answers a JetStream request about ``stream``."""
    client = await quiet_client([url])
    try:
        js = client.jetstream(timeout=2)
        while (error := await _attempt(js.stream_info(stream))) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} does not answer JetStream: {error!r}") from error
            await asyncio.sleep(0.2)
    finally:
        await client.close()


async def _attempt(call: Awaitable[object]) -> Exception | None:
    """Await ``call``; the error it raised, or None (the cluster answers 503 until it is ready)."""
    try:
        await call
    except Exception as error:
        return error
    return None


def container_node_config(
    name: str, node_address: str, peer_addresses: Sequence[str], cluster_name: str = CLUSTER_NAME
) -> str:
    """One node's configuration inside a container: routes to its peers' network addresses.

    Inside the container the server listens on every interface of its own network namespace;
    only the client port leaves it, published on the host's loopback. Client URLs are not
    advertised, so clients stay on the loopback addresses they were given.
    """
    routes = ",\n    ".join(
        f"nats-route://{address}:{_CONTAINER_ROUTE_PORT}" for address in peer_addresses
    )
    return f"""\
server_name: {name}
listen: 0.0.0.0:{_CONTAINER_CLIENT_PORT}

jetstream {{
  store_dir: "/data"
}}

cluster {{
  name: {cluster_name}
  listen: {node_address}:{_CONTAINER_ROUTE_PORT}
  no_advertise: true
  routes: [
    {routes}
  ]
}}
"""


_CONTAINER_CLIENT_PORT = 4222
_CONTAINER_ROUTE_PORT = 6222


@dataclass(slots=True)
class ContainerCluster(NatsCluster):
    """Three nats-server containers on one container network, with the same operations."""

    image: str = ""
    network: Any = None
    containers: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "container"

    def start(self) -> None:
        from docker.types import EndpointConfig  # type: ignore[import-untyped]
        from testcontainers.core.container import DockerContainer  # type: ignore[import-untyped]
        from testcontainers.core.network import Network  # type: ignore[import-untyped]

        self.network = Network(docker_client_kw=client_options()).create()
        subnet = self.network._unwrap_network.attrs["IPAM"]["Config"][0]["Subnet"]
        prefix = subnet.split("/")[0].rsplit(".", 1)[0]
        addresses = [f"{prefix}.{10 + index}" for index in range(self.size)]
        ports = _free_ports(self.size)
        self.nodes = [
            ClusterNode(
                name=f"n{index + 1}",
                client_port=ports[index],
                cluster_port=_CONTAINER_ROUTE_PORT,
                directory=self.root / f"n{index + 1}",
            )
            for index in range(self.size)
        ]
        for node, address in zip(self.nodes, addresses, strict=True):
            node.store_dir.mkdir(parents=True, exist_ok=True)
            peers = [other for other in addresses if other != address]
            node.config_path.write_text(container_node_config(node.name, address, peers))
            container = (
                DockerContainer(self.image, docker_client_kw=client_options())
                .with_command(["-c", "/etc/nats/node.conf"])
                .with_volume_mapping(str(node.config_path), "/etc/nats/node.conf", mode="ro")
                .with_volume_mapping(str(node.store_dir), "/data", mode="rw")
                .with_kwargs(
                    network=self.network.name,
                    networking_config={
                        self.network.name: EndpointConfig("1.41", ipv4_address=address)
                    },
                )
            )
            publish_on_loopback(container, _CONTAINER_CLIENT_PORT, node.client_port)
            self.containers[node.name] = container
            track_container(container)
            container.start()
            node.starts += 1
        for node in self.nodes:
            wait_ready(self.containers[node.name], node.client_port, 0, _START_TIMEOUT)

    def log_tail(self, node: ClusterNode, lines: int = 15) -> str:
        with contextlib.suppress(Exception):
            wrapped = self.containers[node.name].get_wrapped_container()
            text: str = wrapped.logs().decode(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return "(no log)"

    def kill(self, name: str) -> None:
        """SIGKILL the node's server; its container, ports and store stay for a restart."""
        wrapped = self.containers[self.node(name).name].get_wrapped_container()
        wrapped.kill()
        wrapped.wait(timeout=_STOP_TIMEOUT)

    def restart(self, name: str) -> None:
        """Start a killed node's container again: same address, ports, configuration and store."""
        node = self.node(name)
        wrapped = self.containers[name].get_wrapped_container()
        wrapped.reload()
        if wrapped.status == "running":
            raise RuntimeError(f"{name} is still running")
        before = wrapped.logs().count(b"Server is ready")
        wrapped.start()
        node.starts += 1
        wait_ready(self.containers[name], node.client_port, before, _START_TIMEOUT)

    def stop(self) -> None:
        for container in self.containers.values():
            remove_container(container)
        self.containers.clear()
        if self.network is not None:
            with contextlib.suppress(Exception):
                self.network.remove()
            self.network = None


@contextlib.contextmanager
def _cluster(root: Path) -> Iterator[NatsCluster]:
    cluster: NatsCluster
    if docker_answers():
        cluster = ContainerCluster(binary="", root=root, image=container_image())
    else:
        try:
            binary = find_nats_server_binary()
        except NatsServerNotFound as error:
            pytest.fail(f"no nats-server binary for the cluster tests: {error}")
        cluster = NatsCluster(binary=str(binary), root=root)
    try:
        cluster.start()
        announce(
            f"{cluster.kind} nats-server cluster of {cluster.size} at {', '.join(cluster.urls)}"
        )
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def nats_cluster(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    """A fresh three-node JetStream cluster, stopped and removed after the test."""
    with _cluster(tmp_path / "cluster") as cluster:
        await cluster.wait_jetstream()
        yield cluster
