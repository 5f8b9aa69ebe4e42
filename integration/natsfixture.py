"""The nats-server for integration tests: a container when a Docker API answers, else the binary.

A session-wide server is shared by tests that only need a JetStream endpoint (each test uses its
own bucket names); tests that stop, kill or wipe the server get their own restartable instance.
Both kinds are restartable. The container's image is ``$WORKERSET_ADMISSION_NATS_IMAGE``, by
default the release pinned to the binary's version; ``integration/container-engine.sh`` prepares
an engine (podman) and prints the settings.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import nats
import pytest
from natscontainer import ContainerNatsServer, container_image, engine_api_version
from workerset_admission.adapters.nats.embedded import (
    EmbeddedNatsServer,
    NatsServerNotFound,
    find_nats_server_binary,
)

__all__ = [
    "KIND_ENV_VAR",
    "NatsServer",
    "announce",
    "docker_answers",
    "restartable_server",
    "set_announcer",
    "shared_server",
    "show",
]


@dataclass(frozen=True, slots=True)
class NatsServer:
    """Where a test finds its server, and what kind it is."""

    url: str
    kind: Literal["container", "binary"]
    version: str
    handle: EmbeddedNatsServer | ContainerNatsServer | None = None


# Set to ``binary`` to run the local binary even where a container engine answers.
KIND_ENV_VAR = "WORKERSET_ADMISSION_NATS"


def docker_answers() -> bool:
    """True when a Docker-compatible engine responds (asked once per process and address)."""
    if os.environ.get(KIND_ENV_VAR, "").strip() == "binary":
        return False
    return engine_api_version() is not None


def _print_to_stderr(line: str) -> None:
    print(f"\n{line}", file=sys.__stderr__)


# Where announcements go. pytest captures file descriptor 2 while fixtures run, so a plain print
# would only show for a failing test; conftest routes them to the terminal past the capture.
_announcer: list[Callable[[str], None]] = [_print_to_stderr]


def set_announcer(write: Callable[[str], None]) -> None:
    """Send every fixture announcement line to ``write``."""
    _announcer[0] = write


def announce(line: str, *, fixture: str = "nats fixture") -> None:
    """Say which server a fixture started (the CI log counts the container ones)."""
    _announcer[0](f"[{fixture}] {line}")


def show(line: str) -> None:
    """Write one line to the terminal past pytest's output capture (a test's figures)."""
    _announcer[0](line)


def _announce(server: NatsServer, detail: str) -> None:
    announce(f"{server.kind} nats-server {server.version} at {server.url} ({detail})")


def _binary_or_skip() -> Path:
    try:
        return find_nats_server_binary()
    except NatsServerNotFound as exc:
        pytest.skip(f"no nats-server binary available: {exc}")


def _served_version(url: str) -> str:
    """Ask a running server for its version (what the INFO line says)."""

    async def ask() -> str:
        nc = await nats.connect(url)
        try:
            v = nc.connected_server_version
            return f"v{v.major}.{v.minor}.{v.patch}"
        finally:
            await nc.close()

    return asyncio.run(ask())


def shared_server(tmp_dir: Path) -> Iterator[NatsServer]:
    """Yield one server for the whole session and tear it down afterwards."""
    yield from restartable_server(tmp_dir)


def restartable_server(tmp_dir: Path) -> Iterator[NatsServer]:
    """Yield a server (a container, else the binary) that its handle stops, kills and wipes."""
    if docker_answers():
        yield from _container_server(tmp_dir)
    else:
        yield from _binary_server(tmp_dir)


def _container_server(tmp_dir: Path) -> Iterator[NatsServer]:
    handle = ContainerNatsServer(tmp_dir / "container", image=container_image())
    try:
        handle.start()
        server = NatsServer(
            url=handle.url, kind="container", version=_served_version(handle.url), handle=handle
        )
        _announce(server, f"testcontainers, image {handle.image}")
        yield server
    finally:
        handle.close()


def _binary_server(tmp_dir: Path) -> Iterator[NatsServer]:
    binary = _binary_or_skip()
    handle = EmbeddedNatsServer(tmp_dir / "jetstream", binary=binary)
    handle.start()
    server = NatsServer(url=handle.url, kind="binary", version=handle.version(), handle=handle)
    _announce(server, str(binary))
    try:
        yield server
    finally:
        handle.close()
